"""Cursors that know their log (issue 34 item 9): the offset metadata and the pending-ack
state note the partition's log epoch; a claim on a newer log starts the state over, and
positions of an older log are never applied to a new one."""

import fastavro
import pytest

from txnstream.codec import codec
from txnstream.delivery import newer_log, start_on_log
from txnstream.pendingack.handle import PendingAckHandle
from txnstream.pendingack.records import (
    Checkpointed,
    CursorMetadata,
    PendingAckCheckpoint,
    PendingAckEntry,
    PendingAckKind,
)
from txnstream.types import TopicPartition, TxnID, TxnStatus

TP = TopicPartition("in", 0)
A, B = TxnID(0, 1), TxnID(0, 2)


def owner(generation: int, cursor: int, log_epoch: int = -1, member: str = "m") -> PendingAckEntry:
    return PendingAckEntry(PendingAckKind.OWNER, "job", "in", 0, generation=generation,
                           member_id=member, cursor=cursor, log_epoch=log_epoch)


# ------------------------------------------------------------ offset metadata


@pytest.mark.parametrize("meta", [
    CursorMetadata(3, Checkpointed(120, 131)),
    CursorMetadata(1, None),
    CursorMetadata(None, Checkpointed(5, 9)),
    CursorMetadata(),
])
def test_cursor_metadata_round_trips(meta):
    assert CursorMetadata.from_metadata(meta.to_metadata()) == meta


def test_the_first_log_is_written_as_the_previous_release_reads_it():
    """Epoch 0 and "not known" are the same log (newer_log): version 1 text, which a
    consumer of the previous release still takes its checkpoint pointer from."""
    assert CursorMetadata(0, Checkpointed(5, 9)).to_metadata() == "txnstream-pa1:5:9"
    assert CursorMetadata(0, None).to_metadata() is None
    for epoch, version in ((-1, 1), (0, 1), (1, 2)):
        data = owner(1, 10, log_epoch=epoch).encode()
        assert data[0] == version, (epoch, data[0])
        assert PendingAckEntry.decode(data).log_epoch == (epoch if epoch > 0 else -1)
    mark = PendingAckEntry.mark(PendingAckKind.COMMIT_MARK, "job", TP, A)
    assert mark.encode()[0] == 1, "a coordinator's marks stay readable by the old release"
    for epoch, version in ((0, 2), (2, 3)):
        ckpt = PendingAckCheckpoint("job", "in", 0, 1, "m", 7, (9,), log_epoch=epoch)
        data = ckpt.encode()
        assert data[0] == version, (epoch, data[0])
        assert PendingAckCheckpoint.decode(data).log_epoch == (epoch if epoch > 0 else -1)


def test_cursor_metadata_is_small_and_versioned():
    text = CursorMetadata(2**31, Checkpointed(2**62, 2**62 + 7)).to_metadata()
    assert text is not None and text.startswith("txnstream-pa2:") and len(text) <= 100
    # no epoch known: the version 1 text (or none), as older versions wrote it
    assert CursorMetadata(None, Checkpointed(1, 2)).to_metadata() == "txnstream-pa1:1:2"
    assert CursorMetadata().to_metadata() is None


def test_version_1_metadata_of_an_older_txnstream_still_parses():
    assert CursorMetadata.from_metadata("txnstream-pa1:120:131") == CursorMetadata(
        None, Checkpointed(120, 131))
    assert Checkpointed.from_metadata("txnstream-pa1:120:131") == Checkpointed(120, 131)
    assert Checkpointed.from_metadata("txnstream-pa2:4:120:131") == Checkpointed(120, 131)


@pytest.mark.parametrize("text", [None, "", "someone else's metadata", "txnstream-pa1:x:1",
                                  "txnstream-pa2:1:2", "txnstream-pa2:a::",
                                  "txnstream-pa9:1:2:3"])
def test_other_or_garbled_metadata_is_none(text):
    assert CursorMetadata.from_metadata(text) == CursorMetadata()


# ------------------------------------------------------------ is it the current log


def test_newer_log():
    assert newer_log(0, 1) and newer_log(1, 3)
    assert not newer_log(1, 1) and not newer_log(2, 1)
    # no view (plain, not served yet): nothing decided
    assert not newer_log(0, None) and not newer_log(None, None)
    # no epoch noted (an older version, a claim before any view): the first log
    assert newer_log(None, 1) and newer_log(-1, 1)
    assert not newer_log(None, 0) and not newer_log(-1, 0)


def never() -> int:
    raise AssertionError("the initial position is not asked for")


def test_the_same_log_keeps_cursor_and_state():
    plan = start_on_log(40, 1, 1, 44, 1, 0, never)
    assert (plan.start, plan.committed, plan.new_log, plan.log_epoch) == (44, 40, False, 1)


def test_a_cursor_and_state_of_an_older_log_start_the_new_log_from_its_start():
    plan = start_on_log(40, 0, 0, 44, 1, 3, never)
    assert (plan.start, plan.committed, plan.new_log, plan.log_epoch) == (3, -1, True, 1)


def test_offsets_deleted_with_the_topic_and_a_state_of_the_old_log():
    """Kafka deletes a deleted topic's committed offsets: only the state knows."""
    plan = start_on_log(-1, None, 0, 20, 1, 0, never)
    assert (plan.start, plan.committed, plan.new_log) == (0, -1, True)


def test_a_stale_cursor_beside_a_state_already_on_the_new_log():
    """An owner started the state over on the new log, then died before it committed."""
    plan = start_on_log(20, 0, 1, 6, 1, 0, never)
    assert (plan.start, plan.committed, plan.new_log) == (6, -1, False)


def test_no_view_decides_nothing():
    plan = start_on_log(40, 0, 0, 44, None, 0, never)
    assert (plan.start, plan.committed, plan.new_log, plan.log_epoch) == (44, 40, False, 0)
    plain = start_on_log(40, None, -1, 0, None, 0, never)
    assert (plain.start, plain.committed, plain.new_log, plain.log_epoch) == (40, 40, False, -1)


def test_a_new_subscription_starts_at_its_initial_position():
    plan = start_on_log(-1, None, -1, 0, 0, 5, lambda: 17)
    assert (plan.start, plan.new_log, plan.log_epoch) == (17, False, 0)


def test_an_old_version_cursor_on_a_recreated_topic_starts_over():
    """No epoch in the metadata (version 1) counts as the first log."""
    plan = start_on_log(40, None, -1, 0, 1, 0, never)
    assert (plan.start, plan.committed, plan.new_log) == (0, -1, True)


# ------------------------------------------------------------ the handle's fold


def test_an_owner_of_a_newer_log_starts_the_state_over():
    h = PendingAckHandle("job", TP)
    h.apply(owner(1, 10, log_epoch=0))
    h.ack_individual([12, 14], None)
    h.ack_individual([11], A)
    h.ack_cumulative(10, B)
    h.commit(TxnID(9, 9))
    h.apply(owner(20, 0, log_epoch=1, member="m2"))
    assert (h.cursor, h.acked, h.pending, h.cumulative, h.log_epoch) == (0, set(), {}, None, 1)
    assert h.generation == 20 and TxnID(9, 9) in h.ended
    # the old log's txn ends later: nothing here is acked or given back
    assert h.abort(A).redeliver == ()
    assert h.is_deliverable(11) and h.is_deliverable(12)
    # a fenced member's late ack of the old log is ignored
    assert not h.apply(PendingAckEntry(PendingAckKind.ACK_INDIVIDUAL, "job", "in", 0, B, (3,),
                                       generation=1))
    assert h.is_deliverable(3)


def test_an_owner_of_the_same_or_no_epoch_keeps_the_state():
    h = PendingAckHandle("job", TP)
    h.apply(owner(1, 10))  # records of an older version: no epoch
    h.ack_individual([12], None)
    h.apply(owner(2, 0, log_epoch=0))  # the first log: the same one
    assert (h.cursor, h.acked, h.log_epoch) == (10, {12}, 0)
    h.apply(owner(3, 4, log_epoch=-1))  # a claim with no view: keeps the epoch
    assert (h.cursor, h.acked, h.log_epoch) == (10, {12}, 0)


def test_a_state_of_no_epoch_is_of_the_first_log():
    h = PendingAckHandle("job", TP)
    h.apply(owner(1, 10))
    h.ack_individual([12], None)
    h.apply(owner(2, 0, log_epoch=2))
    assert (h.cursor, h.acked, h.log_epoch) == (0, set(), 2)


def test_replay_after_the_reset_gives_the_same_state():
    log = [owner(1, 10, log_epoch=0),
           PendingAckEntry(PendingAckKind.ACK_INDIVIDUAL, "job", "in", 0, A, (11,), 1),
           owner(5, 2, log_epoch=1),
           PendingAckEntry(PendingAckKind.ACK_INDIVIDUAL, "job", "in", 0, B, (4,), 5),
           PendingAckEntry.mark(PendingAckKind.COMMIT_MARK, "job", TP, A)]
    h = PendingAckHandle("job", TP)
    for e in log:
        h.apply(e)
    assert (h.cursor, h.pending, h.log_epoch) == (2, {4: B}, 1)
    assert h.ended[A] is TxnStatus.COMMITTED and h.is_deliverable(11)


# ------------------------------------------------------------ records


def test_entry_and_checkpoint_carry_the_epoch():
    e = owner(3, 7, log_epoch=2)
    assert PendingAckEntry.decode(e.encode()) == e
    h = PendingAckHandle("job", TP)
    h.apply(e)
    ckpt = h.checkpoint()
    assert ckpt.log_epoch == 2
    assert PendingAckCheckpoint.decode(ckpt.encode()) == ckpt
    other = PendingAckHandle("job", TP)
    other.restore(ckpt)
    assert other.log_epoch == 2


def test_records_of_the_previous_versions_read_with_no_epoch():
    import io
    import json

    from txnstream.codec import SCHEMA_DIR

    def old(name: str, version: int, rec: dict) -> bytes:
        schema = fastavro.parse_schema(json.loads(
            (SCHEMA_DIR / f"{name}.v{version}.avsc").read_text()))
        buf = io.BytesIO()
        buf.write(bytes([version]))
        fastavro.schemaless_writer(buf, schema, rec)
        return buf.getvalue()

    v1 = {k: v for k, v in codec("pending_ack_entry").decode(owner(3, 7).encode()).items()
          if k != "log_epoch"}
    assert PendingAckEntry.decode(old("pending_ack_entry", 1, v1)) == owner(3, 7)
    ck = PendingAckHandle("job", TP).checkpoint()
    v2 = {k: v for k, v in codec("pending_ack_checkpoint").decode(ck.encode()).items()
          if k != "log_epoch"}
    assert PendingAckCheckpoint.decode(old("pending_ack_checkpoint", 2, v2)).log_epoch == -1
