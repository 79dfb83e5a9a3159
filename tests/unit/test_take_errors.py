"""A take that meets a Kafka error never raises out of the assignment callback (issue 37).

The chaos soak of stop 44 (seed 24) found it: with a broker down, the whole-assignment
take's fold up to its OWNER records raised ``KafkaException`` (watermarks timed out)
out of ``_on_assign``, so out of ``receive()``, and the consumer process died. The
partitions must instead stay assigned, paused, and be taken again later. No broker:
stand-ins for the Kafka consumer, the follower and the pending-ack store.
"""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.buffer.follower import ServeStatus
from txnstream.config import Config
from txnstream.consumer_group import GroupMember
from txnstream.pendingack.handle import PendingAckHandle
from txnstream.types import TopicPartition

TIMED_OUT = KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                      "Failed to get watermark offsets: Local: Timed out"))


class Kafka:
    """The group's consumer: no committed offsets, a log of 10 records."""

    def __init__(self) -> None:
        self.assigned: list = []
        self.paused: list = []
        self.resumed: list = []

    def committed(self, ktps, timeout):
        return [KafkaTP(k.topic, k.partition, -1001) for k in ktps]

    def incremental_assign(self, parts):
        self.assigned += [(p.topic, p.partition) for p in parts]

    def pause(self, parts):
        self.paused += [(p.topic, p.partition) for p in parts]

    def resume(self, parts):
        self.resumed += [(p.topic, p.partition) for p in parts]


class Follower:
    views: dict = {}
    status: dict = {}
    bounds_error: KafkaException | None = None

    bounds_raises: KafkaException | None = None

    def bounds(self, tps):
        """The log of 10 records of each (the take's one ListOffsets round)."""
        if self.bounds_raises:
            raise self.bounds_raises
        return {tp: self.bounds_error or (0, 10) for tp in tps}

    def prefetch(self, tps):
        return set()

    def follow(self, tp):
        return ServeStatus.PLAIN


class Acks:
    def __init__(self, replay_error=None, claim_error=None) -> None:
        self.replay_error, self.claim_error = replay_error, claim_error

    def replay_many(self, pointers):
        if self.replay_error:
            raise self.replay_error
        return {tp: PendingAckHandle("sub", tp) for tp in pointers}

    def claim_many(self, claims):
        if self.claim_error:
            raise self.claim_error
        assert not claims, "no partition is claimed in these tests"
        return {}


def member(acks: Acks, bounds_error: KafkaException | None = None) -> GroupMember:
    m = GroupMember.__new__(GroupMember)
    m._config = Config(bootstrap_servers="127.0.0.1:1")
    m.kafka = Kafka()  # type: ignore[assignment]
    m._follower = Follower()  # type: ignore[assignment]
    m._follower.bounds_error = bounds_error
    m._acks = acks  # type: ignore[assignment]
    m._lock = threading.RLock()
    m._initial = "earliest"
    m.member_id = "m-1"
    m.readers, m._retake, m._owned = {}, {}, set()
    return m


@pytest.mark.parametrize("acks", [Acks(claim_error=TIMED_OUT), Acks(replay_error=TIMED_OUT)],
                         ids=["claim", "replay"])
def test_a_kafka_error_in_a_take_leaves_the_partitions_paused_for_a_retake(acks):
    m = member(acks)
    kafka = m.kafka
    parts = [KafkaTP("in", 0), KafkaTP("in", 1)]
    m._on_assign(kafka, parts)  # type: ignore[arg-type]
    want = [("in", 0), ("in", 1)]
    assert kafka.assigned == want and kafka.paused == want and not kafka.resumed
    assert set(m._retake) == {TopicPartition("in", 0), TopicPartition("in", 1)}
    assert not m.readers


def test_a_partition_whose_log_bounds_failed_is_left_paused_for_a_retake():
    m = member(Acks(), bounds_error=TIMED_OUT)
    kafka = m.kafka
    m._on_assign(kafka, [KafkaTP("in", 0), KafkaTP("in", 1)])  # type: ignore[arg-type]
    assert kafka.paused == [("in", 0), ("in", 1)] and not kafka.resumed
    assert set(m._retake) == {TopicPartition("in", 0), TopicPartition("in", 1)}
    assert not m.readers


def test_a_bounds_round_that_raises_leaves_the_partitions_paused_for_a_retake():
    """Its client made lazily, or asked after its close: the callback must not raise."""
    m = member(Acks())
    m._follower.bounds_raises = TIMED_OUT
    kafka = m.kafka
    m._on_assign(kafka, [KafkaTP("in", 0), KafkaTP("in", 1)])  # type: ignore[arg-type]
    assert kafka.paused == [("in", 0), ("in", 1)] and not kafka.resumed
    assert set(m._retake) == {TopicPartition("in", 0), TopicPartition("in", 1)}
