"""The ``TransactionLog`` contract over ``KafkaTransactionLog`` on the real broker.

The very checks ``tests/unit/coordinator/test_txn_log.py`` runs over the in-memory log,
so that fake and real log cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from tests.unit.coordinator.test_txn_log import CONTRACT, assert_keeps_the_contract, own_all
from txnstream import Config
from txnstream.coordinator.txn_log import KafkaClients, KafkaTransactionLog, TransactionLog

pytestmark = pytest.mark.integration


@pytest.fixture
def kafka_log(own_config: Config) -> Iterator[KafkaTransactionLog]:
    """A log on internal topics of its own, owning every partition (a group of one)."""
    clients = KafkaClients(
        Consumer(own_config.consumer(f"{own_config.topics.prefix}-coordinators",
                                     **{"fetch.wait.max.ms": 20})),
        Producer(own_config.producer(**{"linger.ms": 0})),
        AdminClient(own_config.admin()))
    log = KafkaTransactionLog(clients, own_config.topics.log, flush_timeout_s=15.0,
                              admin_timeout_s=own_config.admin_timeout_s)
    try:
        own_all(log, own_config.num_coordinators)
        yield log
    finally:
        clients.producer.flush(5)
        log.close()


@pytest.mark.parametrize("check", CONTRACT, ids=lambda c: c.__name__)
def test_kafka_log_keeps_the_contract(kafka_log: KafkaTransactionLog, own_config: Config,
                                      check: Callable[[TransactionLog], None]) -> None:
    assert_keeps_the_contract(check, kafka_log, own_config.num_coordinators)
