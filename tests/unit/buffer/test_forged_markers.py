"""Markers count only if a worker of this cluster wrote them (issue 20 item 1).

A producer with write access to a data topic can write a record with ``txn.marker`` and
``txn.id`` headers. Before markers were signed, one forged ABORT with a huge LWM made
every later txn of that coordinator invisible on the partition, and a forged COMMIT
released an open txn's records before its coordinator decided.
"""

from txnstream.buffer import TransactionBuffer, Verdict
from txnstream.markers import (
    TXN_ID_HEADER,
    TXN_MAC_HEADER,
    TXN_TAG_HEADER,
    MarkerKind,
    MarkerSigner,
    TxnMarker,
)
from txnstream.types import TopicPartition, TxnID

TP = TopicPartition("orders", 3)
SIGNER = MarkerSigner.from_secret("the workers' secret", "cluster-A")


def h(t: TxnID, tp: TopicPartition = TP):
    """A member record's headers (with the txn's tag, as a txnstream writer sends them)."""
    assert SIGNER.membership is not None
    return [(TXN_ID_HEADER, t.to_bytes()), (TXN_TAG_HEADER, SIGNER.membership.tag(t, tp))]


def signed(m: TxnMarker, tp: TopicPartition = TP, signer: MarkerSigner = SIGNER):
    v = m.encode()
    return signer.headers(m, tp.topic, tp.partition, v), v


def test_a_forged_abort_with_a_huge_lwm_hides_nothing_and_ends_nothing():
    b = TransactionBuffer(TP, signer=SIGNER)
    a, later = TxnID(0, 5), TxnID(0, 9)
    b.fold(0, h(a))
    forged = TxnMarker(a, MarkerKind.ABORT, 1 << 40)
    assert b.fold(1, forged.headers(), forged.encode()) is Verdict.FORGED
    assert b.lwm.get(0, 0) == 0 and a in b.ongoing_txns()
    b.fold(2, h(later))
    hdrs, v = signed(TxnMarker(a, MarkerKind.COMMIT, 5))
    assert b.fold(3, hdrs, v) is Verdict.MARKER
    hdrs, v = signed(TxnMarker(later, MarkerKind.COMMIT, 5))
    b.fold(4, hdrs, v)
    assert [o for o in range(5) if b.is_visible(o)] == [0, 2]
    assert b.forged == 1


def test_a_forged_commit_does_not_release_an_open_txn():
    b = TransactionBuffer(TP, signer=SIGNER)
    a = TxnID(2, 1)
    b.fold(0, h(a))
    forged = TxnMarker(a, MarkerKind.COMMIT, 0)
    hdrs = [*forged.headers(), (TXN_MAC_HEADER, b"\0" * 16)]
    assert b.fold(1, hdrs, forged.encode()) is Verdict.FORGED
    assert not b.is_visible(0) and b.max_read_position == -1
    assert a in b.ongoing_txns()


def test_a_marker_copied_to_another_partition_or_cluster_does_not_count():
    a = TxnID(0, 1)
    m = TxnMarker(a, MarkerKind.ABORT, 0)
    hdrs, v = signed(m, TopicPartition("orders", 4))  # signed for partition 4
    b = TransactionBuffer(TP, signer=SIGNER)
    b.fold(0, h(a))
    assert b.fold(1, hdrs, v) is Verdict.FORGED
    other = MarkerSigner.from_secret("the workers' secret", "cluster-B")  # MirrorMaker
    hdrs, v = signed(m, TP, other)
    assert b.fold(2, hdrs, v) is Verdict.FORGED
    hdrs, v = signed(m)
    assert b.fold(3, hdrs, v) is Verdict.MARKER
    assert not b.ongoing


def test_without_a_signer_markers_count_as_before():
    b = TransactionBuffer(TP)
    a = TxnID(0, 1)
    b.fold(0, h(a))
    m = TxnMarker(a, MarkerKind.COMMIT, 0)
    assert b.fold(1, m.headers(), m.encode()) is Verdict.MARKER
    assert b.is_visible(0)


def test_fold_messages_checks_markers_too():
    class Rec:
        def __init__(self, off, headers, value=None):
            self._o, self._h, self._v = off, headers, value

        def offset(self): return self._o
        def headers(self): return self._h
        def value(self): return self._v
        def timestamp(self): return (1, 1000)

    a = TxnID(0, 1)
    forged = TxnMarker(a, MarkerKind.COMMIT, 0)
    b = TransactionBuffer(TP, signer=SIGNER)
    b.fold_messages([Rec(0, h(a)), Rec(1, h(a)), Rec(2, forged.headers(), forged.encode())])
    assert b.max_read_position == -1 and b.forged == 1
