"""Where a worker's Kafka clients come from: a factory it is given.

A worker (:class:`~txnstream.coordinator.worker.CoordinatorWorker`,
:class:`~txnstream.buffer.worker.BufferWorker`) renders each client's librdkafka
settings and asks a :class:`KafkaClientFactory` for the client: :data:`CONFLUENT_KAFKA`
(the default) makes the real confluent-kafka ones; a test passes a factory of fakes
instead, so no test reaches into a worker to swap a client after it was made.
"""

from __future__ import annotations

from typing import Any, Protocol

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

__all__ = ["CONFLUENT_KAFKA", "ConfluentKafka", "KafkaClientFactory"]


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
