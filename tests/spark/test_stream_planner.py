"""The stream source's driver side, on the real broker, without Spark: what the planner
keeps between micro-batches is bounded by what is still ahead (issue 11, item 6)."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

import spark.txnstream_source as src
from tests.spark.conftest import make_topic
from txnstream.markers import TXN_ID_HEADER, MarkerKind, TxnMarker
from txnstream.types import TxnID

pytestmark = pytest.mark.spark


def produce(config, topic: str, first: int, n: int) -> list[bytes]:
    """``n`` txns of TC 9 (a record + marker; one in three aborted) and a plain record
    every 50; returns the values a committed-only reader must deliver, in order."""
    raw = Producer(config.producer(**{"linger.ms": 20}))
    want = []
    for i in range(first, first + n):
        t = TxnID(9, i)
        v = f"t{i}".encode()
        raw.produce(topic, v, partition=0, headers=[(TXN_ID_HEADER, t.to_bytes())])
        m = TxnMarker(t, MarkerKind.ABORT if i % 3 == 0 else MarkerKind.COMMIT, i)
        raw.produce(topic, m.encode(), partition=0, headers=m.headers())
        if i % 3:
            want.append(v)
        if i % 50 == 0:
            raw.produce(topic, f"p{i}".encode(), partition=0)
            want.append(f"p{i}".encode())
        raw.poll(0)
    raw.flush(30)
    return want


def test_micro_batches_forget_what_was_committed_and_deliver_exactly_the_committed(config):
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    topic = make_topic(config, 1)
    reader = src.TxnStreamStreamReader({
        "kafka.bootstrap.servers": config.bootstrap_servers,
        "txnstream.prefix": config.topics.prefix, "subscribe": topic,
        "startingOffsets": "earliest"})
    want, got = [], []
    start = reader.initialOffset()
    try:
        for batch in range(3):
            want += produce(config, topic, batch * 3_000, 3_000)
            end = reader.latestOffset(start, ReadAllAvailable())
            for p in reader.partitions(start, end):
                got += [v for rb in reader.read(p) for v in rb.column("value").to_pylist()]
            reader.commit(end)
            buf = reader._planner.folder.buffers[next(iter(reader._planner.tps))]
            committed = end[topic]["0"]
            assert all(o >= committed for o in buf.invisible), "kept state below the commit"
            assert len(buf.invisible) == 0 and not buf.aborted
            start = end
    finally:
        reader.stop()
    assert got == want
