"""A partition whose leader is moving is asked again, not reported (issue 37), no broker."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.kafka.fetch import watermarks


class Answers:
    def __init__(self, *answers):
        self.answers = list(answers)
        self.asked = 0

    def get_watermark_offsets(self, ktp, timeout):
        self.asked += 1
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a


def test_a_leader_moving_is_asked_again():
    c = Answers(KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)),
                KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE)), (3, 17))
    assert watermarks(c, KafkaTP("t", 0), 5.0) == (3, 17)  # type: ignore[arg-type]
    assert c.asked == 3


def test_an_unknown_partition_is_reported_at_once():
    c = Answers(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)), (0, 1))
    with pytest.raises(KafkaException):
        watermarks(c, KafkaTP("t", 0), 5.0)  # type: ignore[arg-type]
    assert c.asked == 1
