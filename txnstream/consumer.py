"""``Consumer``: committed-only reads with Pulsar-style acks (subscription = consumer group).

Per assigned partition a :class:`_PartitionReader` folds every record through a
:class:`~txnstream.buffer.TransactionBuffer` and delivers, in offset order, only plain
records and records of committed transactions, never beyond the buffer's
``max_read_position`` and never a marker.

Memory is bounded however large an open transaction grows: records that wait behind an
open transaction are held only up to ``max_buffered_bytes``; past that the reader keeps
folding forward (it needs only headers to find the marker) and later re-reads the
records it could not hold, by seeking back.

Acks: the group's committed Kafka offset is the cursor (mark-delete position), so lag
tools keep working. ``acknowledge`` acks one record; the cursor moves to the lowest
delivered-but-unacked offset. ``acknowledge_cumulative`` acks everything up to a record.
``negative_acknowledge`` redelivers the record after ``nack_delay_s``.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError
from confluent_kafka import Message as KafkaMessage
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.buffer import TransactionBuffer
from txnstream.errors import ConfigError, TxnStreamError
from txnstream.markers import TXN_ID_HEADER, TXN_MARKER_HEADER, classify_headers
from txnstream.types import TopicPartition, TxnID

if TYPE_CHECKING:
    from txnstream.client import Client

__all__ = ["Consumer", "Message"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BUFFERED_BYTES = 64 * 1024 * 1024
"""Records held behind open transactions, per consumer; beyond it they are re-read."""
COMMIT_INTERVAL_S = 0.5
"""Cursor commits are batched: at most two offset commits a second per consumer."""


@dataclass(frozen=True, slots=True)
class Message:
    """A delivered record: only user headers; ``txn_id`` if it was written in a txn."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int
    txn_id: TxnID | None = None

    @property
    def tp(self) -> TopicPartition:
        """Where it came from."""
        return TopicPartition(self.topic, self.partition)


def _to_message(m: KafkaMessage, txn_id: TxnID | None) -> Message:
    hdrs = tuple((k, v) for k, v in (m.headers() or [])
                 if k not in (TXN_ID_HEADER, TXN_MARKER_HEADER))
    return Message(m.topic(), m.partition(), m.offset(), m.key(), m.value(), hdrs,
                   m.timestamp()[1], txn_id)


@dataclass
class _PartitionReader:
    """Fold + bounded hold + in-order release for one partition."""

    tp: TopicPartition
    buffer: TransactionBuffer
    deliver_pos: int
    """Next offset to deliver (or skip)."""
    fold_pos: int
    """Next offset to fold; >= deliver_pos."""
    held: deque[KafkaMessage] = field(default_factory=deque)
    held_bytes: int = 0
    overflow: bool = False
    unacked: set[int] = field(default_factory=set)
    committed: int = -1

    def cursor(self) -> int:
        """The group offset to commit: the lowest delivered-but-unacked, else next."""
        return min(self.unacked) if self.unacked else self.deliver_pos


class Consumer:
    """Committed-only consumer; use ``client.subscribe(...)``."""

    def __init__(self, client: Client, topics: str | Sequence[str], subscription: str,
                 initial_position: str = "earliest",
                 max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES,
                 nack_delay_s: float = 1.0, **kafka: object) -> None:
        if initial_position not in ("earliest", "latest"):
            raise ConfigError(f"initial_position must be 'earliest' or 'latest', "
                              f"got {initial_position!r}")
        if not subscription:
            raise ConfigError("subscription (the consumer group) must not be empty")
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.subscription = subscription
        self._client = client
        self._initial = initial_position
        self._max_bytes = max_buffered_bytes
        self._nack_delay = nack_delay_s
        self._lock = threading.RLock()
        self._readers: dict[TopicPartition, _PartitionReader] = {}
        self._ready: deque[Message] = deque()
        self._nacked: list[tuple[float, int, Message]] = []
        self._nack_seq = 0
        self._last_commit = 0.0
        self._kafka = KafkaConsumer(client.config.consumer(
            subscription, **{"auto.offset.reset": initial_position,
                             "partition.assignment.strategy": "cooperative-sticky"}, **kafka))
        self._kafka.subscribe(self.topics, on_assign=self._on_assign,
                              on_revoke=self._on_revoke, on_lost=self._on_revoke)

    # ------------------------------------------------------------ assignment

    def _on_assign(self, consumer: KafkaConsumer, parts: list[KafkaTP]) -> None:
        committed = consumer.committed(parts, timeout=self._client.config.admin_timeout_s)
        seek = []
        for p in committed:
            tp = TopicPartition(p.topic, p.partition)
            low, high = consumer.get_watermark_offsets(
                KafkaTP(p.topic, p.partition), timeout=self._client.config.admin_timeout_s)
            if p.offset >= 0:
                start = p.offset
            else:
                start = low if self._initial == "earliest" else high
            # Fold from the log start: txns that began before ``start`` must be known.
            reader = _PartitionReader(tp, TransactionBuffer(tp), deliver_pos=start,
                                      fold_pos=low, committed=p.offset)
            with self._lock:
                self._readers[tp] = reader
            seek.append(KafkaTP(p.topic, p.partition, low if low < start else start))
            if low >= start:
                reader.fold_pos = start
        consumer.incremental_assign(seek)

    def _on_revoke(self, consumer: KafkaConsumer, parts: list[KafkaTP]) -> None:
        with self._lock:
            self._commit(force=True)
            for p in parts:
                tp = TopicPartition(p.topic, p.partition)
                self._readers.pop(tp, None)
                self._ready = deque(m for m in self._ready if m.tp != tp)
        consumer.incremental_unassign(parts)

    # ------------------------------------------------------------ reading

    def receive(self, timeout_s: float = 5.0) -> Message | None:
        """The next committed record, or None if none came within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                msg = self._next_ready()
                if msg is not None:
                    return msg
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            first = self._kafka.poll(min(left, 0.1))
            batch = [first, *self._kafka.consume(1000, 0)] if first is not None else []
            with self._lock:
                for m in batch:
                    self._ingest(m)
                self._commit()

    def _next_ready(self) -> Message | None:
        if self._nacked and self._nacked[0][0] <= time.monotonic():
            return heapq.heappop(self._nacked)[2]
        if self._ready:
            return self._ready.popleft()
        return None

    def _ingest(self, m: KafkaMessage) -> None:
        if m.error():
            if m.error().code() != KafkaError._PARTITION_EOF:
                log.warning("consumer %s: %s", self.subscription, m.error())
            return
        tp = TopicPartition(m.topic(), m.partition())
        r = self._readers.get(tp)
        if r is None:
            return
        off = m.offset()
        if off >= r.fold_pos:
            ts = m.timestamp()[1]
            r.buffer.fold(off, m.headers(), value=m.value(),
                          timestamp_ms=ts if ts > 0 else None)
            r.fold_pos = off + 1
        if off >= r.deliver_pos and not r.overflow:
            if r.held_bytes + len(m.value() or b"") > self._max_bytes and r.held:
                # Stop holding; fold on to find the marker; re-read these later.
                r.overflow = True
                r.held.clear()
                r.held_bytes = 0
            else:
                r.held.append(m)
                r.held_bytes += len(m.value() or b"")
        self._release(r)

    def _release(self, r: _PartitionReader) -> None:
        limit = r.buffer.max_read_position
        while r.held and r.held[0].offset() <= limit:
            m = r.held.popleft()
            r.held_bytes -= len(m.value() or b"")
            off = m.offset()
            if off < r.deliver_pos:
                continue
            r.deliver_pos = off + 1
            if r.buffer.is_visible(off):
                try:
                    _, txn_id = classify_headers(m.headers())
                except TxnStreamError:
                    txn_id = None
                self._ready.append(_to_message(m, txn_id))
                r.unacked.add(off)  # queued counts as unacked: the cursor stays below it
        if not r.held and r.overflow and limit >= r.deliver_pos:
            # The blocking txn ended: re-read what could not be held.
            r.overflow = False
            self._kafka.seek(KafkaTP(r.tp.topic, r.tp.partition, r.deliver_pos))

    # ------------------------------------------------------------ acks

    def acknowledge(self, msg: Message) -> None:
        """Ack one record (non-transactional)."""
        with self._lock:
            r = self._reader_for(msg)
            r.unacked.discard(msg.offset)
            self._commit()

    def acknowledge_cumulative(self, msg: Message) -> None:
        """Ack every delivered record of the partition up to and including ``msg``."""
        with self._lock:
            r = self._reader_for(msg)
            r.unacked = {o for o in r.unacked if o > msg.offset}
            self._commit()

    def negative_acknowledge(self, msg: Message) -> None:
        """Redeliver ``msg`` after the nack delay."""
        with self._lock:
            self._reader_for(msg)
            self._nack_seq += 1
            heapq.heappush(self._nacked, (time.monotonic() + self._nack_delay, self._nack_seq,
                                          msg))

    def _reader_for(self, msg: Message) -> _PartitionReader:
        r = self._readers.get(msg.tp)
        if r is None:
            raise TxnStreamError(
                f"cannot ack {msg.tp}@{msg.offset}: partition {msg.tp} is not assigned to this "
                f"consumer of subscription {self.subscription!r} (rebalanced away?)")
        return r

    def _commit(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_commit < COMMIT_INTERVAL_S:
            return
        offsets = []
        for r in self._readers.values():
            c = r.cursor()
            if c > r.committed:
                offsets.append(KafkaTP(r.tp.topic, r.tp.partition, c))
                r.committed = c
        if offsets:
            self._kafka.commit(offsets=offsets, asynchronous=not force)
        self._last_commit = now

    def close(self) -> None:
        """Commit the cursor and leave the group."""
        with self._lock:
            self._commit(force=True)
        self._kafka.close()

