"""A coordinator worker's Kafka clients, made by the factory it is given.

:class:`CoordinatorWorker` renders each client's librdkafka settings and asks a
:class:`~txnstream.kafka.clients.KafkaClientFactory` for the client (see that module).
"""

from __future__ import annotations

from txnstream.config import Config
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.txn_log import PRODUCER_SETTINGS, KafkaClients
from txnstream.errors import ConfigError
from txnstream.kafka.clients import COOPERATIVE, KafkaClientFactory

__all__ = ["TC_ASSIGNMENT_STRATEGIES", "worker_clients"]

TC_ASSIGNMENT_STRATEGIES = (COOPERATIVE, "range")
"""``WorkerSettings.tc_assignment_strategy``'s values: incremental, then eager."""


def worker_clients(config: Config, worker_id: str, settings: WorkerSettings,
                   factory: KafkaClientFactory) -> KafkaClients:
    """The Kafka clients of worker ``worker_id``, made by ``factory``.

    The consumer is a member of the ``<prefix>-coordinators`` group over the log (its
    session timeout is the failover time); the one producer carries log entries,
    markers and endpoint records (:data:`~txnstream.coordinator.txn_log.PRODUCER_SETTINGS`).
    """
    s = settings
    if s.tc_assignment_strategy not in TC_ASSIGNMENT_STRATEGIES:
        raise ConfigError(f"tc_assignment_strategy {s.tc_assignment_strategy!r} is not one "
                          f"of {', '.join(TC_ASSIGNMENT_STRATEGIES)}")
    # Rendered first: settings a producer refuses (Config.producer) fail before any client.
    producer = config.producer(**PRODUCER_SETTINGS, **{"client.id": f"tc-{worker_id}"})
    return KafkaClients(
        factory.consumer(config.consumer(
            f"{config.topics.prefix}-coordinators",
            **{"session.timeout.ms": s.session_timeout_ms,
               "heartbeat.interval.ms": s.heartbeat_interval_ms,
               "max.poll.interval.ms": max(60_000, s.session_timeout_ms * 3),
               "fetch.wait.max.ms": 20, "client.id": f"tc-log-{worker_id}",
               "partition.assignment.strategy": s.tc_assignment_strategy})),
        factory.producer(producer),
        factory.admin(config.admin()))
