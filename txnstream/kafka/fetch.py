"""Fetching from a confluent-kafka ``Consumer`` without sitting on what has arrived."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Protocol, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaTP
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from txnstream.errors import KafkaErrorKind, classify_kafka_error
from txnstream.types import TopicPartition

__all__ = ["KafkaRecord", "consume", "delivered_at", "delivered_offset", "drain",
           "KnownTopics", "learn_topic", "read_to", "watermarks"]


class KafkaRecord(Protocol):
    """A consumed message as txnstream reads it: confluent-kafka's ``Message``.

    confluent-kafka types a message's topic, partition and offset as optional because an
    error event carries none. Every message whose ``error()`` is None has them, and every
    consume loop here skips error events first (``message_error``); so the fetch helpers
    hand out messages typed as this, and the loops need no per-record checks.
    """

    def error(self) -> KafkaError | None:
        """None for a record; an error event otherwise."""
    def topic(self) -> str:
        """The record's topic."""
    def partition(self) -> int:
        """Its partition."""
    def offset(self) -> int:
        """Its offset."""
    def key(self) -> bytes | None:
        """Its key."""
    def value(self) -> bytes | None:
        """Its value (None: a tombstone)."""
    def headers(self) -> list[tuple[str, bytes]] | None:
        """Its headers, in order."""
    def timestamp(self) -> tuple[int, int]:
        """(timestamp type, milliseconds)."""


def delivered_offset(msg: Message) -> int | None:
    """The offset of a message its delivery report says was written; None if not known.

    An idempotent producer's retry of a batch the broker had already written (its
    answer ``DUPLICATE_SEQUENCE_NUMBER``, after a broker failed over or a request timed
    out) is reported as delivered, with no offset: the record is in the log, somewhere
    below the log end (seen in the hostile soak, seed 29, during broker kills).
    """
    return msg.offset()


def delivered_at(msg: Message) -> tuple[int, int | None]:
    """(partition, offset) of a message its delivery report says was written.

    The partition is always set then; the offset is None for a retried batch the broker
    had already written (:func:`delivered_offset`).
    """
    part = msg.partition()
    assert part is not None, "a delivered message has a partition"
    return part, msg.offset()


def consume(consumer: Consumer, max_messages: int, timeout: float) -> list[KafkaRecord]:
    """``consumer.consume(max_messages, timeout)``, typed as :class:`KafkaRecord`."""
    return cast(list[KafkaRecord], consumer.consume(max_messages, timeout))

IDLE_POLL_S = 0.05
"""How long :func:`read_to` waits for a record before it asks where the consumer is."""


def drain(consumer: Consumer, max_messages: int, timeout: float) -> list[KafkaRecord]:
    """Wait up to ``timeout`` for the first message, then take what is already there.

    ``Consumer.consume(n, timeout)`` waits the whole timeout unless ``n`` messages come:
    a reader must not sit on a record (or a coordinator on a request) that has arrived.
    """
    first = cast("KafkaRecord | None", consumer.poll(timeout))
    if first is None:
        return []
    if max_messages <= 1:
        return [first]
    return [first, *consume(consumer, max_messages - 1, 0)]


def read_to(consumer: Consumer, topic: str, partition: int, end: int, timeout_s: float,
            max_messages: int = 500) -> Iterator[list[KafkaRecord]]:
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


def watermarks(consumer: Consumer, ktp: KafkaTP, timeout_s: float) -> tuple[int, int]:
    """``ktp``'s log start and end, retrying what Kafka calls retriable until ``timeout_s``.

    A partition whose leader is moving (a new topic, a broker restart) answers
    ``NOT_LEADER_FOR_PARTITION`` for a moment: asked again, not reported as a failure.
    """
    retrying = Retrying(retry=retry_if_exception(
        lambda e: isinstance(e, KafkaException)
        and classify_kafka_error(e) is KafkaErrorKind.RETRIABLE),
        stop=stop_after_delay(timeout_s), wait=wait_exponential(0.05, max=1.0), reraise=True)
    low, high = retrying(consumer.get_watermark_offsets, ktp, timeout=timeout_s)
    return int(low), int(high)


def learn_topic(consumer: Consumer, topic: str, timeout_s: float) -> int:
    """Have ``consumer`` know ``topic``'s partitions and leaders before it assigns any.

    Returns how many partitions it has (0: not known now). librdkafka asks for an
    assigned topic it does not know only at its next topic scan, once a second (for a
    partition its metadata does not have yet, at its periodic refresh): a consumer
    assigned a partition of a topic new to it read nothing for 0.5-1 s (a txn's first
    commit waited that long for its acks' read-back). Once asked for here, the
    assignment fetches at once. A topic not known in time is left to that scan.
    """
    try:
        t = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    except KafkaException:
        return 0
    return len(t.partitions) if t is not None and t.error is None else 0


class KnownTopics:
    """The partition counts of the topics a consumer learnt (:func:`learn_topic`).

    :meth:`ensure` asks again only for a topic not known, or a partition above what its
    metadata had (partitions added since): one metadata request per topic, not one per
    assignment (a request waits behind the consumer's parked fetch). Bounded by the
    topics the caller still uses (``keep``).
    """

    def __init__(self, consumer: Consumer, timeout_s: float) -> None:
        self._consumer = consumer
        self._timeout_s = timeout_s
        self._counts: dict[str, int] = {}

    def ensure(self, tps: Iterable[TopicPartition], keep: Iterable[str]) -> None:
        """Learn the topics of ``tps`` whose partitions are not all known.

        Forgets the topics in neither ``keep`` nor ``tps``.
        """
        top: dict[str, int] = {}
        for tp in tps:
            top[tp.topic] = max(top.get(tp.topic, -1), tp.partition)
        for topic, p in top.items():
            if p >= self._counts.get(topic, 0):
                self._counts[topic] = learn_topic(self._consumer, topic, self._timeout_s)
        used = set(keep) | set(top)
        for topic in [t for t in self._counts if t not in used]:
            del self._counts[topic]
