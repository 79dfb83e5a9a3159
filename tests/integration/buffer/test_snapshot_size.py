"""A real worker's snapshot of a 200k-record aborted txn is a few KB (issue 20, item 8).

On the old code the same partition made a 1.18 MB, 5-segment snapshot.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTP

from tests.integration.buffer.conftest import make_topic, read_all, wait_until
from txnstream import TopicPartition
from txnstream.buffer.follower import BufferStateFollower
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.buffer.worker import BufferWorker
from txnstream.markers import TXN_ID_HEADER

pytestmark = pytest.mark.integration

RECORDS = 200_000
CHUNK = 1_000
"""One record of another (committed) txn after every CHUNK records of the aborted one."""
SMALL_SNAPSHOT_BYTES = 4 * 1024


def _high(config, topic: str) -> int:
    c = Consumer(config.consumer("probe"))
    try:
        return c.get_watermark_offsets(KafkaTP(topic, 0), timeout=10)[1]
    finally:
        c.close()


def test_an_aborted_txn_of_200k_records_makes_a_snapshot_of_a_few_kb(config, tc_worker, client):
    topic = make_topic(config, 1)
    tp = TopicPartition(topic, 0)
    producer = client.create_producer(topic, **{"linger.ms": 50})
    big = client.new_transaction(timeout_s=600)
    other = client.new_transaction(timeout_s=600)
    for i in range(RECORDS // CHUNK):
        producer.send_batch([b"a"] * CHUNK, [0] * CHUNK, big)
        producer.send(b"b%d" % i, txn=other, partition=0)
    producer.flush()
    other.commit()
    big.abort()

    bw = BufferWorker(config, [topic], snapshot_interval_s=1, lwm_check_interval_s=1)
    bw.start()
    store = TransactionBufferSnapshotStore(config)
    try:
        def folded_to_the_end() -> bool:
            snap = store.latest(tp)
            high = _high(config, topic)
            return (snap is not None and snap.position == high - 1
                    and snap.max_read_position == high - 1 and not snap.ongoing)

        wait_until(folded_to_the_end, 180, "a snapshot of the whole partition", every=1)
        snap = store.latest(tp)
        assert snap is not None
        size = len(snap.encode())
        assert size < SMALL_SNAPSHOT_BYTES, f"{size} bytes for one aborted txn of {RECORDS}"
        assert [t for t, _ in snap.aborted] == [big.id]
        assert snap.aborted[0][1].run_count <= RECORDS // CHUNK + 1

        # readers starting from it deliver exactly the committed txn's records
        records = read_all(config, topic, timeout_s=120)
        reader = BufferStateFollower(config)
        try:
            reader.catch_up([tp])
            view = reader.views[tp]
            delivered = [m.value() for m in records
                         if view.visible(m.offset(), dict(m.headers() or []).get(TXN_ID_HEADER))]
        finally:
            reader.close()
        assert delivered == [b"b%d" % i for i in range(RECORDS // CHUNK)]
    finally:
        bw.stop(30)
