"""Direct cases of the fold rules, each named for what it protects."""

import pytest

from txnstream.buffer import TransactionBuffer, TransactionBufferSnapshot, Verdict, take_snapshot
from txnstream.errors import CorruptRecordError
from txnstream.markers import TXN_ID_HEADER, TXN_MARKER_HEADER, MarkerKind, TxnMarker
from txnstream.types import TopicPartition, TxnID

TP = TopicPartition("t", 0)


def h(t: TxnID):
    return [(TXN_ID_HEADER, t.to_bytes())]


def test_open_txn_holds_back_later_plain_records_and_stats_name_it():
    b = TransactionBuffer(TP)
    a = TxnID(1, 7)
    b.fold(0, None)
    b.fold(1, h(a), timestamp_ms=1_000)
    b.fold(2, None)
    assert [o for o in range(3) if b.is_visible(o)] == [0]
    st = b.stats(now_ms=4_000)
    assert st.blocking_txn == a and st.blocking_offset == 1 and st.blocked_for_s == 3.0
    m = TxnMarker(a, MarkerKind.COMMIT, 7)
    b.fold(3, m.headers(), m.encode())
    assert [o for o in range(4) if b.is_visible(o)] == [0, 1, 2]
    assert b.stats().blocking_txn is None


def test_corrupt_records_change_nothing_else():
    b = TransactionBuffer(TP)
    a = TxnID(0, 1)
    b.fold(0, h(a))
    before = take_snapshot(b)
    assert b.fold(1, [(TXN_ID_HEADER, b"bad")]) is Verdict.CORRUPT
    assert b.fold(2, [(TXN_MARKER_HEADER, b"COMMIT"), (TXN_ID_HEADER, a.to_bytes())],
                  b"not avro") is Verdict.CORRUPT
    after = take_snapshot(b)
    assert (after.ongoing, after.aborted, after.lwms, after.ended) == (
        before.ongoing, before.aborted, before.lwms, before.ended)
    assert not b.is_visible(1) and not b.is_visible(2)


def test_second_marker_does_not_change_the_first_outcome():
    b = TransactionBuffer(TP)
    a = TxnID(0, 3)
    b.fold(0, h(a))
    for off, kind in ((1, MarkerKind.COMMIT), (2, MarkerKind.ABORT)):
        m = TxnMarker(a, kind, 0)
        b.fold(off, m.headers(), m.encode())
    assert b.is_visible(0)


def test_lwm_ends_older_ongoing_txns_of_that_tc_only():
    b = TransactionBuffer(TP)
    old0, old1, new0 = TxnID(0, 1), TxnID(1, 1), TxnID(0, 5)
    b.fold(0, h(old0))
    b.fold(1, h(old1))
    m = TxnMarker(new0, MarkerKind.COMMIT, 5)
    b.fold(2, m.headers(), m.encode())
    assert old0 not in b.ongoing_txns() and old1 in b.ongoing_txns()
    assert b.aborted_in_range(0, 3) == {old0}
    assert b.fold(3, h(old0)) is Verdict.STRAGGLER


def test_unknown_txn_marker_is_tolerated():
    b = TransactionBuffer(TP)
    m = TxnMarker(TxnID(0, 99), MarkerKind.COMMIT, 0)
    assert b.fold(0, m.headers(), m.encode()) is Verdict.MARKER
    b.fold(1, None)
    assert [o for o in range(2) if b.is_visible(o)] == [1]


def test_out_of_order_fold_is_refused():
    b = TransactionBuffer(TP)
    b.fold(5, None)
    with pytest.raises(ValueError, match="out of order"):
        b.fold(5, None)


def test_snapshot_garbage_is_a_corrupt_record_error():
    with pytest.raises(CorruptRecordError):
        TransactionBufferSnapshot.decode(b"\x01garbage")
