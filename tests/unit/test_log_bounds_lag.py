"""``LogBounds`` asks again for a partition added moments ago, until the broker's metadata
shows it (no broker: a consumer that answers as a lagging broker would).

Found by CI (stop 61): ``test_bounds_are_the_watermarks_also_of_partitions_added_since``
failed once under ``-n 4``: partition 9, added a moment before, was still unknown to
the broker answering the metadata request, and ``LogBounds.get`` gave
``_UNKNOWN_PARTITION`` at once though it had 10 s. A deleted topic is still reported at
once, not waited on.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from txnstream import Config, TopicPartition
from txnstream.kafka.offsets import LogBounds


class LaggingBroker:
    """Knows ``count`` partitions of ``topic``; the count grows after ``lag`` metadata
    answers (a partition added moments ago); ``topic`` None: the topic is gone."""

    def __init__(self, topic: str | None, count: int, grown: int, lag: int) -> None:
        self.topic, self.count, self.grown, self.lag = topic, count, grown, lag
        self.metadata_asked = 0

    def consumer(self, conf: dict[str, Any]) -> Any:
        return self

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.metadata_asked += 1
        if self.metadata_asked > self.lag:
            self.count = self.grown
        if topic != self.topic:
            return SimpleNamespace(topics={})
        parts = {p: object() for p in range(self.count)}
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions=parts, error=None)})

    def offsets_for_times(self, tps: list[Any], timeout: float) -> list[Any]:
        out = []
        for k in tps:
            known = k.topic == self.topic and k.partition < self.count
            err = None if known else KafkaError(KafkaError._UNKNOWN_PARTITION)
            out.append(SimpleNamespace(topic=k.topic, partition=k.partition, error=err,
                                       offset=0 if k.offset == -2 else 1))
        return out

    def close(self) -> None:
        pass


def test_a_partition_added_moments_ago_is_asked_for_until_the_metadata_shows_it():
    broker = LaggingBroker("t", count=8, grown=10, lag=3)
    got = LogBounds(Config(), "test", kafka=broker).get([TopicPartition("t", 9)], timeout_s=10)
    assert got == {TopicPartition("t", 9): (0, 1)}, got
    assert broker.metadata_asked > 3


def test_a_gone_topic_is_reported_at_once():
    broker = LaggingBroker(None, count=0, grown=0, lag=0)
    got = LogBounds(Config(), "test", kafka=broker).get([TopicPartition("t", 0)], timeout_s=10)
    err = got[TopicPartition("t", 0)]
    assert isinstance(err, KafkaException)
    assert broker.metadata_asked == 1, "a topic that is not there was waited on"
