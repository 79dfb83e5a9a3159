"""Txn records in a partition read plain (issue 33 item 3): junk unless the topic is registered.

No broker: the registrations and the high watermark are stand-ins, the clock is ours.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from txnstream.buffer import follower as follower_module
from txnstream.buffer.follower import BufferStateFollower, ServeStatus
from txnstream.buffer.snapshot_store import (
    LatestSnapshotFinder,
    RegistrationScan,
    registration_key,
    segment_key,
)
from txnstream.buffer.unregistered import Judgement, UnregisteredRecords, topic_anchor
from txnstream.config import Config, TopicNames
from txnstream.coordinator.buffer_registrar import BufferRegistrar
from txnstream.types import TopicPartition

TP = TopicPartition("t", 3)
T0 = TopicPartition("t", 0)


class World:
    """What the reader would find: registrations, the log end, the time; the asks counted."""

    def __init__(self) -> None:
        self.now = 100.0
        self.high = 10
        self.registered: set[TopicPartition] = set()
        self.asked: list[list[TopicPartition]] = []
        self.fail = False

    def any_registered(self, tps: list[TopicPartition]) -> bool:
        self.asked.append(tps)
        if self.fail:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
        return any(tp in self.registered for tp in tps)

    def records(self, interval_s: float = 2.0) -> UnregisteredRecords:
        return UnregisteredRecords(self.any_registered, lambda tp: (0, self.high), who="unit",
                                   interval_s=interval_s, clock=lambda: self.now)


def test_junk_below_the_watermark_is_skipped_on_one_answer():
    w = World()
    u = w.records()
    assert u.judge(TP, 3) is Judgement.JUNK
    assert u.judge(TP, 7) is Judgement.JUNK  # below the watermark read before the answer
    assert u.judge(TP, 9) is Judgement.JUNK
    assert w.asked == [[TP, T0]], "registrations read once, for the partition and its topic"
    assert u.skipped[TP] == 3


def test_a_record_past_the_answer_waits_for_the_next_one_then_is_judged_again():
    w = World()
    u = w.records()
    assert u.judge(TP, 3) is Judgement.JUNK
    w.high = 20  # written after the answer: the answer says nothing of it
    w.now += 1.0
    assert u.judge(TP, 12) is Judgement.LATER
    assert u.due() == set()
    w.now += 1.0
    assert u.due() == {TP}
    assert u.due() == set(), "named once"
    assert u.judge(TP, 12) is Judgement.JUNK
    assert len(w.asked) == 2


def test_a_registration_that_came_with_a_genuine_writer_is_never_missed():
    """The writer's topic registration lands between two answers: the record after it is
    not skipped on the older answer, whatever the interval."""
    w = World()
    u = w.records(interval_s=60.0)
    assert u.judge(TP, 5) is Judgement.JUNK
    w.registered.add(T0)  # a coordinator registers the topic, then the writer writes
    w.high = 11
    assert u.judge(TP, 10) is Judgement.LATER
    w.now += 60.0
    assert u.judge(TP, 10) is Judgement.REGISTERED
    assert u.skipped[TP] == 1


@pytest.mark.parametrize("registered", [TP, T0], ids=["partition", "topic-partition-0"])
def test_a_registered_partition_or_topic_is_followed(registered):
    w = World()
    w.registered.add(registered)
    assert w.records().judge(TP, 3) is Judgement.REGISTERED


def test_no_answer_means_the_record_waits():
    w = World()
    w.fail = True
    u = w.records()
    assert u.judge(TP, 3) is Judgement.LATER
    w.now += 2.0
    w.fail = False
    assert u.due() == {TP}
    assert u.judge(TP, 3) is Judgement.JUNK


def test_a_partition_given_up_is_forgotten():
    w = World()
    u = w.records()
    assert u.judge(TP, 3) is Judgement.JUNK
    w.now += 0.5
    assert u.judge(TP, 12) is Judgement.LATER
    u.forget(TP)
    assert u.due() == set()
    assert u.judge(TP, 4) is Judgement.JUNK, "asked again at once"
    assert len(w.asked) == 2


def test_the_anchor_of_partition_0_is_itself():
    assert topic_anchor(T0) == [T0]
    assert topic_anchor(TP) == [TP, T0]


def test_a_registration_scan_counts_registrations_not_tombstones_or_garbage():
    scan = RegistrationScan([TP, T0])
    scan.add(registration_key(TopicPartition("t", 30)), b"x", "here")  # another partition
    scan.add(registration_key(TopicPartition("tt", 0)), b"x", "here")
    scan.add(registration_key(TP), None, "here")
    scan.add(segment_key(T0, 1, 0), b"\x01garbage", "here")
    scan.add(str(T0).encode(), b"\x01garbage", "here")  # the old single-record format
    assert not scan.registered
    scan.add(registration_key(T0), b"x", "here")
    assert scan.registered


class NeverRegisteredStore:
    """The snapshot topic of a partition no coordinator registered; writes refused."""

    def partition_of(self, tp: TopicPartition) -> int:
        return 0

    def find(self, tp: TopicPartition) -> LatestSnapshotFinder:
        return LatestSnapshotFinder(tp)

    def find_many(self, tps):  # the follower scans many at once
        return {tp: self.find(tp) for tp in tps}

    def register(self, tps: list[TopicPartition], timeout_s: float) -> bool:
        raise AssertionError("a reader wrote a registration")


def test_a_reader_never_registers_a_partition(monkeypatch):
    """Old: ``follow(tp, plain_ok=False)`` registered a partition it found unregistered."""
    f = BufferStateFollower(Config(bootstrap_servers="127.0.0.1:1",
                                   topics=TopicNames("__unit"), kafka={"log_level": 0}))
    try:
        f._store = NeverRegisteredStore()  # type: ignore[assignment]
        assert f.follow(TP, plain_ok=False) is ServeStatus.WAITING
        assert f.follow(TopicPartition("t", 1)) is ServeStatus.PLAIN
    finally:
        f.close()
    assert follower_module.WAIT_WARN_EVERY_S > follower_module.WAIT_WARN_AFTER_S


class ListingFails:
    """A producer whose topic listing fails (the registrar registers what it was asked)."""

    def list_topics(self, topic: str, timeout: float) -> object:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "no metadata"))


class Registry:
    def __init__(self) -> None:
        self.written: list[list[TopicPartition]] = []

    def register(self, tps: list[TopicPartition], timeout_s: float) -> bool:
        self.written.append(tps)
        return True


def test_a_topics_registration_always_includes_partition_0():
    """A reader asks about partition 0 to learn whether the topic is transactional."""
    reg = Registry()
    r = BufferRegistrar(reg, ListingFails(), 1.0, 1.0)  # type: ignore[arg-type]
    assert r.register([TP]) == set()
    assert reg.written == [[T0, TP]]
