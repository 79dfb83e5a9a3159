"""The stream source's driver side, on the real broker, without Spark: what the planner
keeps between micro-batches is bounded by what is still ahead (issue 11, item 6), and
the micro-batches deliver exactly the committed records, in order."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

import txnstream_spark.source as src
from tests.genuine import marker_headers, txn_record_headers
from tests.spark.conftest import make_topic, wait_until
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.markers import MarkerKind, TxnMarker
from txnstream.types import TopicPartition, TxnID

pytestmark = pytest.mark.spark


def produce(config, topic: str, first: int, n: int) -> list[bytes]:
    """``n`` txns of TC 9 (a record + marker; one in three aborted) and a plain record
    every 50; returns the values a committed-only reader must deliver, in order. Records
    and markers as their writers and the workers make them (tests/genuine.py)."""
    raw = Producer(config.producer(**{"linger.ms": 20}))
    want = []
    for i in range(first, first + n):
        t = TxnID(9, i)
        v = f"t{i}".encode()
        raw.produce(topic, v, partition=0, headers=txn_record_headers(config, t, topic, 0))
        m = TxnMarker(t, MarkerKind.ABORT if i % 3 == 0 else MarkerKind.COMMIT, i)
        raw.produce(topic, m.encode(), partition=0,
                    headers=marker_headers(config, m, topic, 0))
        if i % 3:
            want.append(v)
        if i % 50 == 0:
            raw.produce(topic, f"p{i}".encode(), partition=0)
            want.append(f"p{i}".encode())
        raw.poll(0)
    raw.flush(30)
    return want


def test_micro_batches_forget_what_was_committed_and_deliver_exactly_the_committed(config,
                                                                                  worker):
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    topic = make_topic(config, 1)
    tp = TopicPartition(topic, 0)
    # registered as a coordinator does before a txn's first record (TC 9 is none here);
    # the worker's buffer role serves it
    assert TransactionBufferSnapshotStore(config).register([tp], 10)
    reader = src.TxnStreamStreamReader({
        "kafka.bootstrap.servers": config.bootstrap_servers,
        "txnstream.prefix": config.topics.prefix, "subscribe": topic,
        "startingOffsets": "earliest"})
    want, got = [], []
    start = reader.initialOffset()
    batches = 0

    def micro_batch() -> int:
        """Plan and read one micro-batch as Spark would; its end."""
        nonlocal start, batches
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end[topic]["0"] >= start[topic]["0"], "the end moved back"
        for p in reader.partitions(start, end):
            got.extend(v for rb in reader.read(p) for v in rb.column("value").to_pylist())
        reader.commit(end)
        view = reader._planner.follower.views.get(tp)  # None: not served yet
        committed = end[topic]["0"]
        if view is not None:
            assert all(o >= committed for o in view.hidden), "kept state below the commit"
            assert all(last >= committed for _, last in view.aborted.values())
            assert len(view.hidden) + len(view.aborted) <= 2, "kept more than what is ahead"
        start = end
        batches += 1
        return committed

    try:
        for batch in range(3):
            want += produce(config, topic, batch * 3_000, 3_000)
            micro_batch()
        from confluent_kafka import Consumer
        from confluent_kafka import TopicPartition as KafkaTP

        c = Consumer(config.consumer("hw"))
        high = c.get_watermark_offsets(KafkaTP(topic, 0), timeout=10)[1]
        c.close()
        wait_until(lambda: micro_batch() >= high, 60, "micro-batches up to the end")
        # nothing new: planning a micro-batch costs no wait on the idle state
        import time

        t0 = time.monotonic()
        assert reader.latestOffset(start, ReadAllAvailable()) == start
        assert time.monotonic() - t0 < 5, "an idle micro-batch waited"
    finally:
        reader.stop()
    assert batches > 3
    assert reader._planner.follower.views.get(tp) is not None
    assert got == want
