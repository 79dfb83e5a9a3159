"""A reader's buffer-state follower rides through Kafka errors in its snapshot scans.

Chaos found a committed-only consumer dead of ``_DESTROY_BROKER`` raised by a scan's
``get_watermark_offsets`` while a broker was being killed: ``receive()`` must never die
of a transient error in the buffer state it reads. No broker: the store is a stand-in.
"""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError, KafkaException

from txnstream.buffer import follower as follower_module
from txnstream.buffer.follower import BufferStateFollower, ServeStatus
from txnstream.buffer.snapshot_store import LatestSnapshotFinder
from txnstream.config import Config, TopicNames
from txnstream.types import TopicPartition

CONFIG = Config(bootstrap_servers="127.0.0.1:1", topics=TopicNames("__unit"),
                kafka={"log_level": 0})
TP = TopicPartition("t", 0)
DESTROYED = KafkaException(KafkaError(KafkaError._DESTROY_BROKER, "broker handle destroyed"))


class FlakyStore:
    """Fails ``failures`` scans, then finds ``TP`` registered (no snapshot yet)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def partition_of(self, tp: TopicPartition) -> int:
        return 0

    def find(self, tp: TopicPartition) -> LatestSnapshotFinder:
        self.calls += 1
        if self.calls <= self.failures:
            raise DESTROYED
        found = LatestSnapshotFinder(tp)
        found.registered = True
        return found

    def find_many(self, tps):  # the follower scans many at once
        return {tp: self.find(tp) for tp in tps}


@pytest.fixture
def follower(monkeypatch):
    monkeypatch.setattr(follower_module, "SCAN_RETRY_S", 1.0)
    f = BufferStateFollower(CONFIG)
    yield f
    f.close()


def test_a_scan_that_meets_a_transient_error_is_retried(follower):
    follower._store = FlakyStore(failures=2)
    assert follower.follow(TP) is ServeStatus.WAITING
    assert follower._store.calls == 3


def test_a_rescan_that_keeps_failing_leaves_the_partition_waiting(follower, caplog):
    follower._store = FlakyStore(failures=1)
    assert follower.follow(TP) is ServeStatus.WAITING
    follower._store = FlakyStore(failures=10**6)
    with caplog.at_level(logging.WARNING):
        follower._rescan_many([TP])  # must not raise
    assert follower.status[TP] is ServeStatus.WAITING
    assert "cannot read the buffer state of t-0 yet" in caplog.text


def test_a_partition_known_transactional_waits_when_its_scan_keeps_failing(follower, caplog):
    """Soak seed 5, stop 33: a processor died of ``_TIMED_OUT`` out of ``receive()``. Its
    fetch met a txn record of a partition it did not follow yet (``follow(tp,
    plain_ok=False)``) while the brokers were down longer than the scan's retries. Such
    a partition is transactional whatever the scan says: it waits (nothing of it is
    delivered) and the next rescan finds its state."""
    follower._store = FlakyStore(failures=10**6)
    with caplog.at_level(logging.WARNING):
        assert follower.follow(TP, plain_ok=False) is ServeStatus.WAITING
    assert TP not in follower.views
    assert "cannot read the buffer state of t-0 yet" in caplog.text
    follower._store = FlakyStore(failures=0)
    follower._rescan_many([TP])  # the next rescan: registered, still no snapshot
    assert follower.status[TP] is ServeStatus.WAITING


def test_a_partition_of_unknown_kind_still_raises_when_its_scan_keeps_failing(follower):
    """Without a txn record seen, waiting could hold a plain partition for good: the
    error is raised (the consumer's assignment retries it; a Spark query fails, as
    Kafka's source does after its offset fetch retries)."""
    follower._store = FlakyStore(failures=10**6)
    with pytest.raises(KafkaException):
        follower.follow(TP)
