"""``TransactionBufferSnapshotStore``: buffer snapshots in the compacted snapshot topic.

Layout (Pulsar's PIP-196 segmented snapshots, on a compacted Kafka topic): a snapshot of
partition ``tp`` is one or more :class:`TransactionBufferSnapshotSegment` records, each
at most :data:`MAX_SNAPSHOT_RECORD_BYTES`, keyed ``<tp>/<slot>/<index>``. Every record
of ``tp`` goes to the one partition Java's murmur2 puts the key ``<tp>`` in, so a reader
scans one partition, in offset order, for the newest *complete* snapshot: all ``count``
segments of one snapshot id. Compaction keeps one record per key, so the scan is short.

Writes alternate between two slots (key sets): a write cut short (crash, refused
produce, failed delivery) leaves the previous snapshot's slot intact, and the next
write goes to the same, unfinished slot again. Segments past a shorter snapshot's count
are deleted with tombstones. A reader that finds no complete set has no usable
snapshot and folds from the log start, as it does with none.

Format versions: a snapshot of the earlier single-record format (key ``<tp>``, value a
``TransactionBufferSnapshot``) is still read; the first segmented write of ``tp``
deletes it with a tombstone. A record that does not parse, or whose version this reader
does not know, is logged with its position and skipped.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.buffer.snapshot import (
    BufferRegistration,
    TransactionBufferSnapshot,
    TransactionBufferSnapshotSegment,
    join_segments,
    split_snapshot,
)
from txnstream.config import Config
from txnstream.errors import (
    ConfigError,
    CorruptRecordError,
    KafkaErrorKind,
    classify_kafka_error,
    message_error,
)
from txnstream.kafka.clients import close_producer
from txnstream.kafka.fetch import read_to
from txnstream.kafka.partitioning import murmur2_partition
from txnstream.types import TopicPartition

__all__ = ["TransactionBufferSnapshotStore", "LatestSnapshotFinder", "RegistrationScan", "SlotScan",
           "ScanStopped", "segment_key", "registration_key", "registered_partition"]

log = logging.getLogger(__name__)


class ScanStopped(Exception):
    """A scan given up: its caller is stopping (:meth:`TransactionBufferSnapshotStore.scan`)."""


SLOTS = 2
"""Key sets a partition's snapshots alternate between (see the module docstring)."""


def segment_key(tp: TopicPartition, slot: int, index: int) -> bytes:
    """Key of segment ``index`` in ``slot`` (topic names never contain ``/``)."""
    return f"{tp}/{slot}/{index}".encode()


REGISTERED = "registered"


def registration_key(tp: TopicPartition) -> bytes:
    """Key of ``tp``'s registration: a coordinator registered it in a txn (it is served)."""
    return f"{tp}/{REGISTERED}".encode()


def registered_partition(key: bytes | None, value: bytes | None) -> TopicPartition | None:
    """The partition a snapshot-topic record registers; None: not a live registration."""
    if key is None or value is None or not key.endswith(f"/{REGISTERED}".encode()):
        return None
    try:
        return TopicPartition.parse(key.rsplit(b"/", 1)[0].decode())
    except (ValueError, UnicodeDecodeError):
        return None


class LatestSnapshotFinder:
    """Fed one snapshot partition's records in offset order: the newest usable snapshot.

    A pure fold (no I/O), so the store's scan is a thin loop around it. Only complete
    segment sets of one snapshot (or an old single-record snapshot) count; with
    ``at_or_before``, only snapshots folded to at most that offset.
    """

    def __init__(self, tp: TopicPartition, at_or_before: int | None = None) -> None:
        self.tp = tp
        self.at_or_before = at_or_before
        self.best: TransactionBufferSnapshot | None = None
        self.registered = False
        """Whether a coordinator registered ``tp`` (a txn wrote, or may write, to it)."""
        self._registration_key = registration_key(tp)
        self._legacy_key = str(tp).encode()
        self._prefix = f"{tp}/".encode()
        self._partial: dict[str, dict[int, TransactionBufferSnapshotSegment]] = {}

    def add(self, key: bytes | None, value: bytes | None, where: str) -> None:
        """One record of the partition; ``where`` names it in logs (topic[part]@offset)."""
        if key is None or value is None:  # not ours, or a tombstone
            return
        if key == self._registration_key:
            self.registered = True
            return
        if key == self._legacy_key:
            try:
                snap = TransactionBufferSnapshot.decode(value)
            except CorruptRecordError as exc:
                log.error("skipping unreadable buffer snapshot at %s: %s", where, exc)
                return
            self._consider(snap)
            return
        if not key.startswith(self._prefix):
            return
        try:
            seg = TransactionBufferSnapshotSegment.decode(value)
        except CorruptRecordError as exc:
            log.error("skipping unreadable buffer snapshot segment at %s: %s", where, exc)
            return
        if (seg.topic, seg.partition) != (self.tp.topic, self.tp.partition):
            log.error("skipping buffer snapshot segment at %s: it is of %s-%d", where,
                      seg.topic, seg.partition)
            return
        if self.at_or_before is not None and seg.position > self.at_or_before:
            return
        parts = self._partial.setdefault(seg.snapshot_id, {})
        parts[seg.index] = seg
        if len(parts) < seg.count:
            return
        # complete: older unfinished sets can no longer be the newest; forget them
        for sid in list(self._partial):
            del self._partial[sid]
            if sid == seg.snapshot_id:
                break
        try:
            self._consider(join_segments(list(parts.values())))
        except CorruptRecordError as exc:
            log.error("skipping buffer snapshot ending at %s: %s", where, exc)

    def _consider(self, snap: TransactionBufferSnapshot) -> None:
        """The newest: the highest owner generation, then log epoch, then position.

        A zombie owner's snapshot written after a newer owner's claim (lower generation)
        never displaces the newer owner's, whose deltas readers follow. Of one owner's,
        a snapshot of a newer log epoch (the topic was recreated: its position is the
        new log's, likely lower) displaces the older log's.
        """
        if self.at_or_before is not None and snap.position > self.at_or_before:
            return
        self.registered = True
        best = self.best
        if best is None or (snap.generation, snap.log_epoch, snap.position) >= (
                best.generation, best.log_epoch, best.position):
            self.best = snap


class RegistrationScan:
    """Fed snapshot partitions' records: whether any of ``tps`` is registered.

    As :class:`LatestSnapshotFinder` says it: a registration, or a usable snapshot (only
    a registered partition is served). A partition no txn registered has neither, so
    nothing is decoded then.
    """

    def __init__(self, tps: list[TopicPartition]) -> None:
        self.finders = [LatestSnapshotFinder(tp) for tp in tps]

    def add(self, key: bytes | None, value: bytes | None, where: str) -> None:
        """One record of a partition (see :meth:`LatestSnapshotFinder.add`)."""
        for finder in self.finders:
            finder.add(key, value, where)

    @property
    def registered(self) -> bool:
        """Whether any of the partitions was found registered."""
        return any(f.registered for f in self.finders)


class SlotScan:
    """Fed one snapshot partition's records: every partition registered or snapshotted there.

    ``only``: just these partitions (a reader's assignment; the others' records are
    skipped undecoded).
    """

    def __init__(self, only: set[TopicPartition] | None = None) -> None:
        self.finders: dict[TopicPartition, LatestSnapshotFinder] = {}
        self._only = only

    def add(self, key: bytes | None, value: bytes | None, where: str) -> None:
        """One record of the partition (see :meth:`LatestSnapshotFinder.add`)."""
        if key is None:
            return
        head = key.split(b"/", 1)[0]
        try:
            tp = TopicPartition.parse(head.decode())
        except (ValueError, UnicodeDecodeError):
            log.error("skipping snapshot record with an unknown key at %s: %r", where, key)
            return
        if self._only is not None and tp not in self._only:
            return
        finder = self.finders.get(tp)
        if finder is None:
            finder = self.finders[tp] = LatestSnapshotFinder(tp)
        finder.add(key, value, where)


@dataclass
class _Write:
    """Delivery state of one segmented snapshot write."""

    tp: TopicPartition
    slot: int
    left: int
    failed: bool = False


class TransactionBufferSnapshotStore:
    """Publish and look up the latest snapshot of a partition's transaction buffer."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.topic = config.topics.buffer_snapshots
        self._producer: Producer | None = None
        self._partitions: int | None = None
        self._good_slot: dict[TopicPartition, int] = {}
        """Slot holding the newest completely delivered snapshot of each partition."""
        self._counts: dict[tuple[TopicPartition, int], int] = {}
        """Segments last written to each (partition, slot): longer ones get tombstones."""
        self._legacy_deleted: set[TopicPartition] = set()
        self._failed: set[TopicPartition] = set()

    def _num_partitions(self) -> int:
        if self._partitions is None:
            meta = self._producer_().list_topics(self.topic,
                                                 timeout=self.config.admin_timeout_s)
            t = meta.topics.get(self.topic)
            if t is None or t.error is not None or not t.partitions:
                raise ConfigError(f"snapshot topic {self.topic} does not exist "
                                  "(`txnstream init` creates it)")
            self._partitions = len(t.partitions)
        return self._partitions

    def _producer_(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(self.config.producer())
        return self._producer

    def partition_of(self, tp: TopicPartition) -> int:
        """The snapshot partition (= buffer slot) of ``tp``."""
        return murmur2_partition(str(tp).encode(), self._num_partitions())

    def publish(self, snap: TransactionBufferSnapshot, tp: TopicPartition) -> None:
        """Write ``snap`` as the newest snapshot of ``tp``, in segments, asynchronously.

        Raises what the producer raises at once (``KafkaException``, ``BufferError``):
        nothing of this snapshot counts then. A delivery that fails later is logged and
        reported by :meth:`take_failed`; either way the previous snapshot stays readable.
        """
        p = self._producer_()
        p.poll(0)  # deliveries of the previous write decide which slot is good
        part = self.partition_of(tp)
        slot = 1 - self._good_slot.get(tp, 1)
        segs = split_snapshot(snap, uuid.uuid4().hex)
        write = _Write(tp, slot, len(segs))

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                if not write.failed:
                    log.error("buffer snapshot of %s at %d: segment not written (%s); the "
                              "previous snapshot stays in use, the next interval retries",
                              tp, snap.position, err)
                write.failed = True
                self._failed.add(tp)
                self._drop_producer_if_fatal(err)
                return
            write.left -= 1
            if write.left == 0 and not write.failed:
                self._good_slot[tp] = slot

        try:
            for seg in segs:
                p.produce(self.topic, seg.encode(), key=segment_key(tp, slot, seg.index),
                          partition=part, on_delivery=delivered)
            for i in range(len(segs), self._counts.get((tp, slot), 0)):
                p.produce(self.topic, None, key=segment_key(tp, slot, i), partition=part)
            self._counts[(tp, slot)] = len(segs)
            if tp not in self._legacy_deleted:
                p.produce(self.topic, None, key=str(tp).encode(), partition=part)
                self._legacy_deleted.add(tp)
        except KafkaException as exc:
            self._drop_producer_if_fatal(exc.args[0] if exc.args else None)
            raise
        p.poll(0)

    def _drop_producer_if_fatal(self, err: object) -> None:
        """A producer with a fatal error can send nothing more: the next write makes anew."""
        if classify_kafka_error(err) is KafkaErrorKind.FATAL and \
                getattr(err, "fatal", lambda: False)():
            log.error("snapshot producer failed fatally (%s); a new one takes over", err)
            self._producer = None

    def take_failed(self) -> set[TopicPartition]:
        """Partitions whose snapshot deliveries failed since the last call."""
        if self._producer is not None:
            self._producer.poll(0)
        failed, self._failed = self._failed, set()
        return failed

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait for published snapshots."""
        if self._producer is not None:
            self._producer.flush(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Wait for published snapshots (up to ``timeout_s``), then close the producer."""
        if self._producer is not None:
            close_producer(self._producer, timeout_s)
            self._producer = None

    def latest(self, tp: TopicPartition, at_or_before: int | None = None
               ) -> TransactionBufferSnapshot | None:
        """The newest usable snapshot of ``tp`` (folded to <= ``at_or_before`` if given)."""
        return self.find(tp, at_or_before).best

    def find(self, tp: TopicPartition, at_or_before: int | None = None) -> LatestSnapshotFinder:
        """Scan ``tp``'s snapshot partition: its newest snapshot and whether it is registered."""
        finder = LatestSnapshotFinder(tp, at_or_before)
        self.scan(self.partition_of(tp), finder)
        return finder

    def find_many(self, tps: list[TopicPartition]) -> dict[TopicPartition, LatestSnapshotFinder]:
        """:meth:`find` of each of ``tps``, reading each snapshot partition once.

        A reader assigned many partitions (Kafka assigns a whole topic at once) pays one
        scan per snapshot partition instead of one per data partition.
        """
        by_part: dict[int, set[TopicPartition]] = {}
        for tp in tps:
            by_part.setdefault(self.partition_of(tp), set()).add(tp)
        out: dict[TopicPartition, LatestSnapshotFinder] = {}
        for part, group in sorted(by_part.items()):
            found = SlotScan(only=group)
            self.scan(part, found)
            for tp in group:
                out[tp] = found.finders.get(tp) or LatestSnapshotFinder(tp)
        return out

    def scan_slot(self, slot: int, stop: threading.Event | None = None) -> tuple[SlotScan, int]:
        """Every partition registered or snapshotted in ``slot``, and the slot's end offset.

        ``stop``: once set, the scan ends at its next batch with :class:`ScanStopped`.
        """
        found = SlotScan()
        return found, self.scan(slot, found, stop)

    def any_registered(self, tps: list[TopicPartition]) -> bool:
        """Whether any of ``tps`` is registered now: their snapshot partitions, scanned."""
        found = RegistrationScan(tps)
        for part in sorted({self.partition_of(tp) for tp in tps}):
            self.scan(part, found)
            if found.registered:
                return True
        return False

    def scan(self, part: int, sink: LatestSnapshotFinder | SlotScan | RegistrationScan,
             stop: threading.Event | None = None) -> int:
        """Feed every record of snapshot partition ``part`` to ``sink``; the end scanned to.

        A partition not compacted yet can take seconds to read (a CI run's took 42 s); a
        caller that is stopping (``stop`` set) must not sit in it: :class:`ScanStopped`.
        """
        where = f"snapshot store {self.topic}[{part}]"
        c = Consumer(self.config.consumer(f"{self.config.topics.prefix}-snap-{uuid.uuid4().hex}",
                                          **{"fetch.wait.max.ms": 10}))
        try:
            ktp = KafkaTP(self.topic, part)
            low, high = c.get_watermark_offsets(ktp, timeout=self.config.admin_timeout_s)
            if high <= low:
                return high
            ktp.offset = low
            c.assign([ktp])
            for msgs in read_to(c, self.topic, part, high, self.config.admin_timeout_s):
                if stop is not None and stop.is_set():
                    raise ScanStopped(f"{where}: scan stopped at {msgs[0].offset()} of {high}")
                for m in msgs:
                    if message_error(m, where, log) or m.offset() >= high:
                        continue
                    sink.add(m.key(), m.value(), f"{self.topic}[{part}]@{m.offset()}")
            return high
        finally:
            c.close()

    def register(self, tps: list[TopicPartition], timeout_s: float) -> bool:
        """Write ``tps``' registrations and wait for them: whether all were written.

        A coordinator calls this before it confirms the first txn registration of a
        partition, so the registration precedes every txn record written there.
        """
        p = self._producer_()
        failed: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failed.append(err)

        try:
            for tp in tps:
                p.produce(self.topic, BufferRegistration(tp.topic, tp.partition).encode(),
                          key=registration_key(tp), partition=self.partition_of(tp),
                          on_delivery=delivered)
        except (KafkaException, BufferError) as exc:
            log.warning("registration of %s not written: %s", tps, exc)
            return False
        left = p.flush(timeout_s)
        if left or failed:
            log.warning("registration of %s not written: %s", tps,
                        failed[0] if failed else f"{left} undelivered")
            return False
        return True
