"""Checkpoints carry ended txns (issue 20 #5): a late ack of an ended txn stays refused.

Before, a checkpoint held no ended txns, so an ack that landed after its txn's mark was
taken as pending by a handle restored from a checkpoint between the two: the message
was never redelivered and the cursor stayed pinned below it.
"""

from txnstream.pendingack.handle import CHECKPOINT_ENDED_MAX, PendingAckHandle
from txnstream.pendingack.records import PendingAckCheckpoint, PendingAckEntry, PendingAckKind
from txnstream.types import TopicPartition, TxnID, TxnStatus

TP = TopicPartition("in", 0)


def owned(gen: int = 7) -> PendingAckHandle:
    h = PendingAckHandle("job", TP)
    h.apply(PendingAckEntry(PendingAckKind.OWNER, "job", "in", 0, generation=gen,
                            member_id="m-1", cursor=0))
    return h


def ack(txn: TxnID, offset: int, gen: int = 7) -> PendingAckEntry:
    return PendingAckEntry(PendingAckKind.ACK_INDIVIDUAL, "job", "in", 0, txn, (offset,), gen,
                           "m-1")


def restored(h: PendingAckHandle) -> PendingAckHandle:
    fresh = PendingAckHandle("job", TP)
    fresh.restore(PendingAckCheckpoint.decode(h.checkpoint().encode()))
    return fresh


def test_an_ack_landing_after_its_txns_mark_is_refused_after_a_restore():
    t = TxnID(1, 5)
    h = owned()
    assert h.apply(ack(t, 3))
    assert h.apply(PendingAckEntry.mark(PendingAckKind.ABORT_MARK, "job", TP, t))
    fresh = restored(h)                      # a checkpoint between the mark and ...
    late = ack(t, 4)                         # ... the late ack
    assert not h.apply(late), "the live owner refuses it"
    fresh.apply(late)
    assert fresh.pending_txn(4) is None, (
        f"offset 4 pending forever in {t}, which ended before the checkpoint")
    assert fresh.is_deliverable(4) and fresh.lowest_held() is None


def test_checkpoint_keeps_the_newest_ended_txns_up_to_its_bound():
    h = owned()
    total = CHECKPOINT_ENDED_MAX + 50
    txns = [TxnID(0, i) for i in range(total)]
    for i, t in enumerate(txns):
        h.apply(ack(t, i))
        kind = PendingAckKind.COMMIT_MARK if i % 2 else PendingAckKind.ABORT_MARK
        h.apply(PendingAckEntry.mark(kind, "job", TP, t))
    ckpt = h.checkpoint()
    assert len(ckpt.ended) == CHECKPOINT_ENDED_MAX, "the bound holds"
    fresh = restored(h)
    for i in (total - 1, total - CHECKPOINT_ENDED_MAX):  # newest ones kept, with outcome
        want = TxnStatus.COMMITTED if i % 2 else TxnStatus.ABORTED
        assert fresh.ended[txns[i]] is want
        fresh.apply(ack(txns[i], total + i))
        assert fresh.pending_txn(total + i) is None
    # past the bound: the oldest are forgotten; the owner asks the coordinator about a
    # pending txn it took over (predecessors.end_predecessors), so this is not pinned either
    oldest = txns[0]
    assert oldest not in fresh.ended
    fresh.apply(ack(oldest, 10 * total))
    assert fresh.pending_txn(10 * total) == oldest
    assert oldest in fresh.pending_txns()
    fresh.abort(oldest)                       # what the coordinator's answer applies
    assert fresh.is_deliverable(10 * total)


def test_old_checkpoints_without_ended_txns_still_decode():
    import io
    import json

    import fastavro

    from txnstream.codec import SCHEMA_DIR

    v1 = fastavro.parse_schema(json.loads(
        (SCHEMA_DIR / "pending_ack_checkpoint.v1.avsc").read_text()))
    buf = io.BytesIO()
    buf.write(bytes([1]))
    fastavro.schemaless_writer(buf, v1, {
        "subscription": "job", "topic": "in", "partition": 0, "generation": 3,
        "member_id": "m", "cursor": 5, "acked": [7], "pending": []})
    ckpt = PendingAckCheckpoint.decode(buf.getvalue())
    assert (ckpt.cursor, ckpt.acked, ckpt.ended) == (5, (7,), ())
