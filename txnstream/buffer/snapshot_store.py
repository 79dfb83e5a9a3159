"""``TransactionBufferSnapshotStore``: buffer snapshots in the compacted snapshot topic.

Key = ``topic-partition`` text, value = an encoded ``TransactionBufferSnapshot``. Records
are produced with Java's murmur2 partitioner, so a reader computes the one partition a
key lives in and scans only that partition for the latest value of its key (compaction
keeps that scan short). A snapshot that does not parse is logged with its position and
skipped: the reader falls back to an older one, or to folding from the log start.
"""

from __future__ import annotations

import logging
import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.buffer.snapshot import TransactionBufferSnapshot
from txnstream.config import Config
from txnstream.errors import CorruptRecordError
from txnstream.producer import murmur2_partition
from txnstream.types import TopicPartition

__all__ = ["TransactionBufferSnapshotStore"]

log = logging.getLogger(__name__)


class TransactionBufferSnapshotStore:
    """Publish and look up the latest snapshot of a partition's transaction buffer."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.topic = config.topics.buffer_snapshots
        self._producer: Producer | None = None
        self._partitions: int | None = None

    def _num_partitions(self) -> int:
        if self._partitions is None:
            p = self._producer_()
            meta = p.list_topics(self.topic, timeout=self.config.admin_timeout_s)
            self._partitions = len(meta.topics[self.topic].partitions)
        return self._partitions

    def _producer_(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(self.config.producer())
        return self._producer

    def publish(self, snap: TransactionBufferSnapshot, tp: TopicPartition) -> None:
        """Write ``snap`` as the latest snapshot of ``tp`` (asynchronously)."""
        key = str(tp).encode()
        p = self._producer_()
        p.produce(self.topic, snap.encode(), key=key,
                  partition=murmur2_partition(key, self._num_partitions()))
        p.poll(0)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait for published snapshots."""
        if self._producer is not None:
            self._producer.flush(timeout_s)

    def latest(self, tp: TopicPartition, at_or_before: int | None = None
               ) -> TransactionBufferSnapshot | None:
        """The newest valid snapshot of ``tp`` (folded to <= ``at_or_before`` if given)."""
        key = str(tp).encode()
        part = murmur2_partition(key, self._num_partitions())
        c = Consumer(self.config.consumer(f"{self.config.topics.prefix}-snap-{uuid.uuid4().hex}"))
        try:
            ktp = KafkaTP(self.topic, part)
            low, high = c.get_watermark_offsets(ktp, timeout=self.config.admin_timeout_s)
            if high <= low:
                return None
            ktp.offset = low
            c.assign([ktp])
            best: TransactionBufferSnapshot | None = None
            pos = low
            while pos < high:
                m = c.poll(2.0)
                if m is None:
                    break
                if m.error():
                    continue
                pos = m.offset() + 1
                if m.key() != key:
                    continue
                try:
                    snap = TransactionBufferSnapshot.decode(m.value())
                except CorruptRecordError as exc:
                    log.error("skipping unreadable buffer snapshot at %s[%d]@%d: %s",
                              self.topic, part, m.offset(), exc)
                    continue
                if at_or_before is None or snap.position <= at_or_before:
                    best = snap
            return best
        finally:
            c.close()
