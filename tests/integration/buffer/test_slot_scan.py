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
from confluent_kafka import TopicPartition as KafkaTP

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


SCAN_RECORDS = 200_000
"""Registrations of a topic no worker serves in one snapshot partition: a slot scan of
a few seconds on this machine (about 2.5 s, quiet)."""


def _fill(config, store, part: int, topic: str) -> None:
    from txnstream.buffer.snapshot import BufferRegistration

    p = KafkaProducer(config.producer(**{"linger.ms": 20, "batch.size": 1 << 20}))
    for i in range(SCAN_RECORDS):
        value = BufferRegistration(topic, i).encode()
        while True:
            try:
                p.produce(store.topic, value, key=registration_key(TopicPartition(topic, i)),
                          partition=part)
                break
            except BufferError:  # the local queue is full: let it drain
                p.poll(0.05)
    assert p.flush(120) == 0


@pytest.mark.slow
def test_a_worker_stopped_mid_claim_leaves_without_finishing_the_scan(config):
    """A CI run: a stopping worker's buffer role sat in a 42 s slot scan, holding the slot
    (and its group membership) the whole time, while a new worker's readers waited.
    Stopping gives the claim up between batches of the scan: the role ends at once."""
    from confluent_kafka import Consumer

    from txnstream.buffer.worker import BufferWorker

    config = config.with_(topics=TopicNames(f"__stop{uuid.uuid4().hex[:6]}"))
    ensure_topics(config)
    store = TransactionBufferSnapshotStore(config)
    _fill(config, store, 0, f"unserved-{uuid.uuid4().hex[:6]}")
    t0 = time.monotonic()
    store.scan_slot(0)
    full_scan = time.monotonic() - t0

    # one slot partition only matters: the worker serves topics of no such name
    w = BufferWorker(config, topics=["none-such"], member=f"stop-{uuid.uuid4().hex[:6]}")
    watch = Consumer(config.consumer(f"watch-{uuid.uuid4().hex}"))
    try:
        w.start()
        # the OWNER record goes out first, then the scan of the slot's snapshot partition
        deadline = time.monotonic() + 60
        while watch.get_watermark_offsets(
                KafkaTP(config.topics.buffer_state, 0), timeout=10)[1] == 0:
            assert time.monotonic() < deadline, "the worker never began its claim of slot 0"
            time.sleep(0.05)
        t1 = time.monotonic()
        w.stop(timeout_s=full_scan + 30)
        took = time.monotonic() - t1
    finally:
        watch.close()
        w.stop()
    assert w._thread is not None and not w._thread.is_alive(), "the buffer role never ended"
    assert 0 not in w.owned_slots(), "a stopped worker still claims slot 0"
    assert took < full_scan / 2, (
        f"stop took {took:.1f} s mid-claim; the whole scan takes {full_scan:.1f} s: "
        "the claim was finished first")
