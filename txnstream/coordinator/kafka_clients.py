"""Where a coordinator worker's Kafka clients come from: a factory it is given.

:class:`CoordinatorWorker` renders each client's librdkafka settings and asks a
:class:`KafkaClientFactory` for the client: :data:`CONFLUENT_KAFKA` (the default) makes
the real confluent-kafka ones; a test passes a factory of fakes instead, so no test
reaches into the worker to swap a client after it was made.
"""

from __future__ import annotations

from typing import Any, Protocol

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from txnstream.config import Config
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.txn_log import PRODUCER_SETTINGS, KafkaClients

__all__ = ["CONFLUENT_KAFKA", "ConfluentKafka", "KafkaClientFactory", "worker_clients"]


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


def worker_clients(config: Config, worker_id: str, settings: WorkerSettings,
                   factory: KafkaClientFactory) -> KafkaClients:
    """The Kafka clients of worker ``worker_id``, made by ``factory``.

    The consumer is a member of the ``<prefix>-coordinators`` group over the log (its
    session timeout is the failover time); the one producer carries log entries,
    markers and endpoint records (:data:`~txnstream.coordinator.txn_log.PRODUCER_SETTINGS`).
    """
    s = settings
    return KafkaClients(
        factory.consumer(config.consumer(
            f"{config.topics.prefix}-coordinators",
            **{"session.timeout.ms": s.session_timeout_ms,
               "heartbeat.interval.ms": s.heartbeat_interval_ms,
               "max.poll.interval.ms": max(60_000, s.session_timeout_ms * 3),
               "fetch.wait.max.ms": 20, "client.id": f"tc-log-{worker_id}"})),
        factory.producer(config.producer(**PRODUCER_SETTINGS,
                                         **{"client.id": f"tc-{worker_id}"})),
        factory.admin(config.admin()))
