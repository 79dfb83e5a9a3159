"""Records of the pending-ack log, mirroring ``schemas/pending_ack_entry.avsc``.

Kinds: ``ACK_INDIVIDUAL`` / ``ACK_CUMULATIVE`` (a transactional ack, logged by the
partition's owner before it is confirmed), ``COMMIT_MARK`` / ``ABORT_MARK`` (written by
the coordinator when the txn ends), ``OWNER`` (a new owner's claim: its generation and
the cursor it starts from). The key ``subscription|topic|partition`` puts every record
of one subscription partition into one log partition, in order (murmur2 partitioning).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from txnstream.codec import codec
from txnstream.errors import CorruptRecordError
from txnstream.types import TopicPartition, TxnID

__all__ = ["PendingAckKind", "PendingAckEntry", "PendingAckCheckpoint", "CHECKPOINT_HEADER",
           "Checkpointed", "is_checkpoint"]

CHECKPOINT_HEADER = "txnstream.pa"
"""Header marking a :class:`PendingAckCheckpoint` in the pending-ack log (value
``checkpoint``); every other record there is a :class:`PendingAckEntry`."""


class PendingAckKind(enum.Enum):
    """What a pending-ack record says."""

    ACK_INDIVIDUAL = "ACK_INDIVIDUAL"
    ACK_CUMULATIVE = "ACK_CUMULATIVE"
    COMMIT_MARK = "COMMIT_MARK"
    ABORT_MARK = "ABORT_MARK"
    OWNER = "OWNER"


@dataclass(frozen=True, slots=True)
class PendingAckEntry:
    """One pending-ack log record."""

    kind: PendingAckKind
    subscription: str
    topic: str
    partition: int
    txn_id: TxnID | None = None
    offsets: tuple[int, ...] = ()
    generation: int = -1
    member_id: str = ""
    cursor: int = -1

    @property
    def tp(self) -> TopicPartition:
        """The acked topic partition."""
        return TopicPartition(self.topic, self.partition)

    def key(self) -> bytes:
        """Kafka record key: one subscription partition, one ordered stream."""
        return key_of(self.subscription, self.tp)

    @classmethod
    def mark(cls, kind: PendingAckKind, subscription: str, tp: TopicPartition,
             txn_id: TxnID) -> PendingAckEntry:
        """A coordinator's COMMIT_MARK / ABORT_MARK for ``txn_id``."""
        return cls(kind, subscription, tp.topic, tp.partition, txn_id)

    def encode(self) -> bytes:
        """Version byte + Avro."""
        t = self.txn_id
        return codec("pending_ack_entry").encode({
            "kind": self.kind.value, "subscription": self.subscription, "topic": self.topic,
            "partition": self.partition, "most_bits": t.most_bits if t else -1,
            "least_bits": t.least_bits if t else -1, "offsets": list(self.offsets),
            "generation": self.generation, "member_id": self.member_id, "cursor": self.cursor,
        })

    @classmethod
    def decode(cls, data: bytes | None) -> PendingAckEntry:
        """Parse; ``CorruptRecordError`` on garbage or an unknown version."""
        r = codec("pending_ack_entry").decode(data)
        try:
            txn = TxnID(r["most_bits"], r["least_bits"]) if r["most_bits"] >= 0 else None
            return cls(PendingAckKind(r["kind"]), r["subscription"], r["topic"], r["partition"],
                       txn, tuple(r["offsets"]), r["generation"], r["member_id"], r["cursor"])
        except (ValueError, KeyError) as exc:
            raise CorruptRecordError(f"pending_ack_entry: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class PendingAckCheckpoint:
    """A handle's state as of a log position (``schemas/pending_ack_checkpoint.avsc``)."""

    subscription: str
    topic: str
    partition: int
    generation: int
    member_id: str
    cursor: int
    acked: tuple[int, ...] = ()
    pending: tuple[tuple[TxnID, tuple[int, ...]], ...] = ()
    cumulative: tuple[TxnID, int] | None = None
    ended: tuple[tuple[TxnID, bool], ...] = ()
    """The newest txns that ended here, oldest first, and whether each committed."""

    @property
    def tp(self) -> TopicPartition:
        """The acked topic partition."""
        return TopicPartition(self.topic, self.partition)

    def key(self) -> bytes:
        """The same key as the partition's other records: one ordered stream."""
        return key_of(self.subscription, self.tp)

    def encode(self) -> bytes:
        """Version byte + Avro."""
        cum = self.cumulative
        return codec("pending_ack_checkpoint").encode({
            "subscription": self.subscription, "topic": self.topic,
            "partition": self.partition, "generation": self.generation,
            "member_id": self.member_id, "cursor": self.cursor, "acked": list(self.acked),
            "pending": [{"most_bits": t.most_bits, "least_bits": t.least_bits,
                         "offsets": list(offs)} for t, offs in self.pending],
            "cumulative_most_bits": cum[0].most_bits if cum else -1,
            "cumulative_least_bits": cum[0].least_bits if cum else -1,
            "cumulative_offset": cum[1] if cum else -1,
            "ended": [{"most_bits": t.most_bits, "least_bits": t.least_bits,
                       "committed": committed} for t, committed in self.ended],
        })

    @classmethod
    def decode(cls, data: bytes | None) -> PendingAckCheckpoint:
        """Parse; ``CorruptRecordError`` on garbage or an unknown version."""
        r = codec("pending_ack_checkpoint").decode(data)
        try:
            cum = (TxnID(r["cumulative_most_bits"], r["cumulative_least_bits"]),
                   r["cumulative_offset"]) if r["cumulative_most_bits"] >= 0 else None
            return cls(r["subscription"], r["topic"], r["partition"], r["generation"],
                       r["member_id"], r["cursor"], tuple(r["acked"]),
                       tuple((TxnID(p["most_bits"], p["least_bits"]), tuple(p["offsets"]))
                             for p in r["pending"]), cum,
                       tuple((TxnID(e["most_bits"], e["least_bits"]), e["committed"])
                             for e in r["ended"]))
        except (ValueError, KeyError) as exc:
            raise CorruptRecordError(f"pending_ack_checkpoint: {exc!r}") from exc


def is_checkpoint(headers: list[tuple[str, bytes]] | None) -> bool:
    """Whether a pending-ack log record is a checkpoint (by its header)."""
    return bool(headers) and any(k == CHECKPOINT_HEADER for k, _ in headers or ())


def key_of(subscription: str, tp: TopicPartition) -> bytes:
    """The log key of a subscription partition."""
    return f"{subscription}|{tp.topic}|{tp.partition}".encode()


METADATA_PREFIX = "txnstream-pa1:"
"""Committed offset metadata naming the partition's latest pending-ack checkpoint."""


@dataclass(frozen=True, slots=True)
class Checkpointed:
    """Where a subscription partition's latest checkpoint is.

    Replay from ``position``; the checkpoint record itself is at ``at`` (>= position).
    """

    position: int
    at: int

    def to_metadata(self) -> str:
        """Kept in the group's committed offset metadata (a few bytes of its 4 KiB)."""
        return f"{METADATA_PREFIX}{self.position}:{self.at}"

    @classmethod
    def from_metadata(cls, text: str | None) -> Checkpointed | None:
        """Parse; None when there is none (or another tool's metadata)."""
        if not text or not text.startswith(METADATA_PREFIX):
            return None
        try:
            pos, at = text[len(METADATA_PREFIX):].split(":")
            return cls(int(pos), int(at))
        except ValueError:
            return None
