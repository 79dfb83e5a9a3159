"""``BufferPublisher``: what a buffer owner tells readers, in the buffer-state topic.

For each data partition it serves (:class:`ServedPartition`), the owner publishes:

* a DELTA as soon as its fold moved (:meth:`BufferPublisher.deltas`): what was hidden or
  aborted since the last one, and the new max read position, so readers see a commit
  within a fetch round trip. A delta that is not delivered leaves readers a gap: they
  reload from a snapshot, and the partition's next snapshot is due at once;
* every ``snapshot_interval_s``, or when one is due, a snapshot
  (:meth:`BufferPublisher.snapshots`), trimmed below the log start, naming the state
  offset of its last delta: readers start from it and follow the deltas after it.

Each record carries the generation of the owner's claim of the slot (its OWNER record's
offset), so readers refuse those of a fenced owner.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka import TopicPartition as KafkaTP

from txnstream import metrics
from txnstream.buffer.served import take_delta
from txnstream.buffer.snapshot import take_snapshot
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.buffer.transaction_buffer import TransactionBuffer
from txnstream.kafka.clients import IDEMPOTENT_IN_FLIGHT
from txnstream.kafka.fetch import delivered_offset
from txnstream.ratelog import RateLimitedLog
from txnstream.types import TopicPartition

__all__ = ["BufferPublisher", "OwnedSlot", "ServedPartition"]

log = logging.getLogger(__name__)
_rate_limited = RateLimitedLog(log)

SNAPSHOT_RETRY_S = 1.0
"""A snapshot that failed to publish is tried again after this long (its partition's
log unreadable: a recreated topic with fewer partitions, a broker answering errors), not
at every turn of the owner's loop. A handover's snapshots are tried at once."""


@dataclass
class ServedPartition:
    """One data partition this owner serves."""

    buf: TransactionBuffer
    slot: int
    next_from: int
    """``from_position`` of the next delta: one after what the last delta covered."""
    delta_offset: int = -1
    """State-topic offset of the latest delivered delta of this owner for it."""
    produced: int = 0
    """Deltas produced; ``delivered`` catches up as the producer reports."""
    delivered: int = 0
    snapshot_due: bool = True
    dirty: bool = False
    snapshots_at: int = 0
    """``produced`` when the last snapshot was taken: no new snapshot without new deltas."""
    retry_at: float = 0.0
    """After a failed snapshot: not tried again before this (monotonic s)."""


@dataclass
class OwnedSlot:
    """A buffer slot this owner claimed: its generation and the partitions it serves."""

    generation: int
    served: set[TopicPartition] = field(default_factory=set)


class BufferPublisher:
    """Publishes the deltas and snapshots of one owner's served partitions."""

    def __init__(self, producer: Producer, state_topic: str,
                 store: TransactionBufferSnapshotStore, data: Consumer, member: str,
                 admin_timeout_s: float) -> None:
        """``data``: the owner's data consumer (the partitions' log starts)."""
        self._producer = producer
        self._state_topic = state_topic
        self._store = store
        self._data = data
        self._member = member
        self._admin_timeout_s = admin_timeout_s
        self.snapshots_published = 0
        self.snapshot_failures = 0
        self.deltas_published = 0
        self.delta_failures = 0
        self.dirty: set[TopicPartition] = set()
        """Partitions that folded something since their last delta (:meth:`fold`)."""
        self.due: set[TopicPartition] = set()
        """Partitions whose snapshot may be due (:meth:`snapshot_due`): an owner's turn
        looks at these, not at every partition it serves (issue 37)."""
        self.unanswered: dict[int, int] = {}
        """Deltas produced to each state partition (slot) whose delivery is not yet
        reported; a slot with none is not kept."""

    def folded(self, tp: TopicPartition, s: ServedPartition) -> None:
        """``tp`` folded something: its next turn publishes a delta."""
        s.dirty = True
        self.dirty.add(tp)

    def snapshot_due(self, tp: TopicPartition, s: ServedPartition) -> None:
        """``tp`` needs a snapshot (new, a failed delta or snapshot): the next step's."""
        s.snapshot_due = True
        self.due.add(tp)

    def deltas(self, served: Mapping[TopicPartition, ServedPartition],
               slots: Mapping[int, OwnedSlot]) -> None:
        """One DELTA per partition that folded something since the last one.

        A partition whose slot has :data:`~txnstream.kafka.clients.IDEMPOTENT_IN_FLIGHT`
        deltas unanswered stays dirty: its next turn's delta covers both. librdkafka
        could not have sent it sooner, and a record produced behind five unanswered of
        its partition made the producer's broker thread spin until they were answered
        (deltas of several partitions share a slot, and the turn comes every 5 ms).
        """
        now_ms = int(time.time() * 1000)
        dirty, self.dirty = self.dirty, set()
        for tp in dirty:
            if (s := served.get(tp)) is not None and s.dirty:
                if self.unanswered.get(s.slot, 0) >= IDEMPOTENT_IN_FLIGHT:
                    self.dirty.add(tp)
                    continue
                self.delta(tp, s, slots, now_ms)
                if s.dirty:  # not published (its slot not owned now): the next turn's
                    self.dirty.add(tp)
        self._producer.poll(0)

    def delta(self, tp: TopicPartition, s: ServedPartition, slots: Mapping[int, OwnedSlot],
              now_ms: int) -> None:
        """Produce the DELTA of ``tp`` (nothing if its slot is no longer owned)."""
        slot = slots.get(s.slot)
        if slot is None:
            return
        low = s.buf.trimmed_below
        rec = take_delta(s.buf, self._member, slot.generation, s.next_from, low, now_ms)

        def delivered(err: KafkaError | None, msg: Message) -> None:
            self._answered(slot_id)
            if err is not None:
                self.delta_failures += 1
                metrics.BUFFER_DELTAS.labels("failed").inc()
                self.snapshot_due(tp, s)  # readers see a gap and reload from a snapshot
                _rate_limited.error(f"delta {tp}", "buffer worker: delta of %s at %d not "
                                    "written (%s): publishing a snapshot", tp, rec.position,
                                    err)
                return
            s.delivered += 1
            off = delivered_offset(msg)  # None: a retried write the broker had taken
            if off is not None:
                s.delta_offset = max(s.delta_offset, off)
            self.deltas_published += 1
            metrics.BUFFER_DELTAS.labels("ok").inc()

        slot_id = s.slot
        self.unanswered[slot_id] = self.unanswered.get(slot_id, 0) + 1  # before its report
        try:
            self._producer.produce(self._state_topic, rec.encode(), key=str(tp).encode(),
                                   partition=slot_id, on_delivery=delivered)
        except BaseException:
            self._answered(slot_id)
            raise
        s.produced += 1
        s.next_from = rec.position + 1
        s.dirty = False

    def _answered(self, slot_id: int) -> None:
        if (left := self.unanswered[slot_id] - 1) > 0:
            self.unanswered[slot_id] = left
        else:
            del self.unanswered[slot_id]

    def _log_start(self, tp: TopicPartition) -> int:
        """The partition's log start: the fetcher's cached value, else asked of the broker."""
        ktp = KafkaTP(tp.topic, tp.partition)
        low = self._data.get_watermark_offsets(ktp, cached=True)[0]
        if low < 0:
            low = self._data.get_watermark_offsets(ktp, timeout=self._admin_timeout_s)[0]
        return max(low, 0)

    def snapshots(self, served: Mapping[TopicPartition, ServedPartition],
                  slots: Mapping[int, OwnedSlot], force: bool,
                  only: set[int] | None = None) -> None:
        """Snapshot partitions that changed (``force``) or are due; one that fails stays due.

        A snapshot names the state offset of its last delta, so every delta it includes
        must be delivered first: the pending ones are flushed (an empty delta anchors a
        partition this owner has published nothing of yet).
        """
        try:
            for tp in self._store.take_failed():
                if tp in served:
                    self.snapshot_due(tp, served[tp])
        except Exception:
            log.exception("buffer worker: reading snapshot deliveries failed")
        now = time.monotonic()
        looked = served.items() if force or only is not None else [
            (tp, served[tp]) for tp in self.due if tp in served]
        todo = [(tp, s) for tp, s in looked
                if (only is None or s.slot in only) and (only is not None or s.retry_at <= now)
                and (s.snapshot_due or (force and s.delta_offset >= 0
                                        and s.produced > s.snapshots_at))]
        self.due = {tp for tp in self.due if tp in served and served[tp].snapshot_due}
        if not todo:
            return
        now_ms = int(time.time() * 1000)
        for tp, s in todo:
            if s.dirty or s.delivered == 0:
                self.folded(tp, s)
                self.delta(tp, s, slots, now_ms)
        self._producer.flush(self._admin_timeout_s)
        for tp, s in todo:
            slot = slots.get(s.slot)
            if slot is None or s.delivered < s.produced or s.delta_offset < 0:
                self.snapshot_due(tp, s)  # a delta is missing: next turn
                continue
            try:
                low = self._log_start(tp)
                s.buf.trim(low)
                self._store.publish(take_snapshot(s.buf, min_offset=low,
                                                  generation=slot.generation,
                                                  state_offset=s.delta_offset), tp)
            except Exception as exc:
                self.snapshot_failures += 1
                _rate_limited.error(f"snapshot {tp}", "buffer worker: snapshot of %s at %d "
                                    "not published (%r); retrying in %.0f s", tp,
                                    s.buf.last_offset, exc, SNAPSHOT_RETRY_S)
                self.snapshot_due(tp, s)
                s.retry_at = time.monotonic() + SNAPSHOT_RETRY_S
                continue
            self.snapshots_published += 1
            s.snapshot_due = False
            self.due.discard(tp)
            s.snapshots_at = s.produced
