"""Reads planned on the driver from the served buffer state, on the real broker, without
Spark: what a batch read's tasks deliver (``TxnStreamBatchReader``), and what a task
alone delivers from the skip info it was given (``task._read_partition``)."""

from __future__ import annotations

import json
import logging
import time

import pytest
from confluent_kafka import Producer

import txnstream_spark.partition as part_mod
import txnstream_spark.source as src
import txnstream_spark.task as task
from tests.genuine import marker_headers, txn_record_headers
from tests.integration.coordinator.conftest import markers_written
from tests.spark.conftest import make_topic
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.markers import TXN_ID_HEADER, TXN_MARKER_HEADER, MarkerKind, TxnMarker
from txnstream.types import TopicPartition, TxnID

pytestmark = pytest.mark.spark


def _options(config, topic, **extra):
    o = {"kafka.bootstrap.servers": config.bootstrap_servers,
         "txnstream.prefix": config.topics.prefix, "subscribe": topic}
    o.update(extra)
    return o


def batch_read(config, topic, **extra):
    """What ``spark.read`` delivers: the batch reader's plan, each partition read."""
    reader = src.TxnStreamBatchReader(_options(config, topic, **extra))
    parts = list(reader.partitions())
    values = [v for p in parts for rb in reader.read(p) for v in rb.column("value").to_pylist()]
    return values, parts


def register(config, topic, partitions=1):
    """Register the partitions as a coordinator does before a txn's first record."""
    store = TransactionBufferSnapshotStore(config)
    assert store.register([TopicPartition(topic, p) for p in range(partitions)], 10)


def txn_record(config, raw, topic, value, txn, partition=0):
    """A member record of ``txn`` (tagged as its writers tag it: tests/genuine.py)."""
    raw.produce(topic, value, partition=partition,
                headers=txn_record_headers(config, txn, topic, partition))


def marker(config, raw, topic, txn, kind, partition=0):
    """A marker of ``txn`` signed as a worker signs it."""
    m = TxnMarker(txn, kind, 0)
    raw.produce(topic, m.encode(), partition=partition,
                headers=marker_headers(config, m, topic, partition))


def high(config, topic, partition=0):
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTP

    c = Consumer(config.consumer("hw"))
    try:
        return c.get_watermark_offsets(KafkaTP(topic, partition), timeout=10)[1]
    finally:
        c.close()


def test_offsets_pack_compactly_and_unpack_exactly():
    for offsets in ([], [7], [0, 1], list(range(3, 20_000, 2)), [5, 300, 70_000, 2**40, 2**41]):
        packed = part_mod._pack_offsets(offsets)
        assert part_mod._unpack_offsets(packed) == set(offsets)
    markers = list(range(1, 200_000, 2))  # a marker after each one-record txn
    assert len(part_mod._pack_offsets(markers)[2]) < len(markers) + 1


@pytest.mark.parametrize("fate", ["abort", "commit", "open"])
def test_an_open_txn_blocks_the_range_at_its_first_record(config, worker, client, fate):
    topic = make_topic(config, 1)
    p = client.create_producer(topic)
    with client.transaction() as t:
        p.send(b"c0", txn=t, partition=0)
    markers_written(client, t.id)  # so "blocked" comes after c0's marker
    blocker = client.new_transaction()
    p.send(b"blocked", txn=blocker, partition=0)
    p.flush_transaction(blocker)
    first_blocked = high(config, topic) - 1
    later = [f"c{i}".encode() for i in range(1, 41)]
    for v in later:
        with client.transaction() as t:
            p.send(v, txn=t, partition=0)
    p.send(b"plain", partition=0)
    p.flush()
    try:
        if fate == "abort":
            blocker.abort()
            markers_written(client, blocker.id)
            want = [b"c0", *later, b"plain"]
        elif fate == "commit":
            blocker.commit()
            markers_written(client, blocker.id)
            want = [b"c0", b"blocked", *later, b"plain"]
        else:
            want = [b"c0"]  # everything after the open txn's first record waits for it
        got, parts = batch_read(config, topic)
        assert got == want
        if fate == "open":
            (part,) = parts
            assert part.end == first_blocked, "the range must end at the open txn's record"
        else:
            assert parts[0].end == high(config, topic)
    finally:
        if fate == "open":
            blocker.abort()


def test_aborted_spans_and_markers_are_skipped_and_nothing_else(config, worker):
    """An aborted txn's span holds records of other txns and plain ones: only its own
    are skipped. Markers and a record with an undecodable txn.id are never delivered."""
    topic = make_topic(config, 1)
    register(config, topic)
    raw = Producer(config.producer())
    a, b = TxnID(9, 1), TxnID(9, 2)
    txn_record(config, raw, topic, b"a1", a)        # 0  aborted
    txn_record(config, raw, topic, b"b1", b)        # 1  committed, inside a's span
    raw.produce(topic, b"p1", partition=0)  # 2  plain, inside a's span
    txn_record(config, raw, topic, b"a2", a)        # 3  aborted
    raw.produce(topic, b"bad", partition=0, headers=[(TXN_ID_HEADER, b"xyz")])  # 4
    txn_record(config, raw, topic, b"b2", b)        # 5
    marker(config, raw, topic, a, MarkerKind.ABORT)   # 6
    marker(config, raw, topic, b, MarkerKind.COMMIT)  # 7
    raw.produce(topic, b"p2", partition=0)  # 8
    txn_record(config, raw, topic, b"a3", a)        # 9  a straggler after a's end: hidden
    raw.flush(10)
    got, (part,) = batch_read(config, topic)
    assert got == [b"b1", b"p1", b"b2", b"p2"]
    assert (part.start, part.end) == (0, 10)
    assert part.aborted == {a.to_bytes(): (0, 3)}
    hidden = part_mod._unpack_offsets(part.hidden)
    assert {6, 7, 9} <= hidden and not hidden & {1, 2, 5, 8}

    # A range that starts inside the span gets the span too.
    got, (part,) = batch_read(config, topic, startingOffsets=json.dumps({topic: {"0": 3}}),
                              endingOffsets=json.dumps({topic: {"0": 9}}))
    assert got == [b"b2", b"p2"] and part.aborted == {a.to_bytes(): (0, 3)}


def test_a_task_never_delivers_markers_or_undecodable_txn_ids_and_stops_at_its_end(config):
    """Even with no skip info at all, a task filters what can never be a user record."""
    topic = make_topic(config, 1)
    raw = Producer(config.producer())
    t = TxnID(9, 5)
    txn_record(config, raw, topic, b"t", t)
    marker(config, raw, topic, t, MarkerKind.COMMIT)
    raw.produce(topic, b"bad", partition=0, headers=[(TXN_ID_HEADER, b"xyz")])
    raw.produce(topic, b"odd", partition=0, headers=[("user", b"1"), (TXN_MARKER_HEADER, b"")])
    raw.produce(topic, b"plain", partition=0, headers=[("user", b"2")])
    raw.produce(topic, b"past-the-end", partition=0)
    raw.flush(10)
    part = part_mod.TxnStreamPartition(config, topic, 0, 0, 5)
    rows = [r for rb in task._read_partition(part) for r in rb.to_pylist()]
    assert [r["value"] for r in rows] == [b"t", b"plain"]
    assert rows[0]["txn_id"] == str(t)
    assert rows[1]["headers"] == [{"key": "user", "value": b"2"}]
    # and the skip info it is given: the hidden offset and the span
    part = part_mod.TxnStreamPartition(config, topic, 0, 0, 6, hidden=[4],
                                  aborted=[(t.to_bytes(), 0, 0)])
    assert [v for rb in task._read_partition(part)
            for v in rb.column("value").to_pylist()] == [b"past-the-end"]


def test_a_range_that_starts_mid_partition_gets_only_its_own_records(config, worker, client):
    topic = make_topic(config, 1)
    p = client.create_producer(topic)
    for i in range(6):
        with client.transaction() as t:  # each txn: a record and its marker
            p.send(f"v{i}".encode(), txn=t, partition=0)
        markers_written(client, t.id)  # the next txn's record after it, not before
    assert batch_read(config, topic)[0] == [f"v{i}".encode() for i in range(6)]

    def read(s, e):
        return batch_read(config, topic, startingOffsets=json.dumps({topic: {"0": s}}),
                          endingOffsets=json.dumps({topic: {"0": e}}))[0]

    # records at 0, 2, 4, ... and each txn's marker right after
    assert read(4, 9) == [b"v2", b"v3", b"v4"]
    assert read(5, 8) == [b"v3"]


def test_a_plain_topic_is_read_without_any_worker(config):
    """No txn ever registered it: its end is its high watermark; no buffer owner needed."""
    topic = make_topic(config, 2)
    raw = Producer(config.producer())
    want = {f"v{i}".encode() for i in range(200)}
    for i, v in enumerate(sorted(want)):
        raw.produce(topic, v, partition=i % 2)
    raw.flush(10)
    started = time.monotonic()
    got, parts = batch_read(config, topic)
    assert sorted(got) == sorted(want) and len(got) == len(want)
    assert sorted(p.end for p in parts) == [100, 100]
    assert time.monotonic() - started < src.FRESH_WAIT_S, "waited for an owner it needs not"


def test_a_registered_topic_with_no_buffer_owner_delivers_nothing_until_one_serves_it(
        config, monkeypatch, caplog):
    from txnstream.buffer.worker import BufferWorker

    monkeypatch.setattr(src, "FRESH_WAIT_S", 2.0)
    topic = make_topic(config, 1)
    register(config, topic)
    raw = Producer(config.producer())
    t = TxnID(9, 7)
    raw.produce(topic, b"plain-before", partition=0)
    txn_record(config, raw, topic, b"aborted", t)
    marker(config, raw, topic, t, MarkerKind.ABORT)
    raw.produce(topic, b"plain-after", partition=0)
    raw.flush(10)
    with caplog.at_level(logging.WARNING, logger=src.__name__):
        got, parts = batch_read(config, topic)
    # never unfiltered data (a range ending at latest is planned even if empty)
    assert got == [] and all(p.end == p.start for p in parts)
    assert any("no buffer owner serves it" in r.getMessage() for r in caplog.records)

    bw = BufferWorker(config, [topic], snapshot_interval_s=1).start()
    try:
        monkeypatch.setattr(src, "FRESH_WAIT_S", 60.0)
        got, _ = batch_read(config, topic)
    finally:
        bw.stop(30)
    assert got == [b"plain-before", b"plain-after"]


def test_a_txn_record_in_a_range_planned_plain_is_skipped_or_fails_the_task_if_registered(
        config):
    """A raw writer's txn records (and a forged marker) in a topic no txn registered: no
    coordinator admitted them, so the task skips them and delivers the plain records,
    writing nothing to the snapshot topic. Old: the task registered the partition and
    failed, and with workers whose ``--buffer-topics`` do not cover the topic (or an
    application that may not write registrations) the query could never read it again.
    A range planned plain whose topic is registered by the time its task reads it still
    fails the task (a restarted query plans it with the served state); still writing
    nothing."""
    topic = make_topic(config, 1)
    raw = Producer(config.producer())
    t = TxnID(9, 8)
    raw.produce(topic, b"plain-before", partition=0)
    txn_record(config, raw, topic, b"junk", t)
    marker(config, raw, topic, t, MarkerKind.ABORT)
    raw.produce(topic, b"plain-after", partition=0)
    txn_record(config, raw, topic, b"junk-2", TxnID(0, 10**12))
    raw.produce(topic, b"plain-last", partition=0)
    raw.flush(10)
    tp = TopicPartition(topic, 0)
    store = TransactionBufferSnapshotStore(config)
    got, parts = batch_read(config, topic)
    assert got == [b"plain-before", b"plain-after", b"plain-last"]
    assert [p.plain for p in parts] == [True]
    assert not store.find(tp).registered, "the task registered the partition"

    register(config, topic)  # a txn registered the topic after the range was planned
    with pytest.raises(RuntimeError, match=f"{tp}@1: a transactional record in a range "
                                            "planned without served state"):
        list(task._read_partition(parts[0]))
