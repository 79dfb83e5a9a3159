"""A cursor commit that failed is sent again, even when the cursor has not moved since.

The cursor is committed asynchronously, and librdkafka reports the outcome later (the
``on_commit`` callback), not by raising. The member used to note each cursor as committed
once it was handed to librdkafka, so a commit that then failed (the broker killed, the
member unknown to the group for a moment) was never sent again unless the cursor moved:
a partition whose last records were an aborted txn's and its marker kept its committed
offset below them for good (the hostile chaos run's ``subscription_cursor_behind``,
cursor 38 of 40, tail: one aborted record and its marker). No broker: a stand-in for the
group's Kafka consumer.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from confluent_kafka import KafkaError
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.buffer.follower import ServeStatus
from txnstream.consumer_group import GroupMember
from txnstream.delivery import PartitionDelivery
from txnstream.pendingack.handle import PendingAckHandle
from txnstream.pendingack.records import Checkpointed
from txnstream.types import TopicPartition

TP = TopicPartition("retry", 0)


class Kafka:
    """Takes commits; librdkafka answers them later (``answer``)."""

    def __init__(self) -> None:
        self.commits: list[list[tuple[str, int, int]]] = []

    def commit(self, offsets: list[KafkaTP], asynchronous: bool = True) -> list[KafkaTP]:
        self.commits.append([(p.topic, p.partition, p.offset) for p in offsets])
        return offsets


class Acks:
    """No checkpoint is due here."""

    def checkpoint_readers(self, readers, now: float, interval_s: float) -> None:
        pass

    def tail_position(self, tp: TopicPartition) -> int:
        return -1

    def checkpoint_many(self, states: list) -> list:
        return [None] * len(states)


def member() -> GroupMember:
    m = GroupMember.__new__(GroupMember)
    m.kafka = Kafka()  # type: ignore[assignment]
    m._acks = Acks()  # type: ignore[assignment]
    m._lock = threading.RLock()
    m.member_id = "m-1"
    m._checkpoint_interval = 10.0
    m._last_commit = m._last_sweep = 0.0
    h = PendingAckHandle("sub", TP)
    h.log_epoch = 0
    m.readers = {TP: PartitionDelivery(TP, ServeStatus.SERVED, deliver_pos=40, committed=36,
                                       handle=h, checkpoint=Checkpointed(12, 30))}
    return m


def test_a_failed_cursor_commit_is_sent_again_though_the_cursor_did_not_move():
    m = member()
    m.commit(force=True)
    assert m.kafka.commits == [[("retry", 0, 40)]]
    failed = KafkaTP("retry", 0, 40)
    m._on_commit(KafkaError(KafkaError.UNKNOWN_MEMBER_ID), [failed])  # librdkafka, later
    m.commit(force=True)
    assert m.kafka.commits[-1] == [("retry", 0, 40)], \
        f"the failed commit of 40 was not sent again: {m.kafka.commits}"
    m._on_commit(None, [KafkaTP("retry", 0, 40)])  # this one took
    m.commit(force=True)
    assert len(m.kafka.commits) == 2, "a commit that took is not sent again"


def test_a_partition_error_in_a_commits_answer_counts_as_failed():
    m = member()
    m.commit(force=True)
    part = SimpleNamespace(topic="retry", partition=0, offset=40,  # as librdkafka gives it
                           error=KafkaError(KafkaError.REQUEST_TIMED_OUT))
    m._on_commit(None, [part])
    m.commit(force=True)
    assert m.kafka.commits[-1] == [("retry", 0, 40)] and len(m.kafka.commits) == 2
