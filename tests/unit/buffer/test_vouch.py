"""The buffer owner's answer to a txn that stays ongoing: what its coordinator says."""

import pytest

from txnstream.buffer.vouch import Action, TxnAnswer, judge
from txnstream.types import TopicPartition, TxnID, TxnStatus

TP = TopicPartition("orders", 0)
T = TxnID(1, 40)


@pytest.mark.parametrize("status", [TxnStatus.OPEN, TxnStatus.COMMITTING, TxnStatus.ABORTING])
def test_a_live_txn_is_left_to_end_by_itself(status):
    for parts in (frozenset(), frozenset({TP})):  # its registration may be in flight
        assert judge(TP, T, TxnAnswer(status, parts))[0] is Action.KEEP


def test_a_txn_never_issued_is_forged():
    action, why = judge(TP, T, TxnAnswer(None, next_sequence=40))
    assert action is Action.ABORT and "never issued" in why


def test_a_forgotten_txn_with_no_marker_here_never_registered_here():
    action, why = judge(TP, T, TxnAnswer(None, next_sequence=41))
    assert action is Action.ABORT and "never registered" in why


def test_a_committed_txn_registered_here_gets_its_commit():
    assert judge(TP, T, TxnAnswer(TxnStatus.COMMITTED, frozenset({TP})))[0] is Action.COMMIT


def test_a_committed_txn_not_registered_here_never_shows_here():
    other = TopicPartition("orders", 1)
    assert judge(TP, T, TxnAnswer(TxnStatus.COMMITTED, frozenset({other})))[0] is Action.ABORT


def test_an_aborted_txn_is_aborted_here():
    assert judge(TP, T, TxnAnswer(TxnStatus.ABORTED, frozenset({TP})))[0] is Action.ABORT


def test_a_txn_of_a_coordinator_the_cluster_does_not_have_is_forged():
    action, why = judge(TP, TxnID(4_000, 7), TxnAnswer(None, no_coordinator=True))
    assert action is Action.ABORT and "does not exist" in why
