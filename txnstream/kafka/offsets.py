"""Log starts and ends of many partitions in one round, from a consumer that never fetches.

A consumer's own ``get_watermark_offsets`` goes out on the connection its fetches use,
and a broker answers one connection's requests in order: the query waits behind a fetch
parked there (up to that consumer's ``fetch.wait.max.ms``: 100 ms for the buffer owner
and the followers, 500 ms at librdkafka's default). Asked partition by partition, a
buffer owner took 0.4-0.7 s to start serving a new 4-partition topic, and a Spark plan
over 256 partitions waited 256 such fetches. :class:`LogBounds` asks a consumer of its
own that is never assigned anything, with ListOffsets' special times (-2 the log start,
-1 its end: ``offsets_for_times``), one request per leader for all the partitions.
(Not the admin client's ``list_offsets``: called from a worker thread it crashed the
process twice in one CI run, in confluent-kafka 2.16.)
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.config import Config
from txnstream.errors import KafkaErrorKind, classify_kafka_error
from txnstream.kafka.clients import CONFLUENT_KAFKA, KafkaClientFactory
from txnstream.kafka.fetch import learn_topic
from txnstream.types import TopicPartition

__all__ = ["Bounds", "LogBounds"]

Bounds = tuple[int, int] | KafkaException
"""A partition's ``(log start, log end)`` (the end is the high watermark), or why not."""

EARLIEST, LATEST = -2, -1
"""ListOffsets' times for a partition's log start and its end."""

RETRY_WAIT_S = (0.05, 1.0)
"""First and longest pause before partitions whose error is retriable are asked again."""


class LogBounds:
    """Log start and end (high watermark) of partitions, many at once (module docstring)."""

    def __init__(self, config: Config, name: str,
                 kafka: KafkaClientFactory = CONFLUENT_KAFKA) -> None:
        # read_uncommitted: the end is the high watermark, not the last stable offset
        self._consumer = kafka.consumer(config.consumer(
            f"{config.topics.prefix}-bounds-{uuid.uuid4().hex[:8]}",
            **{"client.id": f"bounds-{name}", "isolation.level": "read_uncommitted",
               "enable.auto.commit": False}))
        self._timeout_s = config.admin_timeout_s
        self._lock = threading.Lock()
        self._closed = False

    def get(self, tps: Iterable[TopicPartition], timeout_s: float | None = None,
            retry: bool = True) -> dict[TopicPartition, Bounds]:
        """Each of ``tps``' bounds.

        An error Kafka calls retriable (a leader moving, a topic just created) is asked
        again until ``timeout_s`` (not at all without ``retry``), then given as it is.
        """
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        left = list(dict.fromkeys(tps))
        out: dict[TopicPartition, Bounds] = {}
        pause = RETRY_WAIT_S[0]
        while left:
            got = self._ask(left, max(0.5, deadline - time.monotonic()))
            if unknown := [tp for tp, b in got.items() if _not_in_metadata(b)]:
                # the client's metadata is refreshed every few minutes only: a partition
                # added since (or a topic created again) is asked for now
                for topic in {tp.topic for tp in unknown}:
                    learn_topic(self._consumer, topic, max(0.5, deadline - time.monotonic()))
                got |= self._ask(unknown, max(0.5, deadline - time.monotonic()))
            out.update(got)
            left = [tp for tp, b in got.items() if isinstance(b, KafkaException)
                    and classify_kafka_error(b) is KafkaErrorKind.RETRIABLE]
            if not left or not retry or time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, RETRY_WAIT_S[1])
        return out

    def one(self, tp: TopicPartition, timeout_s: float | None = None) -> tuple[int, int]:
        """``tp``'s bounds; raises the ``KafkaException`` that left them unknown."""
        b = self.get([tp], timeout_s)[tp]
        if isinstance(b, KafkaException):
            raise b
        return b

    def offsets_for_times(self, times: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Each partition's first offset whose record time is at or after its time (ms).

        -1 where no record is that late (Kafka's ListOffsets by timestamp); raises
        Kafka's error of any partition.
        """
        if not times:
            return {}
        with self._lock:
            self._open()
            found = self._consumer.offsets_for_times(
                [KafkaTP(tp.topic, tp.partition, ts) for tp, ts in times.items()],
                timeout=self._timeout_s)
        out: dict[TopicPartition, int] = {}
        for k in found:
            if k.error is not None:
                raise KafkaException(k.error)
            out[TopicPartition(k.topic, k.partition)] = k.offset if k.offset >= 0 else -1
        return out

    def partitions_of(self, topic: str) -> list[TopicPartition] | None:
        """Every partition of ``topic``; None if it does not exist."""
        with self._lock:
            self._open()
            meta = self._consumer.list_topics(topic, timeout=self._timeout_s)
        t = meta.topics.get(topic)
        if t is None or t.error is not None:
            return None
        return [TopicPartition(topic, p) for p in sorted(t.partitions)]

    def close(self) -> None:
        """Close the consumer (idempotent); a later :meth:`get` raises."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._consumer.close()

    def _open(self) -> None:
        """Raise if closed (lock held)."""
        if self._closed:
            raise KafkaException(KafkaError(KafkaError._DESTROY, "log bounds closed"))

    def _ask(self, tps: list[TopicPartition], timeout_s: float) -> dict[TopicPartition, Bounds]:
        with self._lock:
            self._open()
            try:
                low = self._times(tps, EARLIEST, timeout_s)
                high = self._times(tps, LATEST, timeout_s)
            except KafkaException as exc:  # the request as a whole (a timeout, say)
                return dict.fromkeys(tps, exc)
        out: dict[TopicPartition, Bounds] = {}
        for tp in tps:
            lo, hi = low.get(tp), high.get(tp)
            if isinstance(lo, KafkaException) or isinstance(hi, KafkaException):
                out[tp] = lo if isinstance(lo, KafkaException) else hi  # type: ignore[assignment]
            elif lo is None or hi is None:
                out[tp] = KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION,
                                                    f"{tp}: no answer for it"))
            else:
                out[tp] = (lo, hi)
        return out

    def _times(self, tps: list[TopicPartition], at: int, timeout_s: float
               ) -> dict[TopicPartition, int | KafkaException]:
        found = self._consumer.offsets_for_times(
            [KafkaTP(tp.topic, tp.partition, at) for tp in tps], timeout=timeout_s)
        return {TopicPartition(k.topic, k.partition):
                KafkaException(k.error) if k.error is not None else int(k.offset)
                for k in found}


def _not_in_metadata(b: Bounds) -> bool:
    err = b.args[0] if isinstance(b, KafkaException) and b.args else None
    return isinstance(err, KafkaError) and err.code() in (
        KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART)
