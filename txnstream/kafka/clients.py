"""Where a worker's Kafka clients come from: a factory it is given.

A worker (:class:`~txnstream.coordinator.worker.CoordinatorWorker`,
:class:`~txnstream.buffer.worker.BufferWorker`) renders each client's librdkafka
settings and asks a :class:`KafkaClientFactory` for the client: :data:`CONFLUENT_KAFKA`
(the default) makes the real confluent-kafka ones; a test passes a factory of fakes
instead, so no test reaches into a worker to swap a client after it was made.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

__all__ = ["COOPERATIVE", "CONFLUENT_KAFKA", "ConfluentKafka", "IDEMPOTENT_IN_FLIGHT",
           "KafkaClientFactory", "assign_by", "close_member", "close_producer", "leave_group",
           "unassign_by"]

IDEMPOTENT_IN_FLIGHT = 5
"""Records of one partition librdkafka's idempotent producer keeps in flight. A record
produced to a partition with this many unanswered makes the producer's broker thread
poll with a zero timeout until they are answered (docs/upstream-librdkafka-spin.md), so
a worker's producer waits, or holds a record back, instead."""

COOPERATIVE = "cooperative-sticky"
"""The incremental ``partition.assignment.strategy``: a rebalance names only the
partitions that change, and the assignment changes by them."""


class KafkaClientFactory(Protocol):
    """Makes Kafka clients from their librdkafka settings."""

    def consumer(self, conf: dict[str, Any]) -> Consumer:
        """A consumer configured by ``conf``."""

    def producer(self, conf: dict[str, Any]) -> Producer:
        """A producer configured by ``conf``."""

    def admin(self, conf: dict[str, Any]) -> AdminClient:
        """An admin client configured by ``conf``."""


class ConfluentKafka:
    """The real clients of confluent-kafka."""

    def consumer(self, conf: dict[str, Any]) -> Consumer:
        """``confluent_kafka.Consumer(conf)``."""
        return Consumer(conf)

    def producer(self, conf: dict[str, Any]) -> Producer:
        """``confluent_kafka.Producer(conf)``."""
        return Producer(conf)

    def admin(self, conf: dict[str, Any]) -> AdminClient:
        """``confluent_kafka.admin.AdminClient(conf)``."""
        return AdminClient(conf)


CONFLUENT_KAFKA = ConfluentKafka()
"""The factory a worker uses unless it is given another."""


def close_producer(producer: Producer, timeout_s: float) -> int:
    """Flush ``producer`` for up to ``timeout_s``, drop what is still queued, and close it.

    Its threads and broker connections end now, not when the object is collected (a
    producer left to the collector goes on reconnecting, and logging each refused
    connection, after its broker stopped). librdkafka's own ``close()`` would flush for up
    to ``message.timeout.ms``; what did not go within ``timeout_s`` is purged first, and
    counted in the return value. A client without ``close()`` (a test's fake, a
    confluent-kafka before 2.x's ``close``) is flushed and left to the collector.
    """
    left = producer.flush(timeout_s)
    if left:
        producer.purge()
        producer.poll(0)  # serve the purged messages' delivery reports
    close = getattr(producer, "close", None)
    if close is not None:
        close()
    return left


def leave_group(consumer: Consumer, timeout_s: float = 5.0) -> None:
    """Unsubscribe ``consumer`` and poll until its revoke has run (at most ``timeout_s``).

    For a group member with a rebalance callback, before ``close()``: a revoke callback
    librdkafka runs from inside ``close()`` can hang in its ``incremental_unassign`` for
    good when a rebalance is under way (librdkafka issues 4527 and 4884; seen here once
    a second member had just joined). Records a poll brings meanwhile are dropped (the
    caller committed what it delivered); an error (closed already) is left to ``close()``.
    """
    try:
        consumer.unsubscribe()
        deadline = time.monotonic() + timeout_s
        while consumer.assignment() and time.monotonic() < deadline:
            consumer.consume(500, 0.05)
    except (KafkaException, RuntimeError):
        pass


def assign_by(consumer: Consumer, parts: list[TopicPartition], strategy: str) -> None:
    """In an assign callback: take ``parts``.

    They are the partitions added when ``strategy`` is :data:`COOPERATIVE`, the whole
    assignment when it is eager.
    """
    (consumer.incremental_assign if strategy == COOPERATIVE else consumer.assign)(parts)


def unassign_by(consumer: Consumer, parts: list[TopicPartition], strategy: str) -> None:
    """In a revoke or lost callback: give ``parts`` up (eager: everything)."""
    if strategy == COOPERATIVE:
        consumer.incremental_unassign(parts)
    else:
        consumer.unassign()


def close_member(consumer: Consumer, strategy: str) -> None:
    """Close a group member; a cooperative one leaves first (:func:`leave_group`)."""
    if strategy == COOPERATIVE:
        leave_group(consumer)
    consumer.close()
