"""The buffer owners' group consumer (``<prefix>-buffers``): how slots are handed out.

``cooperative-sticky`` (the default, as the coordinators' group, since stop 71): a
member joining or leaving moves only the slots that change owner; every other slot is
served on, with no final snapshot, claim or scan. ``range`` is the eager protocol of
workers before it, kept for a rolling upgrade from them (a group cannot mix the two).
The callbacks take and give slots up by the strategy (``txnstream.kafka.clients``'
:func:`~txnstream.kafka.clients.assign_by` and its kin, as the coordinators' log does).
"""

from __future__ import annotations

from confluent_kafka import Consumer

from txnstream.config import Config
from txnstream.kafka.clients import KafkaClientFactory

__all__ = ["group_consumer"]


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
