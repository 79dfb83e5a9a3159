"""The consumer's delivery decisions without a broker (``txnstream.delivery``).

Each test restates a scenario the integration tests run against a real broker
(tests/integration/consumer, tests/integration/pendingack): what is delivered and what
is held, when a cumulative ack acks exactly a batch, the order of redelivery after an
abort, and what a new owner delivers after a rebalance.
"""

from __future__ import annotations

import pytest

from txnstream.buffer.served import BufferView, ServeStatus
from txnstream.delivery import PartitionDelivery, ReadyQueue, Verdict, check_delivered, verdict
from txnstream.errors import TxnStreamError
from txnstream.message import Message
from txnstream.pendingack.handle import PendingAckHandle
from txnstream.pendingack.records import PendingAckEntry, PendingAckKind
from txnstream.types import TopicPartition, TxnID

TP = TopicPartition("orders", 0)
SUB = "billing"
T1, T2 = TxnID(0, 1), TxnID(0, 2)


def msg(offset: int, partition: int = 0, txn: TxnID | None = None) -> Message:
    return Message("orders", partition, offset, None, f"v{offset}".encode(), (), 0, txn)


def reader(cursor: int = 0, generation: int = 0) -> PartitionDelivery:
    handle = PendingAckHandle(SUB, TP, cursor=cursor, generation=generation, owner="m1")
    return PartitionDelivery(TP, ServeStatus.SERVED, deliver_pos=cursor, handle=handle)


def deliver(r: PartitionDelivery, q: ReadyQueue, offsets: range | list[int]) -> None:
    """What the fetch loop does with visible records: offer each, queue what it may."""
    for o in offsets:
        m = msg(o)
        r.deliver_pos = o + 1
        if r.offer(m):
            q.ready.append(m)


def offsets(msgs: list[Message]) -> list[int]:
    return [m.offset for m in msgs]


def received_and_acked_cumulatively(n: int, txn: TxnID
                                    ) -> tuple[PartitionDelivery, ReadyQueue, list[Message]]:
    """Offsets 0..n-1 delivered and received, then acked cumulatively in ``txn``."""
    r, q = reader(), ReadyQueue()
    deliver(r, q, range(n))
    taken = q.take(n, 0.0)
    r.handle.ack_cumulative(n - 1, txn)
    r.acked(r.covered_by(n - 1), in_txn=True)
    return r, q, taken


# ------------------------------------------------------------------ deliverable or held


def test_records_past_the_max_read_position_wait_and_hidden_ones_are_skipped():
    aborted_raw = T2.to_bytes()
    view = BufferView(TP, position=20, max_read_position=9, hidden={3},
                      aborted={aborted_raw: (5, 7)})
    assert verdict(None, 0, None, False) is Verdict.WAIT  # no served state yet
    assert verdict(view, 2, None, False) is Verdict.DELIVER  # plain, committed position
    assert verdict(view, 3, T1.to_bytes(), False) is Verdict.SKIP  # hidden (straggler)
    assert verdict(view, 4, T1.to_bytes(), True) is Verdict.SKIP  # a marker
    assert verdict(view, 6, aborted_raw, False) is Verdict.SKIP  # an aborted txn's record
    assert verdict(view, 6, T1.to_bytes(), False) is Verdict.DELIVER  # another txn's
    assert verdict(view, 10, None, False) is Verdict.WAIT  # past the max read position


def test_a_record_an_open_txn_acked_is_held_back_until_that_txn_ends():
    r, q = reader(), ReadyQueue()
    r.handle.ack_individual([1], T1)  # a previous owner's open txn acked offset 1
    deliver(r, q, range(3))
    assert offsets(q.take(10, 0.0)) == [0, 2]
    assert list(r.held_back) == [1]
    assert r.cursor() == 0  # below everything unacked or pending
    q.redeliver(r.end_txn(T1, committed=False))
    assert offsets(q.take(10, 0.0)) == [1]  # its abort delivers it


def test_a_held_back_record_is_never_delivered_once_its_txn_commits():
    r, q = reader(), ReadyQueue()
    r.handle.ack_individual([1], T1)
    deliver(r, q, range(3))
    q.take(10, 0.0)
    r.acked([0, 2], in_txn=False)
    r.handle.ack_individual([0, 2], None)
    assert r.end_txn(T1, committed=True) == []
    assert r.held_back == {} and r.cursor() == 3


def test_records_already_acked_are_not_delivered_again():
    r, q = reader(cursor=0), ReadyQueue()
    r.handle.ack_individual([2], None)  # acked above the cursor (a plain ack in the log)
    deliver(r, q, range(4))
    assert offsets(q.take(10, 0.0)) == [0, 1, 3]


# ------------------------------------------------------------------ cumulative exactness


def test_a_cumulative_ack_is_exact_only_when_it_covers_exactly_the_batch():
    r, q = reader(), ReadyQueue()
    deliver(r, q, range(5))
    q.take(10, 0.0)
    assert r.cumulative_is_exact([0, 1, 2], T1)
    assert not r.cumulative_is_exact([1, 2], T1)  # offset 0 is unacked below it
    assert r.covered_by(2) == [0, 1, 2]


def test_a_batch_of_the_records_delivered_here_is_checked_at_once_and_anything_else_each():
    r, q = reader(), ReadyQueue()
    deliver(r, q, range(10))
    taken = q.take(10, 0.0)
    view = BufferView(TP, position=20, max_read_position=20)
    assert check_delivered(r, view, taken[2:6], [2, 3, 4, 5], SUB)  # at once
    assert check_delivered(r, None, taken, offsets(taken), SUB)  # a plain partition
    copies = [msg(o) for o in (2, 3)]  # equal records, not the ones delivered: each
    assert not check_delivered(r, view, copies, [2, 3], SUB)
    view.hidden.add(4)  # one of them no longer visible: each, and refused
    with pytest.raises(TxnStreamError, match=r"orders-0@4: not a message delivered"):
        check_delivered(r, view, taken[3:5], [3, 4], SUB)
    view.hidden.clear()
    view.aborted[T2.to_bytes()] = (5, 5)  # an aborted span among them, of another txn
    assert not check_delivered(r, view, taken[4:7], [4, 5, 6], SUB)  # each: still fine
    beyond = msg(12)  # never released
    with pytest.raises(TxnStreamError, match="@12"):
        check_delivered(r, view, [beyond], [12], SUB)
    r.acked([2], in_txn=True)  # acked already: the handle decides, each is tested
    assert not check_delivered(r, view, taken[2:4], [2, 3], SUB)


def test_records_delivered_before_a_view_reached_them_may_be_acked():
    """A reader delivered records, then its view was made anew below them (the topic
    became served while they were held: the owner's first fold not published yet). CI
    failed on it (``test_a_consumer_holding_all_it_may_waits_and_loses_nothing``): the
    ack of the very record delivered and held was refused as "not delivered"."""
    r, q = reader(), ReadyQueue()
    r.handle.log_epoch = -1  # read plain so far: no log epoch noted
    deliver(r, q, range(6))
    taken = q.take(10, 0.0)
    fresh = BufferView(TP)  # position -1, max read position -1: nothing read yet
    assert not check_delivered(r, fresh, taken[3:5], [3, 4], SUB)  # each, and let through
    with pytest.raises(TxnStreamError, match="@4: not a message delivered"):
        check_delivered(r, fresh, [msg(4)], [4], SUB)  # a copy: not the one delivered
    with pytest.raises(TxnStreamError, match="@9"):
        check_delivered(r, fresh, [msg(9)], [9], SUB)  # never delivered
    fresh.hidden.add(5)
    fresh.max_read_position = 5  # once it has read them, what it says counts
    with pytest.raises(TxnStreamError, match="@5"):
        check_delivered(r, fresh, taken[5:6], [5], SUB)
    newer = BufferView(TP, log_epoch=1)  # a view of a new log (recreated): refused
    with pytest.raises(TxnStreamError, match="@3"):
        check_delivered(r, newer, taken[3:4], [3], SUB)


def test_a_views_batch_test_never_passes_what_visible_refuses():
    raw = T2.to_bytes()
    view = BufferView(TP, position=30, max_read_position=20, hidden={7},
                      aborted={raw: (10, 12)})
    for first in range(0, 25):
        for last in range(first, 25):
            batch = list(range(first, last + 1))
            if view.all_visible(batch):
                assert all(view.visible(o, t) for o in batch for t in (None, raw))
    assert view.all_visible([0, 6, 8]) and not view.all_visible([6, 7])
    assert not view.all_visible([9, 11]) and not view.all_visible([20, 21])


def test_a_cumulative_ack_is_not_exact_over_another_txns_pending_acks():
    r, q = reader(), ReadyQueue()
    deliver(r, q, range(5))
    q.take(10, 0.0)
    r.handle.ack_individual([1], T2)
    r.acked([1], in_txn=True)
    assert not r.cumulative_is_exact([0, 2], T1)  # T2 holds offset 1 below it
    assert r.cumulative_is_exact([3, 4], T2) is False  # 0 and 2 are unacked below 4


def test_a_cumulative_ack_is_not_exact_while_another_txns_cumulative_ack_is_pending():
    r, q, _ = received_and_acked_cumulatively(2, T2)
    deliver(r, q, [2, 3])
    q.take(10, 0.0)
    assert not r.cumulative_is_exact([2, 3], T1)
    assert r.cumulative_is_exact([2, 3], T2)  # its own may move on


# ------------------------------------------------------------------ redelivery after an abort


def test_an_aborted_txns_inputs_come_back_in_offset_order_ahead_of_later_records():
    """Pulsar redelivers 0, 1, 2 before 3, 4."""
    r, q, taken = received_and_acked_cumulatively(3, T1)
    assert sorted(r.inflight) == [0, 1, 2] and r.unacked == {}
    deliver(r, q, [3, 4])  # fetched meanwhile, not received yet
    back = r.end_txn(T1, committed=False)
    assert offsets(back) == offsets(taken)
    q.redeliver(back)
    assert offsets(q.take(10, 0.0)) == [0, 1, 2, 3, 4]
    assert r.cursor() == 0


def test_a_committed_txns_inputs_are_gone_and_the_cursor_moves_past_them():
    r, _, _ = received_and_acked_cumulatively(3, T1)
    assert r.end_txn(T1, committed=True) == []
    assert r.inflight == {} and r.cursor() == 3


def test_redelivering_what_is_already_waiting_does_not_queue_it_twice():
    r, q = reader(), ReadyQueue()
    deliver(r, q, range(3))
    assert q.redeliver(list(r.unacked.values())) == 0
    assert offsets(q.take(10, 0.0)) == [0, 1, 2]


def test_a_nacked_record_comes_back_after_its_delay_before_newer_ready_ones():
    r, q = reader(), ReadyQueue()
    deliver(r, q, range(2))
    first = q.take(1, 0.0)[0]
    q.nack(first, due=5.0)
    assert offsets(q.take(10, 1.0)) == [1]
    deliver(r, q, [2])
    assert offsets(q.take(10, 5.0)) == [0, 2]


def unacked_in(r: PartitionDelivery):
    return lambda m: m.tp == r.tp and m.offset in r.unacked


def test_a_record_nacked_twice_comes_back_once_at_its_latest_due_time():
    r, q = reader(), ReadyQueue()
    deliver(r, q, range(1))
    m = q.take(1, 0.0)[0]
    q.nack(m, due=1.0)
    q.nack(m, due=3.0)
    assert q.take(10, 2.0, unacked_in(r)) == []
    assert offsets(q.take(10, 3.0, unacked_in(r))) == [0]
    assert q.take(10, 9.0, unacked_in(r)) == []


def test_a_nacked_record_acked_before_its_delay_is_up_is_dropped():
    r, q = reader(), ReadyQueue()
    deliver(r, q, range(2))
    m0, _ = q.take(2, 0.0)
    q.nack(m0, due=1.0)
    r.handle.ack_individual([0], T1)
    r.acked([0], in_txn=True)
    assert q.take(10, 2.0, unacked_in(r)) == []  # its txn decides, not the nack
    assert q.given_back(TP, [0]) == []


def test_an_abort_after_a_superseded_nack_still_redelivers():
    """A stale nack entry left in the queue must not count as waiting."""
    r, q = reader(), ReadyQueue()
    deliver(r, q, range(1))
    m = q.take(1, 0.0)[0]
    q.nack(m, due=5.0)
    q.nack(m, due=1.0)  # the later nack wins: due at 1, the entry due at 5 is stale
    assert offsets(q.take(10, 1.0, unacked_in(r))) == [0]
    r.handle.ack_individual([0], T1)
    r.acked([0], in_txn=True)
    assert q.redeliver(r.end_txn(T1, committed=False)) == 1
    assert offsets(q.take(10, 2.0, unacked_in(r))) == [0]
    assert q.take(10, 6.0, unacked_in(r)) == []


def test_dropping_a_partition_forgets_only_its_waiting_messages():
    q = ReadyQueue()
    q.ready.extend([msg(0, 0), msg(0, 1), msg(1, 0)])
    q.nack(msg(5, 1), due=0.0)
    q.drop(TP)
    assert [(m.partition, m.offset) for m in q.take(10, 1.0)] == [(1, 5), (1, 0)]


# ------------------------------------------------------------------ across a rebalance


def replayed(log: list[PendingAckEntry], cursor: int) -> PartitionDelivery:
    """A new owner: replay the pending-ack log, then deliver from the cursor."""
    handle = PendingAckHandle(SUB, TP, cursor=cursor)
    for e in log:
        handle.apply(e)
    start = max(cursor, handle.cursor)
    return PartitionDelivery(TP, ServeStatus.SERVED, deliver_pos=start, handle=handle)


def entry(kind: PendingAckKind, txn: TxnID | None, offs: tuple[int, ...], gen: int,
          member: str = "m1", cursor: int = -1) -> PendingAckEntry:
    return PendingAckEntry(kind, SUB, TP.topic, TP.partition, txn, offs, gen, member, cursor)


def test_a_new_owner_holds_back_what_an_open_txn_acked_and_delivers_the_rest_in_order():
    log = [entry(PendingAckKind.OWNER, None, (), 0, cursor=0),
           entry(PendingAckKind.ACK_INDIVIDUAL, T1, (1, 2), 0),
           entry(PendingAckKind.ACK_INDIVIDUAL, None, (4,), 0),  # a plain ack above cursor
           entry(PendingAckKind.OWNER, None, (), 1, member="m2", cursor=0)]
    r, q = replayed(log, cursor=0), ReadyQueue()
    deliver(r, q, range(6))
    assert offsets(q.take(10, 0.0)) == [0, 3, 5]
    assert sorted(r.held_back) == [1, 2]
    assert r.handle.pending_txns() == {T1}
    q.redeliver(r.end_txn(T1, committed=False))  # the predecessor's txn aborted
    assert offsets(q.take(10, 0.0)) == [1, 2]


def test_a_fenced_members_late_ack_does_not_count_for_the_new_owner():
    log = [entry(PendingAckKind.OWNER, None, (), 0, cursor=0),
           entry(PendingAckKind.OWNER, None, (), 1, member="m2", cursor=0),
           entry(PendingAckKind.ACK_INDIVIDUAL, T1, (0,), 0)]  # m1's ack after m2's OWNER
    r, q = replayed(log, cursor=0), ReadyQueue()
    deliver(r, q, range(2))
    assert offsets(q.take(10, 0.0)) == [0, 1]
    assert r.handle.pending_txns() == set()


def test_a_committed_txns_acks_are_not_delivered_by_the_new_owner():
    log = [entry(PendingAckKind.OWNER, None, (), 0, cursor=0),
           entry(PendingAckKind.ACK_CUMULATIVE, T1, (2,), 0),
           PendingAckEntry.mark(PendingAckKind.COMMIT_MARK, SUB, TP, T1),
           entry(PendingAckKind.OWNER, None, (), 1, member="m2", cursor=0)]
    r, q = replayed(log, cursor=0), ReadyQueue()
    assert r.deliver_pos == 3 and r.cursor() == 3
    deliver(r, q, range(3, 5))
    assert offsets(q.take(10, 0.0)) == [3, 4]


def test_records_given_back_are_known_until_handed_out_again_and_no_longer():
    """What a cumulative ack in a txn may not take (the consumer refuses it): records an
    aborted txn or a nack gave back, while they wait. The set empties as they are taken
    or their partition is dropped, so it never outgrows the queue."""
    r, q, _ = received_and_acked_cumulatively(3, T1)
    deliver(r, q, [3, 4])
    assert offsets(q.take(2, 0.0)) == [3, 4]  # received, after 0-2
    q.redeliver(r.end_txn(T1, committed=False))
    assert q.given_back(TP, r.covered_by(4)) == [0, 1, 2]
    assert offsets(q.take(2, 0.0)) == [0, 1]
    assert q.given_back(TP, range(5)) == [2]
    nacked = q.take(1, 0.0)[0]
    q.nack(nacked, due=1.0)
    assert q.given_back(TP, range(5)) == [2]
    q.take(10, 1.0)
    assert q.given_back(TP, range(5)) == [] and q._given_back == {}
    q.nack(msg(7), due=9.0)
    q.drop(TP)
    assert q._given_back == {}
