"""Redelivery counts (issue 38): kept by the pending-ack state, so they survive a replay.

An aborted txn's acks give their offsets back (count one up, live and when the
``ABORT_MARK`` is replayed), a ``REDELIVERED`` record counts a nack's, an ack ends the
count, a checkpoint carries them, and the consumer's messages show them.
"""

from __future__ import annotations

import pytest

from txnstream.delivery import PartitionDelivery, ReadyQueue
from txnstream.message import Message
from txnstream.pendingack import handle as handle_mod
from txnstream.pendingack.handle import PendingAckHandle
from txnstream.pendingack.records import PendingAckCheckpoint, PendingAckEntry, PendingAckKind
from txnstream.types import TopicPartition, TxnID

SUB = "billing"
TP = TopicPartition("orders", 0)
T1, T2, T3 = TxnID(0, 1), TxnID(0, 2), TxnID(1, 3)


def owner(generation: int = 0, cursor: int = 0) -> PendingAckEntry:
    return PendingAckEntry(PendingAckKind.OWNER, SUB, TP.topic, TP.partition,
                           generation=generation, member_id="m", cursor=cursor)


def ack(txn: TxnID | None, *offsets: int, cumulative: bool = False) -> PendingAckEntry:
    kind = PendingAckKind.ACK_CUMULATIVE if cumulative else PendingAckKind.ACK_INDIVIDUAL
    return PendingAckEntry(kind, SUB, TP.topic, TP.partition, txn, offsets, generation=0)


def mark(txn: TxnID, committed: bool) -> PendingAckEntry:
    kind = PendingAckKind.COMMIT_MARK if committed else PendingAckKind.ABORT_MARK
    return PendingAckEntry.mark(kind, SUB, TP, txn)


def redelivered(*offsets: int, generation: int = 0, count: int = 1) -> PendingAckEntry:
    return PendingAckEntry(PendingAckKind.REDELIVERED, SUB, TP.topic, TP.partition, None,
                           offsets, generation=generation, member_id="m", cursor=count)


def replay(*entries: PendingAckEntry) -> PendingAckHandle:
    h = PendingAckHandle(SUB, TP)
    for e in (owner(), *entries):
        h.apply(PendingAckEntry.decode(e.encode()))  # as read from the log
    return h


def test_each_aborted_txn_that_acked_an_offset_counts_once_in_a_replay():
    h = replay(ack(T1, 3, 4), mark(T1, False), ack(T2, 3), mark(T2, False),
               ack(T3, 3), mark(T3, False))
    assert h.redeliveries == {3: 3, 4: 1}
    assert h.redelivery_count(3) == 3 and h.redelivery_count(5) == 0


def test_a_cumulative_acks_abort_counts_every_offset_it_gave_back():
    h = replay(ack(None, 1), ack(T1, 3, cumulative=True), mark(T1, False))
    assert h.redeliveries == {0: 1, 2: 1, 3: 1}  # 1 was acked plainly: not given back


def test_the_outcome_applied_live_and_then_read_back_counts_once():
    h = replay(ack(T1, 5))
    h.abort(T1)  # the coordinator's reply
    h.apply(mark(T1, False))  # its mark, read back later
    assert h.redeliveries == {5: 1}


def test_an_ack_ends_the_count_and_a_commit_counts_nothing():
    h = replay(ack(T1, 2, 3), mark(T1, False), ack(T2, 2), mark(T2, True))
    assert h.redeliveries == {3: 1}
    h.ack_individual([3], None)
    assert h.redeliveries == {}


def test_a_redelivered_record_counts_unless_fenced_or_acked():
    h = replay(redelivered(7, 8), redelivered(8, count=2), ack(None, 7),
               redelivered(9, generation=-5))  # the last: a fenced owner's
    assert h.redeliveries == {8: 2}


def test_a_redelivered_record_read_after_a_checkpoint_that_counted_it_counts_once():
    h = replay(ack(T1, 4), mark(T1, False))  # 4: once
    h.came_back([4])  # a nack: twice, live; its REDELIVERED record is not read back yet
    fresh = PendingAckHandle(SUB, TP)
    fresh.restore(PendingAckCheckpoint.decode(h.checkpoint().encode()))
    fresh.apply(PendingAckEntry.decode(redelivered(4, count=2).encode()))  # then read back
    assert fresh.redeliveries == {4: 2}


def test_a_checkpoint_keeps_the_counts_and_a_new_log_drops_them():
    h = replay(ack(T1, 3, 4), mark(T1, False), redelivered(4, count=2))
    ckpt = PendingAckCheckpoint.decode(h.checkpoint().encode())
    assert ckpt.redeliveries == ((3, 1), (4, 2))
    fresh = PendingAckHandle(SUB, TP)
    fresh.restore(ckpt)
    assert fresh.redeliveries == {3: 1, 4: 2}
    fresh.new_log(1, 0)
    assert fresh.redeliveries == {}


def test_a_checkpoint_without_counts_is_written_as_the_previous_release_reads_it():
    plain = replay(ack(None, 0)).checkpoint().encode()
    assert plain[0] == 2  # a release before the counts reads it
    counted = replay(ack(T1, 3), mark(T1, False)).checkpoint().encode()
    assert counted[0] == 4
    assert ack(T1, 3).encode()[0] == 1 and redelivered(3).encode()[0] == 3


def test_the_counts_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(handle_mod, "MAX_COUNTED", 5)
    h = replay(redelivered(*range(20, 30)), redelivered(29, count=2))
    assert sorted(h.redeliveries) == [25, 26, 27, 28, 29]  # the lowest are forgotten
    assert h.redeliveries[29] == 2


# ---------------------------------------------------------------- the consumer's side

def msg(offset: int) -> Message:
    return Message(TP.topic, TP.partition, offset, None, f"v{offset}".encode(), (), 0)


def reader(h: PendingAckHandle) -> PartitionDelivery:
    from txnstream.buffer.served import ServeStatus

    return PartitionDelivery(TP, ServeStatus.SERVED, deliver_pos=0, handle=h)


def test_a_fetched_record_that_came_back_before_carries_its_count():
    r = reader(replay(ack(T1, 1), mark(T1, False)))
    assert not r.quiet()  # the fetch loop asks the handle
    first, second = r.offer(msg(0)), r.offer(msg(1))
    assert first is not None and first.redelivery_count == 0
    assert second is not None and second.redelivery_count == 1
    assert r.unacked[1] is second  # the ack names the message handed out


def test_an_aborted_txns_acks_come_back_counted_in_their_messages():
    r = reader(replay())
    m = r.offer(msg(4))
    assert m is not None
    r.handle.ack_individual([4], T1)
    r.acked([4], in_txn=True)
    back = r.end_txn(T1, committed=False)
    assert [(b.offset, b.redelivery_count) for b in back] == [(4, 1)]
    assert r.unacked[4] is back[0]


def test_a_redelivery_of_unacked_messages_counts_only_those_not_queued_already():
    r = reader(replay())
    q = ReadyQueue()
    got = [r.offer(msg(o)) for o in (0, 1, 2)]
    q.ready.extend(got)
    handed = q.take(2, 0.0)  # 0 and 1 handed out; 2 still queued

    def bump(ms: list[Message]) -> list[Message]:
        return r.came_back(ms)

    assert q.redeliver(list(r.unacked.values()), fresh=bump) == 2
    again = q.take(10, 0.0)
    assert [(m.offset, m.redelivery_count) for m in again] == [(0, 1), (1, 1), (2, 0)]
    assert r.handle.redeliveries == {0: 1, 1: 1}
    assert handed[0].redelivery_count == 0  # a message once handed out never changes


@pytest.mark.parametrize("count", [0, -1, True, 1.5, "3"])
def test_a_dead_letter_policy_refuses_a_count_that_is_not_a_positive_int(count):
    from txnstream import DeadLetterPolicy
    from txnstream.errors import ConfigError

    with pytest.raises(ConfigError, match="max_redeliver_count"):
        DeadLetterPolicy(count)


@pytest.mark.parametrize("kw,option", [
    ({"dead_letter_topic": "bad topic"}, "dead_letter_topic"),
    ({"dead_letter_topic": ""}, "dead_letter_topic"),
    ({"dead_letter_topic": "x" * 250}, "dead_letter_topic"),
    ({"retry_letter_topic": "bad/topic"}, "retry_letter_topic"),
    ({"enable_retry": "yes"}, "enable_retry"),
])
def test_a_dead_letter_policy_refuses_bad_topics_naming_the_option(kw, option):
    from txnstream import DeadLetterPolicy
    from txnstream.errors import ConfigError

    with pytest.raises(ConfigError, match=option):
        DeadLetterPolicy(3, **kw)


def test_an_earlier_copy_of_a_record_handed_out_again_can_still_be_acked():
    from txnstream.delivery import check_delivered

    r = reader(replay())
    old = r.offer(msg(3))
    assert old is not None
    r.deliver_pos = 4
    (new,) = r.came_back([old])
    assert new.redelivery_count == 1 and new == old  # the count is not the record
    check_delivered(r, None, [old], [3], SUB)  # no error: the same record
