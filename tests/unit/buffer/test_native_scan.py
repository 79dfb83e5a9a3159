"""The native scan and the Python path give the same runs, and every way to fold gives one state.

``txnstream._native.coalesce`` runs the C rules of the owner's scan on records given from
Python; :func:`txnstream.buffer.runs.runs_of` is the pure-Python fallback. On generated
logs (plain, members of txns, forged claims, copied tags, user headers, null values,
markers genuine and forged, corrupt ids, recreated offsets with gaps, partitions
interleaved) both give the same entries, and folding those entries gives the state
folding the records one by one gives.
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
from txnstream.types import TopicPartition, TxnID

NATIVE = native_scan()
SIGNER = MarkerSigner.from_secret("the workers' secret", "cluster-A")
FORGER = MarkerSigner.from_secret("another secret", "cluster-A")
assert SIGNER.membership is not None and FORGER.membership is not None
TOPICS = ("orders", "payments")

txn_ids = st.builds(TxnID, st.integers(0, 1), st.integers(0, 4))
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
