"""``TransactionLog``: where the coordinators' entries are kept, behind one small Protocol.

Pulsar pairs ``MLTransactionLogImpl`` (a managed ledger) with an in-memory log for its
tests; here :class:`KafkaTransactionLog` keeps the entries in ``__txn_log`` (partition
``p`` is TC ``p``'s log) and :class:`InMemoryTransactionLog` keeps them in lists, and
``tests/unit/coordinator/test_txn_log.py`` runs one contract over both.

What a coordinator worker does with its log, and nothing else:

* **Own partitions** (:meth:`TransactionLog.subscribe`): the log tells which TC ids this
  worker owns and when it loses them. For Kafka that is the ``<prefix>-coordinators``
  consumer group over the log topic; a partition assigned is read from its start.
* **Tail** (:meth:`~TransactionLog.poll`, :meth:`~TransactionLog.seek`,
  :meth:`~TransactionLog.watermarks`): the records of every owned partition in offset
  order, the replay and the read-back of the worker's own appends alike.
* **Append** (:meth:`~TransactionLog.append`): entries to one partition, flushed; their
  offsets, or why not. :meth:`~TransactionLog.append_async` appends without waiting and
  reports a failure later (for records nobody waits on).
* **Truncate** (:meth:`~TransactionLog.truncate`): drop every record below an offset.

The log knows nothing of epochs or txns: what a record means, and what a failed append
costs, is the business of :mod:`txnstream.coordinator.ownership`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
)
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from txnstream.coordinator.log_entry import TransactionLogEntry
from txnstream.errors import TxnStreamError, is_retriable_kafka_error, message_error
from txnstream.kafka.clients import IDEMPOTENT_IN_FLIGHT, assign_by, close_member, unassign_by
from txnstream.kafka.fetch import KafkaRecord, drain
from txnstream.kafka.topics import NO_AUTO_CREATE

__all__ = [
    "AppendResult",
    "InMemoryTransactionLog",
    "KafkaClients",
    "KafkaTransactionLog",
    "LogRecord",
    "PRODUCER_SETTINGS",
    "TransactionLog",
]

log = logging.getLogger(__name__)

POLL_MAX_RECORDS = 2_000
"""Records taken per poll: one turn's worth, so requests are not kept waiting behind a
long replay."""

LINGER_S = 0.005
"""The worker's producer's ``linger.ms``. Log appends are flushed at once; a turn's
markers are produced together and then flushed (``TxnFinalizer``), so a partition's
markers of one turn go in one request. With ``linger.ms`` 0 each went as a request of its
own as soon as it was produced, and a partition with five unanswered spun the producer's
broker thread until they were answered
(:data:`~txnstream.kafka.clients.IDEMPOTENT_IN_FLIGHT`)."""

PRODUCER_SETTINGS: dict[str, Any] = {
    "linger.ms": int(LINGER_S * 1000),
    # Markers go to data topics that may have been deleted since a txn registered them:
    # never recreate one (librdkafka's producer default would, on a broker with Kafka's
    # default auto.create.topics.enable), and fail such a marker within a second.
    **NO_AUTO_CREATE,
}
"""librdkafka settings of the worker's one producer (:class:`KafkaClients`) on top of
``Config.producer()``."""

TRUNCATE_TIMEOUT_S = 5.0
"""Longest wait for one ``delete_records`` (Kafka answers in about 0.5 s). librdkafka
sends it to the leader its metadata names and, while that broker is down, retries it at
every state change of any of the admin client's brokers: 0.46 of a core for the whole
wait, even after the leader moved (``tests/fault/test_topic_ids_spin.py``). The
metadata is asked anew first, so a leader moved since is the one asked."""
METADATA_TIMEOUT_S = 1.0
"""Longest wait for that metadata, in the worker's loop (one round trip, once a
checkpoint)."""

Assigned = Callable[[list[int]], None]
"""Called with the TC ids (log partitions) this worker was given or lost."""
Failed = Callable[[Any], None]
"""Called with why an append failed (a ``KafkaError``, an exception or a string)."""


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record read from TC ``tc_id``'s log."""

    tc_id: int
    offset: int
    value: bytes
    timestamp_ms: int | None
    """When the log took it (None if unknown)."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The offsets of appended entries (in order), or why they were not all appended."""

    offsets: tuple[int, ...] = ()
    error: Any = None
    """A ``KafkaError``, the exception ``produce()`` raised, or ``"timeout"``."""

    @property
    def ok(self) -> bool:
        """Whether every entry was appended."""
        return self.error is None


class TransactionLog(Protocol):
    """The log of every TC a worker owns; partition ``tc_id`` is TC ``tc_id``'s log."""

    def subscribe(self, on_assign: Assigned, on_revoke: Assigned) -> None:
        """Join the owners; the callbacks run inside :meth:`poll`."""

    def watermarks(self, tc_id: int) -> tuple[int, int]:
        """The first offset still kept and the offset the next append gets."""

    def seek(self, tc_id: int, offset: int) -> None:
        """Read ``tc_id``'s log again from ``offset``."""

    def poll(self, timeout_s: float) -> Iterator[LogRecord]:
        """Records of the owned partitions, waiting up to ``timeout_s`` for the first."""

    def append(self, tc_id: int, entries: Sequence[TransactionLogEntry]) -> AppendResult:
        """Append ``entries`` in order and wait until they are stored (or failed)."""

    def append_async(self, tc_id: int, entries: Sequence[TransactionLogEntry],
                     on_failure: Failed) -> None:
        """Append without waiting; ``on_failure`` runs (maybe later) if one is lost."""

    def truncate(self, tc_id: int, before: int) -> Future[Any]:
        """Drop every record below offset ``before``, without waiting.

        The future is done when the log has (its exception says why not).
        """

    def close(self) -> None:
        """Leave the owners."""


# ------------------------------------------------------------------ Kafka


@dataclass(slots=True)
class KafkaClients:
    """The Kafka clients of one worker, shared by its parts.

    One producer carries log entries, markers and endpoint records, so the finalizer's
    flush also delivers the final records appended without waiting. Made by
    :func:`txnstream.coordinator.kafka_clients.worker_clients` (a test gives the worker
    a factory of fakes there).
    """

    consumer: Consumer
    """Member of the ``<prefix>-coordinators`` group over the log topic."""
    producer: Producer
    """Made with :data:`PRODUCER_SETTINGS` (it never creates a topic)."""
    admin: AdminClient | None
    """None once the log is closed (an admin client has no ``close()``: it is destroyed
    when the last reference goes)."""


@dataclass
class KafkaTransactionLog:
    """The log in ``__txn_log``; ownership is the consumer group's assignment."""

    clients: KafkaClients
    topic: str
    flush_timeout_s: float
    """How long an :meth:`append` waits for its records to be stored."""
    admin_timeout_s: float
    where: str = "log consumer"
    """Names the consume loop in logged consumed errors."""
    strategy: str = "range"
    """The group's ``partition.assignment.strategy``: how a callback takes and gives
    partitions up (:func:`~txnstream.kafka.clients.assign_by`)."""
    _unanswered: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    """Entries produced to each TC's partition whose delivery is not yet reported. A
    turn's append came behind the last turn's final entries (:meth:`append_async`): at 16
    concurrent txns the producer's thread spent 1.5-2.1 ms of CPU per txn spinning, and a
    core for as long as a broker was paused; an append now first waits, idle, while
    :data:`~txnstream.kafka.clients.IDEMPOTENT_IN_FLIGHT` are unanswered
    (``tests/fault/test_producer_spin.py``): librdkafka could not send it sooner anyway."""

    def subscribe(self, on_assign: Assigned, on_revoke: Assigned) -> None:
        """Join the group; a partition assigned is read from its start."""
        def assigned(consumer: Consumer, parts: list[KafkaTP]) -> None:
            for p in parts:
                p.offset = OFFSET_BEGINNING
            assign_by(consumer, parts, self.strategy)
            on_assign([p.partition for p in parts])

        def revoked(consumer: Consumer, parts: list[KafkaTP]) -> None:
            on_revoke([p.partition for p in parts])
            unassign_by(consumer, parts, self.strategy)

        self.clients.consumer.subscribe([self.topic], on_assign=assigned, on_revoke=revoked,
                                        on_lost=revoked)

    @retry(retry=retry_if_exception(is_retriable_kafka_error),
           stop=stop_after_delay(10), wait=wait_exponential(0.05, max=1), reraise=True)
    def watermarks(self, tc_id: int) -> tuple[int, int]:
        """The partition's watermarks, retried while the error is retriable."""
        low, high = self.clients.consumer.get_watermark_offsets(
            KafkaTP(self.topic, tc_id), timeout=self.admin_timeout_s)
        return low, high

    def seek(self, tc_id: int, offset: int) -> None:
        """Move the group consumer's position in ``tc_id``'s partition."""
        self.clients.consumer.seek(KafkaTP(self.topic, tc_id, offset))

    def poll(self, timeout_s: float) -> Iterator[LogRecord]:
        """Records fetched by the group consumer.

        Consumed errors are logged; a fatal one raises ``KafkaClientError``.
        """
        # Fetch now (the group's callbacks run here); consumed errors are classified as
        # the records are taken, so a caller acting on an assignment does so first.
        return self._records(drain(self.clients.consumer, POLL_MAX_RECORDS, timeout_s))

    def _records(self, msgs: list[KafkaRecord]) -> Iterator[LogRecord]:
        for m in msgs:
            if message_error(m, self.where, log):
                continue
            part, offset = m.partition(), m.offset()
            if part is None or offset is None:
                continue
            ts = m.timestamp()[1]
            yield LogRecord(part, offset, m.value() or b"", ts if ts > 0 else None)

    def _produce_all(self, tc_id: int, entries: Sequence[TransactionLogEntry],
                     on_delivery: Any, deadline: float) -> Exception | None:
        """Produce ``entries`` to ``tc_id``'s partition; the error if one was refused.

        First waits (serving delivery reports, until ``deadline`` on the monotonic clock)
        until fewer than :data:`IDEMPOTENT_IN_FLIGHT` earlier entries of the partition are
        unanswered; if they still are then, nothing is produced and the error says so.
        """
        producer = self.clients.producer
        unanswered = self._unanswered
        while unanswered.get(tc_id, 0) >= IDEMPOTENT_IN_FLIGHT:
            left = deadline - time.monotonic()
            if left <= 0:
                return TxnStreamError(
                    f"{self.topic} [{tc_id}]: {unanswered[tc_id]} earlier entries still "
                    f"unanswered after {self.flush_timeout_s:.1f} s")
            producer.poll(min(0.1, left))

        def reported(err: KafkaError | None, msg: Message) -> None:
            unanswered[tc_id] -= 1
            on_delivery(err, msg)

        for e in entries:
            unanswered[tc_id] = unanswered.get(tc_id, 0) + 1  # before: a report may come first
            try:
                producer.produce(self.topic, e.encode(), partition=tc_id, on_delivery=reported)
            except (KafkaException, BufferError) as exc:
                unanswered[tc_id] -= 1
                # e.g. MSG_SIZE_TOO_LARGE over message.max.bytes, or a full local queue.
                # Entries already produced may still land: the replay will read them.
                return exc
        return None

    def append(self, tc_id: int, entries: Sequence[TransactionLogEntry]) -> AppendResult:
        """Produce ``entries`` and flush once.

        Failed if one was refused, reported undelivered, or not reported within
        ``flush_timeout_s``.
        """
        offsets: list[int] = []
        failed: list[Any] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            offset = msg.offset() if err is None else None
            if offset is None:
                failed.append(err or "no offset")
            else:
                offsets.append(offset)

        deadline = time.monotonic() + self.flush_timeout_s
        refused = self._produce_all(tc_id, entries, on_delivery, deadline)
        if refused is not None:
            failed.append(refused.args[0] if refused.args else refused)
        self.clients.producer.flush(max(0.0, deadline - time.monotonic()))
        if failed or len(offsets) != len(entries):
            return AppendResult(error=failed[0] if failed else "timeout")
        return AppendResult(tuple(sorted(offsets)))

    def append_async(self, tc_id: int, entries: Sequence[TransactionLogEntry],
                     on_failure: Failed) -> None:
        """Produce ``entries`` without flushing.

        ``on_failure`` runs now if one is refused, or from a delivery report (in a later
        poll or flush of the shared producer).
        """
        def on_delivery(err: KafkaError | None, _m: Message) -> None:
            if err is not None:
                on_failure(err)

        refused = self._produce_all(tc_id, entries, on_delivery,
                                    time.monotonic() + self.flush_timeout_s)
        if refused is not None:
            on_failure(refused)
        self.clients.producer.poll(0)

    def truncate(self, tc_id: int, before: int) -> Future[Any]:
        """``delete_records`` below ``before``; the broker's answer in the future.

        Kafka answers once every replica has moved its log start, at the followers' next
        fetch: about ``replica.fetch.wait.max.ms`` (500 ms) with 3 replicas. The worker
        does not wait for it; the request times out after :data:`TRUNCATE_TIMEOUT_S`
        (or ``admin_timeout_s`` if shorter), asked of the leader fresh metadata names.
        """
        admin = self.clients.admin
        if admin is None:
            raise TxnStreamError(f"{self.topic}: cannot truncate tc {tc_id}, the log is closed")
        try:
            admin.list_topics(self.topic, timeout=min(METADATA_TIMEOUT_S, self.admin_timeout_s))
        except KafkaException as exc:  # the cached leaders are asked
            log.debug("%s: metadata before truncating tc %d: %s", self.topic, tc_id, exc)
        timeout = {"request_timeout": min(TRUNCATE_TIMEOUT_S, self.admin_timeout_s)}
        (fut,) = admin.delete_records([KafkaTP(self.topic, tc_id, before)], **timeout).values()
        return fut

    def close(self) -> None:
        """Close the group consumer (it leaves the group); drop the admin client."""
        close_member(self.clients.consumer, self.strategy)
        self.clients.admin = None


# ------------------------------------------------------------------ in memory


@dataclass
class InMemoryTransactionLog:
    """The log in lists, for tests that need no broker; it owns every partition.

    ``refuse`` set makes every append fail with it (a log that refuses).
    """

    partitions: int
    refuse: Any = None
    _records: dict[int, list[tuple[int, bytes, int | None]]] = field(default_factory=dict)
    _low: dict[int, int] = field(default_factory=dict)
    _next: dict[int, int] = field(default_factory=dict)
    _position: dict[int, int] = field(default_factory=dict)
    _on_assign: Assigned | None = None

    def subscribe(self, on_assign: Assigned, on_revoke: Assigned) -> None:
        """Every partition is assigned at the next :meth:`poll`; none is ever revoked."""
        self._on_assign = on_assign

    def watermarks(self, tc_id: int) -> tuple[int, int]:
        """The first offset kept and the next one to append."""
        return self._low.get(tc_id, 0), self._next.get(tc_id, 0)

    def seek(self, tc_id: int, offset: int) -> None:
        """Read ``tc_id``'s records again from ``offset``."""
        self._position[tc_id] = offset

    def poll(self, timeout_s: float) -> Iterator[LogRecord]:
        """What was appended since the last poll (never waits)."""
        if self._on_assign is not None:  # the whole log at the first poll, as Kafka would
            assign, self._on_assign = self._on_assign, None
            self._position.update({p: 0 for p in range(self.partitions)})
            assign(list(range(self.partitions)))
        out: list[LogRecord] = []
        for tc_id, at in self._position.items():
            for offset, value, ts in self._records.get(tc_id, []):
                if offset >= at and len(out) < POLL_MAX_RECORDS:
                    out.append(LogRecord(tc_id, offset, value, ts))
                    self._position[tc_id] = offset + 1
        return iter(out)

    def append(self, tc_id: int, entries: Sequence[TransactionLogEntry]) -> AppendResult:
        """Append at once, or fail with ``refuse``."""
        if self.refuse is not None:
            return AppendResult(error=self.refuse)
        records = self._records.setdefault(tc_id, [])
        offsets = []
        for e in entries:
            offset = self._next.get(tc_id, 0)
            records.append((offset, e.encode(), None))
            self._next[tc_id] = offset + 1
            offsets.append(offset)
        return AppendResult(tuple(offsets))

    def append_async(self, tc_id: int, entries: Sequence[TransactionLogEntry],
                     on_failure: Failed) -> None:
        """Append at once; ``on_failure`` runs at once if it failed."""
        result = self.append(tc_id, entries)
        if not result.ok:
            on_failure(result.error)

    def truncate(self, tc_id: int, before: int) -> Future[Any]:
        """Drop the records below ``before`` at once.

        Past the end the future fails, as Kafka's does.
        """
        fut: Future[Any] = Future()
        if before > self._next.get(tc_id, 0):  # as Kafka: OFFSET_OUT_OF_RANGE
            fut.set_exception(ValueError(f"tc {tc_id}: no offset {before} in the log yet"))
            return fut
        self._low[tc_id] = max(self._low.get(tc_id, 0), before)
        self._records[tc_id] = [r for r in self._records.get(tc_id, []) if r[0] >= before]
        fut.set_result(None)
        return fut

    def close(self) -> None:
        """Stop reading."""
        self._position.clear()
