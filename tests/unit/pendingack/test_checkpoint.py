"""Pending-ack checkpoints: the record round-trips and restoring gives the same state."""

import pytest

from txnstream.errors import CorruptRecordError
from txnstream.pendingack.handle import PendingAckHandle
from txnstream.pendingack.records import (
    Checkpointed,
    PendingAckCheckpoint,
    PendingAckEntry,
    PendingAckKind,
    is_checkpoint,
)
from txnstream.types import TopicPartition, TxnID

TP = TopicPartition("in", 3)
A, B = TxnID(0, 1), TxnID(2, 7)


def busy_handle():
    h = PendingAckHandle("job", TP)
    h.apply(PendingAckEntry(PendingAckKind.OWNER, "job", "in", 3, generation=4,
                            member_id="m-1", cursor=10))
    h.ack_individual([12, 15], None)
    h.ack_individual([13], A)
    h.ack_individual([17, 18], B)
    h.ack_cumulative(11, A)
    return h


def test_checkpoint_round_trips_and_restores_the_same_state():
    h = busy_handle()
    ckpt = h.checkpoint()
    back = PendingAckCheckpoint.decode(ckpt.encode())
    assert back == ckpt
    fresh = PendingAckHandle("job", TP)
    fresh.restore(back)
    assert (fresh.cursor, fresh.acked, fresh.pending, fresh.cumulative, fresh.generation,
            fresh.owner) == (h.cursor, h.acked, h.pending, h.cumulative, h.generation, h.owner)
    # and it behaves the same: a commit of A applies its individual and cumulative acks
    assert fresh.commit(A) == h.commit(A)


def test_garbage_checkpoint_is_a_clear_error():
    with pytest.raises(CorruptRecordError, match="pending_ack_checkpoint"):
        PendingAckCheckpoint.decode(b"\x01garbage")


def test_checkpoint_header_and_pointer_metadata():
    assert is_checkpoint([("txnstream.pa", b"checkpoint")])
    assert not is_checkpoint(None) and not is_checkpoint([("other", b"")])
    p = Checkpointed(120, 131)
    assert Checkpointed.from_metadata(p.to_metadata()) == p
    assert Checkpointed.from_metadata("") is None
    assert Checkpointed.from_metadata("someone else's metadata") is None
    assert Checkpointed.from_metadata("txnstream-pa1:x:y") is None


def test_plain_individual_ack_records_replay_under_the_current_generation_only():
    h = PendingAckHandle("job", TP)
    h.apply(PendingAckEntry(PendingAckKind.OWNER, "job", "in", 3, generation=0,
                            member_id="m-1", cursor=0))
    assert h.apply(PendingAckEntry(PendingAckKind.ACK_INDIVIDUAL, "job", "in", 3, None, (2,),
                                   generation=0))
    assert not h.apply(PendingAckEntry(PendingAckKind.ACK_INDIVIDUAL, "job", "in", 3, None,
                                       (4,), generation=-1)), "a fenced member's plain ack"
    assert h.acked == {2}
    assert not h.apply(PendingAckEntry(PendingAckKind.ACK_CUMULATIVE, "job", "in", 3, None,
                                       (9,), generation=0)), "cumulative plain acks: cursor"
