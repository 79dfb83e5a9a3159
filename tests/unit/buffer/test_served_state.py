"""Property tests of the served buffer state: a reader driven only by the owner's deltas
(:class:`~txnstream.buffer.served.BufferView`) delivers exactly what the reference
whole-log fold delivers, at every point the owner publishes.

The owner folds with :class:`TransactionBuffer` (one by one, or with ``fold_messages``)
with a :class:`Journal` and publishes :func:`take_delta` after random batch sizes; the
reference is a separate buffer folded one record at a time (and, for the visible set,
the obviously-correct ``reference`` of ``test_fold_properties``).
"""

from __future__ import annotations

import bisect

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from tests.unit.buffer.test_fold_properties import _Msg, reference, to_record, txn_ids
from txnstream.buffer import (
    TransactionBuffer,
    TransactionBufferSnapshot,
    restore,
    take_snapshot,
)
from txnstream.buffer.served import (
    BufferStateKind,
    BufferStateRecord,
    BufferView,
    take_delta,
)
from txnstream.buffer.transaction_buffer import Journal
from txnstream.errors import CorruptRecordError
from txnstream.markers import TXN_ID_HEADER, TXN_MARKER_HEADER, MarkerKind, TxnMarker
from txnstream.types import MAX_TC_ID, TopicPartition, TxnID

TP = TopicPartition("t", 0)
NOW_MS = 5_000

# ------------------------------------------------------------------ the log

BAD_MARKER_VALUES = ("none", "empty", "version", "truncated", "trailing", "garbage",
                     "other_txn")

def _event_mix(ids, lwms):
    return st.one_of(
        st.just(("plain",)),
        st.tuples(st.just("txn"), ids),
        st.tuples(st.just("txn"), ids),
        st.tuples(st.just("txn"), ids),
        st.tuples(st.just("txn+user"), ids),
        # a txn.id header of the wrong length
        st.tuples(st.just("badlen"), st.binary(max_size=24).filter(lambda b: len(b) != 16)),
        # a marker (valid txn.id header) whose value does not parse or names another txn
        st.tuples(st.just("badmarker"), ids, st.sampled_from(BAD_MARKER_VALUES)),
        # a marker header without a txn.id header
        st.tuples(st.just("orphan_marker"), ids),
        st.tuples(st.just("marker"), ids, st.sampled_from(list(MarkerKind)), lwms),
        st.tuples(st.just("marker"), ids, st.sampled_from(list(MarkerKind)), lwms),
    )


served_events = st.one_of(
    # short logs of few txns (as test_fold_properties): every collision and LWM case
    st.lists(_event_mix(txn_ids, st.integers(0, 6)), max_size=60),
    # long logs of more txns: many publish points, several txns open at once
    st.lists(_event_mix(st.builds(TxnID, st.integers(0, 1), st.integers(0, 11)),
                        st.integers(0, 12)), min_size=25, max_size=80),
)
"""The event mix of ``test_fold_properties`` plus corrupt records."""

batch_sizes = st.lists(st.integers(0, 8), max_size=15)
"""Records the owner folds between two publishes (0: a delta with nothing new)."""


def _bad_marker_value(t: TxnID, how: str) -> bytes | None:
    good = TxnMarker(t, MarkerKind.COMMIT, 0).encode()
    return {
        "none": None,
        "empty": b"",
        "version": b"\x02" + good[1:],
        "truncated": good[:-1],
        "trailing": good + b"\x00",
        "garbage": b"\x01\xff\xff",
        "other_txn": TxnMarker(TxnID(t.tc_id, t.least_bits + 1), MarkerKind.COMMIT, 0).encode(),
    }[how]


def to_served_record(e):
    """(headers, value) of an event, corrupt ones included."""
    kind = e[0]
    if kind == "txn+user":
        return [("user", b"u"), (TXN_ID_HEADER, e[1].to_bytes())], b"x"
    if kind == "badlen":
        return [(TXN_ID_HEADER, e[1])], b"x"
    if kind == "badmarker":
        return TxnMarker(e[1], MarkerKind.COMMIT, 0).headers(), _bad_marker_value(e[1], e[2])
    if kind == "orphan_marker":
        return [(TXN_MARKER_HEADER, b"ABORT")], TxnMarker(e[1], MarkerKind.ABORT, 0).encode()
    return to_record(e)


def normalized(log):
    """The log as ``reference`` reads it: corrupt records are neither txn nor marker."""
    out = []
    for e in log:
        if e[0] == "txn+user":
            out.append(("txn", e[1]))
        elif e[0] in ("badlen", "badmarker", "orphan_marker"):
            out.append(("corrupt",))
        else:
            out.append(e)
    return out


def raw_of(headers) -> bytes | None:
    """The record's raw ``txn.id`` header (as the fold reads it: the last one), or None."""
    raw = None
    for k, v in headers or ():
        if k == TXN_ID_HEADER:
            raw = v
    return raw


# ---------------------------------------------------------- owner and reference


class Owner:
    """A buffer owner: folds with a journal, publishes a delta when told."""

    def __init__(self, records, member="a", generation=1, buf=None, via_messages=False):
        self.records = records
        self.buf = buf if buf is not None else TransactionBuffer(TP)
        self.buf.journal = Journal()
        self.member, self.generation, self.via_messages = member, generation, via_messages
        self.from_position = self.buf.last_offset + 1

    def fold_to(self, end: int) -> None:
        """Fold every record up to and including offset ``end``."""
        start = self.buf.last_offset + 1
        if end < start:
            return
        if self.via_messages:
            self.buf.fold_messages(_Msg(o, *self.records[o]) for o in range(start, end + 1))
        else:
            for o in range(start, end + 1):
                h, v = self.records[o]
                self.buf.fold(o, h, v, 1000 + o)

    def publish(self) -> BufferStateRecord:
        d = take_delta(self.buf, self.member, self.generation, self.from_position, 0, NOW_MS)
        self.from_position = self.buf.last_offset + 1
        return d


def fold_ref(records, upto: int) -> TransactionBuffer:
    """The reference: a fresh buffer, no journal, folded one by one to ``upto``."""
    buf = TransactionBuffer(TP)
    for o in range(upto + 1):
        h, v = records[o]
        buf.fold(o, h, v, 1000 + o)
    return buf


def publish_points(start: int, end: int, cuts) -> list[int]:
    """Positions at which the owner publishes folding ``[start, end]``: after each batch
    of ``cuts`` (clamped to the end), then once more at ``end``."""
    pts, at = [], start - 1
    for c in cuts:
        at = min(at + c, end)
        pts.append(at)
    pts.append(end)
    return pts


def view_answers(view: BufferView, records, lo: int = 0) -> set[int]:
    hi = len(records) + 2
    return {o for o in range(lo, hi)
            if view.visible(o, raw_of(records[o][0]) if o < len(records) else None)}


def ref_answers(buf: TransactionBuffer, n: int, lo: int = 0) -> set[int]:
    return {o for o in range(lo, n + 2) if buf.is_visible(o)}


def roundtrip(d: BufferStateRecord) -> BufferStateRecord:
    back = BufferStateRecord.decode(d.encode())
    assert back == d
    return back


# ---------------------------------------------------------------- examples

T00, T01, T02, T10, T11 = TxnID(0, 0), TxnID(0, 1), TxnID(0, 2), TxnID(1, 0), TxnID(1, 1)
C, A = MarkerKind.COMMIT, MarkerKind.ABORT

LWM_ENDED = [  # (0,0) ends without a marker: (0,2)'s marker carries lwm 2 > 0
    ("txn", T00), ("plain",), ("txn", T02), ("txn", T00), ("marker", T02, C, 2),
    ("plain",), ("txn", T00), ("marker", T00, C, 2)]
STRAGGLERS = [  # records of txns after their own marker, one aborted, one committed
    ("txn", T10), ("txn", T11), ("marker", T10, A, 0), ("txn", T10), ("plain",),
    ("txn", T11), ("marker", T11, C, 0), ("txn", T11), ("txn+user", T10), ("plain",)]
CORRUPT_INSIDE_ABORTED = [  # corrupt records of a txn inside its aborted span
    ("txn", T01), ("badmarker", T01, "truncated"), ("badlen", b"\x00" * 15), ("txn", T01),
    ("orphan_marker", T01), ("badmarker", T01, "other_txn"), ("txn+user", T01),
    ("marker", T01, A, 0), ("plain",), ("badmarker", T01, "none")]
OPEN_BLOCKS = [  # an open txn holds back a committed one and plain records
    ("txn", T00), ("txn", T10), ("plain",), ("marker", T10, C, 0), ("plain",), ("txn", T00)]


# ------------------------------------------------- 1 + 2: deltas == reference fold


@settings(max_examples=200, deadline=None)
@given(served_events, batch_sizes, st.booleans(), st.booleans())
@example(LWM_ENDED, [1, 2, 0, 3], False, True)
@example(LWM_ENDED, [1] * 8, True, False)
@example(STRAGGLERS, [2, 1, 3], False, True)
@example(STRAGGLERS, [], True, True)
@example(CORRUPT_INSIDE_ABORTED, [1] * 10, False, True)
@example(CORRUPT_INSIDE_ABORTED, [3, 4], True, False)
@example(OPEN_BLOCKS, [1, 2, 0, 1], False, True)
def test_reader_driven_by_deltas_delivers_what_the_reference_fold_does_at_every_prefix(
        log, cuts, via_messages, avro):
    records = [to_served_record(e) for e in log]
    n = len(records)
    owner = Owner(records, via_messages=via_messages)
    view = BufferView(TP)
    ref = TransactionBuffer(TP)
    for p in publish_points(0, n - 1, cuts):
        owner.fold_to(p)
        d = owner.publish()
        if avro:
            d = roundtrip(d)
        assert d.kind is BufferStateKind.DELTA and d.position == p
        assert view.apply(d)
        for o in range(ref.last_offset + 1, p + 1):
            h, v = records[o]
            ref.fold(o, h, v, 1000 + o)
        assert view.position == p
        assert view.max_read_position == ref.max_read_position
        want = ref_answers(ref, n)
        assert view_answers(view, records) == want, f"at prefix end {p}"
        assert want == reference(normalized(log[:p + 1]))[0]
        hidden, spans = view.skip_in(0, p + 1)  # what a range read skips says the same
        assert want == {o for o in range(p + 1) if o <= view.max_read_position
                        and o not in hidden
                        and not any(r == raw_of(records[o][0]) and f <= o <= la
                                    for r, f, la in spans)}
        vs, rs = view.stats(NOW_MS), ref.stats(NOW_MS)
        assert (vs.last_offset, vs.max_read_position, vs.ongoing, vs.aborted, vs.blocking_txn,
                vs.blocking_offset, vs.blocked_for_s) == (
            rs.last_offset, rs.max_read_position, rs.ongoing, rs.aborted, rs.blocking_txn,
            rs.blocking_offset, rs.blocked_for_s)


def test_the_examples_hit_what_they_are_named_for():
    """LWM-ended, straggler and corrupt records really occur in the example logs."""
    def verdicts(log):
        buf = TransactionBuffer(TP)
        out = []
        for o, e in enumerate(log):
            out.append(buf.fold(o, *to_served_record(e)).value)
        return buf, out

    buf, _ = verdicts(LWM_ENDED)
    assert T00 in buf.aborted  # ended by (0,2)'s LWM, no marker of its own before
    assert not buf.is_visible(0) and not buf.is_visible(6) and buf.is_visible(2)
    _, v = verdicts(STRAGGLERS)
    assert v.count("straggler") == 3
    buf, v = verdicts(CORRUPT_INSIDE_ABORTED)
    assert v.count("corrupt") == 5 and T01 in buf.aborted
    assert [o for o in range(10) if buf.is_visible(o)] == [8]


@settings(max_examples=150, deadline=None)
@given(served_events, batch_sizes)
def test_every_delta_survives_avro(log, cuts):
    records = [to_served_record(e) for e in log]
    owner = Owner(records, via_messages=True)
    for p in publish_points(0, len(records) - 1, cuts):
        owner.fold_to(p)
        delta = owner.publish()
        assert BufferStateRecord.decode(delta.encode()) == delta


offsets = st.integers(0, 1 << 62)
any_txn = st.builds(TxnID, st.integers(0, MAX_TC_ID), st.integers(0, (1 << 63) - 1))


@settings(max_examples=150, deadline=None)
@given(st.builds(
    BufferStateRecord,
    st.sampled_from(list(BufferStateKind)), st.text(max_size=8), st.integers(-1, 1 << 62),
    st.text(max_size=8), st.integers(0, 1 << 30), offsets, st.integers(-1, 1 << 62),
    st.integers(-1, 1 << 62),
    st.lists(offsets, unique=True, max_size=20).map(lambda xs: tuple(sorted(xs))),
    st.lists(st.tuples(any_txn, offsets, offsets), max_size=5).map(tuple),
    st.integers(0, 1 << 30), st.integers(0, 1 << 30), st.none() | any_txn,
    st.integers(-1, 1 << 62), st.integers(-1, 1 << 62), offsets, st.integers(0, 1 << 62)))
def test_any_state_record_survives_avro(rec):
    roundtrip(rec)
    data = rec.encode()
    for bad in (data[:-1], data[:len(data) // 2], data + b"\x00",
                bytes([data[0] + 1]) + data[1:]):  # a version this reader does not know
        with pytest.raises(CorruptRecordError):
            BufferStateRecord.decode(bad)


# -------------------------------------------------------------- 3: snapshots


@settings(max_examples=150, deadline=None)
@given(served_events, batch_sizes, st.integers(0, 70), st.booleans())
@example(LWM_ENDED, [2, 3], 3, False)
@example(CORRUPT_INSIDE_ABORTED, [1] * 10, 4, True)
def test_view_from_a_snapshot_plus_later_deltas_equals_view_from_all_deltas(
        log, cuts, snap_at, via_messages):
    """A snapshot taken between any two records (journal published or not)."""
    records = [to_served_record(e) for e in log]
    n = len(records)
    snap_at %= n + 1  # records folded when the snapshot is taken
    owner = Owner(records, generation=7, via_messages=via_messages)
    full = BufferView(TP)
    from_snap = None
    for p in publish_points(0, n - 1, cuts):
        if from_snap is None and snap_at - 1 <= p:
            owner.fold_to(snap_at - 1)
            snap = take_snapshot(owner.buf, 0, owner.generation, -1)
            snap = TransactionBufferSnapshot.decode(snap.encode())
            from_snap = BufferView.from_snapshot(snap)
            assert from_snap.position == snap_at - 1 and from_snap.generation == 7
            ref = fold_ref(records, snap_at - 1)
            assert from_snap.max_read_position == ref.max_read_position
            assert view_answers(from_snap, records) == ref_answers(ref, n)
        owner.fold_to(p)
        d = owner.publish()
        assert full.apply(d)
        if from_snap is not None:
            assert from_snap.apply(d)
            assert (from_snap.position, from_snap.max_read_position, from_snap.generation) == (
                full.position, full.max_read_position, full.generation)
            assert view_answers(from_snap, records) == view_answers(full, records)
    assert from_snap is not None
    assert view_answers(full, records) == ref_answers(fold_ref(records, n - 1), n)


@settings(max_examples=100, deadline=None)
@given(served_events, st.integers(0, 70), batch_sizes, st.booleans())
@example(LWM_ENDED, 3, [1], False)
@example(STRAGGLERS, 2, [1, 1], True)
def test_restored_owner_folds_on_to_the_full_fold(log, cut, cuts, via_messages):
    """The owner's recovery: restore the snapshot, fold on with a journal."""
    records = [to_served_record(e) for e in log]
    n = len(records)
    cut %= n + 1
    head = Owner(records, via_messages=via_messages)
    head.fold_to(cut - 1)
    snap = TransactionBufferSnapshot.decode(take_snapshot(head.buf, 0, 1, -1).encode())
    resumed = Owner(records, "b", 2, buf=restore(snap), via_messages=via_messages)
    for p in publish_points(cut, n - 1, cuts):
        resumed.fold_to(p)
        resumed.publish()
    full = fold_ref(records, n - 1)
    assert resumed.buf.max_read_position == full.max_read_position
    assert resumed.buf.last_offset == full.last_offset
    assert ref_answers(resumed.buf, n) == ref_answers(full, n)
    assert take_snapshot(resumed.buf) == take_snapshot(full)


# ----------------------------------------- 4: overlapping deltas, fencing, gaps


@settings(max_examples=200, deadline=None)
@given(served_events, batch_sizes, batch_sizes, st.integers(0, 70), st.integers(0, 70),
       st.booleans(), st.booleans())
@example(LWM_ENDED, [1, 2], [1], 6, 2, True, False)
@example(CORRUPT_INSIDE_ABORTED, [2, 2], [1, 1], 9, 1, True, True)
@example(STRAGGLERS, [3], [2], 8, 6, False, False)  # a gap: reload from the snapshot
def test_a_second_owner_overlapping_the_first_changes_no_answer(
        log, cuts_a, cuts_b, death, snap_at, a_publishes_last, via_messages):
    """Owner A (generation 10) folds ``death`` records and dies, having snapshotted
    after ``snap_at`` of them and maybe not published its last batch; owner B
    (generation 20) restores that snapshot and re-folds the rest. A reader applies
    A's deltas, then B's (overlapping them); where B's first delta leaves a gap (the
    snapshot is past what A published) the reader reloads from the snapshot."""
    records = [to_served_record(e) for e in log]
    n = len(records)
    death %= n + 1
    snap_at %= death + 1
    a = Owner(records, "a", 10, via_messages=via_messages)
    pts = publish_points(0, death - 1, cuts_a)
    if not a_publishes_last:
        pts = pts[:-1]
    a_deltas, snap = [], None
    for p in [*pts, death - 1]:
        if snap is None and snap_at - 1 <= p:
            a.fold_to(snap_at - 1)
            snap = TransactionBufferSnapshot.decode(
                take_snapshot(a.buf, 0, a.generation, -1).encode())
        a.fold_to(p)
        if p in pts:
            a_deltas.append(roundtrip(a.publish()))
    assert snap is not None and snap.position == snap_at - 1

    b = Owner(records, "b", 20, buf=restore(snap), via_messages=not via_messages)
    b_deltas = []
    for p in publish_points(snap_at, n - 1, cuts_b):
        b.fold_to(p)
        b_deltas.append(roundtrip(b.publish()))

    view = BufferView(TP)
    for d in a_deltas:
        assert view.apply(d)
    pa = view.position
    refs: dict[int, TransactionBuffer] = {}
    for i, d in enumerate(b_deltas):
        if i == 0:
            event("gap: reload from the snapshot" if d.from_position > pa + 1
                  else "overlap" if d.from_position <= pa else "contiguous")
        if i == 0 and d.from_position > pa + 1:
            before = (view.position, view.generation, view_answers(view, records))
            assert not view.apply(d)  # a gap: refused, nothing changed
            assert (view.position, view.generation, view_answers(view, records)) == before
            assert view.fenced == 0
            view = BufferView.from_snapshot(snap)
        assert view.apply(d)
        assert view.generation == 20
        at = max(pa, d.position)
        assert view.position == at
        ref = refs.setdefault(at, fold_ref(records, at))
        assert view.max_read_position == ref.max_read_position
        assert view_answers(view, records) == ref_answers(ref, n), f"after B's delta {i}"

    final = view_answers(view, records)
    assert final == ref_answers(fold_ref(records, n - 1), n)
    for d in b_deltas:  # again: idempotent
        assert view.apply(d)
    assert view_answers(view, records) == final
    for k, d in enumerate(a_deltas, 1):  # the old owner again: fenced
        assert not view.apply(d)
        assert view.fenced == k
    assert view_answers(view, records) == final and view.generation == 20
    only_b = BufferView.from_snapshot(snap)
    for d in b_deltas:
        assert only_b.apply(d)
    assert view_answers(only_b, records) == final


def _delta(gen, frm, pos, mrp, hidden=(), aborted=()):
    return BufferStateRecord(BufferStateKind.DELTA, "m", gen, TP.topic, TP.partition, frm, pos,
                             mrp, tuple(hidden), tuple(aborted))


def test_a_delta_of_a_lower_generation_is_refused_and_counted():
    view = BufferView(TP)
    assert view.apply(_delta(5, 0, 9, 9, hidden=[3], aborted=[(T00, 4, 6)]))
    before = (view.position, view.max_read_position, set(view.hidden), dict(view.aborted))
    assert not view.apply(_delta(4, 10, 20, 20, hidden=[12], aborted=[(T01, 13, 14)]))
    assert view.fenced == 1
    assert not view.apply(_delta(4, 0, 9, 9))
    assert view.fenced == 2 and view.generation == 5
    assert (view.position, view.max_read_position, set(view.hidden), dict(view.aborted)) == before
    assert view.apply(_delta(5, 10, 12, 12, hidden=[12]))  # same generation: fine
    assert view.apply(_delta(6, 5, 14, 14))  # newer, overlapping: fine
    assert view.fenced == 2 and view.generation == 6 and view.position == 14


def test_a_delta_that_leaves_a_gap_is_refused():
    view = BufferView(TP)
    assert not view.apply(_delta(1, 1, 5, 5, hidden=[2]))  # a fresh view has nothing: 0 next
    assert view.position == -1 and not view.hidden and view.fenced == 0
    assert view.apply(_delta(1, 0, 5, 5, hidden=[2]))
    assert not view.apply(_delta(1, 7, 9, 9, hidden=[8]))  # 6 missing
    assert not view.apply(_delta(2, 7, 9, 9, hidden=[8]))  # newer owner, still a gap
    assert view.position == 5 and view.hidden == {2} and view.generation == 1
    assert view.fenced == 0
    assert view.apply(_delta(1, 6, 9, 9, hidden=[8]))
    assert view.position == 9 and view.hidden == {2, 8}


# ------------------------------------------------------------------- 5: trim


@settings(max_examples=150, deadline=None)
@given(served_events, batch_sizes, st.lists(st.integers(0, 70), max_size=16), st.booleans())
@example(CORRUPT_INSIDE_ABORTED, [1] * 10, [0, 0, 2, 3, 3, 5, 7, 7, 9, 11], False)
@example(LWM_ENDED, [1, 1, 1, 1], [1, 3, 4], True)
def test_trim_forgets_only_what_is_below_the_trim_point(log, cuts, trims, behind_only):
    """A reader trims as it goes: answers at or above the trim point never change (vs
    an untrimmed view and the reference), and nothing below it is kept."""
    records = [to_served_record(e) for e in log]
    n = len(records)
    owner = Owner(records)
    trimmed, untrimmed = BufferView(TP), BufferView(TP)
    for i, p in enumerate(publish_points(0, n - 1, cuts)):
        owner.fold_to(p)
        d = owner.publish()
        assert trimmed.apply(d) and untrimmed.apply(d)
        if i < len(trims):
            k = trims[i]
            if behind_only:  # a reader trims below what it may deliver
                k = min(k, trimmed.max_read_position + 1)
            before = view_answers(trimmed, records, lo=k)
            trimmed.trim(k)
            assert view_answers(trimmed, records, lo=k) == before
        lo = trimmed.trimmed_below
        assert all(o >= lo for o in trimmed.hidden)
        assert all(last >= lo for _, last in trimmed.aborted.values())
        assert len(trimmed.hidden) + len(trimmed.aborted) <= \
            len({o for o in untrimmed.hidden if o >= lo}) + \
            len([s for s in untrimmed.aborted.values() if s[1] >= lo])
        assert view_answers(trimmed, records, lo=lo) == view_answers(untrimmed, records, lo=lo)
        assert view_answers(trimmed, records, lo=lo) == \
            ref_answers(fold_ref(records, p), n, lo=lo)


@pytest.mark.slow
def test_a_view_trimmed_as_it_goes_stays_bounded_over_200k_txns():
    """Bounded state: 200,000 committed 10-record txns (one in 50 aborted instead), 2.2M
    records: the view holds the markers and aborted txns above its trim point, never the
    committed records."""
    txns, per_txn, batch_txns, lag = 200_000, 10, 1_000, 3_000
    owner = TransactionBuffer(TP)
    owner.journal = Journal()
    view = BufferView(TP)
    markers: list[int] = []
    aborted_last: list[int] = []
    off, frm, max_sizes = 0, 0, (0, 0)
    for start in range(0, txns, batch_txns):
        recs = []
        for i in range(start, start + batch_txns):
            t = TxnID(3, i)
            h = [(TXN_ID_HEADER, t.to_bytes())]
            recs.extend(_Msg(off + j, h, b"x") for j in range(per_txn))
            off += per_txn
            kind = MarkerKind.ABORT if i % 50 == 7 else MarkerKind.COMMIT
            if kind is MarkerKind.ABORT:
                aborted_last.append(off - 1)
            m = TxnMarker(t, kind, i)  # the TC's LWM moves with it, as it does live
            recs.append(_Msg(off, m.headers(), m.encode()))
            markers.append(off)
            off += 1
        owner.fold_messages(recs)
        d = take_delta(owner, "a", 1, frm, 0, NOW_MS)
        frm = owner.last_offset + 1
        assert view.apply(d)
        assert view.position == view.max_read_position == off - 1
        for o in (off - 1, off - 2, off - 12, aborted_last[-1], markers[-1]):  # spot checks
            assert view.visible(o, raw_of(recs[o - recs[0].offset()].headers())) == \
                owner.is_visible(o)
        below = view.max_read_position + 1 - lag  # the reader lags `lag` records
        view.trim(below)
        owner.trim(below)  # the owner trims below the log start likewise
        floor = view.trimmed_below
        assert len(view.hidden) <= len(markers) - bisect.bisect_left(markers, floor)
        assert len(view.aborted) <= len(aborted_last) - bisect.bisect_left(aborted_last, floor)
        max_sizes = (max(max_sizes[0], len(view.hidden)), max(max_sizes[1], len(view.aborted)))
    assert off == txns * (per_txn + 1)
    # a batch of markers plus the lag: never the 2M committed records
    assert max_sizes[0] <= batch_txns + lag // (per_txn + 1) + 1
    assert max_sizes[1] <= (batch_txns * (per_txn + 1) + lag) // (50 * (per_txn + 1)) + 2
    assert len(view._hidden_order) == len(view.hidden)
    assert len(view._aborted_order) == len(view.aborted)
    assert view.stats(NOW_MS).ongoing == 0 and view.stats(NOW_MS).blocking_txn is None
