"""``BufferWorker``: keeps transaction buffers current and publishes their snapshots.

Hosted by ``txnstream worker --buffer-topics PATTERN``. Workers form the consumer group
``<prefix>-buffers`` over the data topics; the member assigned a partition:

1. restores its buffer from the latest snapshot (else folds from the log start);
2. folds every new record;
3. every ``snapshot_interval_s`` publishes a snapshot (position folded to, max read
   position, ongoing/aborted txns, LWMs) to the compacted snapshot topic, so readers
   start from it instead of the log start;
4. every ``lwm_check_interval_s`` asks the coordinators for their low watermarks: a txn
   still ongoing here whose sequence is below its TC's LWM ended at the TC without a
   marker here (its partition was never registered). The worker writes an ABORT marker
   for it, so every reader converges and the partition is unblocked.

Why writing ABORT there is safe: a TC's LWM passes a txn only after that txn's markers
were written to every registered partition. If the txn *did* commit here, its COMMIT
marker is at a lower offset than the ABORT this worker appends, and the fold keeps the
first marker. A crash at any point loses nothing: snapshots are an optimisation, and
the fold is a function of the log.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.buffer.snapshot import restore, take_snapshot
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.buffer.transaction_buffer import TransactionBuffer
from txnstream.config import Config
from txnstream.markers import MarkerKind, TxnMarker
from txnstream.types import TopicPartition

__all__ = ["BufferWorker"]

log = logging.getLogger(__name__)


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
        self._consumer = Consumer(config.consumer(
            f"{config.topics.prefix}-buffers",
            **{"client.id": f"tb-{uuid.uuid4().hex[:6]}"}))
        self._producer = Producer(config.producer())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.markers_written = 0

    def _on_assign(self, consumer: Consumer, parts: list[KafkaTP]) -> None:
        for p in parts:
            tp = TopicPartition(p.topic, p.partition)
            low, _ = consumer.get_watermark_offsets(p, timeout=self.config.admin_timeout_s)
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
            self.buffers[tp] = buf
            p.offset = buf.last_offset + 1
        consumer.assign(parts)

    def _on_revoke(self, consumer: Consumer, parts: list[KafkaTP]) -> None:
        self._publish(force=True)
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
        """The loop."""
        self._consumer.subscribe(self.topics, on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_revoke)
        next_snap = time.monotonic() + self.snapshot_interval_s
        next_lwm = time.monotonic() + self.lwm_check_interval_s
        try:
            while not self._stop.is_set():
                runs: dict[tuple[str, int], list[Message]] = {}
                for m in self._consumer.consume(2000, 0.2):
                    if m.error():
                        if m.error().code() != KafkaError._PARTITION_EOF:
                            log.warning("buffer worker: %s", m.error())
                        continue
                    runs.setdefault((m.topic(), m.partition()), []).append(m)
                for (topic, partition), msgs in runs.items():
                    tp = TopicPartition(topic, partition)
                    buf = self.buffers.get(tp)
                    if buf is not None and buf.fold_messages(msgs):
                        self._dirty.add(tp)
                now = time.monotonic()
                if now >= next_snap:
                    self._publish()
                    next_snap = now + self.snapshot_interval_s
                if now >= next_lwm:
                    self._abort_below_lwm()
                    next_lwm = now + self.lwm_check_interval_s
        finally:
            self._publish(force=True)
            self._store.flush()
            self._producer.flush(5)
            self._consumer.close()

    def _publish(self, force: bool = False) -> None:
        for tp in list(self._dirty if not force else self.buffers):
            buf = self.buffers.get(tp)
            if buf is None:
                continue
            low, _ = self._consumer.get_watermark_offsets(
                KafkaTP(tp.topic, tp.partition), cached=True) or (0, 0)
            self._store.publish(take_snapshot(buf, min_offset=max(low, 0)), tp)
        self._dirty.clear()

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
