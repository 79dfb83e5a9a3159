"""Bounds of the buffer's state and snapshots (issue 11, item 6): trim, and segments."""

from __future__ import annotations

import dataclasses
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.buffer.test_fold_properties import events, fold, to_record
from txnstream.buffer import TransactionBuffer, restore, take_snapshot
from txnstream.markers import TXN_ID_HEADER, MarkerKind, TxnMarker
from txnstream.types import TopicPartition, TxnID

TP = TopicPartition("t", 0)
MARKERS = 260_000
"""Past the ~250k retained markers that made a 1 MB snapshot in the issue."""


def _fold_markers(buf: TransactionBuffer, n: int, every: int, then) -> None:
    """Fold ``n`` txns of TC 9 (a record + its marker; one in ten aborted), calling
    ``then(buf)`` every ``every`` records, as a reader that trims as it goes does."""
    off = buf.last_offset + 1
    for i in range(n):
        t = TxnID(9, i)
        if i % 10 == 0:  # an aborted txn: a record, then ABORT
            buf.fold(off, [(TXN_ID_HEADER, t.to_bytes())], b"x")
            off += 1
        kind = MarkerKind.ABORT if i % 10 == 0 else MarkerKind.COMMIT
        m = TxnMarker(t, kind, i)  # the TC's LWM moves with it, as it does live
        buf.fold(off, m.headers(), m.encode())
        off += 1
        if off % every == 0:
            then(buf)


def test_a_buffer_past_250k_markers_is_bounded_by_trim_and_trimming_is_cheap():
    """Phase 1: nothing may be forgotten yet (the log start stays at 0), and the owner
    calls trim often anyway (the worker before every snapshot, readers after every
    batch): each call must cost nothing like a rebuild of everything retained. Phase 2:
    the log start passes it all: one trim forgets it, and the snapshot fits one record."""
    buf = TransactionBuffer(TP)
    spent = [0.0]

    def trim_at_zero(b: TransactionBuffer) -> None:
        t0 = time.perf_counter()
        b.trim(0)
        spent[0] += time.perf_counter() - t0

    _fold_markers(buf, MARKERS, every=100, then=trim_at_zero)
    assert len(buf.invisible) >= MARKERS  # every marker kept: readers may start at 0
    # ~2,900 calls over a set growing to 290k: a rebuild each time costs tens of seconds
    assert spent[0] < 1.0, f"trim with nothing to forget cost {spent[0]:.1f} s in all"
    big = len(take_snapshot(buf).encode())
    from txnstream.buffer.snapshot import MAX_SNAPSHOT_RECORD_BYTES as BOUND

    # 1.08 MB before offsets were kept as runs (issue 20, item 8); still segmented
    assert BOUND < big < 2 * BOUND, big

    log_start = buf.last_offset - 999
    t0 = time.perf_counter()
    buf.trim(log_start)
    assert time.perf_counter() - t0 < 2.0
    assert len(buf.invisible) <= 1_000 and len(buf.aborted) <= 100
    assert all(o >= log_start for o in buf.invisible)
    from txnstream.buffer.snapshot import MAX_SNAPSHOT_RECORD_BYTES

    assert len(take_snapshot(buf, min_offset=log_start).encode()) < MAX_SNAPSHOT_RECORD_BYTES

    # phase 3: a reader trimming below what it delivered keeps it bounded from then on
    sizes = []

    def trim_behind(b: TransactionBuffer) -> None:
        b.trim(b.max_read_position + 1 - 2_000)  # the reader lags 2,000 records
        sizes.append((len(b.invisible), len(b.aborted)))

    _fold_markers(buf, 50_000, every=1_000, then=trim_behind)
    assert max(s for s, _ in sizes) <= 3_000
    assert max(a for _, a in sizes) <= 300


def test_trim_keeps_the_set_a_reader_holds():
    """Spark's folding read keeps ``buf.invisible`` as its skip set: trim forgets in place."""
    buf = TransactionBuffer(TP)
    _fold_markers(buf, 100, every=10**9, then=lambda b: None)
    held = buf.invisible
    buf.trim(50)
    assert buf.invisible is held and min(held) >= 50


@settings(max_examples=300, deadline=None)
@given(events, st.lists(st.integers(0, 60), max_size=6))
def test_trimmed_buffer_decides_like_an_untrimmed_one_above_the_trim_point(log, cuts):
    """Trim below the reader's position at random points of the fold: every later
    decision above that position, and the snapshot above it, are unchanged."""
    full = fold(log)
    buf = TransactionBuffer(TP)
    floor = 0
    cuts = sorted(min(c, len(log)) for c in cuts)
    for off, e in enumerate(log):
        while cuts and cuts[0] == off:
            cuts.pop(0)
            floor = max(floor, min(off, buf.max_read_position + 1))
            buf.trim(floor)
        headers, value = to_record(e)
        buf.fold(off, headers, value)
    assert buf.max_read_position == full.max_read_position
    assert all(buf.is_visible(o) == full.is_visible(o) for o in range(floor, len(log)))
    assert buf.invisible_in_range(floor, len(log)) == full.invisible_in_range(floor, len(log))
    assert take_snapshot(buf, min_offset=floor) == take_snapshot(full, min_offset=floor)


def test_trim_below_an_ongoing_txn_forgets_its_old_records_when_it_aborts():
    """The log start can pass an open txn's first records (retention); when it aborts,
    offsets below the trim point are not brought back."""
    buf = TransactionBuffer(TP)
    t = TxnID(0, 1)
    for off in range(10):
        buf.fold(off, [(TXN_ID_HEADER, t.to_bytes())])
    buf.trim(5)
    m = TxnMarker(t, MarkerKind.ABORT, 0)
    buf.fold(10, m.headers(), m.encode())
    assert sorted(buf.invisible) == [5, 6, 7, 8, 9, 10]
    assert buf.aborted == {t: [5, 6, 7, 8, 9]}
    assert buf.max_read_position == 10


# -------------------------------------------------------------------- segments


def _big_buffer(markers: int) -> TransactionBuffer:
    buf = TransactionBuffer(TP)
    _fold_markers(buf, markers, every=10**9, then=lambda b: None)
    return buf


@pytest.fixture(scope="module")
def big_snapshot():
    from txnstream.buffer.snapshot import MAX_SNAPSHOT_RECORD_BYTES

    snap = take_snapshot(_big_buffer(MARKERS))
    assert len(snap.encode()) > MAX_SNAPSHOT_RECORD_BYTES  # more than one segment
    return snap


def test_a_snapshot_over_1mb_is_split_into_segments_under_the_bound_and_joins_back(
        big_snapshot):
    from txnstream.buffer.snapshot import (
        MAX_SNAPSHOT_RECORD_BYTES,
        TransactionBufferSnapshotSegment,
        join_segments,
        split_snapshot,
    )

    assert MAX_SNAPSHOT_RECORD_BYTES < 1_000_000
    segs = split_snapshot(big_snapshot, "s1")
    assert len(segs) > 1
    assert all(len(s.encode()) <= MAX_SNAPSHOT_RECORD_BYTES for s in segs)
    wire = [TransactionBufferSnapshotSegment.decode(s.encode()) for s in segs]
    assert join_segments(wire) == big_snapshot
    assert join_segments(list(reversed(wire))) == big_snapshot
    assert restore(join_segments(wire)).invisible == restore(big_snapshot).invisible


def test_an_incomplete_or_mixed_segment_set_is_no_snapshot(big_snapshot):
    from txnstream.buffer.snapshot import join_segments, split_snapshot
    from txnstream.errors import CorruptRecordError

    segs = split_snapshot(big_snapshot, "s1")
    with pytest.raises(CorruptRecordError, match="segment"):
        join_segments(segs[:-1])
    other = split_snapshot(big_snapshot, "s2")
    with pytest.raises(CorruptRecordError, match="snapshot"):
        join_segments([other[0], *segs[1:]])
    bad = dataclasses.replace(segs[1], data=segs[1].data[:-1] + b"?")
    with pytest.raises(CorruptRecordError, match="checksum"):
        join_segments([segs[0], bad, *segs[2:]])
