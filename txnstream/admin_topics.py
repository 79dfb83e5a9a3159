"""The internal topics of DESIGN.md section 2, created idempotently (``txnstream init``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from txnstream.config import Config
from txnstream.errors import ClusterError

__all__ = ["TopicSpec", "TopicReport", "topic_specs", "ensure_topics"]

_DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One internal topic: name, partitions, configs, and whether its count must match."""

    name: str
    partitions: int
    config: dict[str, str]
    strict: bool
    """Partition count is part of the protocol (TC ids): a mismatch is reported."""


@dataclass(frozen=True, slots=True)
class TopicReport:
    """What ``ensure_topics`` found or did for one topic."""

    name: str
    partitions: int
    status: str
    """``created``, ``exists`` or ``mismatch``."""
    detail: str = ""


BUFFER_STATE_RETENTION_MS = _DAY_MS
"""Retention of the buffer-state deltas: far beyond the snapshot interval (seconds)."""
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
                  {"cleanup.policy": "compact", "min.insync.replicas": isr}, strict=True),
        TopicSpec(t.buffer_snapshots, config.num_buffer_slots,
                  {"cleanup.policy": "compact", "min.insync.replicas": isr}, strict=True),
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
    return [reports[s.name] for s in specs]
