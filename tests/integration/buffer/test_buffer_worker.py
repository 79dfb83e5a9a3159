"""The buffer worker: snapshots published; a txn stuck below its TC's LWM gets an ABORT."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer as KafkaProducer

from tests.integration.buffer.conftest import make_topic, wait_until
from txnstream import TopicPartition
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.buffer.worker import BufferWorker
from txnstream.markers import TXN_ID_HEADER

pytestmark = pytest.mark.integration


def test_unregistered_txn_record_is_aborted_at_lwm_and_unblocks(config, tc_worker, client):
    topic = make_topic(config, 2)
    producer = client.create_producer(topic)
    txn = client.new_transaction()
    producer.send(b"registered", txn=txn, partition=0)
    raw = KafkaProducer(config.producer())
    # a record of the same txn in a partition it never registered (a buggy client)
    raw.produce(topic, b"unregistered", partition=1,
                headers=[(TXN_ID_HEADER, txn.id.to_bytes())])
    raw.flush(10)
    txn.commit()
    producer.send(b"plain-after", partition=1)
    producer.flush()
    later = client.new_transaction()     # moves the TC's LWM past txn
    later.commit()
    tp1 = TopicPartition(topic, 1)
    # served, without the LWM duty yet: the txn blocks partition 1
    idle = BufferWorker(config, [topic], snapshot_interval_s=1, lwm_check_interval_s=3600)
    idle.start()
    try:
        wait_until(lambda: _served(client, tp1), 30, "partition 1 served")
        assert client.admin.buffer_stats(tp1).blocking_txn == txn.id
    finally:
        idle.stop()
    bw = BufferWorker(config, [topic], snapshot_interval_s=1, lwm_check_interval_s=1).start()
    try:
        wait_until(lambda: bw.markers_written >= 1, 30, "an ABORT marker from the buffer worker")
        wait_until(lambda: client.admin.buffer_stats(tp1).blocking_txn is None, 30,
                   "the ABORT marker folded and published")
        consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
        got = []
        while (m := consumer.receive(timeout_s=4)) is not None:
            got.append(m.value)
            consumer.acknowledge(m)
        consumer.close()
        assert sorted(got) == [b"plain-after", b"registered"]
        store = TransactionBufferSnapshotStore(config)
        wait_until(lambda: (s := store.latest(tp1)) is not None and s.position >= 2, 30,
                   "a published snapshot of partition 1")
    finally:
        bw.stop()


def _served(client, tp) -> bool:
    from txnstream.errors import TxnStreamError

    try:
        client.admin.buffer_stats(tp)
        return True
    except TxnStreamError:
        return False
