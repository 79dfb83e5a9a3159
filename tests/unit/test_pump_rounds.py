"""A reader's round costs what happened, not the width of its assignment (issue 37).

Every ``receive`` round of a committed-only reader used to walk all its partitions three
times (the log epoch of each view, the status and wait of each reader, the trim of each
view): at 1,024 partitions its thread took 5.1 ms of CPU per 1-record txn against 0.67
at 4 (``bench.scale``, stop 59). A round now looks at the partitions the follower says
changed, those taken since, and those that wait; the rest is swept at the cursor
commit's pace. No broker: stand-ins for the group's consumer and the follower.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from txnstream.buffer.follower import ServeStatus
from txnstream.consumer_group import GroupMember
from txnstream.delivery import PartitionDelivery
from txnstream.pendingack.handle import PendingAckHandle
from txnstream.types import TopicPartition

WIDTH = 1024


@dataclass
class View:
    max_read_position: int = 100
    log_epoch: int = 0
    trimmed_to: int | None = None

    def trim(self, below: int) -> None:
        self.trimmed_to = below


class CountingViews(dict):
    """The follower's views, counting the lookups a round makes."""

    gets = 0

    def get(self, key, default=None):  # type: ignore[override]
        CountingViews.gets += 1
        return super().get(key, default)


class Follower:
    def __init__(self) -> None:
        self.views = CountingViews()
        self.status: dict[TopicPartition, ServeStatus] = {}
        self.changed: set[TopicPartition] = set()
        self.unfollowed: list[TopicPartition] = []

    def take_changed(self) -> set[TopicPartition]:
        out, self.changed = self.changed, set()
        return out

    def unfollow(self, tp: TopicPartition) -> None:
        self.unfollowed.append(tp)


class Kafka:
    def __init__(self) -> None:
        self.resumed: list = []
        self.paused: list = []

    def resume(self, parts):
        self.resumed += [(p.topic, p.partition) for p in parts]

    def pause(self, parts):
        self.paused += [(p.topic, p.partition) for p in parts]

    def seek(self, part):
        pass


class Owner:
    def __init__(self) -> None:
        self.dropped: list[tuple[TopicPartition, str]] = []

    def partition_dropped(self, tp, why, fence_txns):
        self.dropped.append((tp, why))


def tp(i: int) -> TopicPartition:
    return TopicPartition("wide", i)


def member(width: int = WIDTH) -> GroupMember:
    """A member holding ``width`` served partitions of one log, none waiting."""
    m = GroupMember.__new__(GroupMember)
    m.kafka = Kafka()  # type: ignore[assignment]
    m._follower = Follower()  # type: ignore[assignment]
    m._owner = Owner()  # type: ignore[assignment]
    m._lock = threading.RLock()
    m.member_id = "m-1"
    m.readers, m._retake, m._owned = {}, {}, set()
    m.waiting, m._taken = {}, set()
    for i in range(width):
        h = PendingAckHandle("sub", tp(i))
        h.log_epoch = 0
        m.readers[tp(i)] = PartitionDelivery(tp(i), ServeStatus.SERVED, deliver_pos=50,
                                             handle=h)
        m._follower.views[tp(i)] = View()
        m._follower.status[tp(i)] = ServeStatus.SERVED
        m._owned.add(tp(i))
    return m


def test_a_round_of_a_wide_reader_looks_only_at_what_changed_and_what_waits():
    m = member()
    r = m.readers[tp(7)]
    m.hold_at(r, 120)  # waits for a commit past the served position (100)
    CountingViews.gets = 0
    m.unblock(set())
    assert CountingViews.gets <= 2, f"{CountingViews.gets} view lookups for 1 waiting partition"
    assert r.wait_at == 120
    m._follower.views[tp(7)].max_read_position = 130
    CountingViews.gets = 0
    m.unblock({tp(7)})
    assert r.wait_at is None and tp(7) not in m.waiting
    assert CountingViews.gets <= 2


def test_a_partition_that_waited_for_served_state_resumes_once_its_view_starts():
    m = member(4)
    r = m.readers[tp(2)]
    r.status = ServeStatus.WAITING
    del m._follower.views[tp(2)]
    m._follower.status[tp(2)] = ServeStatus.WAITING
    m.hold_at(r, 60)
    m.unblock(set())
    assert r.wait_at == 60 and r.status is ServeStatus.WAITING
    m._follower.views[tp(2)] = View(max_read_position=70)  # the follower starts its view
    m._follower.status[tp(2)] = ServeStatus.SERVED
    m._follower.changed.add(tp(2))
    m.unblock({tp(2)})
    assert r.status is ServeStatus.SERVED and r.wait_at is None


def test_a_view_on_a_newer_log_takes_its_partition_again_at_the_next_round():
    m = member(4)
    m._follower.views[tp(1)] = View(log_epoch=1)  # the topic was recreated
    m._follower.changed.add(tp(1))
    m.unblock(set())
    assert tp(1) not in m.readers and tp(1) in m._retake
    assert m._owner.dropped == [(tp(1), "new log (epoch 1)")]


def test_a_partition_taken_on_an_older_log_than_its_view_is_taken_again_at_the_next_round():
    m = member(4)
    m._follower.views[tp(3)] = View(log_epoch=2)  # nothing changed since: taken just now
    m._taken.add(tp(3))
    m.unblock(set())
    assert tp(3) not in m.readers and tp(3) in m._retake


def test_the_sweep_looks_at_every_partition_and_trims_every_view():
    m = member(8)
    r = m.readers[tp(5)]
    r.wait_at = 120  # set behind the member's back: the sweep still finds it
    m._follower.views[tp(6)] = View(log_epoch=1)
    m.sweep()
    assert m.waiting == {tp(5): r}
    assert tp(6) not in m.readers
    assert all(m._follower.views[tp(i)].trimmed_to == 50 for i in range(8) if i != 6)


def test_a_reader_taken_anew_is_never_resumed_at_where_its_predecessor_waited():
    m = member(4)
    old = m.readers[tp(1)]
    m.wait_at(old, 120)  # paused there: a resume seeks the fetch to 120
    m.readers[tp(1)] = PartitionDelivery(tp(1), ServeStatus.SERVED, deliver_pos=300)
    m._follower.views[tp(1)].max_read_position = 400
    m.kafka.paused.clear()
    m.unblock({tp(1)})
    assert m.kafka.resumed == [] and tp(1) not in m.waiting
