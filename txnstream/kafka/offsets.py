"""Log starts and ends of many partitions in one round, from a client that never fetches.

A consumer's own ``get_watermark_offsets`` goes out on the connection its fetches use,
and a broker answers one connection's requests in order: the query waits behind a fetch
parked there (up to that consumer's ``fetch.wait.max.ms``: 100 ms for the buffer owner
and the followers, 500 ms at librdkafka's default). Asked partition by partition, a
buffer owner took 0.4-0.7 s to start serving a new 4-partition topic, and a Spark plan
over 256 partitions waited 256 such fetches. :class:`LogBounds` asks an admin client
instead: one ListOffsets request per leader for all the partitions at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from txnstream.config import Config
from txnstream.errors import KafkaErrorKind, classify_kafka_error
from txnstream.kafka.clients import CONFLUENT_KAFKA, KafkaClientFactory
from txnstream.types import TopicPartition

__all__ = ["Bounds", "LogBounds"]

Bounds = tuple[int, int] | KafkaException
"""A partition's ``(log start, log end)`` (the end is the high watermark), or why not."""

RETRY_WAIT_S = (0.05, 1.0)
"""First and longest pause before partitions whose error is retriable are asked again."""


class LogBounds:
    """Log start and end (high watermark) of partitions, many at once (module docstring)."""

    def __init__(self, config: Config, name: str,
                 kafka: KafkaClientFactory = CONFLUENT_KAFKA) -> None:
        # never one that creates a topic it asks about: a broker with
        # auto.create.topics.enable would create a deleted topic again
        self._admin = kafka.admin(config.admin() | {
            "client.id": f"bounds-{name}", "allow.auto.create.topics": False,
            "logger": logging.getLogger("txnstream.librdkafka")})
        self._timeout_s = config.admin_timeout_s

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
                # the admin client's metadata is refreshed every few minutes only: a
                # partition added since (or a topic created again) is asked for now
                self._learn({tp.topic for tp in unknown}, deadline)
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

    def _learn(self, topics: set[str], deadline: float) -> None:
        for topic in topics:
            try:
                self._admin.list_topics(topic, timeout=max(0.5, deadline - time.monotonic()))
            except KafkaException:
                pass  # asked again below all the same; its error is the answer

    def _ask(self, tps: list[TopicPartition], timeout_s: float) -> dict[TopicPartition, Bounds]:
        ktps = {tp: KafkaTP(tp.topic, tp.partition) for tp in tps}
        earliest, latest = OffsetSpec.earliest(), OffsetSpec.latest()  # type: ignore[no-untyped-call]
        try:
            # both requests in flight together: one round trip, not two
            low = self._admin.list_offsets({k: earliest for k in ktps.values()},
                                           request_timeout=timeout_s)
            high = self._admin.list_offsets({k: latest for k in ktps.values()},
                                            request_timeout=timeout_s)
        except KafkaException as exc:
            return dict.fromkeys(tps, _as_partition_error(exc))
        out: dict[TopicPartition, Bounds] = {}
        for tp, k in ktps.items():
            try:
                out[tp] = (int(low[k].result().offset), int(high[k].result().offset))
            except KafkaException as exc:
                out[tp] = _as_partition_error(exc)
        return out


def _not_in_metadata(b: Bounds) -> bool:
    err = b.args[0] if isinstance(b, KafkaException) and b.args else None
    return isinstance(err, KafkaError) and err.code() in (
        KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART)


def _as_partition_error(exc: KafkaException) -> KafkaException:
    """The error a consumer's watermark query gives for the same cause.

    With no partition of the request led by a known broker, the admin client fails it
    as a whole (``_NOENT``, "no leaders found"); asked of a consumer, the same partition
    answers ``UNKNOWN_TOPIC_OR_PART``, which callers treat as a log not served (yet).
    """
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError) and err.code() == KafkaError._NOENT:
        return KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, err.str()))
    return exc
