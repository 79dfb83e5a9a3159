"""Pending-ack conflict rules and what commit/abort do to the cursor."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txnstream.errors import CorruptRecordError, InvalidTxnStatusError, TransactionConflictError
from txnstream.pendingack.handle import PendingAckHandle
from txnstream.pendingack.records import PendingAckEntry, PendingAckKind
from txnstream.types import TopicPartition, TxnID

TP = TopicPartition("in", 0)
A, B = TxnID(0, 1), TxnID(1, 1)


def h(cursor=0):
    return PendingAckHandle("job", TP, cursor)


def test_individual_vs_individual():
    x = h()
    x.ack_individual([3], A)
    x.ack_individual([3], A)                    # same txn: no-op
    with pytest.raises(TransactionConflictError, match=r"offset 3.*\(0,1\)"):
        x.ack_individual([3], B)
    x.ack_individual([4], B)                    # other offsets are fine


def test_cumulative_covering_pending_individual_and_the_reverse():
    x = h()
    x.ack_individual([5], A)
    with pytest.raises(TransactionConflictError):
        x.ack_cumulative(7, B)
    y = h()
    y.ack_cumulative(7, A)
    with pytest.raises(TransactionConflictError):
        y.ack_individual([6], B)
    with pytest.raises(TransactionConflictError):
        y.ack_cumulative(9, B)                  # one pending cumulative at a time
    y.ack_individual([8], B)                    # beyond A's range: fine


def test_plain_ack_vs_pending():
    x = h()
    x.ack_individual([2], A)
    with pytest.raises(TransactionConflictError, match="plain ack"):
        x.ack_individual([2], None)
    with pytest.raises(TransactionConflictError):
        x.ack_cumulative(4, None)


def test_txn_ack_of_acked_offset_conflicts_plain_repeat_is_ignored():
    x = h()
    x.ack_individual([0, 1], None)
    assert x.cursor == 2
    x.ack_individual([1], None)
    with pytest.raises(TransactionConflictError, match="has been acked"):
        x.ack_individual([1], A)
    with pytest.raises(TransactionConflictError):
        x.ack_cumulative(1, A)


def test_ack_after_end_is_refused():
    x = h()
    x.ack_individual([1], A)
    x.commit(A)
    with pytest.raises(InvalidTxnStatusError, match="COMMITTED"):
        x.ack_individual([2], A)
    x.abort(B)
    with pytest.raises(InvalidTxnStatusError, match="ABORTED"):
        x.ack_cumulative(5, B)


def test_commit_advances_cursor_over_contiguous_and_keeps_gaps():
    x = h()
    x.ack_individual([0, 1, 3], A)
    eff = x.commit(A)
    assert eff.cursor == 2 and x.acked == {3}
    x.ack_individual([2], B)
    assert x.commit(B).cursor == 4 and x.acked == set()
    assert x.commit(B).cursor == 4               # idempotent


def test_abort_redelivers_and_leaves_cursor():
    x = h(cursor=10)
    x.ack_individual([12], A)
    x.ack_cumulative(11, B)
    eff = x.abort(B)
    assert eff.cursor == 10 and eff.redeliver == (10, 11)
    eff = x.abort(A)
    assert eff.redeliver == (12,) and x.is_deliverable(12)
    assert x.lowest_held() is None


def test_stale_generation_acks_are_ignored_on_replay():
    x = h()
    x.apply(PendingAckEntry(PendingAckKind.OWNER, "job", "in", 0, generation=1, cursor=0))
    assert x.apply(PendingAckEntry(PendingAckKind.ACK_INDIVIDUAL, "job", "in", 0, A, (4,), 1))
    x.apply(PendingAckEntry(PendingAckKind.OWNER, "job", "in", 0, generation=2, cursor=0))
    late = PendingAckEntry(PendingAckKind.ACK_INDIVIDUAL, "job", "in", 0, B, (5,), 1)
    assert not x.apply(late)
    assert x.pending == {4: A}
    x.apply(PendingAckEntry.mark(PendingAckKind.COMMIT_MARK, "job", TP, A))
    assert x.acked == {4} and x.pending == {}


ops = st.lists(st.tuples(st.sampled_from(["ind", "cum", "commit", "abort"]),
                         st.sampled_from([A, B, TxnID(0, 2)]), st.integers(0, 12)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_replaying_the_log_rebuilds_the_live_state(seq):
    live = h()
    log = [PendingAckEntry(PendingAckKind.OWNER, "job", "in", 0, generation=1, cursor=0)]
    live.apply(log[0])
    for op, txn, off in seq:
        try:
            if op == "ind":
                live.ack_individual([off], txn)
                log.append(PendingAckEntry(PendingAckKind.ACK_INDIVIDUAL, "job", "in", 0,
                                           txn, (off,), 1))
            elif op == "cum":
                live.ack_cumulative(off, txn)
                log.append(PendingAckEntry(PendingAckKind.ACK_CUMULATIVE, "job", "in", 0,
                                           txn, (off,), 1))
            else:
                kind = PendingAckKind.COMMIT_MARK if op == "commit" else PendingAckKind.ABORT_MARK
                (live.commit if op == "commit" else live.abort)(txn)
                log.append(PendingAckEntry.mark(kind, "job", TP, txn))
        except (TransactionConflictError, InvalidTxnStatusError):
            pass  # refused acks are never logged
    again = h()
    for e in log:
        again.apply(PendingAckEntry.decode(e.encode()))
    assert (again.cursor, again.acked, again.pending, again.cumulative) == (
        live.cursor, live.acked, live.pending, live.cumulative)


def test_garbage_entry_is_corrupt():
    with pytest.raises(CorruptRecordError):
        PendingAckEntry.decode(b"\x01\x99\x99")
