"""``KnownTopics``: a consumer asks a topic's metadata once, again only for a partition
above what it learnt (partitions added), and forgets topics no longer used."""

from __future__ import annotations

from types import SimpleNamespace

from txnstream.kafka.fetch import KnownTopics
from txnstream.types import TopicPartition


class Metadata:
    """A consumer whose ``list_topics`` answers from ``counts`` and counts the asks."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.asked: list[str] = []

    def list_topics(self, topic, timeout=None):
        self.asked.append(topic)
        n = self.counts.get(topic)
        topics = {} if n is None else {topic: SimpleNamespace(error=None,
                                                              partitions=dict.fromkeys(range(n)))}
        return SimpleNamespace(topics=topics)


def tps(topic: str, *parts: int) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in parts]


def test_a_topic_is_asked_once_and_again_only_past_its_known_partitions():
    c = Metadata({"a": 4, "b": 2})
    known = KnownTopics(c, 1.0)  # type: ignore[arg-type]
    known.ensure(tps("a", 0, 1, 2, 3) + tps("b", 0), keep=())
    known.ensure(tps("a", 3) + tps("b", 1), keep={"a", "b"})
    assert sorted(c.asked) == ["a", "b"]
    c.counts["a"] = 6  # partitions added
    known.ensure(tps("a", 5), keep={"a", "b"})
    known.ensure(tps("a", 4), keep={"a", "b"})
    assert c.asked[2:] == ["a"]


def test_a_topic_not_known_yet_is_asked_again_and_unused_ones_are_forgotten():
    c = Metadata({})
    known = KnownTopics(c, 1.0)  # type: ignore[arg-type]
    known.ensure(tps("new", 0), keep=())
    c.counts["new"] = 1
    known.ensure(tps("new", 0), keep=())  # the first answer had no partitions
    known.ensure(tps("new", 0), keep=())
    assert c.asked == ["new", "new"]
    known.ensure(tps("other", 0), keep={"other"})  # "new" no longer used: forgotten
    known.ensure(tps("new", 0), keep={"other"})
    assert c.asked[-1] == "new" and len(c.asked) == 4
