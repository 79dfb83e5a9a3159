"""The snapshot topic's layout without a broker: which snapshot a reader takes, and how
a writer lays segments out (slots, tombstones, failed deliveries)."""

from __future__ import annotations

import logging

import pytest

from tests.unit.buffer.test_bounds import _big_buffer
from txnstream.buffer import TransactionBuffer, take_snapshot
from txnstream.buffer.snapshot import split_snapshot
from txnstream.buffer.snapshot_store import (
    LatestSnapshotFinder,
    TransactionBufferSnapshotStore,
    segment_key,
)
from txnstream.config import Config
from txnstream.types import TopicPartition

TP = TopicPartition("t", 0)


def snap_at(position: int):
    buf = TransactionBuffer(TP)
    buf.fold(position, None)
    return take_snapshot(buf)


@pytest.fixture(scope="module")
def big():
    """A snapshot of 300k markers (30k aborted txns): a few segments at the real bound."""
    return take_snapshot(_big_buffer(300_000))


def feed(finder, records):
    for i, (key, value) in enumerate(records):
        finder.add(key, value, f"snap[0]@{i}")
    return finder.best


def seg_records(snap, sid, slot, segs=None):
    segs = segs if segs is not None else split_snapshot(snap, sid)
    return [(segment_key(TP, slot, s.index), s.encode()) for s in segs]


def test_the_newest_complete_snapshot_wins(big):
    older, newer = snap_at(5), snap_at(9)
    recs = seg_records(older, "a", 0) + seg_records(newer, "b", 1)
    assert feed(LatestSnapshotFinder(TP), recs) == newer
    assert feed(LatestSnapshotFinder(TP, at_or_before=8), recs) == older
    assert feed(LatestSnapshotFinder(TP, at_or_before=4), recs) is None
    multi = seg_records(big, "c", 0)
    assert len(multi) > 1
    assert feed(LatestSnapshotFinder(TP), recs + multi) == big


def test_a_write_cut_short_leaves_the_previous_snapshot_in_use(big):
    prev = snap_at(5)
    cut = seg_records(big, "c", 1)[:-1]  # the last segment never arrived
    assert feed(LatestSnapshotFinder(TP), seg_records(prev, "a", 0) + cut) == prev
    assert feed(LatestSnapshotFinder(TP), cut) is None  # incomplete: no usable snapshot


def test_segments_of_other_partitions_and_tombstones_are_ignored():
    other = TopicPartition("t", 10)  # "t-10/..." must not pass for "t-1/..." either
    s = snap_at(3)
    recs = [(segment_key(other, 0, 0), split_snapshot(snap_at(7), "x")[0].encode()),
            (segment_key(TP, 0, 0), None), *seg_records(s, "a", 0),
            (segment_key(TP, 1, 0), None)]
    assert feed(LatestSnapshotFinder(TP), recs) == s
    assert feed(LatestSnapshotFinder(TopicPartition("t", 1)), recs) is None


def test_the_old_single_record_format_is_still_read_and_a_newer_segmented_one_wins():
    old, new = snap_at(4), snap_at(8)
    legacy = [(str(TP).encode(), old.encode())]
    assert feed(LatestSnapshotFinder(TP), legacy) == old
    assert feed(LatestSnapshotFinder(TP), legacy + seg_records(new, "n", 0)) == new


def test_an_unknown_version_or_garbage_is_rejected_with_a_clear_error_and_skipped(caplog):
    s = snap_at(2)
    good = seg_records(s, "a", 0)
    future = [(segment_key(TP, 1, 0), b"\x07" + good[0][1][1:])]
    legacy = [(str(TP).encode(), b"\x01garbage")]
    assert feed(LatestSnapshotFinder(TP), good + future + legacy) == s
    assert "unknown record format version 7" in caplog.text
    assert "snap[0]@1" in caplog.text and "snap[0]@2" in caplog.text
    assert all(r.levelno == logging.ERROR for r in caplog.records)


# ----------------------------------------------------------------------- writer

class FakeProducer:
    """Records produces; deliveries are reported at ``poll`` as scripted."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes | None]] = []
        self.pending: list = []
        self.fail_next = False

    def produce(self, topic, value, key=None, partition=None, on_delivery=None):
        self.sent.append((key, value))
        if on_delivery is not None:
            self.pending.append(on_delivery)

    def poll(self, timeout=0):
        pending, self.pending = self.pending, []
        for cb in pending:
            cb("broker down" if self.fail_next else None, None)
        return len(pending)

    def flush(self, timeout=None):
        return self.poll()


def store_with(producer):
    store = TransactionBufferSnapshotStore(Config(bootstrap_servers="127.0.0.1:1"))
    store._producer = producer
    store._partitions = 1
    return store


def test_writes_alternate_slots_only_after_a_complete_delivery_and_clean_up(big):
    p = FakeProducer()
    store = store_with(p)
    store.publish(big, TP)
    n = len(split_snapshot(big, "x"))
    assert [k for k, v in p.sent if v is not None] == [segment_key(TP, 0, i) for i in range(n)]
    assert (str(TP).encode(), None) in p.sent  # the old single-record key is deleted
    p.sent.clear()
    store.publish(snap_at(1), TP)  # slot 0 delivered: the next write takes slot 1
    assert p.sent[0][0] == segment_key(TP, 1, 0)
    p.sent.clear()
    store.publish(snap_at(2), TP)  # back to slot 0, one segment: the rest are deleted
    assert p.sent[0][0] == segment_key(TP, 0, 0)
    assert [k for k, v in p.sent if v is None] == [segment_key(TP, 0, i) for i in range(1, n)]


def test_a_failed_delivery_is_reported_and_the_same_slot_is_written_again():
    p = FakeProducer()
    store = store_with(p)
    store.publish(snap_at(1), TP)
    p.poll()  # slot 0 is good
    p.fail_next = True
    store.publish(snap_at(2), TP)  # slot 1 ...
    p.poll()  # ... not delivered
    assert store.take_failed() == {TP}
    assert store.take_failed() == set()
    p.fail_next = False
    p.sent.clear()
    store.publish(snap_at(3), TP)
    assert p.sent[0][0] == segment_key(TP, 1, 0), "slot 0 holds the last good snapshot"
