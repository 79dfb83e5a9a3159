"""``Client.close()`` closes what the client made, as Pulsar's ``PulsarClient.close()``."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.consumer.conftest import make_topic
from txnstream import Client

pytestmark = pytest.mark.integration


def _members(config, group: str) -> int:
    admin = AdminClient(config.admin())
    desc = admin.describe_consumer_groups([group])[group].result(timeout=30)
    return len(desc.members)


def test_client_close_flushes_its_producers_and_takes_its_consumers_out_of_their_groups(
        config, worker):
    topic = make_topic(config, 1)
    group = f"close-{uuid.uuid4().hex[:6]}"
    client = Client(config=config)
    producer = client.create_producer(topic)
    consumer = client.subscribe(topic, subscription=group)
    with client.transaction() as txn:
        producer.send(b"committed", txn=txn, partition=0)
    producer.send(b"plain, not flushed by the test", partition=0)
    got = []
    while len(got) < 1:
        m = consumer.receive(timeout_s=30)
        assert m is not None, "the committed record never came"
        got.append(m.value)
        consumer.acknowledge(m)
    assert _members(config, group) == 1

    client.close()

    assert _members(config, group) == 0, "client.close() left its consumer in the group"
    with pytest.raises(RuntimeError):
        producer.send(b"after close", partition=0)  # its Kafka producer is closed
    producer.close()  # a second close (here, after the client's) does nothing
    consumer.close()
    # the unflushed plain send was flushed by the close, not dropped
    with Client(config=config) as reader:
        c = reader.subscribe(topic, subscription=f"r-{uuid.uuid4().hex[:6]}")
        seen = []
        while len(seen) < 2:
            m = c.receive(timeout_s=30)
            assert m is not None, f"only {seen} came"
            seen.append(m.value)
        assert seen == [b"committed", b"plain, not flushed by the test"]
