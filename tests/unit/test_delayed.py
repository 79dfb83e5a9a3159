"""Delayed delivery's pure parts (``txnstream.delayed``, the hold in ``txnstream.delivery``).

The real-broker scenarios are in tests/integration/consumer/test_delayed_delivery.py;
here: what a send may ask and the header it writes, when a record read back falls due
(whatever a writer outside txnstream put in its header), and how held records keep the
cursor below them and come out in the order they fall due.
"""

from __future__ import annotations

import datetime as dt

import pytest

from txnstream.buffer.served import ServeStatus
from txnstream.delayed import (
    MAX_DELAY_S,
    Held,
    commit_ms,
    delay_header,
    due_ms,
    held_size,
)
from txnstream.delivery import PartitionDelivery, ReadyQueue
from txnstream.errors import ConfigError
from txnstream.message import DELIVER_AFTER_HEADER, DELIVER_AT_HEADER, Message, split_headers
from txnstream.pendingack.handle import PendingAckHandle
from txnstream.types import TopicPartition

NOW = 1_800_000_000_000
TP = TopicPartition("orders", 0)
WEEK_MS = MAX_DELAY_S * 1000


def msg(offset: int, value: bytes = b"v", tp: TopicPartition = TP) -> Message:
    return Message(tp.topic, tp.partition, offset, None, value, (), NOW)


def reader(tp: TopicPartition = TP) -> PartitionDelivery:
    return PartitionDelivery(tp, ServeStatus.SERVED, deliver_pos=0,
                             handle=PendingAckHandle("s", tp, owner="m"))


# ------------------------------------------------------------------ what a send writes

def test_deliver_after_outside_a_txn_is_a_time_from_now() -> None:
    assert delay_header(dt.timedelta(seconds=3), None, False, NOW) == \
        (DELIVER_AT_HEADER, str(NOW + 3000).encode())
    assert delay_header(2.5, None, False, NOW) == (DELIVER_AT_HEADER, str(NOW + 2500).encode())


def test_deliver_after_in_a_txn_counts_from_its_commit() -> None:
    assert delay_header(dt.timedelta(minutes=1), None, True, NOW) == \
        (DELIVER_AFTER_HEADER, b"60000")


def test_deliver_at_takes_epoch_ms_or_an_aware_datetime() -> None:
    assert delay_header(None, NOW + 5, True, NOW) == (DELIVER_AT_HEADER, str(NOW + 5).encode())
    at = dt.datetime.fromtimestamp((NOW + 7000) / 1000, tz=dt.UTC)
    assert delay_header(None, at, False, NOW) == (DELIVER_AT_HEADER, str(NOW + 7000).encode())
    assert delay_header(None, None, False, NOW) is None


@pytest.mark.parametrize(("after", "at", "named"), [
    (1, NOW, "not both"),
    (-1, None, "deliver_after"),
    (dt.timedelta(days=8), None, "deliver_after"),
    (True, None, "deliver_after"),
    (float("nan"), None, "deliver_after"),
    (float("inf"), None, "deliver_after"),
    ("5s", None, "deliver_after"),
    (None, -5, "deliver_at"),
    (None, NOW + WEEK_MS + 1, "deliver_at"),
    (None, dt.datetime(2030, 1, 1), "deliver_at"),  # naive: which zone?
    (None, "tomorrow", "deliver_at"),
])
def test_a_delay_that_is_negative_absurd_or_not_a_time_is_refused_by_name(
        after: object, at: object, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        delay_header(after, at, False, NOW)


# ------------------------------------------------------------------ what a reader reads

def test_the_delay_header_is_not_a_user_header() -> None:
    txn_raw, marker, user, delay = split_headers(
        [("a", b"1"), (DELIVER_AT_HEADER, b"5"), ("b", None)])
    assert (txn_raw, marker, user, delay) == (None, False, [("a", b"1"), ("b", None)],
                                              (DELIVER_AT_HEADER, b"5"))


def test_when_a_record_falls_due() -> None:
    assert due_ms((DELIVER_AT_HEADER, str(NOW + 10).encode()), NOW - 99, NOW, False) == NOW + 10
    assert due_ms((DELIVER_AFTER_HEADER, b"500"), NOW - 99, NOW, True) is None  # its commit's
    # written outside txnstream without a txn: from the record's own time
    assert due_ms((DELIVER_AFTER_HEADER, b"500"), NOW - 99, NOW, False) == NOW + 401
    assert due_ms(None, NOW, NOW, True) == 0


@pytest.mark.parametrize("raw", [b"", b"-5", b"12a", b"1" * 20, None, b" 5"])
def test_a_delay_header_that_does_not_parse_names_itself(raw: bytes | None) -> None:
    with pytest.raises(ValueError, match="txn.deliver.at"):
        due_ms((DELIVER_AT_HEADER, raw), NOW, NOW, False)


def test_a_header_claiming_more_than_the_longest_delay_is_taken_as_that() -> None:
    far = str(NOW * 10).encode()
    assert due_ms((DELIVER_AT_HEADER, far), NOW, NOW, False) == NOW + WEEK_MS
    assert due_ms((DELIVER_AFTER_HEADER, far), NOW, NOW, False) == NOW + WEEK_MS


def test_a_commit_time_is_the_markers_within_the_record_and_the_reader_clock() -> None:
    assert commit_ms(NOW + 5, NOW, NOW + 10) == NOW + 5
    assert commit_ms(NOW - 1000, NOW, NOW + 10) == NOW  # a marker older than its record
    assert commit_ms(NOW + 10**9, NOW, NOW + 10) == NOW + 10  # one from the future


# ------------------------------------------------------------------ holding

def test_held_records_come_out_in_the_order_they_fall_due_and_are_counted() -> None:
    held, r = Held(), reader()
    for off, due in [(0, NOW + 30), (1, NOW + 10), (2, NOW + 20)]:
        held.hold(r, msg(off, b"x" * off), due)
    assert held.bytes == sum(held_size(msg(o, b"x" * o)) for o in range(3))
    assert held.next_due() == NOW + 10
    assert held.pop_due(NOW + 9) is None
    assert [m.offset for m in iter(lambda: held.pop_due(NOW + 25), None)] == [1, 2]
    assert held.pop_due(NOW + 30).offset == 0  # type: ignore[union-attr]
    assert held.bytes == 0 and not held


def test_records_delayed_from_their_commit_wait_for_it() -> None:
    held, r = Held(), reader()
    held.hold(r, msg(3), None, after=1000, txn_raw=b"T")
    assert held.next_due() is None and held.pop_due(NOW * 2) is None
    held.committed(r, b"other", NOW)
    assert r.awaiting
    held.committed(r, b"T", NOW + 5)
    assert not r.awaiting and held.next_due() == NOW + 1005


def test_dropping_a_partition_forgets_what_it_held_and_its_bytes() -> None:
    held, r, other = Held(), reader(), reader(TopicPartition("orders", 1))
    held.hold(r, msg(0), NOW)
    held.hold(other, msg(0, tp=other.tp), NOW + 1)
    held.drop(r.tp)
    assert held.bytes == held_size(msg(0)) and held.pop_due(NOW + 5).tp == other.tp  # type: ignore[union-attr]


def test_a_held_record_keeps_the_cursor_below_it_and_a_cumulative_ack_off_it() -> None:
    r, q = reader(), ReadyQueue()
    q.held.hold(r, msg(0), NOW + 100)
    for o in (1, 2):
        r.deliver_pos = o + 1
        q.ready.append(r.offer(msg(o)))  # type: ignore[arg-type]
    assert r.cursor() == 0
    assert r.holds_delayed(2) and not r.cumulative_is_exact([1, 2], None)
    r.handle.ack_individual([1, 2], None)  # type: ignore[union-attr]
    r.acked([1, 2], in_txn=False)
    assert r.cursor() == 0


def test_take_hands_out_a_record_when_it_falls_due_ahead_of_later_ones() -> None:
    r, q = reader(), ReadyQueue()
    q.held.hold(r, msg(0), NOW + 100)
    r.deliver_pos = 2
    q.ready.append(r.offer(msg(1)))  # type: ignore[arg-type]

    def release(m: Message) -> Message | None:
        del r.delayed[m.offset]
        return r.offer(m)

    assert [m.offset for m in q.take(10, 0.0, release=release, wall_ms=NOW)] == [1]
    assert q.take(10, 0.0, release=release, wall_ms=NOW + 99) == []
    assert [m.offset for m in q.take(10, 0.0, release=release, wall_ms=NOW + 100)] == [0]
    assert r.cursor() == 0 and 0 in r.unacked  # delivered now, unacked
