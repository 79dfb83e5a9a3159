"""``TransactionBufferSnapshot``: a buffer's state, so readers need not fold from the start.

Mirrors ``schemas/txn_buffer_snapshot.avsc`` field for field (Pulsar's
``TransactionBufferSnapshot``). Size is bounded by taking the snapshot with
``min_offset`` = the partition's log start offset: aborted entries and invisible offsets
below it are dropped (readers can never be there again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from txnstream.buffer.transaction_buffer import OngoingTxn, TransactionBuffer
from txnstream.codec import codec
from txnstream.errors import CorruptRecordError
from txnstream.types import TopicPartition, TxnID

__all__ = ["TransactionBufferSnapshot", "take_snapshot", "restore"]


@dataclass(frozen=True, slots=True)
class TransactionBufferSnapshot:
    """One partition's fold state at ``position``."""

    topic: str
    partition: int
    position: int
    max_read_position: int
    ongoing: tuple[tuple[TxnID, tuple[int, ...], int | None], ...]
    aborted: tuple[tuple[TxnID, tuple[int, ...]], ...]
    invisible: tuple[int, ...]
    lwms: tuple[tuple[int, int], ...]
    ended: tuple[tuple[int, tuple[int, ...]], ...]

    def to_avro(self) -> dict[str, Any]:
        """The dict fastavro writes."""
        return {
            "topic": self.topic, "partition": self.partition, "position": self.position,
            "max_read_position": self.max_read_position,
            "ongoing": [{"most_bits": t.most_bits, "least_bits": t.least_bits,
                         "offsets": list(offs), "first_timestamp_ms": ts}
                        for t, offs, ts in self.ongoing],
            "aborted": [{"most_bits": t.most_bits, "least_bits": t.least_bits,
                         "offsets": list(offs)} for t, offs in self.aborted],
            "invisible": list(self.invisible),
            "lwms": [{"tc": tc, "lwm": lwm} for tc, lwm in self.lwms],
            "ended": [{"tc": tc, "seqs": list(seqs)} for tc, seqs in self.ended],
        }

    @classmethod
    def from_avro(cls, r: dict[str, Any]) -> TransactionBufferSnapshot:
        """Inverse of :meth:`to_avro`."""
        return cls(
            r["topic"], r["partition"], r["position"], r["max_read_position"],
            tuple((TxnID(o["most_bits"], o["least_bits"]), tuple(o["offsets"]),
                   o["first_timestamp_ms"]) for o in r["ongoing"]),
            tuple((TxnID(a["most_bits"], a["least_bits"]), tuple(a["offsets"]))
                  for a in r["aborted"]),
            tuple(r["invisible"]),
            tuple((x["tc"], x["lwm"]) for x in r["lwms"]),
            tuple((x["tc"], tuple(x["seqs"])) for x in r["ended"]),
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


def take_snapshot(buf: TransactionBuffer, min_offset: int = 0) -> TransactionBufferSnapshot:
    """Snapshot ``buf``, dropping what lies below ``min_offset`` (the log start)."""
    return TransactionBufferSnapshot(
        buf.tp.topic, buf.tp.partition, buf.last_offset, buf.max_read_position,
        tuple(sorted((t, tuple(e.offsets), e.first_timestamp_ms)
                     for t, e in buf.ongoing.items())),
        tuple(sorted((t, tuple(o for o in offs if o >= min_offset))
                     for t, offs in buf.aborted.items() if offs[-1] >= min_offset)),
        tuple(sorted(o for o in buf.invisible if o >= min_offset)),
        tuple(sorted(buf.lwm.items())),
        tuple(sorted((tc, tuple(sorted(seqs))) for tc, seqs in buf.ended.items() if seqs)),
    )


def restore(snap: TransactionBufferSnapshot) -> TransactionBuffer:
    """A buffer in the state the snapshot describes; fold on from ``snap.position + 1``."""
    buf = TransactionBuffer(TopicPartition(snap.topic, snap.partition))
    buf.last_offset = snap.position
    buf.max_read_position = snap.max_read_position
    buf.ongoing = {t: OngoingTxn(offs[0], list(offs), ts) for t, offs, ts in snap.ongoing}
    buf.aborted = {t: list(offs) for t, offs in snap.aborted if offs}
    buf.invisible = set(snap.invisible)
    buf.lwm = dict(snap.lwms)
    buf.ended = {tc: set(seqs) for tc, seqs in snap.ended}
    return buf
