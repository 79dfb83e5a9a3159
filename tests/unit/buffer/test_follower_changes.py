"""What a follower tells a reader's round (issue 37): the partitions whose view or status
changed (:meth:`take_changed`) and those a poll moved, found from what the poll read, not
by a look at every view. No broker: the snapshot scan is a list, the polled records given."""

from __future__ import annotations

import pytest

from tests.unit.buffer.test_recreation import TP, _delta, _folded, _Msg, _Store
from txnstream.buffer import follower as follower_module
from txnstream.buffer import take_snapshot
from txnstream.buffer.follower import BufferStateFollower, ServeStatus
from txnstream.config import Config, TopicNames


@pytest.fixture
def follower(monkeypatch):
    # no broker to learn the state topic from (its metadata request would time out)
    monkeypatch.setattr(follower_module, "learn_topic", lambda *args: None)
    f = BufferStateFollower(Config(bootstrap_servers="127.0.0.1:1", topics=TopicNames("__unit"),
                                   kafka={"log_level": 0}), "changes")
    f._store = _Store(take_snapshot(_folded(0, 45), generation=5, state_offset=10))
    yield f
    f.close()


def polled(monkeypatch, f: BufferStateFollower, *msgs) -> set:
    monkeypatch.setattr(follower_module, "drain", lambda consumer, n, timeout: list(msgs))
    return f.poll(0)


def test_a_new_view_is_a_change_once(follower):
    assert follower.follow(TP) is ServeStatus.SERVED
    assert follower.take_changed() == {TP}
    assert follower.take_changed() == set()


def test_a_delta_moves_its_partition_without_changing_it(follower, monkeypatch):
    follower.follow(TP)
    follower.take_changed()
    assert polled(monkeypatch, follower, _Msg(_delta(0, 44, 50, 50), 11)) == {TP}
    assert follower.views[TP].max_read_position == 50
    assert follower.take_changed() == set()
    # the same position again (a delta that moved nothing readers see): not moved
    assert polled(monkeypatch, follower, _Msg(_delta(0, 50, 51, 50), 12)) == set()


def test_a_view_dropped_for_a_newer_log_is_a_change(follower, monkeypatch):
    follower.follow(TP)
    follower.take_changed()
    follower._next_rescan = float("inf")  # no rescan in this poll
    assert polled(monkeypatch, follower, _Msg(_delta(1, 0, -1, -1), 11)) == set()
    assert follower.status[TP] is ServeStatus.WAITING
    assert follower.take_changed() == {TP}


def test_unfollowing_is_a_change(follower):
    follower.follow(TP)
    follower.take_changed()
    follower.unfollow(TP)
    assert follower.take_changed() == {TP}
