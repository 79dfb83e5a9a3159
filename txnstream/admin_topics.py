"""The internal topics of DESIGN.md section 2, created idempotently (``txnstream init``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # public, not in __all__
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)
from confluent_kafka.cimpl import NewTopic
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from txnstream.config import Config
from txnstream.errors import ClusterError

__all__ = ["TopicSpec", "TopicReport", "topic_specs", "ensure_topics"]

log = logging.getLogger(__name__)

_DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One internal topic: name, partitions, configs, and whether its count must match."""

    name: str
    partitions: int
    config: dict[str, str]
    strict: bool
    """Partition count is part of the protocol (TC ids): a mismatch is reported."""
    kept: tuple[str, ...] = ()
    """Configs an existing topic is brought to (a topic made by an older version)."""


@dataclass(frozen=True, slots=True)
class TopicReport:
    """What ``ensure_topics`` found or did for one topic."""

    name: str
    partitions: int
    status: str
    """``created``, ``exists``, ``updated`` (:attr:`TopicSpec.kept` configs set) or
    ``mismatch``."""
    detail: str = ""


BUFFER_STATE_RETENTION_MS = _DAY_MS
"""Retention of the buffer-state deltas: far beyond the snapshot interval (seconds)."""
COMPACTED_TOPIC_ROLL_MS = 60_000
"""``segment.ms`` of the compacted internal topics (snapshots, endpoints). Kafka never
compacts the active segment and by default rolls it after 7 days or 1 GiB, while every
reader start and slot claim scans a whole snapshot partition, and every client start the
whole endpoint topic (each worker rewrites its records every 30 s): with this roll a scan
reads the live keys (at most twice over, Kafka's ``min.cleanable.dirty.ratio`` 0.5), the
last minute's records, and what the log cleaner has not reached yet
(``log.cleaner.backoff.ms``, 15 s)."""
PENDING_ACK_RETENTION_MS = 7 * _DAY_MS
"""Retention of the pending-ack log: Kafka's default committed-offset retention."""


def topic_specs(config: Config) -> list[TopicSpec]:
    """The internal topics for ``config``."""
    t = config.topics
    rf = config.replication_factor
    isr = str(min(2, rf))
    forever = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete",
               "min.insync.replicas": isr}
    return [
        # Truncated only by delete_records below the first record still needed; never by
        # time or compaction (a stale writer's record could replace a valid one).
        TopicSpec(t.log, config.num_coordinators, forever, strict=True),
        # The newest owner of each TC and where it listens; compacted: one per TC is kept.
        TopicSpec(t.endpoints, config.num_coordinators,
                  {"cleanup.policy": "compact", "min.insync.replicas": isr,
                   "segment.ms": str(COMPACTED_TOPIC_ROLL_MS)}, strict=True,
                  kept=("segment.ms",)),
        # Compacted, and rolled each minute so compaction can reach what was written.
        TopicSpec(t.buffer_snapshots, config.num_buffer_slots,
                  {"cleanup.policy": "compact", "min.insync.replicas": isr,
                   "segment.ms": str(COMPACTED_TOPIC_ROLL_MS)}, strict=True,
                  kept=("segment.ms",)),
        # Deltas are needed only after the latest snapshot of their partition (one every
        # few seconds while it changes); a reader that finds a gap reloads a snapshot.
        TopicSpec(t.buffer_state, config.num_buffer_slots,
                  {"retention.ms": str(BUFFER_STATE_RETENTION_MS), "cleanup.policy": "delete",
                   "min.insync.replicas": isr}, strict=True),
        # Time-bounded like Kafka's committed offsets (offsets.retention.minutes, 7 days):
        # each owner checkpoints its partitions' pending acks every few seconds and a new
        # owner replays from the latest checkpoint, so only a subscription left without
        # any member for longer than this loses its acks above the cursor.
        TopicSpec(t.pending_ack, 8,
                  {"retention.ms": str(PENDING_ACK_RETENTION_MS), "cleanup.policy": "delete",
                   "min.insync.replicas": isr}, strict=True),
    ]


_LOGIN_REFUSED = (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
                  KafkaError._SSL)
"""librdkafka error codes that mean the broker answered but refused this client's login."""


def ensure_topics(config: Config) -> list[TopicReport]:
    """Create missing internal topics; report existing ones (never changes them)."""
    # librdkafka's connect errors go to Python logging (DEBUG), not raw to stderr: the
    # one message a person needs is the ClusterError below.
    quiet = logging.getLogger("txnstream.librdkafka")
    refused: list[KafkaError] = []

    def on_error(err: KafkaError) -> None:
        if err.code() in _LOGIN_REFUSED:
            refused.append(err)

    admin = AdminClient(config.admin() | {"socket.timeout.ms": 5000, "logger": quiet,
                                          "error_cb": on_error})
    try:
        meta = admin.list_topics(timeout=min(10.0, config.admin_timeout_s))
    except KafkaException as exc:
        admin.poll(0.5)  # serves the error callbacks queued meanwhile (a refused login)
        if refused:  # the broker answered, and refused the login: say that, not "no broker"
            raise ClusterError(
                f"Kafka at {config.bootstrap_servers} refused the login: {refused[-1].str()}. "
                "Check the SASL/TLS settings (--kafka-config / $TXNSTREAM_KAFKA_CONFIG: "
                "sasl.mechanisms, sasl.username, sasl.password).") from None
        raise ClusterError(
            f"no Kafka broker answers at {config.bootstrap_servers}: {exc.args[0].str()}. "
            "Start one with `txnstream cluster up` or point --bootstrap at yours.") from exc
    specs = topic_specs(config)
    reports: dict[str, TopicReport] = {}
    missing = []
    for spec in specs:
        have = meta.topics.get(spec.name)
        if have is None or have.error is not None:
            missing.append(spec)
            continue
        n = len(have.partitions)
        if spec.strict and n != spec.partitions:
            reports[spec.name] = TopicReport(
                spec.name, n, "mismatch",
                f"has {n} partitions, configuration says {spec.partitions}; left unchanged")
        else:
            reports[spec.name] = TopicReport(spec.name, n, "exists")
    if missing:
        futures = admin.create_topics([
            NewTopic(s.name, s.partitions, config.replication_factor, config=s.config)
            for s in missing], operation_timeout=config.admin_timeout_s)
        for spec in missing:
            try:
                futures[spec.name].result(config.admin_timeout_s)
                reports[spec.name] = TopicReport(spec.name, spec.partitions, "created")
            except KafkaException as exc:
                err = exc.args[0]
                if err.name() == "TOPIC_ALREADY_EXISTS":  # created concurrently
                    reports[spec.name] = TopicReport(spec.name, spec.partitions, "exists")
                else:
                    raise ClusterError(f"could not create {spec.name}: {err.str()}") from exc
        _await_listed(admin, {s.name: s.partitions for s in missing}, config)
    _keep_configs(admin, [s for s in specs if s.kept and reports[s.name].status == "exists"],
                  reports, config)
    return [reports[s.name] for s in specs]


class _NotListedYet(Exception):
    pass


def _await_listed(admin: AdminClient, wanted: dict[str, int], config: Config) -> None:
    """Return once the broker's metadata lists every topic of ``wanted`` with its partitions.

    A CreateTopics answer means the controller has the topic; the broker that answers
    metadata requests learns of it a moment later (longer on a loaded machine), and a
    worker or store started right after ``init`` that looks it up in between was told it
    does not exist.
    """
    timeout_s = config.admin_timeout_s

    def listed() -> None:
        topics = admin.list_topics(timeout=min(10.0, timeout_s)).topics
        late = sorted(n for n, parts in wanted.items()
                      if n not in topics or topics[n].error is not None
                      or len(topics[n].partitions) < parts)
        if late:
            raise _NotListedYet(late)

    try:
        Retrying(retry=retry_if_exception(lambda e: isinstance(e, (_NotListedYet, KafkaException))),
                 reraise=True, stop=stop_after_delay(timeout_s),
                 wait=wait_exponential(0.05, max=1))(listed)
    except _NotListedYet as exc:
        raise ClusterError(f"created {', '.join(exc.args[0])}, but the broker at "
                           f"{config.bootstrap_servers} still does not list them after "
                           f"{timeout_s:.0f} s") from None
    except KafkaException as exc:
        raise ClusterError(f"created {', '.join(sorted(wanted))}, but listing them at "
                           f"{config.bootstrap_servers} failed: {exc.args[0].str()}") from exc


def _not_known_yet(exc: BaseException) -> bool:
    """A topic just created is not yet known to every broker that answers about it."""
    return (isinstance(exc, KafkaException) and bool(exc.args)
            and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART)


def _describe(admin: AdminClient, res: ConfigResource, timeout_s: float) -> dict[str, ConfigEntry]:
    return admin.describe_configs([res])[res].result(timeout_s)  # type: ignore[no-any-return]


def _keep_configs(admin: AdminClient, specs: list[TopicSpec],
                  reports: dict[str, TopicReport], config: Config) -> None:
    """Set each existing topic's :attr:`TopicSpec.kept` configs that differ (only those).

    One that cannot be read or set (no DescribeConfigs/AlterConfigs right, a broker that
    still does not know the topic) leaves the topic as it is, named in its report's detail.
    """
    for spec in specs:
        wanted = ", ".join(f"{k}={spec.config[k]}" for k in spec.kept)
        res = ConfigResource(ConfigResource.Type.TOPIC, spec.name)
        try:
            have = Retrying(retry=retry_if_exception(_not_known_yet), reraise=True,
                            stop=stop_after_delay(config.admin_timeout_s),
                            wait=wait_exponential(0.1, max=2))(
                _describe, admin, res, config.admin_timeout_s)
            changes = {k: spec.config[k] for k in spec.kept
                       if k not in have or have[k].value != spec.config[k]}
            if not changes:
                continue
            alter = ConfigResource(ConfigResource.Type.TOPIC, spec.name, incremental_configs=[
                ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                for k, v in changes.items()])
            admin.incremental_alter_configs([alter])[alter].result(config.admin_timeout_s)
        except KafkaException as exc:
            log.warning("%s: could not check or set %s (%s); set them with kafka-configs",
                        spec.name, wanted, exc.args[0].str())
            reports[spec.name] = TopicReport(
                spec.name, reports[spec.name].partitions, "exists",
                f"{wanted} not checked or set ({exc.args[0].str()})")
            continue
        was = ", ".join(f"{k} {have[k].value if k in have else 'unset'} -> {v}"
                        for k, v in changes.items())
        reports[spec.name] = TopicReport(spec.name, reports[spec.name].partitions,
                                         "updated", was)
