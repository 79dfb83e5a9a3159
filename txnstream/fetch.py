"""Fetching from a confluent-kafka ``Consumer`` without sitting on what has arrived."""

from __future__ import annotations

from confluent_kafka import Consumer, Message

__all__ = ["drain"]


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
