"""A slot claim reads the slot's snapshot partition in time bounded by its records.

Offsets in a Kafka partition are not dense: compaction removes records and a Kafka
transaction's commit leaves a control record no consumer sees. A scan that waits for
"the records left below the end" waited its whole fetch timeout at every such gap, and
a claim (a failover) took seconds instead of milliseconds.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer as KafkaProducer

from tests.integration.buffer.conftest import make_topic
from txnstream import TopicPartition
from txnstream.admin_topics import ensure_topics
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore, registration_key
from txnstream.config import TopicNames

pytestmark = pytest.mark.integration


def test_a_slot_scan_over_an_offset_gap_takes_no_fetch_timeout(config):
    topic = make_topic(config, 1)
    tp = TopicPartition(topic, 0)
    # internal topics of its own: the control record below stays out of the session's
    config = config.with_(topics=TopicNames(f"__gap{uuid.uuid4().hex[:6]}"))
    ensure_topics(config)
    store = TransactionBufferSnapshotStore(config)
    part = store.partition_of(tp)
    assert store.register([tp], timeout_s=10)
    # a Kafka transaction in the same partition ends in a control record: the last
    # offset below the end is one no consumer is given
    raw = KafkaProducer(config.producer(**{"transactional.id": f"gap-{uuid.uuid4().hex}"}))
    raw.init_transactions(10)
    raw.begin_transaction()
    raw.produce(store.topic, None, key=registration_key(TopicPartition(f"{topic}-gap", 0)),
                partition=part)
    raw.commit_transaction(10)

    t0 = time.monotonic()
    scan, end = store.scan_slot(part)
    took = time.monotonic() - t0

    assert scan.finders[tp].registered, "the registration before the gap was not found"
    assert end > 0
    assert took < 1.0, f"scan of {store.topic}[{part}] took {took:.2f} s over one offset gap"
