"""Every TxnStatus transition, allowed and refused (Pulsar's TransactionUtil table, and
PREPARED)."""

import itertools

import pytest

from txnstream.coordinator.meta import TxnMeta
from txnstream.errors import InvalidTxnStatusError
from txnstream.types import TxnID, TxnStatus

S = TxnStatus
ALLOWED = {
    (S.OPEN, S.OPEN), (S.OPEN, S.COMMITTING), (S.OPEN, S.ABORTING),
    (S.COMMITTING, S.COMMITTING), (S.COMMITTING, S.COMMITTED),
    (S.ABORTING, S.ABORTING), (S.ABORTING, S.ABORTED),
    (S.COMMITTED, S.COMMITTED), (S.ABORTED, S.ABORTED),
    # issue 39: OPEN -> PREPARED -> COMMITTING | ABORTING, never back to OPEN
    (S.OPEN, S.PREPARED), (S.PREPARED, S.PREPARED), (S.PREPARED, S.COMMITTING),
    (S.PREPARED, S.ABORTING),
}


@pytest.mark.parametrize("old,new", list(itertools.product(S, S)))
def test_transition_table(old, new):
    meta = TxnMeta(TxnID(0, 1), old, 0, 1000)
    assert old.can_transition_to(new) is ((old, new) in ALLOWED)
    if (old, new) in ALLOWED:
        meta.update_status(new, expected=old)
        assert meta.status is new
    else:
        with pytest.raises(InvalidTxnStatusError) as exc:
            meta.update_status(new)
        assert meta.status is old
        assert "(0,1)" in str(exc.value)


def test_wrong_expected_status_is_refused():
    meta = TxnMeta(TxnID(2, 9), S.COMMITTING, 0, 1000)
    with pytest.raises(InvalidTxnStatusError) as exc:
        meta.update_status(S.COMMITTED, expected=S.OPEN)
    assert exc.value.expected is S.OPEN and exc.value.actual is S.COMMITTING
    assert meta.status is S.COMMITTING


def test_partitions_join_only_open_txns():
    from txnstream.types import TopicPartition

    meta = TxnMeta(TxnID(0, 1), S.OPEN, 0, 1000)
    meta.add_partitions({TopicPartition("t", 0)})
    meta.update_status(S.ABORTING)
    with pytest.raises(InvalidTxnStatusError):
        meta.add_partitions({TopicPartition("t", 1)})
    assert meta.partitions == {TopicPartition("t", 0)}


def test_txnid_forms():
    t = TxnID(3, 42)
    assert str(t) == "(3,42)"
    assert TxnID.parse("(3,42)") == t == TxnID.parse(" ( 3 , 42 ) ") == TxnID.parse("3:42")
    assert TxnID.from_bytes(t.to_bytes()) == t and len(t.to_bytes()) == 16
    for bad in ("3,42", "(a,b)", ""):
        with pytest.raises(ValueError, match="not a TxnID"):
            TxnID.parse(bad)
    with pytest.raises(ValueError, match="16 bytes"):
        TxnID.from_bytes(b"short")
    with pytest.raises(ValueError, match="TC id"):
        TxnID(1 << 16, 0)
