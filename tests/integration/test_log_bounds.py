"""``LogBounds``: many partitions' log start and end in one round, as a consumer's
watermarks give them; partitions added since are found; a topic asked about is never
created (the local broker, as Kafka's default, has ``auto.create.topics.enable``)."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from txnstream import Config, TopicPartition
from txnstream.kafka.offsets import LogBounds

pytestmark = pytest.mark.integration


def test_bounds_are_the_watermarks_also_of_partitions_added_since(kafka_bootstrap):
    cfg = Config(bootstrap_servers=kafka_bootstrap)
    admin = AdminClient(cfg.admin())
    topic = f"lb-{uuid.uuid4().hex[:6]}"
    for f in admin.create_topics([NewTopic(topic, 8, 1)]).values():
        f.result(30)
    p = Producer(cfg.producer())
    for i in range(100):
        p.produce(topic, b"x", partition=i % 8 if i % 3 else 0)
    p.flush(30)
    bounds = LogBounds(cfg, "test")
    got = bounds.get([TopicPartition(topic, i) for i in range(8)])
    c = Consumer(cfg.consumer(f"lb-{uuid.uuid4().hex}"))
    want = {TopicPartition(topic, i): c.get_watermark_offsets(KafkaTP(topic, i), timeout=10)
            for i in range(8)}
    assert got == want
    for f in admin.create_partitions([NewPartitions(topic, 10)]).values():
        f.result(30)
    # A producer that knows the new partitions: the broker's metadata may show them a
    # moment after the controller (the record then fails with an unknown partition)
    landed: list[bool] = []
    deadline = time.monotonic() + 15
    while not landed and time.monotonic() < deadline:
        p = Producer(cfg.producer())
        p.produce(topic, b"y", partition=9,
                  on_delivery=lambda err, _m: err is None and landed.append(True))
        p.flush(30)
    assert landed, "the record for the new partition 9 was never delivered"
    # LogBounds reports a partition its metadata does not show at once (as a deleted
    # topic's); the broker it asks may learn of partition 9 a moment after the producer's
    found = bounds.get([TopicPartition(topic, 9)], timeout_s=10)
    while isinstance(found[TopicPartition(topic, 9)], KafkaException) and \
            time.monotonic() < deadline:
        time.sleep(0.2)
        found = bounds.get([TopicPartition(topic, 9)], timeout_s=10)
    assert found == {TopicPartition(topic, 9): (0, 1)}
    c.close()


def test_a_topic_asked_about_is_never_created(kafka_bootstrap):
    cfg = Config(bootstrap_servers=kafka_bootstrap)
    topic = f"lb-gone-{uuid.uuid4().hex[:6]}"
    got = LogBounds(cfg, "test").get([TopicPartition(topic, 0)], timeout_s=3)
    assert isinstance(got[TopicPartition(topic, 0)], KafkaException)
    meta = AdminClient(cfg.admin()).list_topics(timeout=10)
    assert topic not in meta.topics, f"asking {topic}'s bounds created it"
