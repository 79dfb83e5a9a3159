"""Delayed delivery through the Spark source, on the real broker (issue 38).

A record sent with ``deliver_after``/``deliver_at`` reaches no micro-batch before its
time; what lies behind it is not held back; once due it is read by a later batch,
exactly once; and a batch replayed from its offsets reads the same records.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

import txnstream_spark.deferred as deferred_mod
import txnstream_spark.source as src
from tests.spark.conftest import make_topic, stream_values, wait_until

pytestmark = pytest.mark.spark


def _reader(config, topic):
    return src.TxnStreamStreamReader({
        "kafka.bootstrap.servers": config.bootstrap_servers,
        "txnstream.prefix": config.topics.prefix, "subscribe": topic,
        "startingOffsets": "earliest"})


class Batches:
    """Micro-batches planned and read as Spark does, each value with when it was read."""

    def __init__(self, reader):
        self.reader, self.start = reader, reader.initialOffset()
        self.read: list[tuple[bytes, float]] = []
        self.plans: list[tuple[dict, dict, list[bytes]]] = []

    def values(self, start, end) -> list[bytes]:
        return [v for p in self.reader.partitions(start, end) for rb in self.reader.read(p)
                for v in rb.column("value").to_pylist()]

    def step(self) -> list[bytes]:
        from pyspark.sql.streaming.datasource import ReadAllAvailable

        end = self.reader.latestOffset(self.start, ReadAllAvailable())
        if end == self.start:
            return []
        got = self.values(self.start, end)
        now = time.time()
        self.read += [(v, now) for v in got]
        self.plans.append((self.start, end, got))
        self.reader.commit(end)
        self.start = end
        return got


def test_a_delayed_record_is_read_once_when_due_and_holds_back_nothing_behind_it(
        config, worker, client):
    topic = make_topic(config, 2)
    producer = client.create_producer(topic)
    sent_at = time.time()
    with client.transaction() as txn:
        producer.send(b"late-txn", partition=0, txn=txn, deliver_after=timedelta(seconds=4))
        producer.send(b"now-txn", partition=0, txn=txn)
    producer.send(b"late-plain", partition=1, deliver_after=timedelta(seconds=2))
    producer.send(b"now-plain", partition=1)
    producer.send(b"at-past", partition=1, deliver_at=int(sent_at * 1000) - 1_000)
    producer.flush()
    batches = Batches(_reader(config, topic))
    try:
        wait_until(lambda: batches.step() is not None and {v for v, _ in batches.read} >= {
            b"now-txn", b"now-plain", b"at-past"}, 30, "the records due now")
        early = {v for v, _ in batches.read}
        assert b"late-txn" not in early or time.time() - sent_at >= 4
        wait_until(lambda: batches.step() is not None and len(batches.read) >= 5, 30,
                   "the delayed records, once due")
        got = [v for v, _ in batches.read]
        assert sorted(got) == sorted([b"late-txn", b"now-txn", b"late-plain", b"now-plain",
                                      b"at-past"]), f"lost or duplicated: {got}"
        when = dict(batches.read)
        assert when[b"late-plain"] >= sent_at + 2, "read before its time"
        assert when[b"late-txn"] >= sent_at + 4, "read before its time (after the commit)"
        assert when[b"now-plain"] < when[b"late-plain"], "the delay held back a due record"
        # a batch replayed from its offsets (Spark after a failure) reads the same records
        for start, end, values in batches.plans:
            assert sorted(batches.values(start, end)) == sorted(values)
        time.sleep(0.5)
        assert batches.step() == [], "read again"
    finally:
        batches.reader.stop()


def test_deferring_past_the_bound_makes_the_partition_wait_and_loses_nothing(
        config, worker, client, monkeypatch):
    monkeypatch.setattr(deferred_mod, "MAX_DEFERRED_RUNS", 2)
    topic = make_topic(config, 1)
    producer = client.create_producer(topic)
    t0 = time.time()
    want = []
    with client.transaction() as txn:
        for i in range(4):  # each its own time: runs that do not merge
            producer.send(f"late{i}".encode(), txn=txn,
                          deliver_after=timedelta(seconds=2 + 0.3 * i))
            producer.send(f"now{i}".encode(), txn=txn)
            want += [f"late{i}".encode(), f"now{i}".encode()]
    batches = Batches(_reader(config, topic))
    try:
        wait_until(lambda: batches.step() is not None and b"now1" in dict(batches.read), 30,
                   "the first due records")
        assert b"now2" not in dict(batches.read) or time.time() - t0 >= 2, \
            "read past a partition whose deferred runs are at the bound"
        wait_until(lambda: batches.step() is not None and len(batches.read) >= 8, 30,
                   "everything, once due")
        got = [v for v, _ in batches.read]
        assert sorted(got) == sorted(want), f"lost or duplicated: {got}"
        when = dict(batches.read)
        for i in range(4):
            assert when[f"late{i}".encode()] >= t0 + 2 + 0.3 * i, f"late{i} read early"
    finally:
        batches.reader.stop()


def test_a_streaming_query_reads_delayed_records_once_each_when_due(spark, config, worker,
                                                                   client, tmp_path):
    topic = make_topic(config, 2)
    producer = client.create_producer(topic)
    seen: list[bytes] = []
    q = stream_values(spark, config, tmp_path, seen, subscribe=topic,
                      startingOffsets="earliest")
    try:
        sent = time.time()
        with client.transaction() as txn:
            producer.send(b"late", partition=0, txn=txn, deliver_after=timedelta(seconds=5))
            for i in range(20):
                producer.send(f"v{i}".encode(), txn=txn)
        wait_until(lambda: len(seen) >= 20, 60, "the records due now")
        assert b"late" not in seen or time.time() - sent >= 5, "read before its time"
        wait_until(lambda: b"late" in seen, 60, "the delayed record, once due")
        time.sleep(2)
        assert sorted(seen) == sorted([b"late", *(f"v{i}".encode() for i in range(20))])
    finally:
        q.stop()
