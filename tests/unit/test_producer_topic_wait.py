"""A new producer waits briefly for a topic just created (its metadata lags its creation).

Under load, a broker can answer a metadata request for a topic that ``create_topics``
just created with ``LEADER_NOT_AVAILABLE`` or no partitions for a moment; the producer
refused it as missing (seen in ``tests/packaging/test_wheel.py`` while a soak ran). A
topic still unknown after :data:`TOPIC_WAIT_S` is refused, naming it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from txnstream import producer as producer_module
from txnstream.config import Config
from txnstream.errors import ConfigError


class LaggingMetadata:
    """A confluent-kafka producer whose metadata knows the topic after ``lag`` asks."""

    def __init__(self, lag: int) -> None:
        self.lag, self.asked = lag, 0

    def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
        self.asked += 1
        if self.asked <= self.lag:
            t = SimpleNamespace(error="LEADER_NOT_AVAILABLE", partitions={})
        else:
            t = SimpleNamespace(error=None, partitions={0: None, 1: None, 2: None})
        return SimpleNamespace(topics={topic: t})


def test_a_topic_whose_metadata_lags_its_creation_is_taken():
    fake = LaggingMetadata(lag=3)
    assert producer_module._partitions_of(fake, "t", 10.0, "b:9092") == 3
    assert fake.asked == 4


def test_a_topic_still_unknown_after_the_wait_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(producer_module, "TOPIC_WAIT_S", 0.3)
    fake = LaggingMetadata(lag=10**9)
    with pytest.raises(ConfigError, match="topic 't' does not exist on b:9092"):
        producer_module._partitions_of(fake, "t", 10.0, "b:9092")
    assert fake.asked >= 2


def test_the_wait_is_no_longer_than_the_admin_timeout(monkeypatch):
    fake = LaggingMetadata(lag=10**9)
    with pytest.raises(ConfigError):
        producer_module._partitions_of(fake, "t", 0.2, Config().bootstrap_servers)
    assert fake.asked <= 4
