"""The buffer owners' group consumer (``<prefix>-buffers``): how slots are handed out.

``cooperative-sticky`` (the default, as the coordinators' group, since stop 71): a
member joining or leaving moves only the slots that change owner; every other slot is
served on, with no final snapshot, claim or scan. ``range`` is the eager protocol of
workers before it, kept for a rolling upgrade from them (a group cannot mix the two).
"""

from __future__ import annotations

from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.config import Config
from txnstream.kafka.clients import KafkaClientFactory, leave_group

__all__ = ["COOPERATIVE", "group_consumer", "assign", "unassign", "close_group"]

COOPERATIVE = "cooperative-sticky"


def group_consumer(kafka: KafkaClientFactory, config: Config, member: str,
                   session_timeout_ms: int | None, strategy: str) -> Consumer:
    """A new member of the slots' group (it subscribes later)."""
    extra: dict[str, object] = {"client.id": f"tb-{member}", "auto.offset.reset": "latest",
                                "fetch.wait.max.ms": 50,
                                "partition.assignment.strategy": strategy}
    if session_timeout_ms:
        extra["session.timeout.ms"] = session_timeout_ms
        extra["heartbeat.interval.ms"] = max(100, session_timeout_ms // 6)
    return kafka.consumer(config.consumer(f"{config.topics.prefix}-buffers", **extra))


def assign(consumer: Consumer, parts: list[KafkaTP], strategy: str) -> None:
    """Take ``parts`` (the whole assignment when eager, the slots added when not)."""
    (consumer.incremental_assign if strategy == COOPERATIVE else consumer.assign)(parts)


def unassign(consumer: Consumer, parts: list[KafkaTP], strategy: str) -> None:
    """Give ``parts`` up (eager: everything)."""
    if strategy == COOPERATIVE:
        consumer.incremental_unassign(parts)
    else:
        consumer.unassign()


def close_group(consumer: Consumer, strategy: str) -> None:
    """Leave the group.

    A cooperative member's revoke runs before ``close()``: inside it, it can hang
    (:func:`~txnstream.kafka.clients.leave_group`).
    """
    if strategy == COOPERATIVE:
        leave_group(consumer)
    consumer.close()
