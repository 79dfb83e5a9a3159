"""Delayed records in the fold and the served state: due times from the log alone, bounded."""

from hypothesis import given, settings
from hypothesis import strategies as st

from txnstream.buffer import TransactionBuffer, TransactionBufferSnapshot, take_snapshot
from txnstream.buffer.delays import MAX_DELAYED_RUNS, DelayRuns, PendingDelays, delay_of
from txnstream.buffer.runs import runs_of
from txnstream.buffer.served import BufferStateRecord, BufferView, take_delta
from txnstream.buffer.snapshot import restore
from txnstream.buffer.transaction_buffer import Journal
from txnstream.delayed import MAX_DELAY_S
from txnstream.markers import TXN_ID_HEADER, MarkerKind, TxnMarker
from txnstream.message import DELIVER_AFTER_HEADER, DELIVER_AT_HEADER
from txnstream.types import TopicPartition, TxnID

TP = TopicPartition("t", 0)
A, B = TxnID(1, 7), TxnID(1, 8)


def at(ms):
    return [(DELIVER_AT_HEADER, str(ms).encode())]


def txn(t, *extra):
    return [(TXN_ID_HEADER, t.to_bytes()), *extra]


def marker(t, kind=MarkerKind.COMMIT):
    m = TxnMarker(t, kind, 0)
    return m.headers(), m.encode()


def test_a_plain_record_not_due_is_noted_with_its_time_and_one_due_is_not():
    b = TransactionBuffer(TP)
    b.fold(0, at(50_000), timestamp_ms=1_000)
    b.fold(1, at(500), timestamp_ms=1_000)  # already due when written
    b.fold(2, None, timestamp_ms=1_000)
    b.fold(3, [("k", b"v"), (DELIVER_AT_HEADER, b"junk")], timestamp_ms=1_000)
    assert list(b.delayed) == [(0, 0, 50_000)]
    assert b.is_visible(0)  # visibility is the fold's: the due time is the reader's


def test_a_txn_records_delay_counts_from_its_commit_marker():
    b = TransactionBuffer(TP)
    b.fold(0, txn(A, (DELIVER_AFTER_HEADER, b"3000")), timestamp_ms=1_000)
    b.fold(1, txn(A, (DELIVER_AT_HEADER, b"2000")), timestamp_ms=1_000)  # due before commit
    b.fold(2, txn(A, (DELIVER_AT_HEADER, b"90000")), timestamp_ms=1_000)
    assert not b.delayed  # not visible yet: nothing to defer
    h, v = marker(A)
    b.fold(3, h, v, timestamp_ms=10_000)
    assert list(b.delayed) == [(0, 0, 13_000), (2, 2, 90_000)]


def test_an_aborted_txns_delays_are_dropped():
    b = TransactionBuffer(TP)
    b.fold(0, txn(A, (DELIVER_AFTER_HEADER, b"3000")), timestamp_ms=1_000)
    h, v = marker(A, MarkerKind.ABORT)
    b.fold(1, h, v, timestamp_ms=2_000)
    assert not b.delayed and not b.is_visible(0)


def test_a_delay_beyond_the_bound_is_taken_as_the_bound():
    b = TransactionBuffer(TP)
    b.fold(0, at(10**15), timestamp_ms=1_000)
    assert list(b.delayed) == [(0, 0, 1_000 + MAX_DELAY_S * 1000)]


def test_runs_fold_to_the_same_delays_as_records_one_by_one():
    class Rec:
        def __init__(self, o, h, v=None, ts=1_000):
            self.o, self.h, self.v, self.ts = o, h, v, ts

        def offset(self):
            return self.o

        def headers(self):
            return self.h

        def value(self):
            return self.v

        def timestamp(self):
            return 1, self.ts

    hm, vm = marker(A)
    recs = [Rec(0, at(9_000)), Rec(1, at(9_000)), Rec(2, None), Rec(3, at(8_000)),
            *(Rec(o, txn(A, (DELIVER_AFTER_HEADER, b"500"))) for o in range(4, 9)),
            Rec(9, hm, vm, 5_000)]
    one = TransactionBuffer(TP)
    for r in recs:
        one.fold(r.o, r.h, r.v, r.ts)
    runs = TransactionBuffer(TP)
    runs.fold_entries(runs_of(recs, TP.topic, TP.partition))
    assert list(one.delayed) == list(runs.delayed) == [(0, 1, 9_000), (3, 3, 8_000),
                                                       (4, 8, 5_500)]


def test_a_snapshot_keeps_delays_of_visible_records_and_open_txns():
    b = TransactionBuffer(TP)
    b.fold(0, at(9_000), timestamp_ms=1_000)
    b.fold(1, txn(B, (DELIVER_AFTER_HEADER, b"700")), timestamp_ms=1_000)
    snap = take_snapshot(b)
    back = TransactionBufferSnapshot.decode(snap.encode())
    assert back == snap and back.delayed == ((0, 0, 9_000),)
    again = restore(back)
    h, v = marker(B)
    again.fold(2, h, v, timestamp_ms=4_000)
    b.fold(2, h, v, timestamp_ms=4_000)
    assert list(again.delayed) == list(b.delayed) == [(0, 0, 9_000), (1, 1, 4_700)]


def test_snapshot_below_the_log_start_drops_what_lies_below():
    b = TransactionBuffer(TP)
    b.fold(0, at(9_000), timestamp_ms=1_000)
    b.fold(1, at(9_500), timestamp_ms=1_000)
    assert take_snapshot(b, min_offset=1).delayed == ((1, 1, 9_500),)
    b.trim(1)
    assert list(b.delayed) == [(1, 1, 9_500)]


def test_a_delta_carries_new_delays_and_a_view_defers_by_them():
    b = TransactionBuffer(TP, journal=Journal())
    view = BufferView.from_snapshot(take_snapshot(b))
    b.fold(0, at(9_000), timestamp_ms=1_000)
    b.fold(1, None, timestamp_ms=1_000)
    d = take_delta(b, "m", 0, 0, 0, now_ms=2_000)
    d = BufferStateRecord.decode(d.encode())
    assert d.delayed == ((0, 0, 9_000),)
    assert view.apply(d) and view.apply(d)  # idempotent
    assert view.delays_in(0, 2, now_ms=2_000) == [(0, 0, 9_000)]
    assert view.delays_in(0, 2, now_ms=9_000) == []  # due
    view.trim(1)
    assert view.delays_in(0, 2, now_ms=2_000) == []


def test_the_owner_forgets_delays_long_due_when_it_publishes():
    b = TransactionBuffer(TP, journal=Journal())
    b.fold(0, at(9_000), timestamp_ms=1_000)
    take_delta(b, "m", 0, 0, 0, now_ms=9_000 + 300_001)
    assert not b.delayed and take_snapshot(b).delayed == ()


def test_delay_of_reads_either_header_and_ignores_junk():
    assert delay_of(at(5)) == (5, 0)
    assert delay_of([(DELIVER_AFTER_HEADER, b"7")]) == (0, 7)
    assert delay_of([(DELIVER_AT_HEADER, b"-5")]) is None
    assert delay_of([(DELIVER_AT_HEADER, None)]) is None
    assert delay_of([("x", b"1")]) is None and delay_of(None) is None


runs_st = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 5), st.integers(0, 50)),
                   max_size=80)


@settings(max_examples=300, deadline=None)
@given(runs_st, st.integers(2, 12))
def test_delay_runs_never_make_a_record_due_earlier_and_stay_bounded(adds, cap):
    runs = DelayRuns(cap=cap)
    want: dict[int, int] = {}
    for first, length, due in adds:
        runs.add(first, first + length, due)
        for o in range(first, first + length + 1):
            want[o] = max(want.get(o, 0), due)
        assert len(runs) <= cap
    got = list(runs)
    assert all(a[1] < b[0] for a, b in zip(got, got[1:], strict=False))  # disjoint, ordered
    for o, due in want.items():
        covering = [r for r in got if r[0] <= o <= r[1]]
        assert covering and covering[0][2] >= due
    for first, last, due in got:  # a run applied again (a delta read twice): no change
        runs.add(first, last, due)
    assert list(runs) == got


def test_delay_runs_without_the_cap_keep_each_time_exactly():
    runs = DelayRuns()
    for o in range(0, 100, 2):
        runs.add(o, o, 1_000 + o)
    assert len(runs) == 50 and runs.in_range(10, 15) == [(10, 10, 1_010), (12, 12, 1_012),
                                                         (14, 14, 1_014)]
    assert runs.in_range(10, 15, after_ms=1_011) == [(12, 12, 1_012), (14, 14, 1_014)]


def test_a_flood_of_delays_in_one_txn_stays_bounded():
    p = PendingDelays()
    for o in range(MAX_DELAYED_RUNS * 3):
        p.add(2 * o, 2 * o, o, 0)  # each its own time, not touching
    assert len(p.runs) <= MAX_DELAYED_RUNS
    resolved = p.resolve(0, 0)
    for o in range(0, MAX_DELAYED_RUNS * 3, 997):
        cover = [r for r in resolved if r[0] <= 2 * o <= r[1]]
        assert cover and cover[0][2] >= o
