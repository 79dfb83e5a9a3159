"""Partitions added to a topic under a live producer, as Kafka's producer handles them.

Java's producer, asked for a partition its metadata does not have yet, refreshes its
metadata and waits for it (up to ``max.block.ms``) before it gives up. Found by CI: a
stream test added partitions and sent to them at once from a fresh client, whose
producer had read the topic's metadata before the broker it asked knew the new count,
and was refused with "partition 2 does not exist: ... has 2".
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from tests.integration.coordinator.conftest import make_topic, read_all
from txnstream.errors import ConfigError

pytestmark = pytest.mark.integration


def _grow(config, topic: str, total: int) -> None:
    admin = AdminClient(config.admin())
    for f in admin.create_partitions([NewPartitions(topic, total)]).values():
        f.result(30)


def test_a_producer_sends_to_partitions_added_after_it_was_made(config, worker, client):
    topic = make_topic(config, 2)
    producer = client.create_producer(topic)
    with client.transaction() as t:  # both of its librdkafka handles made before
        producer.send_batch([b"first-batch"], [1], txn=t)
        producer.send(b"first-send", txn=t, partition=0)
    assert producer.num_partitions == 2
    _grow(config, topic, 5)
    with client.transaction() as t:
        producer.send_batch([b"by-batch"], [3], txn=t)
        producer.send(b"by-send", txn=t, partition=2)
        producer.send_batch([b"by-batch-2"], [4], txn=t)
    assert producer.num_partitions == 5
    got = {(m.partition(), m.value()) for m in read_all(config, topic)
           if m.value() is not None and m.value().startswith((b"first-", b"by-"))}
    assert got == {(1, b"first-batch"), (0, b"first-send"), (3, b"by-batch"),
                   (2, b"by-send"), (4, b"by-batch-2")}


def test_a_partition_that_never_comes_is_refused_naming_it(config, worker, client):
    topic = make_topic(config, 2)
    producer = client.create_producer(topic)
    with client.transaction() as t:
        with pytest.raises(ConfigError, match=rf"partition 7 does not exist: {topic} has 2"):
            producer.send(b"x", txn=t, partition=7)
        with pytest.raises(ConfigError, match=rf"partition 5 does not exist: {topic} has 2"):
            producer.send_batch([b"x", b"y"], [0, 5], txn=t)
        t.abort()
