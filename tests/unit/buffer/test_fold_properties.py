"""Property tests: the buffer fold against an obviously-correct reference over whole logs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from txnstream.buffer import TransactionBuffer, restore, take_snapshot
from txnstream.markers import TXN_ID_HEADER, MarkerKind, TxnMarker
from txnstream.types import TopicPartition, TxnID

TP = TopicPartition("t", 0)
txn_ids = st.builds(TxnID, st.integers(0, 1), st.integers(0, 5))
events = st.lists(st.one_of(
    st.just(("plain",)),
    st.tuples(st.just("txn"), txn_ids),
    st.tuples(st.just("txn"), txn_ids),
    st.tuples(st.just("marker"), txn_ids, st.sampled_from(list(MarkerKind)), st.integers(0, 6)),
), max_size=60)


def to_record(e):
    if e[0] == "plain":
        return None, None
    if e[0] == "txn":
        return [(TXN_ID_HEADER, e[1].to_bytes())], b"x"
    m = TxnMarker(e[1], e[2], e[3])
    return m.headers(), m.encode()


def fold(log, buf=None, start=0):
    buf = buf or TransactionBuffer(TP)
    for off in range(start, len(log)):
        headers, value = to_record(log[off])
        buf.fold(off, headers, value)
    return buf


def reference(log):
    """Visible offsets once the whole log is known; and the max read position."""
    def ends(e, t):
        return e[0] == "marker" and (e[1] == t or (e[1].tc_id == t.tc_id and e[3] > t.least_bits))

    fate, first = {}, {}
    for o, e in enumerate(log):
        if e[0] != "txn":
            continue
        t = e[1]
        if any(ends(log[p], t) for p in range(o)):
            fate[o] = "straggler"
            continue
        first.setdefault(t, o)
        later = next((log[p] for p in range(o + 1, len(log)) if ends(log[p], t)), None)
        if later is None:
            fate[o] = "ongoing"
        elif later[1] == t:
            fate[o] = later[2].value
        else:
            fate[o] = "ABORT"
    ongoing_first = [first[log[o][1]] for o, f in fate.items() if f == "ongoing"]
    mrp = min(ongoing_first) - 1 if ongoing_first else len(log) - 1
    visible = {o for o, e in enumerate(log) if o <= mrp and
               (e[0] == "plain" or (e[0] == "txn" and fate[o] == "COMMIT"))}
    return visible, mrp


@settings(max_examples=300, deadline=None)
@given(events)
def test_fold_matches_reference(log):
    buf = fold(log)
    visible, mrp = reference(log)
    assert buf.max_read_position == mrp
    assert {o for o in range(len(log)) if buf.is_visible(o)} == visible


@settings(max_examples=200, deadline=None)
@given(events)
def test_nothing_beyond_mrp_and_nothing_retracted(log):
    buf = TransactionBuffer(TP)
    shown: set[int] = set()
    for off, e in enumerate(log):
        headers, value = to_record(e)
        buf.fold(off, headers, value)
        now = {o for o in range(off + 1) if buf.is_visible(o)}
        assert all(o <= buf.max_read_position for o in now)
        assert shown <= now, f"retracted {shown - now}"
        shown = now
        markers = {o for o in range(off + 1) if log[o][0] == "marker"}
        assert not (now & markers)


@settings(max_examples=200, deadline=None)
@given(events, st.integers(0, 60))
def test_snapshot_plus_replay_equals_full_fold(log, cut):
    cut = min(cut, len(log))
    head = fold(log[:cut])
    snap = take_snapshot(head)
    resumed = fold(log, restore(type(snap).decode(snap.encode())), start=cut)
    full = fold(log)
    assert take_snapshot(resumed) == take_snapshot(full)
    assert all(resumed.is_visible(o) == full.is_visible(o) for o in range(len(log)))


class _Msg:
    """A record as confluent-kafka's ``Message`` shows it."""

    __slots__ = ("_o", "_h", "_v")

    def __init__(self, offset, headers, value):
        self._o, self._h, self._v = offset, headers, value

    def offset(self):
        return self._o

    def headers(self):
        return self._h

    def value(self):
        return self._v

    def timestamp(self):
        return (1, 1000 + self._o)


richer_events = st.lists(st.one_of(
    st.just(("plain",)),
    st.tuples(st.just("txn"), txn_ids),
    st.tuples(st.just("txn"), txn_ids),
    st.tuples(st.just("txn"), txn_ids),
    st.tuples(st.just("txn+user"), txn_ids),
    st.tuples(st.just("corrupt"), st.binary(max_size=20)),
    st.tuples(st.just("marker"), txn_ids, st.sampled_from(list(MarkerKind)), st.integers(0, 6)),
), max_size=80)


def to_rich_record(e):
    if e[0] == "txn+user":
        return [("user", b"u"), (TXN_ID_HEADER, e[1].to_bytes())], b"x"
    if e[0] == "corrupt":
        return [(TXN_ID_HEADER, e[1])], b"x"
    return to_record(e)


@settings(max_examples=300, deadline=None)
@given(richer_events, st.lists(st.integers(1, 10), max_size=10))
def test_fold_messages_equals_fold_one_by_one(log, cuts):
    records = [_Msg(o, *to_rich_record(e)) for o, e in enumerate(log)]
    one = TransactionBuffer(TP)
    for m in records:
        ts = m.timestamp()[1]
        one.fold(m.offset(), m.headers(), m.value(), ts)
    many = TransactionBuffer(TP)
    i = 0
    for c in [*cuts, len(records)]:  # in chunks, each re-delivering part of the last
        many.fold_messages(records[max(0, i - 2):i + c])
        i += c
    assert take_snapshot(many) == take_snapshot(one)
    assert many.invisible == one.invisible
    assert many.max_read_position == one.max_read_position
    assert many.last_offset == one.last_offset
    assert {t: (e.first_offset, e.offsets, e.first_timestamp_ms)
            for t, e in many.ongoing.items()} == {
        t: (e.first_offset, e.offsets, e.first_timestamp_ms) for t, e in one.ongoing.items()}
