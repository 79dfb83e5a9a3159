"""``BufferWorker``: keeps transaction buffers current and publishes their snapshots.

Hosted by ``txnstream worker --buffer-topics PATTERN``. Workers form the consumer group
``<prefix>-buffers`` over the data topics; the member assigned a partition:

1. restores its buffer from the latest snapshot (else folds from the log start);
2. folds every new record;
3. every ``snapshot_interval_s`` trims the buffer below the partition's log start (no
   reader can start below it) and publishes a snapshot (position folded to, max read
   position, ongoing/aborted txns, LWMs) to the compacted snapshot topic, in segments
   of at most ``MAX_SNAPSHOT_RECORD_BYTES`` (see :mod:`txnstream.buffer.snapshot_store`),
   so readers start from it instead of the log start;
4. every ``lwm_check_interval_s`` asks the coordinators for their low watermarks: a txn
   still ongoing here whose sequence is below its TC's LWM ended at the TC without a
   marker here (its partition was never registered). The worker writes an ABORT marker
   for it, so every reader converges and the partition is unblocked.

Why writing ABORT there is safe: a TC's LWM passes a txn only after that txn's markers
were written to every registered partition. If the txn *did* commit here, its COMMIT
marker is at a lower offset than the ABORT this worker appends, and the fold keeps the
first marker. A crash at any point loses nothing: snapshots are an optimisation, and
the fold is a function of the log.

The worker thread outlives every Kafka error: each step (fold, snapshot, LWM check)
fails alone, is logged, and runs again at its next turn; a snapshot that is refused or
not delivered leaves its partition due, so the next interval writes it again, and the
LWM aborts go on meanwhile. A consumer that reports a fatal error can consume no more:
it is closed and a new one joins the group (its partitions are assigned and restored
anew).

Bounds: per partition, the buffer's state above the log start (see
:mod:`txnstream.buffer.transaction_buffer`); per snapshot record,
``MAX_SNAPSHOT_RECORD_BYTES``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, Message, Producer
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.buffer.snapshot import restore, take_snapshot
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.buffer.transaction_buffer import TransactionBuffer
from txnstream.config import Config
from txnstream.errors import KafkaClientError, message_error
from txnstream.markers import MarkerKind, TxnMarker
from txnstream.types import TopicPartition

__all__ = ["BufferWorker"]

log = logging.getLogger(__name__)

ERROR_BACKOFF_S = 1.0
"""Pause after a failed fold step: no busy loop on a broker that is down, and short next
to the session timeout, so the group keeps the member."""


class BufferWorker:
    """Folds the partitions it is assigned; publishes snapshots; unblocks stuck partitions."""

    def __init__(self, config: Config, topics: list[str], snapshot_interval_s: float = 10.0,
                 lwm_check_interval_s: float = 5.0) -> None:
        self.config = config
        self.topics = topics
        self.snapshot_interval_s = snapshot_interval_s
        self.lwm_check_interval_s = lwm_check_interval_s
        self.buffers: dict[TopicPartition, TransactionBuffer] = {}
        self._dirty: set[TopicPartition] = set()
        self._store = TransactionBufferSnapshotStore(config)
        self._consumer = self._new_consumer()
        self._producer = Producer(config.producer())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.markers_written = 0
        self.snapshots_published = 0
        self.snapshot_failures = 0
        self.consumers_renewed = 0

    def _new_consumer(self) -> Consumer:
        return Consumer(self.config.consumer(
            f"{self.config.topics.prefix}-buffers",
            **{"client.id": f"tb-{uuid.uuid4().hex[:6]}"}))

    def _on_assign(self, consumer: Consumer, parts: list[KafkaTP]) -> None:
        for p in parts:
            tp = TopicPartition(p.topic, p.partition)
            try:
                low, _ = consumer.get_watermark_offsets(p, timeout=self.config.admin_timeout_s)
            except KafkaException as exc:  # fold from the earliest record the broker has
                log.warning("%s: log start unknown (%s); folding from the earliest", tp, exc)
                low = 0
            snap = None
            try:
                snap = self._store.latest(tp)
            except Exception as exc:
                log.warning("%s: no usable snapshot (%s); folding from the log start", tp, exc)
            if snap is not None and snap.position >= low - 1:
                buf = restore(snap)
            else:
                buf = TransactionBuffer(tp)
                buf.last_offset = low - 1
            buf.trim(low)
            self.buffers[tp] = buf
            p.offset = buf.last_offset + 1
        consumer.assign(parts)

    def _on_revoke(self, consumer: Consumer, parts: list[KafkaTP]) -> None:
        self._publish()  # what changed since the last snapshot, for the next owner
        self._step("snapshot flush", lambda: self._store.flush())
        for p in parts:
            self.buffers.pop(TopicPartition(p.topic, p.partition), None)
        consumer.unassign()

    def start(self) -> BufferWorker:
        """Run in a daemon thread."""
        self._thread = threading.Thread(target=self.run, name="tb-worker", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Publish final snapshots and leave the group."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def run(self) -> None:
        """The loop: each step fails alone and runs again at its next turn."""
        self._subscribe()
        next_snap = time.monotonic() + self.snapshot_interval_s
        next_lwm = time.monotonic() + self.lwm_check_interval_s
        try:
            while not self._stop.is_set():
                if not self._step("fold", self._fold_new):
                    self._stop.wait(ERROR_BACKOFF_S)
                now = time.monotonic()
                if now >= next_snap:
                    self._step("snapshot", self._publish)
                    next_snap = now + self.snapshot_interval_s
                if now >= next_lwm:
                    self._step("LWM check", self._abort_below_lwm)
                    next_lwm = now + self.lwm_check_interval_s
        finally:
            self._publish()
            for what, close in (("snapshot flush", lambda: self._store.flush()),
                                ("marker flush", lambda: self._producer.flush(5)),
                                ("consumer close", self._consumer.close)):
                self._step(what, close)

    def _step(self, what: str, fn: Callable[[], object]) -> bool:
        """Run one step; a failure is logged, never raised. Whether it succeeded."""
        try:
            fn()
            return True
        except KafkaClientError as exc:  # the consumer is done for: a new one rejoins
            log.error("buffer worker: %s: %s; renewing the group consumer", what, exc)
            self._renew_consumer()
        except Exception:
            log.exception("buffer worker: %s failed; retrying at its next turn", what)
        return False

    def _subscribe(self) -> None:
        self._consumer.subscribe(self.topics, on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_revoke)

    def _renew_consumer(self) -> None:
        old, self._consumer = self._consumer, self._new_consumer()
        try:
            old.close()
        except Exception as exc:  # already failed; the new member matters now
            log.warning("buffer worker: closing the failed consumer: %s", exc)
        self.buffers.clear()
        self._dirty.clear()
        self.consumers_renewed += 1
        self._subscribe()

    def _fold_new(self) -> None:
        runs: dict[tuple[str, int], list[Message]] = {}
        for m in self._consumer.consume(2000, 0.2):
            if message_error(m, "buffer worker", log):
                continue
            runs.setdefault((m.topic(), m.partition()), []).append(m)
        for (topic, partition), msgs in runs.items():
            tp = TopicPartition(topic, partition)
            buf = self.buffers.get(tp)
            if buf is not None and buf.fold_messages(msgs):
                self._dirty.add(tp)

    def _log_start(self, tp: TopicPartition) -> int:
        """The partition's log start: the fetcher's cached value, else asked of the broker."""
        ktp = KafkaTP(tp.topic, tp.partition)
        low = self._consumer.get_watermark_offsets(ktp, cached=True)[0]
        if low < 0:
            low = self._consumer.get_watermark_offsets(
                ktp, timeout=self.config.admin_timeout_s)[0]
        return max(low, 0)

    def _publish(self) -> None:
        """Trim and snapshot every changed partition; one that fails stays due. Never raises.

        A partition is due when it folded records since its last snapshot, or when that
        snapshot was refused or not delivered.
        """
        try:
            self._dirty |= self._store.take_failed()
        except Exception:
            log.exception("buffer worker: reading snapshot deliveries failed")
        for tp in list(self._dirty):
            buf = self.buffers.get(tp)
            if buf is None:
                self._dirty.discard(tp)
                continue
            try:
                low = self._log_start(tp)
                buf.trim(low)
                self._store.publish(take_snapshot(buf, min_offset=low), tp)
            except Exception as exc:
                self.snapshot_failures += 1
                log.error("buffer worker: snapshot of %s at %d not published (%r); "
                          "retrying at the next interval", tp, buf.last_offset, exc)
                self._dirty.add(tp)
                continue
            self.snapshots_published += 1
            self._dirty.discard(tp)

    def _abort_below_lwm(self) -> None:
        stuck = {tp: buf.ongoing_txns() for tp, buf in self.buffers.items() if buf.ongoing}
        if not stuck:
            return
        from txnstream.client import Client

        try:
            with Client(config=self.config) as client:
                lwms = {s.tc_id: s.stats.get("low_watermark", 0)
                        for s in client.admin.coordinator_stats()}
        except Exception as exc:
            log.warning("buffer worker: cannot read coordinator LWMs: %s", exc)
            return
        for tp, txns in stuck.items():
            for txn_id in txns:
                if txn_id.least_bits < lwms.get(txn_id.tc_id, 0):
                    marker = TxnMarker(txn_id, MarkerKind.ABORT, lwms[txn_id.tc_id])
                    self._producer.produce(tp.topic, marker.encode(), partition=tp.partition,
                                           headers=marker.headers())
                    self.markers_written += 1
                    log.warning("%s: txn %s ended at its coordinator (LWM %d) but is still "
                                "ongoing here: wrote an ABORT marker", tp, txn_id,
                                lwms[txn_id.tc_id])
        self._producer.flush(10)
