"""One frozen settings object that renders librdkafka dicts.

Every timeout is a named setting with a comment saying why its value; secrets in the
librdkafka settings are never printed (see :meth:`Config.redacted`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from txnstream.errors import ConfigError

__all__ = ["Config", "TopicNames", "KafkaSettings", "DEFAULT_BOOTSTRAP", "is_secret_setting",
           "load_kafka_properties"]

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
_SECRET_HINTS = ("password", "secret", "sasl.oauthbearer", "ssl.key", "jaas", "token")
"""A librdkafka setting whose name holds one of these is a secret: masked when shown."""


def is_secret_setting(name: str) -> bool:
    """True for librdkafka settings that hold credentials (passwords, keys, JAAS)."""
    return any(h in name for h in _SECRET_HINTS)


class KafkaSettings(dict[str, Any]):
    """librdkafka settings that print with their secrets masked.

    Clients get the real values (it is a plain dict to them); ``repr``/``str``, and so
    every log line or error that formats a Config, show ``***`` instead.
    """

    def masked(self) -> dict[str, Any]:
        """A copy with every secret value replaced by ``***``."""
        return {k: "***" if is_secret_setting(k) else v for k, v in self.items()}

    def __repr__(self) -> str:
        return repr(self.masked())

    __str__ = __repr__


def load_kafka_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read librdkafka settings from a Java-style ``client.properties`` (``key=value`` lines).

    Blank lines and ``#``/``!`` comments are skipped. An error names the file and the
    line number, never the line's text (it may hold a password).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read Kafka client properties {path}: "
                          f"{exc.strerror or exc}") from None
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{path} line {n}: expected key=value")
        out[key.strip()] = value.strip()
    return out


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


@dataclass(frozen=True, slots=True)
class Config:
    """Settings shared by clients, workers and tools.

    ``kafka`` holds librdkafka settings passed through unchanged to every Kafka client.
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

    # The direct line to coordinators (DESIGN.md section 5) -------------------------
    tc_secret: str | None = field(default=None, repr=False)
    """Shared secret a client proves (HMAC of the worker's nonce; never sent) before a
    worker takes its requests; ``TXNSTREAM_TC_SECRET``. None: no check."""
    tc_tls_cafile: str | None = None
    """CA bundle: with it, clients speak TLS to workers and verify their certificate."""
    tc_tls_certfile: str | None = None
    """A worker's certificate (it serves TLS); a client's, for mutual TLS."""
    tc_tls_keyfile: str | None = field(default=None, repr=False)
    """Private key of ``tc_tls_certfile``."""
    tc_tls_client_auth: bool = False
    """Workers require a client certificate signed by ``tc_tls_cafile`` (mutual TLS)."""

    # Timeouts ---------------------------------------------------------------------
    default_txn_timeout_s: float = 60.0
    """Pulsar's client default; long enough for a batch, short enough to unblock readers."""
    max_txn_timeout_s: float = 3600.0
    """Cap a client cannot exceed: an open txn blocks its partitions for committed readers."""
    request_timeout_s: float = 30.0
    """Deadline for one coordinator request including retries; covers a failover
    (session timeout + log replay) so a client rides through an owner crash."""
    admin_timeout_s: float = 15.0
    """Deadline for topic admin calls; KRaft metadata updates take well under a second."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kafka", KafkaSettings(self.kafka))  # masked when printed
        if not self.bootstrap_servers:
            raise ConfigError("bootstrap_servers is empty: give host:port of a Kafka broker")
        if not 1 <= self.num_coordinators <= 4096:
            raise ConfigError(f"num_coordinators must be 1..4096, got {self.num_coordinators}")
        if self.replication_factor < 1:
            raise ConfigError(f"replication_factor must be >= 1, got {self.replication_factor}")

    @classmethod
    def from_env(cls, bootstrap: str | None = None, **overrides: Any) -> Config:
        """Build from the environment and overrides.

        ``TXNSTREAM_BOOTSTRAP``, ``TXNSTREAM_TOPIC_PREFIX``, ``TXNSTREAM_TC_SECRET`` and
        ``TXNSTREAM_KAFKA_CONFIG`` (a client.properties file of librdkafka settings).
        """
        boot = bootstrap or os.environ.get("TXNSTREAM_BOOTSTRAP") or DEFAULT_BOOTSTRAP
        prefix = os.environ.get("TXNSTREAM_TOPIC_PREFIX")
        if prefix and "topics" not in overrides:
            overrides["topics"] = TopicNames(prefix)
        props = os.environ.get("TXNSTREAM_KAFKA_CONFIG")
        if props and "kafka" not in overrides:
            overrides["kafka"] = load_kafka_properties(props)
        secret = os.environ.get("TXNSTREAM_TC_SECRET")
        if secret and "tc_secret" not in overrides:
            overrides["tc_secret"] = secret
        return cls(bootstrap_servers=boot, **overrides)

    def with_(self, **changes: Any) -> Config:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def common(self) -> dict[str, Any]:
        """Settings every librdkafka client gets."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        conf.update(self.kafka)
        return conf

    def producer(self, **extra: Any) -> dict[str, Any]:
        """Settings for an idempotent producer (no duplicates on retry, order kept)."""
        conf = self.common()
        conf.setdefault("enable.idempotence", True)
        conf.setdefault("linger.ms", 5)
        # Java's default partitioner: keyed records land where Java clients put them, and
        # readers can compute a key's partition (pending-ack log, snapshots).
        conf.setdefault("partitioner", "murmur2_random")
        conf.update(extra)
        return conf

    def consumer(self, group_id: str, **extra: Any) -> dict[str, Any]:
        """Settings for a consumer of ``group_id``; offsets are committed explicitly."""
        conf = self.common()
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
