"""A record is in a txn only if it carries that txn's ``txn.tag`` (issue 33 items 1, 2, 7).

On the old fold a ``txn.id`` header was enough: a junk record naming a TxnID not issued
yet held the partition until the owner's check, which then wrote an ABORT marker that
ended that TxnID here for good, so the honest txn later issued under it committed
records no reader would ever see; a junk record naming a live txn held the partition
for that txn's whole life. Here such records are junk: hidden at once, and they end,
block and join nothing.
"""

from txnstream.buffer import TransactionBuffer, Verdict
from txnstream.buffer.snapshot import restore, take_snapshot
from txnstream.markers import TXN_ID_HEADER, TXN_TAG_HEADER, MarkerKind, MarkerSigner, TxnMarker
from txnstream.membership import MembershipKey, hkdf_sha256, partition_tag, txn_headers
from txnstream.types import TopicPartition, TxnID

TP = TopicPartition("orders", 3)
SIGNER = MarkerSigner.from_secret("the workers' secret", "cluster-A")
assert SIGNER.membership is not None
KEYS: MembershipKey = SIGNER.membership


def member(t: TxnID, tp: TopicPartition = TP):
    """Headers as a txnstream writer holding the txn's key sends them."""
    return txn_headers(t, KEYS.txn_key(t), tp.topic, tp.partition)


def claim(t: TxnID, tag: bytes | None = None):
    """Headers of a plain producer naming ``t`` (with a tag of its own, or none)."""
    h = [(TXN_ID_HEADER, t.to_bytes())]
    return h if tag is None else [*h, (TXN_TAG_HEADER, tag)]


def marker(t: TxnID, kind: MarkerKind = MarkerKind.COMMIT, lwm: int = 0):
    m = TxnMarker(t, kind, lwm)
    v = m.encode()
    return SIGNER.headers(m, TP.topic, TP.partition, v), v


def visible(b: TransactionBuffer, n: int) -> list[int]:
    return [o for o in range(n) if b.is_visible(o)]


def test_junk_naming_a_future_txnid_ends_nothing_and_blocks_nothing():
    b = TransactionBuffer(TP, signer=SIGNER)
    future = TxnID(0, 7)
    assert b.fold(0, claim(future)) is Verdict.JUNK
    assert b.fold(1, claim(future, b"\0" * 16)) is Verdict.JUNK
    assert b.max_read_position == 1 and not b.ongoing and not b.ended
    # the coordinator later issues (0,7) to an honest writer: its records commit
    assert b.fold(2, member(future)) is Verdict.TXN_PENDING
    assert b.max_read_position == 1
    assert b.fold(3, *marker(future)) is Verdict.MARKER
    assert visible(b, 4) == [2] and b.junk == 2


def test_junk_naming_a_live_txn_neither_holds_the_partition_nor_joins_the_txn():
    b = TransactionBuffer(TP, signer=SIGNER)
    alice = TxnID(1, 40)
    b.fold(0, [])  # a plain record
    assert b.fold(1, claim(alice)) is Verdict.JUNK
    b.fold(2, [])
    assert b.max_read_position == 2 and visible(b, 3) == [0, 2]
    b.fold(3, member(alice))
    b.fold(4, *marker(alice))
    assert visible(b, 5) == [0, 2, 3]


def test_a_tag_copied_to_another_partition_or_cluster_is_junk_there():
    t = TxnID(0, 3)
    b = TransactionBuffer(TP, signer=SIGNER)
    assert b.fold(0, member(t, TopicPartition("orders", 4))) is Verdict.JUNK
    other = MarkerSigner.from_secret("the workers' secret", "cluster-B").membership
    assert other is not None
    copied = txn_headers(t, other.txn_key(t), TP.topic, TP.partition)
    assert b.fold(1, copied) is Verdict.JUNK
    assert b.fold(2, member(t)) is Verdict.TXN_PENDING


def test_a_flood_of_junk_leaves_the_state_and_its_snapshot_the_size_of_one_run():
    b = TransactionBuffer(TP, signer=SIGNER)
    for off in range(20_000):
        b.fold(off, claim(TxnID(off % 4, 100 + off)))
    assert b.max_read_position == 19_999 and not b.ongoing and not b.ended and not b.lwm
    snap = take_snapshot(b)
    assert len(snap.hidden.to_deltas()) <= 2
    assert len(snap.encode()) < 300
    again = restore(snap)
    assert visible(again, 20_000) == []


def test_records_before_membership_follow_the_old_rules():
    b = TransactionBuffer(TP, signer=SIGNER, legacy_until=2)
    old = TxnID(0, 1)
    assert b.fold(0, claim(old)) is Verdict.TXN_PENDING  # written before the upgrade
    assert b.fold(1, claim(old)) is Verdict.TXN_PENDING
    assert b.fold(2, claim(old)) is Verdict.JUNK  # untagged after it: junk
    b.fold(3, *marker(old))
    assert visible(b, 4) == [0, 1]


def test_without_a_membership_key_a_txn_id_is_taken_as_before():
    b = TransactionBuffer(TP)
    t = TxnID(0, 1)
    assert b.fold(0, claim(t)) is Verdict.TXN_PENDING
    assert b.fold(1, member(t)) is Verdict.TXN_PENDING


def test_fold_messages_judges_membership_as_fold_does():
    class Rec:
        def __init__(self, off, headers, value=None):
            self._o, self._h, self._v = off, headers, value

        def offset(self): return self._o
        def headers(self): return self._h
        def value(self): return self._v
        def timestamp(self): return (1, 1000)

    a, b_ = TxnID(0, 1), TxnID(0, 2)
    log = [member(a), member(a), claim(a), member(a), claim(b_, b"x" * 16), member(b_),
           member(b_), claim(a), [], member(a)]
    recs = [Rec(i, h) for i, h in enumerate(log)]
    hdr, v = marker(a)
    recs.append(Rec(len(recs), hdr, v))
    one = TransactionBuffer(TP, signer=SIGNER)
    for r in recs:
        one.fold(r.offset(), r.headers(), r.value())
    many = TransactionBuffer(TP, signer=SIGNER)
    many.fold_messages(recs)
    assert one.invisible == many.invisible and one.junk == many.junk == 3
    assert one.ongoing_txns() == many.ongoing_txns() == {b_: 5}
    assert visible(one, len(recs)) == visible(many, len(recs)) == [0, 1, 3]


def test_keys_and_tags_are_bound_to_cluster_txn_and_partition():
    again = MarkerSigner.from_secret("the workers' secret", "cluster-A").membership
    assert again is not None
    t = TxnID(0, 1)
    assert again.txn_key(t) == KEYS.txn_key(t) and len(KEYS.txn_key(t)) == 16
    assert KEYS.txn_key(t) != KEYS.txn_key(TxnID(0, 2))
    k = KEYS.txn_key(t)
    assert partition_tag(k, "orders", 3) == KEYS.tag(t, TP)
    assert partition_tag(k, "orders", 3) != partition_tag(k, "orders", 4)
    assert partition_tag(k, "orders", 3) != partition_tag(k, "orders3", 3)
    weaker = MarkerSigner.from_secret("another secret", "cluster-A").membership
    assert weaker is not None and weaker.txn_key(t) != k


def test_hkdf_matches_rfc_5869_test_case_3():
    okm = hkdf_sha256(bytes([0x0B] * 22), b"", 42)
    assert okm.hex() == ("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d"
                         "9d201395faa4b61a96c8")


def test_an_owner_upgraded_from_a_snapshot_before_membership_reads_the_old_records():
    """The upgrade path: a state restored from a version-3 snapshot (taken by an owner
    that checked no membership) judges the log it holds at the claim by the old rules."""
    from txnstream.buffer.snapshot import TransactionBufferSnapshot
    from txnstream.codec import codec

    old = TransactionBuffer(TP)  # an owner of the old version: no membership
    t = TxnID(0, 1)
    old.fold(0, claim(t))
    snap = take_snapshot(old)
    assert snap.legacy_until == -1
    v3 = codec("txn_buffer_snapshot")._older[3]
    import io

    import fastavro
    buf = io.BytesIO()
    buf.write(bytes([3]))
    rec = snap.to_avro()
    del rec["legacy_until"]
    fastavro.schemaless_writer(buf, v3, rec)
    read = TransactionBufferSnapshot.decode(buf.getvalue())
    assert read.legacy_until == -1
    b = restore(read)
    b.attach_signer(SIGNER, log_end=3)  # records 1 and 2 were written before the upgrade
    assert b.legacy_until == 3
    assert b.fold(1, claim(t)) is Verdict.TXN_PENDING
    assert b.fold(2, *marker(t)) is Verdict.MARKER
    assert b.fold(3, claim(t)) is Verdict.JUNK  # after the upgrade: junk
    assert visible(b, 4) == [0, 1]
    again = restore(TransactionBufferSnapshot.decode(take_snapshot(b).encode()))
    assert again.legacy_until == 3
    again.attach_signer(SIGNER, log_end=100)  # a later owner keeps the boundary
    assert again.legacy_until == 3
