"""``TransactionBufferSnapshot``: a buffer's state, so readers need not fold from the start.

Mirrors ``schemas/txn_buffer_snapshot.avsc`` field for field (Pulsar's
``TransactionBufferSnapshot``). Its size is set by txns and hidden offsets, not records:
an ongoing or aborted txn's offsets are written as runs of consecutive offsets
(:class:`~txnstream.buffer.offset_runs.OffsetRuns`: one run unless other records
interleave, a few bytes each), and the hidden offsets that are no aborted txn's records
(markers, stragglers) as runs too. Taking it with ``min_offset`` = the partition's log
start offset drops what lies below (readers can never be there again). What is left
still grows with the markers and aborted txns the log retains, so a snapshot is
written as one or more :class:`TransactionBufferSnapshotSegment` records of at most
:data:`MAX_SNAPSHOT_RECORD_BYTES` each, as Pulsar's PIP-196 segmented snapshots do: a
reader joins a snapshot only from a complete set of one snapshot's segments.

Version 1 of the schema (``txn_buffer_snapshot.v1.avsc``) listed every offset; such
snapshots are still read (Avro schema resolution fills the version 2 fields with their
empty defaults, and :meth:`TransactionBufferSnapshot.from_avro` turns the offsets into
runs). Version 2 writes the version 1 lists empty. Version 3 adds the log epoch and the
topic id (:mod:`txnstream.buffer.recreation`); older snapshots read as epoch 0, id
unknown. Version 4 adds ``legacy_until`` (:mod:`txnstream.membership`); older snapshots
read as -1, not known. Version 5 adds the delayed records (:mod:`txnstream.buffer.delays`);
older snapshots read as none.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from txnstream.buffer.delays import DelayRuns, PendingDelays
from txnstream.buffer.offset_runs import OffsetRuns
from txnstream.buffer.transaction_buffer import OngoingTxn, TransactionBuffer
from txnstream.codec import codec
from txnstream.errors import CorruptRecordError
from txnstream.types import TopicPartition, TxnID

__all__ = ["TransactionBufferSnapshot", "TransactionBufferSnapshotSegment", "BufferRegistration",
           "MAX_SNAPSHOT_RECORD_BYTES", "take_snapshot", "restore", "split_snapshot",
           "join_segments"]

MAX_SNAPSHOT_RECORD_BYTES = 256 * 1024
"""Bound on one snapshot record's value. A quarter of the broker's default
``message.max.bytes`` (1 MiB) and of librdkafka's (1,000,000): a segment, its key and
the batch framing fit even where a topic lowers the limit to half, and several
segments still share one produce request. Readers hold one snapshot's segments at once."""
SEGMENT_OVERHEAD_BYTES = 1024
"""Room for a segment's fields besides its data: a topic name (at most 249 bytes), the
snapshot id and seven varints come to under 400 bytes."""


@dataclass(frozen=True, slots=True)
class TransactionBufferSnapshot:
    """One partition's fold state at ``position``."""

    topic: str
    partition: int
    position: int
    max_read_position: int
    ongoing: tuple[tuple[TxnID, OffsetRuns, int | None], ...]
    """(txn, its offsets here, its first record's timestamp)"""
    aborted: tuple[tuple[TxnID, OffsetRuns], ...]
    hidden: OffsetRuns
    """Offsets never delivered that are no aborted txn's records (``hidden_runs``)."""
    lwms: tuple[tuple[int, int], ...]
    ended: tuple[tuple[int, tuple[int, ...]], ...]
    generation: int = -1
    """The owner generation that took it (the offset of its OWNER state record)."""
    state_offset: int = -1
    """Offset in the state topic of the last delta it includes: readers tail from after it."""
    log_epoch: int = 0
    """The log epoch of the state (:attr:`TransactionBuffer.log_epoch`; version 3)."""
    topic_id: str = field(default="", compare=False)
    """The topic id of the log folded ("": not known; version 3). Names the log, is no
    part of the fold's state: equal folds of one log compare equal with or without it."""
    legacy_until: int = field(default=-1, compare=False)
    """:attr:`TransactionBuffer.legacy_until` (version 4); -1: not known (an older
    snapshot, or an owner that checks no membership). Not compared: it says which era's
    rules the fold applies below an offset, not what the fold decided."""
    delayed: tuple[tuple[int, int, int], ...] = ()
    """Visible records not due yet: (first, last, due ms) (version 5)."""
    pending_delays: tuple[tuple[TxnID, tuple[tuple[int, int, int, int], ...]], ...] = ()
    """Ongoing txns' delayed records: (txn, ((first, last, at ms, after ms), ...))."""

    def to_avro(self) -> dict[str, Any]:
        """The dict fastavro writes."""
        return {
            "topic": self.topic, "partition": self.partition, "position": self.position,
            "max_read_position": self.max_read_position,
            "ongoing": [{"most_bits": t.most_bits, "least_bits": t.least_bits,
                         "offsets": [], "runs": offs.to_deltas(), "first_timestamp_ms": ts}
                        for t, offs, ts in self.ongoing],
            "aborted": [{"most_bits": t.most_bits, "least_bits": t.least_bits,
                         "offsets": [], "runs": offs.to_deltas()} for t, offs in self.aborted],
            "invisible": [], "hidden_runs": self.hidden.to_deltas(),
            "lwms": [{"tc": tc, "lwm": lwm} for tc, lwm in self.lwms],
            "ended": [{"tc": tc, "seqs": list(seqs)} for tc, seqs in self.ended],
            "generation": self.generation, "state_offset": self.state_offset,
            "log_epoch": self.log_epoch, "topic_id": self.topic_id,
            "legacy_until": self.legacy_until,
            "delayed": [{"first": f, "last": la, "due_ms": d} for f, la, d in self.delayed],
            "pending_delays": [{"most_bits": t.most_bits, "least_bits": t.least_bits,
                                "first": f, "last": la, "at_ms": at, "after_ms": af}
                               for t, runs in self.pending_delays for f, la, at, af in runs],
        }

    @classmethod
    def from_avro(cls, r: dict[str, Any]) -> TransactionBufferSnapshot:
        """Inverse of :meth:`to_avro`; reads version 1's offset lists as runs too."""
        aborted = tuple((TxnID(a["most_bits"], a["least_bits"]), _runs(a))
                        for a in r["aborted"])
        hidden = OffsetRuns.from_deltas(r["hidden_runs"])
        if r["invisible"]:  # version 1: every hidden offset, aborted txns' records too
            in_aborted = {o for _, offs in aborted for o in offs}
            hidden = OffsetRuns(sorted(o for o in r["invisible"] if o not in in_aborted))
        pending: dict[TxnID, list[tuple[int, int, int, int]]] = {}
        for d in r["pending_delays"]:
            pending.setdefault(TxnID(d["most_bits"], d["least_bits"]), []).append(
                (d["first"], d["last"], d["at_ms"], d["after_ms"]))
        return cls(
            r["topic"], r["partition"], r["position"], r["max_read_position"],
            tuple((TxnID(o["most_bits"], o["least_bits"]), _runs(o),
                   o["first_timestamp_ms"]) for o in r["ongoing"]),
            aborted, hidden,
            tuple((x["tc"], x["lwm"]) for x in r["lwms"]),
            tuple((x["tc"], tuple(x["seqs"])) for x in r["ended"]),
            r["generation"], r["state_offset"], r["log_epoch"], r["topic_id"],
            r["legacy_until"],
            tuple((d["first"], d["last"], d["due_ms"]) for d in r["delayed"]),
            tuple((t, tuple(runs)) for t, runs in pending.items()),
        )

    def encode(self) -> bytes:
        """Version byte + Avro."""
        return codec("txn_buffer_snapshot").encode(self.to_avro())

    @classmethod
    def decode(cls, data: bytes | None) -> TransactionBufferSnapshot:
        """Parse; ``CorruptRecordError`` on garbage or an unknown version."""
        rec = codec("txn_buffer_snapshot").decode(data)
        try:
            return cls.from_avro(rec)
        except (ValueError, KeyError) as exc:
            raise CorruptRecordError(f"txn_buffer_snapshot: {exc!r}") from exc


def _runs(r: dict[str, Any]) -> OffsetRuns:
    """The offsets of a ``SnapshotOngoing``/``SnapshotAborted``: runs, or version 1's list."""
    return OffsetRuns.from_deltas(r["runs"]) if r["runs"] else OffsetRuns(r["offsets"])


def _not_in(offsets: list[int], runs: list[tuple[int, int]]) -> list[int]:
    """The sorted ``offsets`` outside the sorted, disjoint ``runs`` (one merge pass)."""
    out, i = [], 0
    for o in offsets:
        while i < len(runs) and runs[i][1] < o:
            i += 1
        if i == len(runs) or o < runs[i][0]:
            out.append(o)
    return out


def take_snapshot(buf: TransactionBuffer, min_offset: int = 0, generation: int = -1,
                  state_offset: int = -1) -> TransactionBufferSnapshot:
    """Snapshot ``buf``, dropping what lies below ``min_offset`` (the log start).

    Costs O(hidden offsets) time (``buf.invisible`` holds every aborted record), but its
    size is O(txns + runs + hidden offsets that are no aborted txn's records).
    """
    aborted = tuple(sorted((t, offs.at_or_above(min_offset))
                           for t, offs in buf.aborted.items() if offs[-1] >= min_offset))
    aborted_runs = sorted(r for _, offs in aborted for r in offs.runs())
    hidden = _not_in(sorted(o for o in buf.invisible if o >= min_offset), aborted_runs)
    return TransactionBufferSnapshot(
        buf.tp.topic, buf.tp.partition, buf.last_offset, buf.max_read_position,
        tuple(sorted((t, e.offsets.copy(), e.first_timestamp_ms)
                     for t, e in buf.ongoing.items())),
        aborted, OffsetRuns(hidden),
        tuple(sorted(buf.lwm.items())),
        tuple(sorted((tc, tuple(sorted(seqs))) for tc, seqs in buf.ended.items() if seqs)),
        generation, state_offset, buf.log_epoch, buf.topic_id,
        buf.legacy_until if buf.checks_membership else -1,
        tuple(buf.delayed.in_range(min_offset, buf.last_offset + 1)),
        tuple(sorted((t, tuple((f, la, at, af) for f, la, at, af in e.delays.runs
                               if la >= min_offset))
                     for t, e in buf.ongoing.items() if e.delays is not None)),
    )


def restore(snap: TransactionBufferSnapshot) -> TransactionBuffer:
    """A buffer in the state the snapshot describes; fold on from ``snap.position + 1``."""
    buf = TransactionBuffer(TopicPartition(snap.topic, snap.partition))
    buf.last_offset = snap.position
    buf.max_read_position = snap.max_read_position
    buf.ongoing = {t: OngoingTxn(offs[0], offs.copy(), ts) for t, offs, ts in snap.ongoing}
    for t, offs in snap.aborted:
        buf.mark_aborted(t, offs.copy())
    buf.mark_invisible(snap.hidden)
    buf.lwm = dict(snap.lwms)
    buf.ended = {tc: set(seqs) for tc, seqs in snap.ended}
    buf.log_epoch = snap.log_epoch
    buf.topic_id = snap.topic_id
    buf.legacy_until = snap.legacy_until
    buf.delayed = DelayRuns(snap.delayed)
    for t, runs in snap.pending_delays:
        if t in buf.ongoing and runs:
            buf.ongoing[t].delays = PendingDelays(runs)
    return buf


@dataclass(frozen=True, slots=True)
class TransactionBufferSnapshotSegment:
    """One piece of an encoded snapshot (Pulsar's PIP-196 segment).

    Mirrors ``schemas/txn_buffer_snapshot_segment.avsc``: ``data`` is bytes
    ``[index * chunk, (index + 1) * chunk)`` of the encoded snapshot.
    """

    topic: str
    partition: int
    snapshot_id: str
    position: int
    index: int
    count: int
    total_bytes: int
    crc32: int
    data: bytes

    def to_avro(self) -> dict[str, Any]:
        """The dict fastavro writes."""
        return {"topic": self.topic, "partition": self.partition,
                "snapshot_id": self.snapshot_id, "position": self.position,
                "index": self.index, "count": self.count, "total_bytes": self.total_bytes,
                "crc32": self.crc32, "data": self.data}

    def encode(self) -> bytes:
        """Version byte + Avro."""
        return codec("txn_buffer_snapshot_segment").encode(self.to_avro())

    @classmethod
    def decode(cls, data: bytes | None) -> TransactionBufferSnapshotSegment:
        """Parse; ``CorruptRecordError`` on garbage or an unknown version."""
        r = codec("txn_buffer_snapshot_segment").decode(data)
        try:
            return cls(r["topic"], r["partition"], r["snapshot_id"], r["position"],
                       r["index"], r["count"], r["total_bytes"], r["crc32"], r["data"])
        except KeyError as exc:
            raise CorruptRecordError(f"txn_buffer_snapshot_segment: {exc!r}") from exc


def split_snapshot(snap: TransactionBufferSnapshot, snapshot_id: str,
                   max_bytes: int = MAX_SNAPSHOT_RECORD_BYTES
                   ) -> list[TransactionBufferSnapshotSegment]:
    """``snap`` as segments whose encoded records are each at most ``max_bytes``."""
    data = snap.encode()
    chunk = max_bytes - SEGMENT_OVERHEAD_BYTES - len(snap.topic.encode()) \
        - len(snapshot_id.encode())
    if chunk <= 0:
        raise ValueError(f"max_bytes {max_bytes} leaves no room for a segment's data")
    count = max(1, math.ceil(len(data) / chunk))
    crc = zlib.crc32(data)
    return [TransactionBufferSnapshotSegment(
        snap.topic, snap.partition, snapshot_id, snap.position, i, count, len(data), crc,
        data[i * chunk:(i + 1) * chunk]) for i in range(count)]


def join_segments(segments: Sequence[TransactionBufferSnapshotSegment]
                  ) -> TransactionBufferSnapshot:
    """The snapshot a complete set of one snapshot's segments encodes (in any order).

    ``CorruptRecordError`` if the set is incomplete, mixes snapshots, or its bytes do
    not match the length and checksum every segment carries: no usable snapshot.
    """
    if not segments:
        raise CorruptRecordError("no snapshot segments")
    first = segments[0]
    head = (first.topic, first.partition, first.snapshot_id, first.position, first.count,
            first.total_bytes, first.crc32)
    by_index: dict[int, TransactionBufferSnapshotSegment] = {}
    for seg in segments:
        if (seg.topic, seg.partition, seg.snapshot_id, seg.position, seg.count,
                seg.total_bytes, seg.crc32) != head:
            raise CorruptRecordError(
                f"snapshot segments of different snapshots: {first.snapshot_id} "
                f"and {seg.snapshot_id}")
        by_index[seg.index] = seg
    if sorted(by_index) != list(range(first.count)):
        raise CorruptRecordError(
            f"snapshot {first.snapshot_id} of {first.topic}-{first.partition}: "
            f"{len(by_index)} of {first.count} segments (incomplete)")
    data = b"".join(by_index[i].data for i in range(first.count))
    if len(data) != first.total_bytes or zlib.crc32(data) != first.crc32:
        raise CorruptRecordError(
            f"snapshot {first.snapshot_id} of {first.topic}-{first.partition}: joined "
            f"segments fail their length or checksum")
    return TransactionBufferSnapshot.decode(data)


@dataclass(frozen=True, slots=True)
class BufferRegistration:
    """Mirrors ``schemas/txn_buffer_registration.avsc``: ``topic``-``partition`` is served.

    Written by a coordinator, to the partition's snapshot slot, before it confirms the
    first txn registration of that partition.
    """

    topic: str
    partition: int

    def encode(self) -> bytes:
        """Version byte + Avro."""
        return codec("txn_buffer_registration").encode(
            {"topic": self.topic, "partition": self.partition})

    @classmethod
    def decode(cls, data: bytes | None) -> BufferRegistration:
        """Parse; ``CorruptRecordError`` on garbage or an unknown version."""
        r = codec("txn_buffer_registration").decode(data)
        return cls(r["topic"], r["partition"])
