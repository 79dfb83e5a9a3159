"""One frozen settings object that renders librdkafka dicts.

Every timeout is a named setting with a comment saying why its value; secrets in the
librdkafka settings are never printed (see :meth:`Config.redacted`).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from txnstream.errors import ConfigError
from txnstream.types import ANONYMOUS

__all__ = ["Config", "TopicNames", "KafkaSettings", "DEFAULT_BOOTSTRAP", "is_secret_setting",
           "load_kafka_properties", "load_tc_users", "read_secret_file", "check_principal",
           "txn_producer_problem", "check_txn_producer"]

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
_SECRET_HINTS = ("password", "secret", "sasl.oauthbearer", "ssl.key", "jaas", "token")
"""A librdkafka setting whose name holds one of these is a secret: masked when shown."""


def is_secret_setting(name: str) -> bool:
    """True for librdkafka settings that hold credentials (passwords, keys, JAAS)."""
    return any(h in name for h in _SECRET_HINTS)


class KafkaSettings(dict[str, Any]):
    """librdkafka settings that print with their secrets masked, and say where they came from.

    Clients get the real values (it is a plain dict to them); ``repr``/``str``, and so
    every log line or error that formats a Config, show ``***`` instead. ``origin``
    (``"given to Client()"``, ``"in FILE, from --kafka-config"``) is what an error about
    one of them names; it survives :meth:`Config.with_` and pickling.
    """

    def __init__(self, settings: Mapping[str, Any] | None = None, /,
                 origin: str | None = None) -> None:
        super().__init__(settings or {})
        self.origin: str = origin or getattr(settings, "origin", None) or "in Config.kafka"

    def masked(self) -> dict[str, Any]:
        """A copy with every secret value replaced by ``***``."""
        return {k: "***" if is_secret_setting(k) else v for k, v in self.items()}

    def __repr__(self) -> str:
        return repr(self.masked())

    __str__ = __repr__


_ACKS = ("acks", "request.required.acks", "topic.acks", "topic.request.required.acks")
"""librdkafka's names of the producer's ``acks`` (aliases, and as topic settings)."""
_TOPIC_CONFIG = "default.topic.config"
"""confluent-kafka's (deprecated) nested topic settings: ``acks`` may hide there too."""
_ACKS_ALL = ("all", "-1")
_IDEMPOTENCE_ON = ("true", "t", "1")
"""The text of a true ``enable.idempotence``, as librdkafka reads it (any case)."""

_ACKS_WHY = ("a transactional record must be acknowledged by every in-sync replica before "
             "its txn can commit (with fewer, a record the broker refused or lost with its "
             "leader counts as delivered, and readers see part of the txn); use acks=all "
             "(the default), as Kafka requires of a transactional producer")
_IDEMPOTENCE_WHY = ("a producer that writes into txns must be idempotent, or a retried send "
                    "can be written twice or out of order within its txn; use "
                    "enable.idempotence=true (the default), as Kafka requires of a "
                    "transactional producer")


def _text(value: object) -> str:
    """A setting's value as a properties file would spell it (``false``, not ``False``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _is_acks_all(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value == -1
    return isinstance(value, str) and value.strip().lower() in _ACKS_ALL


def _is_true(value: object) -> bool:
    if isinstance(value, (bool, int)):
        return value == 1
    return isinstance(value, str) and value.strip().lower() in _IDEMPOTENCE_ON


def txn_producer_problem(settings: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The first librdkafka setting that breaks a txn's durability: (name, value, why).

    None if there is none. A producer that writes into txns needs ``acks=all`` (or
    ``-1``, under any of librdkafka's names for it) and ``enable.idempotence`` on (absent
    is on: :meth:`Config.producer` defaults it); Kafka's Java producer refuses anything
    else for a transactional producer. A value librdkafka cannot read is not judged here:
    librdkafka refuses it itself.
    """
    nested = settings.get(_TOPIC_CONFIG)
    found = [(k, settings[k]) for k in _ACKS if k in settings]
    if isinstance(nested, Mapping):
        found += [(f"{_TOPIC_CONFIG}.{k}", nested[k]) for k in _ACKS if k in nested]
    for name, value in found:
        if not _is_acks_all(value):
            return name, _text(value), _ACKS_WHY
    idempotence = settings.get("enable.idempotence", True)
    if not _is_true(idempotence):
        return "enable.idempotence", _text(idempotence), _IDEMPOTENCE_WHY
    return None


def check_txn_producer(settings: Mapping[str, Any], where: str) -> None:
    """``ConfigError`` if ``settings`` break a txn's durability (:func:`txn_producer_problem`).

    The error names the setting, its value, ``where`` it came from and why.
    """
    problem = txn_producer_problem(settings)
    if problem is not None:
        name, value, why = problem
        raise ConfigError(f"{name}={value} ({where}): {why}")


def _key_values(path: str | os.PathLike[str], what: str) -> list[tuple[str, str, int]]:
    """``key=value`` lines of a file, with their line numbers; errors never show a line."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    out: list[tuple[str, str, int]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{path} line {n}: expected key=value")
        out.append((key.strip(), value.strip(), n))
    return out


def load_kafka_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read librdkafka settings from a Java-style ``client.properties`` (``key=value`` lines).

    Blank lines and ``#``/``!`` comments are skipped. An error names the file and the
    line number, never the line's text (it may hold a password).
    """
    return {k: v for k, v, _ in _key_values(path, "Kafka client properties")}


_PRINCIPAL = re.compile(r"[A-Za-z0-9._@:/=+-]{1,128}")
"""A principal's name: what a certificate's common name or a user name usually holds."""


def check_principal(name: object, what: str) -> str:
    """``name`` if it is a principal's name, else ``ConfigError`` naming ``what``."""
    if not isinstance(name, str) or not _PRINCIPAL.fullmatch(name):
        raise ConfigError(f"{what}: {name!r} is not a principal name (1-128 of "
                          "A-Z a-z 0-9 . _ @ : / = + -)")
    return name


def read_secret_file(path: str | os.PathLike[str], what: str) -> str:
    """The secret held in a file (surrounding white space dropped); errors never show it."""
    try:
        secret = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    if not secret:
        raise ConfigError(f"{what}: {path} is empty")
    return secret


def load_tc_users(path: str | os.PathLike[str]) -> dict[str, str]:
    """Principals and their secrets from a ``principal=secret`` file (``tc_users_file``).

    Blank lines and ``#`` comments are skipped; an error names the file and line, never
    the line's text.
    """
    users: dict[str, str] = {}
    for key, value, n in _key_values(path, "coordinator users file"):
        check_principal(key, f"{path} line {n}")
        if key == ANONYMOUS:
            raise ConfigError(f"{path} line {n}: {ANONYMOUS!r} is the name of clients that "
                              "prove nothing; an authenticated principal needs another")
        if not value:
            raise ConfigError(f"{path} line {n}: the secret of {key} is empty")
        users[key] = value
    return users


@dataclass(frozen=True, slots=True)
class TopicNames:
    """Internal topic names; all share one configurable prefix (DESIGN.md section 2)."""

    prefix: str = "__txn"

    @property
    def log(self) -> str:
        """The transaction log: one partition per coordinator."""
        return f"{self.prefix}_log"

    @property
    def endpoints(self) -> str:
        """Where each coordinator is served (compacted): partition p = TC p's owner."""
        return f"{self.prefix}_tc_endpoints"

    @property
    def buffer_snapshots(self) -> str:
        """Compacted transaction-buffer snapshots, key = topic-partition."""
        return f"{self.prefix}_buffer_snapshots"

    @property
    def buffer_state(self) -> str:
        """Served transaction-buffer state: owner claims and deltas, partition = slot."""
        return f"{self.prefix}_buffer_state"

    @property
    def pending_ack(self) -> str:
        """Pending-ack log of every subscription."""
        return f"{self.prefix}_pending_ack"

    def all(self) -> list[str]:
        """Every internal topic name."""
        return [self.log, self.endpoints, self.buffer_snapshots, self.buffer_state,
                self.pending_ack]


KAFKA_LOG = logging.getLogger("txnstream.librdkafka")
RECONNECT_BACKOFF_MS = 20
"""librdkafka's ``reconnect.backoff.ms`` for every client txnstream makes (a user's
``kafka`` setting wins). librdkafka (2.x) drops its bootstrap connection once the first
metadata names the brokers, fails the requests still on it, and sends them again on a
new connection only after its sparse-connect pause, half this backoff (at least about
11 ms): at librdkafka's default of 100 ms every new client's first request took 55 ms
on a local broker (metadata, watermarks), 15 ms at 20. A Spark task, a plan, a new
client pay it at start. The backoff still doubles up to ``reconnect.backoff.max.ms``
(10 s) while a broker stays down (Java's clients start at 50 ms)."""
"""Where librdkafka's own log lines go, for the producers and consumers built from a
:class:`Config` (confluent-kafka's ``logger`` setting, served when the client is polled):
Python logging, so an application (and the CLI: warnings behind ``-v``) decides what is
shown, instead of lines printed straight to stderr. Admin clients, rarely polled, keep
librdkafka's own printing."""


@dataclass(frozen=True, slots=True)
class Config:
    """Settings shared by clients, workers and tools.

    ``kafka`` holds librdkafka settings passed through unchanged to every Kafka client;
    :meth:`producer` refuses those that break a txn's durability.
    """

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    topics: TopicNames = field(default_factory=TopicNames)
    num_coordinators: int = 4
    """Partitions of the log and endpoints topics = number of TCs; fixed once created."""
    num_buffer_slots: int = 4
    """Partitions of the snapshot and buffer-state topics (buffer slots: a data partition's
    slot is Java's murmur2 of ``topic-partition``); at most this many workers share the
    buffer role. Fixed once created."""
    replication_factor: int = 1
    kafka: Mapping[str, Any] = field(default_factory=dict)

    # The direct line to coordinators (DESIGN.md sections 5 and 10, docs/security.md) --
    tc_principal: str = "txnstream"
    """Who this client is on the line when it proves ``tc_secret``; a txn belongs to the
    principal that opened it. ``TXNSTREAM_TC_PRINCIPAL``."""
    tc_secret: str | None = field(default=None, repr=False)
    """Secret of ``tc_principal``. Each frame after the handshake carries an HMAC keyed
    from it, so neither the secret nor a relay can be used against a connection.
    ``TXNSTREAM_TC_SECRET`` or ``TXNSTREAM_TC_SECRET_FILE``. None: no secret."""
    workers_key_file: str | None = None
    """Workers: the workers' key (32 random bytes as hex, :mod:`txnstream.workers_key`):
    signs markers and endpoint records, makes records members of their txns. Without
    it the key comes from ``tc_secret``, else from the default key file
    (:func:`txnstream.workers_key.default_key_path`); a worker with none of them does not
    start unless unsigned. ``TXNSTREAM_WORKERS_KEY_FILE``, ``--workers-key-file``."""
    tc_users_file: str | None = None
    """Workers: more principals, one ``principal=secret`` line each (mode 0600); the
    worker's own ``tc_principal``/``tc_secret`` is always one of them.
    ``TXNSTREAM_TC_USERS_FILE``."""
    tc_admins: tuple[str, ...] = ()
    """Workers: principals that may list, inspect and abort every txn; empty: the
    worker's own ``tc_principal``. ``TXNSTREAM_TC_ADMINS`` (comma-separated)."""
    tc_tls_cafile: str | None = None
    """CA bundle: with it, clients speak TLS to workers and verify their certificate;
    workers verify client certificates with it. ``TXNSTREAM_TC_TLS_CAFILE``."""
    tc_tls_certfile: str | None = None
    """A worker's certificate (it serves TLS); a client's, for mutual TLS (its subject's
    common name is its principal). ``TXNSTREAM_TC_TLS_CERTFILE``."""
    tc_tls_keyfile: str | None = field(default=None, repr=False)
    """Private key of ``tc_tls_certfile``. ``TXNSTREAM_TC_TLS_KEYFILE``."""
    tc_tls_client_auth: bool = False
    """Workers require a client certificate signed by ``tc_tls_cafile`` (mutual TLS).
    ``TXNSTREAM_TC_TLS_CLIENT_AUTH=1``."""

    # Timeouts ---------------------------------------------------------------------
    default_txn_timeout_s: float = 60.0
    """Pulsar's client default; long enough for a batch, short enough to unblock readers."""
    max_txn_timeout_s: float = 3600.0
    """Cap a client cannot exceed: an open txn blocks its partitions for committed readers."""
    default_max_prepared_s: float = 600.0
    """How long a prepared txn may wait for its completion (``txn.prepare()``) unless
    ``new_transaction(max_prepared_s=)`` says: it blocks its partitions' readers meanwhile."""
    max_prepared_s: float = 86_400.0
    """Cap on a prepared txn's age a client cannot exceed (the coordinator aborts it after)."""
    request_timeout_s: float = 30.0
    """Deadline for one coordinator request including retries; covers a failover
    (session timeout + log replay) so a client rides through an owner crash."""
    admin_timeout_s: float = 15.0
    """Deadline for topic admin calls; KRaft metadata updates take well under a second."""

    def __post_init__(self) -> None:
        # masked when printed; keeps its origin (where a producer's refusal says it is from)
        object.__setattr__(self, "kafka", KafkaSettings(self.kafka))
        if not self.bootstrap_servers:
            raise ConfigError("bootstrap_servers is empty: give host:port of a Kafka broker")
        if not 1 <= self.num_coordinators <= 4096:
            raise ConfigError(f"num_coordinators must be 1..4096, got {self.num_coordinators}")
        if self.replication_factor < 1:
            raise ConfigError(f"replication_factor must be >= 1, got {self.replication_factor}")
        check_principal(self.tc_principal, "tc_principal")
        for admin in self.tc_admins:
            check_principal(admin, "tc_admins")
        if self.tc_secret is not None and not self.tc_secret:
            raise ConfigError("tc_secret is empty: give a secret, or None for no secret")
        for name in ("default_txn_timeout_s", "max_txn_timeout_s", "request_timeout_s",
                     "admin_timeout_s", "default_max_prepared_s", "max_prepared_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a finite number of seconds > 0, "
                                  f"got {value!r}")
        if self.default_txn_timeout_s > self.max_txn_timeout_s:
            raise ConfigError(f"default_txn_timeout_s ({self.default_txn_timeout_s:g}) is "
                              f"over max_txn_timeout_s ({self.max_txn_timeout_s:g})")
        if self.default_max_prepared_s > self.max_prepared_s:
            raise ConfigError(f"default_max_prepared_s ({self.default_max_prepared_s:g}) is "
                              f"over max_prepared_s ({self.max_prepared_s:g})")

    @property
    def admins(self) -> frozenset[str]:
        """Principals a worker treats as admins (``tc_admins``, else its own principal)."""
        return frozenset(self.tc_admins or (self.tc_principal,))

    @property
    def has_workers_key(self) -> bool:
        """Whether this config names the workers' key (a key file or a secret).

        Without it workers take the default key file (:mod:`txnstream.workers_key`).
        """
        return bool(self.workers_key_file or self.tc_secret)

    @property
    def tc_authenticated(self) -> bool:
        """Whether a worker with this config authenticates its clients."""
        return bool(self.tc_secret or self.tc_users_file or self.tc_tls_client_auth)

    @classmethod
    def from_env(cls, bootstrap: str | None = None, **overrides: Any) -> Config:
        """Build from the environment and overrides.

        ``TXNSTREAM_BOOTSTRAP``, ``TXNSTREAM_TOPIC_PREFIX``, ``TXNSTREAM_KAFKA_CONFIG`` (a
        client.properties file of librdkafka settings) and the line's settings:
        ``TXNSTREAM_TC_PRINCIPAL``, ``TXNSTREAM_TC_SECRET`` (or ``_SECRET_FILE``),
        ``TXNSTREAM_TC_USERS_FILE``, ``TXNSTREAM_TC_ADMINS``, ``TXNSTREAM_TC_TLS_CAFILE``,
        ``_CERTFILE``, ``_KEYFILE``, ``_CLIENT_AUTH``; the workers'
        ``TXNSTREAM_WORKERS_KEY_FILE``.
        """
        boot = bootstrap or os.environ.get("TXNSTREAM_BOOTSTRAP") or DEFAULT_BOOTSTRAP
        prefix = os.environ.get("TXNSTREAM_TOPIC_PREFIX")
        if prefix and "topics" not in overrides:
            overrides["topics"] = TopicNames(prefix)
        props = os.environ.get("TXNSTREAM_KAFKA_CONFIG")
        if props and "kafka" not in overrides:
            overrides["kafka"] = KafkaSettings(load_kafka_properties(props),
                                               origin=f"in {props}, from $TXNSTREAM_KAFKA_CONFIG")
        env = os.environ
        secret = env.get("TXNSTREAM_TC_SECRET")
        if not secret and env.get("TXNSTREAM_TC_SECRET_FILE") and "tc_secret" not in overrides:
            secret = read_secret_file(env["TXNSTREAM_TC_SECRET_FILE"],
                                      "TXNSTREAM_TC_SECRET_FILE")
        if secret and "tc_secret" not in overrides:
            overrides["tc_secret"] = secret
        for var, name in (("TXNSTREAM_TC_PRINCIPAL", "tc_principal"),
                          ("TXNSTREAM_WORKERS_KEY_FILE", "workers_key_file"),
                          ("TXNSTREAM_TC_USERS_FILE", "tc_users_file"),
                          ("TXNSTREAM_TC_TLS_CAFILE", "tc_tls_cafile"),
                          ("TXNSTREAM_TC_TLS_CERTFILE", "tc_tls_certfile"),
                          ("TXNSTREAM_TC_TLS_KEYFILE", "tc_tls_keyfile")):
            if env.get(var) and name not in overrides:
                overrides[name] = env[var]
        if env.get("TXNSTREAM_TC_ADMINS") and "tc_admins" not in overrides:
            overrides["tc_admins"] = tuple(
                a.strip() for a in env["TXNSTREAM_TC_ADMINS"].split(",") if a.strip())
        if env.get("TXNSTREAM_TC_TLS_CLIENT_AUTH") and "tc_tls_client_auth" not in overrides:
            overrides["tc_tls_client_auth"] = env["TXNSTREAM_TC_TLS_CLIENT_AUTH"].lower() \
                in ("1", "true", "yes", "on")
        return cls(bootstrap_servers=boot, **overrides)

    def with_(self, **changes: Any) -> Config:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def common(self) -> dict[str, Any]:
        """Settings every librdkafka client gets (``kafka`` wins over the defaults)."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers,
                                "reconnect.backoff.ms": RECONNECT_BACKOFF_MS}
        conf.update(self.kafka)
        return conf

    def producer(self, **extra: Any) -> dict[str, Any]:
        """Settings for an idempotent producer (no duplicates on retry, order kept).

        Every producer txnstream makes writes into txns or their state (records,
        pending acks, the log, markers), so settings that break durability (acks other
        than all, idempotence off: :func:`txn_producer_problem`) are refused with a
        ``ConfigError`` naming the setting and where it came from (``extra``, else
        ``kafka``'s origin), before any client is made.
        """
        check_txn_producer(extra, "given to Config.producer()")
        conf = self.common()
        conf.setdefault("logger", KAFKA_LOG)
        conf.setdefault("enable.idempotence", True)
        conf.setdefault("linger.ms", 5)
        # Java's default partitioner: keyed records land where Java clients put them, and
        # readers can compute a key's partition (pending-ack log, snapshots).
        conf.setdefault("partitioner", "murmur2_random")
        conf.update(extra)
        check_txn_producer(conf, getattr(self.kafka, "origin", "in Config.kafka"))
        return conf

    def consumer(self, group_id: str, **extra: Any) -> dict[str, Any]:
        """Settings for a consumer of ``group_id``; offsets are committed explicitly."""
        conf = self.common()
        conf.setdefault("logger", KAFKA_LOG)
        conf.update({"group.id": group_id, "enable.auto.commit": False,
                     "auto.offset.reset": "earliest", "enable.partition.eof": False})
        conf.update(extra)
        return conf

    def admin(self) -> dict[str, Any]:
        """Settings for an AdminClient."""
        return self.common()

    def redacted(self) -> dict[str, Any]:
        """The librdkafka settings with secrets masked, for logs and tables."""
        return KafkaSettings(self.common()).masked()
