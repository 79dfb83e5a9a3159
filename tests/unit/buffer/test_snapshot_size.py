"""Snapshots are sized by txns and aborted spans, not by records (issue 20, item 8).

One aborted txn of 200,000 records made a 1.18 MB, 5-segment snapshot. The bound stated
in docs/buffer.md: a snapshot costs a few bytes per aborted or ongoing txn, per run of
its records (a run ends where another txn's records interleave) and per hidden offset
that is no aborted txn's record (markers, stragglers), whatever the txns' record counts.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.unit.buffer.test_fold_properties import events, fold
from txnstream.buffer import TransactionBuffer, restore, take_snapshot
from txnstream.buffer.offset_runs import OffsetRuns
from txnstream.buffer.served import BufferView
from txnstream.buffer.snapshot import TransactionBufferSnapshot
from txnstream.codec import codec
from txnstream.errors import CorruptRecordError
from txnstream.markers import TXN_ID_HEADER, MarkerKind, TxnMarker
from txnstream.types import TopicPartition, TxnID

TP = TopicPartition("t", 0)
RECORDS = 200_000
SMALL_SNAPSHOT_BYTES = 4 * 1024
"""The bound asserted here: a handful of txns and a few hundred runs fit in 4 KiB."""
A, B = TxnID(1, 7), TxnID(1, 8)


def _txn(buf: TransactionBuffer, offset: int, t: TxnID) -> None:
    buf.fold(offset, [(TXN_ID_HEADER, t.to_bytes())], b"x")


def _marker(buf: TransactionBuffer, offset: int, t: TxnID, kind: MarkerKind) -> None:
    m = TxnMarker(t, kind, 0)
    buf.fold(offset, m.headers(), m.encode())


def _fold_big_txn(interleave_every: int | None) -> tuple[TransactionBuffer, list[int]]:
    """A's 200k records (one record of B after every ``interleave_every`` of A's), then
    B's COMMIT; A stays open. Returns the buffer and B's offsets."""
    buf = TransactionBuffer(TP)
    off, b_offsets = 0, []
    for i in range(RECORDS):
        _txn(buf, off, A)
        off += 1
        if interleave_every and (i + 1) % interleave_every == 0:
            _txn(buf, off, B)
            b_offsets.append(off)
            off += 1
    _marker(buf, off, B, MarkerKind.COMMIT)
    return buf, b_offsets


def _size(buf: TransactionBuffer) -> int:
    return len(take_snapshot(buf).encode())


@pytest.mark.parametrize("interleave_every", [None, 1_000], ids=["contiguous", "interleaved"])
def test_an_aborted_txn_of_200k_records_makes_a_snapshot_of_a_few_kb(interleave_every):
    buf, b_offsets = _fold_big_txn(interleave_every)
    end = buf.last_offset + 1
    _marker(buf, end, A, MarkerKind.ABORT)
    snap = take_snapshot(buf)
    size = len(snap.encode())
    assert size < SMALL_SNAPSHOT_BYTES, f"{size} bytes for one aborted txn of {RECORDS} records"

    # and it says exactly what the fold said: A's records hidden, B's delivered
    back = restore(TransactionBufferSnapshot.decode(snap.encode()))
    assert back.max_read_position == buf.max_read_position == end
    assert back.aborted == buf.aborted and back.invisible == buf.invisible
    a_last = end - 3 if b_offsets else end - 2  # then B's last record, B's marker
    assert all(back.is_visible(o) for o in b_offsets)
    assert not any(back.is_visible(o) for o in (0, 1, a_last, end - 1, end))
    assert back.aborted[A].run_count == max(1, len(b_offsets))
    view = BufferView.from_snapshot(TransactionBufferSnapshot.decode(snap.encode()))
    assert view.aborted == {A.to_bytes(): (0, a_last)}
    assert view.hidden == {end - 1, end}  # the two markers
    assert all(view.visible(o, B.to_bytes()) for o in b_offsets)
    assert not view.visible(0, A.to_bytes()) and not view.visible(a_last, A.to_bytes())


@pytest.mark.parametrize("interleave_every", [None, 1_000], ids=["contiguous", "interleaved"])
def test_an_ongoing_txn_of_200k_records_makes_a_snapshot_of_a_few_kb(interleave_every):
    buf, _ = _fold_big_txn(interleave_every)
    snap = take_snapshot(buf)
    size = len(snap.encode())
    assert size < SMALL_SNAPSHOT_BYTES, f"{size} bytes for one open txn of {RECORDS} records"

    back = restore(TransactionBufferSnapshot.decode(snap.encode()))
    assert back.ongoing_txns() == buf.ongoing_txns() == {A: 0}
    assert back.ongoing[A].offsets == buf.ongoing[A].offsets
    # it ends after the restore as it would have without one
    end = buf.last_offset + 1
    for b in (buf, back):
        _marker(b, end, A, MarkerKind.ABORT)
    assert back.aborted == buf.aborted and back.invisible == buf.invisible
    assert _size(back) < SMALL_SNAPSHOT_BYTES


def test_the_size_grows_with_interleavings_not_records():
    """Twice the records of each run costs nothing; twice the runs costs a few bytes each."""
    sizes = {}
    for runs, every in ((100, 2_000), (200, 1_000), (400, 500)):
        buf, _ = _fold_big_txn(every)
        _marker(buf, buf.last_offset + 1, A, MarkerKind.ABORT)
        sizes[runs] = _size(buf)
    assert sizes[400] < SMALL_SNAPSHOT_BYTES, sizes
    assert sizes[400] - sizes[200] < 200 * 8 and sizes[200] - sizes[100] < 100 * 8


# ------------------------------------------------------------ wire compatibility


def _v1_bytes(buf: TransactionBuffer) -> bytes:
    """``buf`` as the version 1 code wrote its snapshot: every offset listed."""
    import json

    from txnstream.codec import SCHEMA_DIR, AvroCodec

    v1 = AvroCodec("txn_buffer_snapshot",
                   json.loads((SCHEMA_DIR / "txn_buffer_snapshot.v1.avsc").read_text()))
    assert v1.version == 1
    return v1.encode({
        "topic": TP.topic, "partition": TP.partition, "position": buf.last_offset,
        "max_read_position": buf.max_read_position,
        "ongoing": [{"most_bits": t.most_bits, "least_bits": t.least_bits,
                     "offsets": list(e.offsets), "first_timestamp_ms": e.first_timestamp_ms}
                    for t, e in sorted(buf.ongoing.items())],
        "aborted": [{"most_bits": t.most_bits, "least_bits": t.least_bits,
                     "offsets": list(offs)} for t, offs in sorted(buf.aborted.items())],
        "invisible": sorted(buf.invisible),
        "lwms": [{"tc": tc, "lwm": lwm} for tc, lwm in sorted(buf.lwm.items())],
        "ended": [{"tc": tc, "seqs": sorted(s)} for tc, s in sorted(buf.ended.items()) if s],
        "generation": 3, "state_offset": 4})


@settings(max_examples=200, deadline=None)
@given(events)
def test_a_version_1_snapshot_is_read_as_the_same_state(log):
    buf = fold(log)
    old = TransactionBufferSnapshot.decode(_v1_bytes(buf))
    assert old == take_snapshot(buf, generation=3, state_offset=4)
    back = restore(old)
    assert back.aborted == buf.aborted and back.invisible == buf.invisible
    assert back.ongoing == buf.ongoing and back.max_read_position == buf.max_read_position
    new = take_snapshot(buf)
    assert TransactionBufferSnapshot.decode(new.encode()) == new  # round trip, version 5
    assert new.encode()[0] == 5  # version 5: delayed records (version 4: legacy_until)


@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(0, 200), max_size=60), st.integers(0, 210), st.integers(0, 210))
@example({0, 1}, 1, 1)  # an empty range meets no run
def test_offset_runs_hold_exactly_their_offsets(offsets, lo, hi):
    want = sorted(offsets)
    runs = OffsetRuns(want)
    assert runs == want and list(runs) == want and len(runs) == len(want)
    assert OffsetRuns.from_deltas(runs.to_deltas()) == runs
    assert all((o in runs) == (o in offsets) for o in range(-1, 212))
    assert runs.at_or_above(lo) == [o for o in want if o >= lo]
    assert runs.intersects(lo, hi) == any(lo <= o < hi for o in want)
    assert [runs[i] for i in range(-len(want), len(want))] == want + want
    assert runs.run_count == sum(1 for i, o in enumerate(want) if i == 0 or want[i - 1] != o - 1)


@pytest.mark.parametrize("deltas", [[5], [5, 0], [-1, 2], [5, 2, 0, 1], [1, 1, -3, 2]])
def test_offset_runs_that_cannot_be_are_a_corrupt_snapshot(deltas):
    snap = take_snapshot(_fold_big_txn(None)[0])
    rec = snap.to_avro()
    rec["ongoing"][0]["runs"] = deltas
    data = codec("txn_buffer_snapshot").encode(rec)
    with pytest.raises(CorruptRecordError):
        TransactionBufferSnapshot.decode(data)
