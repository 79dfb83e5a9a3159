"""Fetching from a confluent-kafka ``Consumer`` without sitting on what has arrived."""

from __future__ import annotations

import time
from collections.abc import Iterator

from confluent_kafka import Consumer, Message
from confluent_kafka import TopicPartition as KafkaTP

__all__ = ["drain", "read_to"]

IDLE_POLL_S = 0.05
"""How long :func:`read_to` waits for a record before it asks where the consumer is."""


def drain(consumer: Consumer, max_messages: int, timeout: float) -> list[Message]:
    """Wait up to ``timeout`` for the first message, then take what is already there.

    ``Consumer.consume(n, timeout)`` waits the whole timeout unless ``n`` messages come:
    a reader must not sit on a record (or a coordinator on a request) that has arrived.
    """
    first = consumer.poll(timeout)
    if first is None:
        return []
    if max_messages <= 1:
        return [first]
    return [first, *consumer.consume(max_messages - 1, 0)]


def read_to(consumer: Consumer, topic: str, partition: int, end: int, timeout_s: float,
            max_messages: int = 500) -> Iterator[list[Message]]:
    """Batches of the one assigned partition until the consumer's position reaches ``end``.

    Offsets are not dense (compaction removes records; a Kafka transaction's commit leaves
    a control record no consumer is given), so the end is where the consumer's position
    is, never a count of records. Raises ``TimeoutError`` when ``timeout_s`` passes with
    no progress; records at or past ``end`` may be in the last batch.
    """
    ktp = KafkaTP(topic, partition)
    deadline = time.monotonic() + timeout_s
    while True:
        msgs = drain(consumer, max_messages, IDLE_POLL_S)
        if msgs:
            deadline = time.monotonic() + timeout_s
            yield msgs
            if msgs[-1].offset() >= end - 1:
                return
            continue
        [at] = consumer.position([ktp])
        if at.offset >= end:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic}[{partition}]: no record between {at.offset} and "
                               f"{end} within {timeout_s:g} s")
