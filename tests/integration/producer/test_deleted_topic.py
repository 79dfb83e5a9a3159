"""A send to a topic deleted under the producer raises txnstream's error, naming the topic.

Against a real broker and worker. librdkafka learns that a topic is gone from the
metadata refreshes failed deliveries trigger, and from then on its ``produce()`` refuses
at once with ``_UNKNOWN_TOPIC``. That raw ``KafkaException`` escaped ``Producer.send``: the
hostile flood's producer (seed 54, stop 64) lost both opener threads to it, since a
caller handles :class:`~txnstream.errors.TxnStreamError`, the root of every error
txnstream raises on purpose.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaException

from tests.integration.coordinator.conftest import delete_topic, make_topic
from txnstream.errors import TxnStreamError

GONE_AFTER_MS = 1000
"""``topic.metadata.propagation.max.ms``: librdkafka marks a topic missing from its
metadata as gone only after this (30 s by default, for topics just created)."""
SETTINGS = {"allow.auto.create.topics": False, "topic.metadata.propagation.max.ms": GONE_AFTER_MS}
LEARN_S = 60.0
"""librdkafka learns the deletion from the failed deliveries' metadata refreshes."""


def _refused_at_once(send) -> TxnStreamError:
    """The error ``send()`` raises once librdkafka knows the topic is gone (failing the
    test on a raw Kafka exception or on none within :data:`LEARN_S`)."""
    deadline = time.monotonic() + LEARN_S
    while time.monotonic() < deadline:
        try:
            send()
        except KafkaException as exc:
            pytest.fail(f"send() raised confluent-kafka's own error, not txnstream's: {exc!r}")
        except TxnStreamError as exc:
            return exc
        time.sleep(0.2)
    pytest.fail(f"send() to a deleted topic never refused within {LEARN_S:g} s")


def test_a_send_to_a_deleted_topic_raises_txnstreams_error_naming_the_topic(
        config, worker, client):
    topic = make_topic(config, 1, "deleted")
    producer = client.create_producer(topic, **SETTINGS)
    txn = client.new_transaction(timeout_s=60)
    producer.send(b"registered", txn=txn, partition=0)  # the partition is in the txn
    txn.flush()
    delete_topic(config, topic)

    plain = _refused_at_once(lambda: producer.send(b"plain", partition=0))
    assert topic in str(plain), f"the error should name the topic {topic}: {plain}"
    in_txn = _refused_at_once(lambda: producer.send(b"txn", txn=txn, partition=0))
    assert topic in str(in_txn), f"the error should name the topic {topic}: {in_txn}"
    batch = _refused_at_once(lambda: producer.send_batch([b"b0", b"b1"], [0, 0], txn))
    assert topic in str(batch), f"the error should name the topic {topic}: {batch}"
    txn.abort()
    producer.close()
