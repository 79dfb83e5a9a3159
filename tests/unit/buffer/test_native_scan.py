"""The native scan and the Python path give the same runs, and every way to fold gives one state.

``txnstream._native.coalesce`` runs the C rules of the owner's scan on records given from
Python; :func:`txnstream.buffer.runs.runs_of` is the pure-Python fallback. On generated
logs (plain, members of txns, forged claims, copied tags, user headers, null values,
markers genuine and forged, corrupt ids, recreated offsets with gaps, partitions
interleaved, delay headers on plain records and on txn records) both give the same
entries, and folding those entries gives the state folding the records one by one gives.
A plain record with a delay header is in no headers-None run: its entry keeps its
headers, and only records with the same headers, byte for byte, join it.
"""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txnstream.buffer import TransactionBuffer
from txnstream.buffer.runs import runs_of
from txnstream.buffer.scan import native_scan
from txnstream.buffer.snapshot import take_snapshot
from txnstream.markers import TXN_ID_HEADER, TXN_TAG_HEADER, MarkerKind, MarkerSigner, TxnMarker
from txnstream.membership import txn_headers
from txnstream.message import DELIVER_AFTER_HEADER, DELIVER_AT_HEADER
from txnstream.types import TopicPartition, TxnID

NATIVE = native_scan()
SIGNER = MarkerSigner.from_secret("the workers' secret", "cluster-A")
FORGER = MarkerSigner.from_secret("another secret", "cluster-A")
assert SIGNER.membership is not None and FORGER.membership is not None
TOPICS = ("orders", "payments")

txn_ids = st.builds(TxnID, st.integers(0, 1), st.integers(0, 4))
delays = st.tuples(st.sampled_from([DELIVER_AT_HEADER, DELIVER_AFTER_HEADER]),
                   st.sampled_from([b"0", b"0", b"1", b"", None]))  # (name, value)
kinds = st.one_of(
    st.just(("plain",)), st.just(("plain+user",)),
    st.tuples(st.just("member"), txn_ids), st.tuples(st.just("member"), txn_ids),
    st.tuples(st.just("member+user"), txn_ids),
    st.tuples(st.just("claim"), txn_ids),  # a txn.id without its tag: junk, or legacy
    st.tuples(st.just("copied"), txn_ids),  # the tag of another partition
    st.tuples(st.just("corrupt"), st.binary(max_size=20)),
    st.tuples(st.just("null"), txn_ids),  # a header with a null value
    st.tuples(st.just("marker"), txn_ids, st.sampled_from(list(MarkerKind)), st.integers(0, 5)),
    st.tuples(st.just("forged"), txn_ids, st.sampled_from(list(MarkerKind))),
    st.tuples(st.just("delayed"), delays), st.tuples(st.just("delayed"), delays),
    st.tuples(st.just("delayed+user"), delays),  # the delay header after a user's
    st.tuples(st.just("member+delay"), txn_ids, delays),
)
# (partition, gap before it, kind): offsets of a partition rise, with gaps
logs = st.lists(st.tuples(st.integers(0, 2), st.sampled_from([0, 0, 0, 1, 3]), kinds),
                max_size=120)


def tp_of(p: int) -> TopicPartition:
    return TopicPartition(TOPICS[p % 2], p)


def record(tp: TopicPartition, k: tuple) -> tuple[list | None, bytes | None]:  # type: ignore[type-arg]
    keys = SIGNER.membership
    assert keys is not None
    match k[0]:
        case "plain":
            return None, b"p"
        case "plain+user":
            return [("user", b"u"), ("empty", b"")], b"p"
        case "member":
            return txn_headers(k[1], keys.txn_key(k[1]), tp.topic, tp.partition), b"x"
        case "member+user":
            return [*txn_headers(k[1], keys.txn_key(k[1]), tp.topic, tp.partition),
                    ("user", b"u")], b"x"
        case "claim":
            return [(TXN_ID_HEADER, k[1].to_bytes())], b"x"
        case "copied":
            return txn_headers(k[1], keys.txn_key(k[1]), tp.topic, tp.partition + 1), b"x"
        case "corrupt":
            return [(TXN_ID_HEADER, k[1])], b"x"
        case "null":
            return [(TXN_ID_HEADER, k[1].to_bytes()), (TXN_TAG_HEADER, None)], b"x"
        case "delayed":
            return [k[1]], b"d"
        case "delayed+user":
            return [("user", b"u"), k[1]], b"d"
        case "member+delay":
            return [*txn_headers(k[1], keys.txn_key(k[1]), tp.topic, tp.partition), k[2]], b"x"
        case "marker" | "forged":
            m = TxnMarker(k[1], k[2], k[3] if k[0] == "marker" else 0)
            v = m.encode()
            signer = SIGNER if k[0] == "marker" else FORGER
            return list(signer.headers(m, tp.topic, tp.partition, v)), v
    raise AssertionError(k)


def build(log) -> list[tuple]:  # type: ignore[no-untyped-def,type-arg]
    """``(topic, partition, offset, headers, value, timestamp)`` records, partitions mixed."""
    nxt: dict[int, int] = {}
    out = []
    for p, gap, k in log:
        off = nxt.get(p, 0) + gap
        nxt[p] = off + 1
        tp = tp_of(p)
        headers, value = record(tp, k)
        out.append((tp.topic, tp.partition, off, headers, value, 1000 + off))
    return out


class Msg:
    """A record as confluent-kafka's ``Message`` shows it."""

    def __init__(self, r: tuple) -> None:  # type: ignore[type-arg]
        self.r = r

    def offset(self) -> int:
        return self.r[2]

    def headers(self):  # type: ignore[no-untyped-def]
        return self.r[3]

    def value(self):  # type: ignore[no-untyped-def]
        return self.r[4]

    def timestamp(self) -> tuple[int, int]:
        return (1, self.r[5])


def python_runs(records: list[tuple]) -> list[tuple]:  # type: ignore[type-arg]
    """runs_of over each stretch of one partition, as the scan cuts at a partition change."""
    out = []
    for (topic, part), group in itertools.groupby(records, key=lambda r: (r[0], r[1])):
        out += runs_of([Msg(r) for r in group], topic, part)
    return out


def fresh(tp: TopicPartition, legacy_until: int) -> TransactionBuffer:
    return TransactionBuffer(tp, signer=SIGNER, legacy_until=legacy_until)


def assert_same(a: TransactionBuffer, b: TransactionBuffer) -> None:
    assert take_snapshot(a) == take_snapshot(b)
    assert a.invisible == b.invisible
    assert (a.last_offset, a.max_read_position) == (b.last_offset, b.max_read_position)
    assert (a.junk, a.forged) == (b.junk, b.forged)
    assert a.ongoing_txns() == b.ongoing_txns()


# Only TXNSTREAM_NATIVE=0 (the pure-Python path on purpose) skips the C side: a build
# that failed must fail these tests, not skip them.
needs_native = pytest.mark.skipif(os.environ.get("TXNSTREAM_NATIVE") == "0",
                                  reason="TXNSTREAM_NATIVE=0: the pure-Python path only")


def test_the_native_scan_is_built_and_loads():
    if os.environ.get("TXNSTREAM_NATIVE") != "0":
        assert NATIVE is not None, "txnstream._native did not build or load (logged why)"


@needs_native
@settings(max_examples=400, deadline=None)
@given(logs)
def test_native_and_python_cut_the_same_runs(log):
    records = build(log)
    assert NATIVE.coalesce(records) == python_runs(records)


@settings(max_examples=300, deadline=None)
@given(logs, st.sampled_from([0, 0, 5, 20, -1]), st.lists(st.integers(1, 12), max_size=8))
def test_folding_runs_equals_folding_one_by_one(log, legacy_until, cuts):
    records = build(log)
    one: dict[TopicPartition, TransactionBuffer] = {}
    for topic, part, off, headers, value, ts in records:
        tp = TopicPartition(topic, part)
        buf = one.setdefault(tp, fresh(tp, legacy_until))
        is_marker = any(k == "txn.marker" for k, _ in headers or ())
        buf.fold(off, headers, value if is_marker else None, ts)
    cutters = [python_runs] + ([NATIVE.coalesce] if NATIVE is not None else [])
    for cut_runs in cutters:
        many: dict[TopicPartition, TransactionBuffer] = {}
        i = 0
        for c in [*cuts, len(records)]:  # in turns, each re-reading the last one's tail
            for e in cut_runs(records[max(0, i - 3):i + c]):
                tp = TopicPartition(e[0], e[1])
                many.setdefault(tp, fresh(tp, legacy_until)).fold_entries([e])
            i += c
        assert many.keys() == one.keys()
        for tp, buf in one.items():
            assert_same(many[tp], buf)


@needs_native
def test_a_long_txn_is_one_entry_and_a_marker_its_own():
    tp = tp_of(0)
    t = TxnID(0, 1)
    headers, _ = record(tp, ("member", t))
    mh, mv = record(tp, ("marker", t, MarkerKind.COMMIT, 0))
    recs = [(tp.topic, 0, o, headers, b"x", 5) for o in range(1000)]
    recs += [(tp.topic, 0, 1000, mh, mv, 6)] + [(tp.topic, 0, o, None, b"p", 7)
                                                 for o in range(1001, 1500)]
    got = NATIVE.coalesce(recs)
    assert [(e[2], e[3]) for e in got] == [(0, 999), (1000, 1000), (1001, 1499)]
    assert got[1][5] == mv and got[0][5] is None and got[2][4] is None
    buf = fresh(tp, 0)
    for e in got:
        buf.fold_entries([e])
    assert buf.is_visible(999) and not buf.is_visible(1000) and buf.max_read_position == 1499


@needs_native
@pytest.mark.parametrize("bad", [
    [("t", 0, 0)],
    [("t", 0, 0, "not a list", None, 1)],
    [("t", 0, 0, [("k", "str")], None, 1)],
    [("t", 0, 0, None, "str", 1)],
    [(b"t", 0, 0, None, None, 1)],
])
def test_coalesce_names_what_is_wrong_with_a_record(bad):
    with pytest.raises(TypeError, match="record|header"):
        NATIVE.coalesce(bad)


# ---- plain records with a delay header: exact entries ----
AT, AFTER = DELIVER_AT_HEADER, DELIVER_AFTER_HEADER
_T = TxnID(0, 1)
_KEYS = SIGNER.membership
MEMBER = txn_headers(_T, _KEYS.txn_key(_T), "orders", 0)
MARKER_H, MARKER_V = record(tp_of(0), ("marker", _T, MarkerKind.COMMIT, 0))

DELAY_CASES = {
    # name: ([(offset, headers)], [(first, last, headers of the entry)])
    "equal deliver.at values: one run keeping the headers": (
        [(0, [(AT, b"5")]), (1, [(AT, b"5")]), (2, [(AT, b"5")])],
        [(0, 2, [(AT, b"5")])]),
    "different deliver.at values: a run each": (
        [(0, [(AT, b"5")]), (1, [(AT, b"5")]), (2, [(AT, b"6")]), (3, [(AT, b"5")])],
        [(0, 1, [(AT, b"5")]), (2, 2, [(AT, b"6")]), (3, 3, [(AT, b"5")])]),
    "interleaved with plain records without a delay header": (
        [(0, None), (1, [("user", b"u")]), (2, [(AT, b"5")]), (3, [(AT, b"5")]),
         (4, None), (5, [(AT, b"5")]), (6, []), (7, None)],
        [(0, 1, None), (2, 3, [(AT, b"5")]), (4, 4, None), (5, 5, [(AT, b"5")]),
         (6, 7, None)]),
    "user headers beside the delay header: equal only in the same order": (
        [(0, [("user", b"u"), (AT, b"5")]), (1, [("user", b"u"), (AT, b"5")]),
         (2, [(AT, b"5"), ("user", b"u")]), (3, [(AT, b"5")]),
         (4, [("user", b"v"), (AT, b"5")]), (5, [("user", b"v"), (AT, b"5")])],
        [(0, 1, [("user", b"u"), (AT, b"5")]), (2, 2, [(AT, b"5"), ("user", b"u")]),
         (3, 3, [(AT, b"5")]), (4, 5, [("user", b"v"), (AT, b"5")])]),
    "deliver.after: its own name, not deliver.at's": (
        [(0, [(AFTER, b"500")]), (1, [(AFTER, b"500")]), (2, [(AT, b"500")]),
         (3, [(AFTER, b"501")])],
        [(0, 1, [(AFTER, b"500")]), (2, 2, [(AT, b"500")]), (3, 3, [(AFTER, b"501")])]),
    "a null, an empty and a set delay value differ": (
        [(0, [(AT, None)]), (1, [(AT, None)]), (2, [(AT, b"")]), (3, [(AT, b"")]),
         (4, [(AT, b"0")])],
        [(0, 1, [(AT, None)]), (2, 3, [(AT, b"")]), (4, 4, [(AT, b"0")])]),
    "a txn record with a delay header, then plain ones with the same delay header": (
        [(0, [*MEMBER, (AFTER, b"10")]), (1, [*MEMBER, (AFTER, b"10")]),
         (2, [(AFTER, b"10")]), (3, [(AFTER, b"10")]), (4, [*MEMBER, (AFTER, b"10")])],
        [(0, 1, [*MEMBER, (AFTER, b"10")]), (2, 3, [(AFTER, b"10")]),
         (4, 4, [*MEMBER, (AFTER, b"10")])]),
    "a txn record without, then a plain one with, a delay header": (
        [(0, MEMBER), (1, [*MEMBER, (AT, b"5")]), (2, [(AT, b"5")]), (3, None)],
        [(0, 0, MEMBER), (1, 1, [*MEMBER, (AT, b"5")]), (2, 2, [(AT, b"5")]),
         (3, 3, None)]),
    "an offset gap cuts a run of equal delayed records": (
        [(0, [(AT, b"5")]), (1, [(AT, b"5")]), (3, [(AT, b"5")])],
        [(0, 1, [(AT, b"5")]), (3, 3, [(AT, b"5")])]),
    "a marker between equal delayed records": (
        [(0, [(AT, b"5")]), (1, MARKER_H), (2, [(AT, b"5")]), (3, [(AT, b"5")])],
        [(0, 0, [(AT, b"5")]), (1, 1, MARKER_H), (2, 3, [(AT, b"5")])]),
}


@pytest.mark.parametrize("recs,want", DELAY_CASES.values(), ids=list(DELAY_CASES))
def test_a_plain_record_with_a_delay_header_runs_only_with_equal_headers(recs, want):
    records = [("orders", 0, off, h, MARKER_V if h is MARKER_H else b"v", 100)
               for off, h in recs]
    expected = [("orders", 0, first, last, h, MARKER_V if h is MARKER_H else None, 100)
                for first, last, h in want]
    got = runs_of([Msg(r) for r in records], "orders", 0)
    assert got == expected
    if os.environ.get("TXNSTREAM_NATIVE") != "0":
        assert NATIVE.coalesce(records) == expected


def test_equal_delayed_plain_records_of_other_timestamps_are_a_run_each():
    """A plain record's due time may count from its timestamp (txn.deliver.after, the
    bound), so a run of them has one; a txn's records run on whatever their timestamps."""
    txn_h = [*MEMBER, (AFTER, b"10")]
    records = [("orders", 0, 0, [(AT, b"5")], b"v", 100), ("orders", 0, 1, [(AT, b"5")], b"v", 100),
               ("orders", 0, 2, [(AT, b"5")], b"v", 101), ("orders", 0, 3, txn_h, b"v", 102),
               ("orders", 0, 4, txn_h, b"v", 103)]
    expected = [("orders", 0, 0, 1, [(AT, b"5")], None, 100),
                ("orders", 0, 2, 2, [(AT, b"5")], None, 101),
                ("orders", 0, 3, 4, txn_h, None, 102)]
    assert runs_of([Msg(r) for r in records], "orders", 0) == expected
    if os.environ.get("TXNSTREAM_NATIVE") != "0":
        assert NATIVE.coalesce(records) == expected


@needs_native
def test_equal_delayed_records_of_two_partitions_are_two_runs():
    h = [(AT, b"5")]
    records = [("orders", 0, 0, h, b"v", 1), ("orders", 0, 1, h, b"v", 1),
               ("orders", 2, 2, h, b"v", 1), ("payments", 2, 3, h, b"v", 1)]
    assert NATIVE.coalesce(records) == python_runs(records) == [
        ("orders", 0, 0, 1, h, None, 1), ("orders", 2, 2, 2, h, None, 1),
        ("payments", 2, 3, 3, h, None, 1)]


@needs_native
def test_a_long_run_of_delayed_records_is_one_entry():
    h = [("user", b"u"), (AT, b"1700000000000")]
    recs = [("orders", 0, o, list(h), b"x", 5) for o in range(1000)]
    recs += [("orders", 0, o, None, b"p", 6) for o in range(1000, 1200)]
    got = NATIVE.coalesce(recs)
    assert got == python_runs(recs) == [("orders", 0, 0, 999, h, None, 5),
                                        ("orders", 0, 1000, 1199, None, None, 6)]
