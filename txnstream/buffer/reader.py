"""Fold a partition from Kafka into a :class:`TransactionBuffer` (used by admin and Spark)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator

from confluent_kafka import Consumer, Message
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.buffer.snapshot import restore
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.buffer.transaction_buffer import TransactionBuffer
from txnstream.config import Config
from txnstream.errors import ConfigError, message_error
from txnstream.types import TopicPartition

__all__ = ["PartitionFolder"]

log = logging.getLogger(__name__)


class PartitionFolder:
    """Keeps buffers of several partitions current by folding new records on demand.

    Starts from the latest published snapshot if there is one (else the log start), then
    folds every record up to the partition's end at each :meth:`catch_up`. Each buffer
    is trimmed below its partition's log start whenever that is read (no reader can
    start below it); a reader that delivers trims below what it delivered itself
    (``buffers[tp].trim(below)``), so the state stays bounded by what is still ahead.
    """

    def __init__(self, config: Config, use_snapshots: bool = True) -> None:
        self.config = config
        self._consumer = Consumer(config.consumer(
            f"{config.topics.prefix}-fold-{uuid.uuid4().hex[:8]}",
            **{"fetch.max.bytes": 16 * 1024 * 1024}))
        self._snapshots = TransactionBufferSnapshotStore(config) if use_snapshots else None
        self.buffers: dict[TopicPartition, TransactionBuffer] = {}

    def _start(self, tp: TopicPartition, at_or_before: int | None = None) -> TransactionBuffer:
        low, _ = self._consumer.get_watermark_offsets(KafkaTP(tp.topic, tp.partition),
                                                      timeout=self.config.admin_timeout_s)
        buf = TransactionBuffer(tp)
        if self._snapshots is not None:
            try:
                snap = self._snapshots.latest(tp, at_or_before)
            except Exception:  # no snapshot topic, or unreadable: fold from the start
                snap = None
            if snap is not None and snap.position >= low - 1:
                buf = restore(snap)
        buf.trim(low)
        if buf.last_offset < low - 1:
            buf.last_offset = low - 1
            buf.max_read_position = max(buf.max_read_position, low - 1)
        self.buffers[tp] = buf
        return buf

    def catch_up(self, tps: list[TopicPartition], timeout_s: float = 60.0
                 ) -> dict[TopicPartition, TransactionBuffer]:
        """Fold every partition in ``tps`` up to its current end."""
        ends = {}
        assign = []
        for tp in tps:
            buf = self.buffers.get(tp)
            if buf is None:  # a partition seen for the first time: check it exists
                meta = self._consumer.list_topics(tp.topic, timeout=self.config.admin_timeout_s)
                t = meta.topics.get(tp.topic)
                if t is None or t.error is not None or tp.partition not in t.partitions:
                    raise ConfigError(f"unknown topic partition {tp}")
                buf = self._start(tp)
            low, high = self._consumer.get_watermark_offsets(
                KafkaTP(tp.topic, tp.partition), timeout=self.config.admin_timeout_s)
            buf.trim(low)
            if high - 1 > buf.last_offset:
                ends[(tp.topic, tp.partition)] = high - 1
                assign.append(KafkaTP(tp.topic, tp.partition, buf.last_offset + 1))
        if not assign:
            return {tp: self.buffers[tp] for tp in tps}
        by_key = {(tp.topic, tp.partition): self.buffers[tp] for tp in tps}
        self._consumer.assign(assign)
        deadline = time.monotonic() + timeout_s
        try:
            while ends and time.monotonic() < deadline:
                runs: dict[tuple[str, int], list[Message]] = {}
                for m in self._consumer.consume(5000, 0.2):
                    if not message_error(m, "partition folder", log):
                        runs.setdefault((m.topic(), m.partition()), []).append(m)
                for key, msgs in runs.items():
                    buf = by_key[key]
                    buf.fold_messages(msgs)
                    if buf.last_offset >= ends.get(key, -1):
                        ends.pop(key, None)
        finally:
            self._consumer.unassign()
        return {tp: self.buffers[tp] for tp in tps}

    def scan(self, tp: TopicPartition, since: int, until: int, timeout_s: float = 5.0
             ) -> Iterator[tuple[TransactionBuffer, list[Message]]]:
        """Fold ``tp`` up to offset ``until`` (exclusive), batch by batch, as it is read.

        Starts from a snapshot folded to before ``since`` (else the log start), so every
        record from ``since`` on passes through the yielded batches. Yields the buffer
        right after folding each batch, with the batch: a reader that delivers as it
        folds (Spark's batch read) emits what the buffer has decided. Raises
        ``RuntimeError`` if the partition yields nothing for ``timeout_s``.
        """
        buf = self.buffers.get(tp)
        if buf is None or buf.last_offset >= since:
            buf = self._start(tp, at_or_before=since - 1)
        pos = buf.last_offset + 1
        if pos >= until:
            return
        self._consumer.assign([KafkaTP(tp.topic, tp.partition, pos)])
        try:
            while pos < until:
                msgs = self._consumer.consume(min(5000, until - pos), timeout_s)
                if not msgs:
                    raise RuntimeError(f"{tp}: no records between {pos} and {until} within "
                                       f"{timeout_s:g} s (deleted by retention?)")
                batch = [m for m in msgs if not message_error(m, f"partition folder {tp}", log)]
                if not batch:
                    continue
                last = batch[-1].offset()
                if last >= until:
                    batch = [m for m in batch if m.offset() < until]
                buf.fold_messages(batch)
                pos = last + 1
                yield buf, batch
        finally:
            self._consumer.unassign()

    def close(self) -> None:
        """Release the consumer."""
        self._consumer.close()
