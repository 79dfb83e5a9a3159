"""Records of the pending-ack log, mirroring ``schemas/pending_ack_entry.avsc``.

Kinds: ``ACK_INDIVIDUAL`` / ``ACK_CUMULATIVE`` (a transactional ack, logged by the
partition's owner before it is confirmed), ``COMMIT_MARK`` / ``ABORT_MARK`` (written by
the coordinator when the txn ends), ``OWNER`` (a new owner's claim: its generation and
the cursor it starts from), ``REDELIVERED`` (offsets the owner delivered again: their
redelivery counts). The key ``subscription|topic|partition`` puts every record
of one subscription partition into one log partition, in order (murmur2 partitioning).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from txnstream.codec import codec
from txnstream.errors import CorruptRecordError
from txnstream.types import TopicPartition, TxnID

__all__ = ["PendingAckKind", "PendingAckEntry", "PendingAckCheckpoint", "CHECKPOINT_HEADER",
           "Checkpointed", "CursorMetadata", "is_checkpoint"]

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
    REDELIVERED = "REDELIVERED"
    """Offsets an owner delivered again unacked (a nack, ``redeliver_unacknowledged``),
    with the count they reached in its ``cursor`` field (version 3)."""


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
    log_epoch: int = -1
    """OWNER: the log epoch of the data partition ``cursor`` is on; -1 not known."""

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
            "log_epoch": self.log_epoch,
        }, None if self.kind is PendingAckKind.REDELIVERED else 2 if self.log_epoch > 0
            else 1)  # what older releases read, where nothing added since is used

    @classmethod
    def decode(cls, data: bytes | None) -> PendingAckEntry:
        """Parse; ``CorruptRecordError`` on garbage or an unknown version."""
        r = codec("pending_ack_entry").decode(data)
        try:
            txn = TxnID(r["most_bits"], r["least_bits"]) if r["most_bits"] >= 0 else None
            return cls(PendingAckKind(r["kind"]), r["subscription"], r["topic"], r["partition"],
                       txn, tuple(r["offsets"]), r["generation"], r["member_id"], r["cursor"],
                       r["log_epoch"])
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
    log_epoch: int = -1
    """The log epoch of the data partition the offsets are of; -1 not known."""
    redeliveries: tuple[tuple[int, int], ...] = ()
    """(offset, times it came back) of unacked offsets above the cursor (version 4)."""

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
            "log_epoch": self.log_epoch,
            "redeliveries": [{"offset": o, "count": n} for o, n in self.redeliveries],
        }, None if self.redeliveries else 3 if self.log_epoch > 0 else 2)  # what older
        # releases read, where the fields added since hold nothing

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
                             for e in r["ended"]), r["log_epoch"],
                       tuple((d["offset"], d["count"]) for d in r["redeliveries"]))
        except (ValueError, KeyError) as exc:
            raise CorruptRecordError(f"pending_ack_checkpoint: {exc!r}") from exc


def is_checkpoint(headers: list[tuple[str, bytes]] | None) -> bool:
    """Whether a pending-ack log record is a checkpoint (by its header)."""
    return bool(headers) and any(k == CHECKPOINT_HEADER for k, _ in headers or ())


def key_of(subscription: str, tp: TopicPartition) -> bytes:
    """The log key of a subscription partition."""
    return f"{subscription}|{tp.topic}|{tp.partition}".encode()


METADATA_PREFIX = "txnstream-pa1:"
"""Committed offset metadata of version 1: ``txnstream-pa1:P:C`` (a checkpoint pointer)."""
METADATA_PREFIX_V2 = "txnstream-pa2:"
"""Version 2: ``txnstream-pa2:E:P:C``, the cursor's log epoch ``E`` beside the pointer
(each part empty when there is none)."""


@dataclass(frozen=True, slots=True)
class Checkpointed:
    """Where a subscription partition's latest checkpoint is.

    Replay from ``position``; the checkpoint record itself is at ``at`` (>= position).
    """

    position: int
    at: int

    def to_metadata(self) -> str:
        """Version 1 metadata (what :class:`CursorMetadata` writes with no log epoch known)."""
        return f"{METADATA_PREFIX}{self.position}:{self.at}"

    @classmethod
    def from_metadata(cls, text: str | None) -> Checkpointed | None:
        """Parse either version; None when there is none (or another tool's metadata)."""
        return CursorMetadata.from_metadata(text).checkpoint


@dataclass(frozen=True, slots=True)
class CursorMetadata:
    """What a subscription keeps in its committed offset's metadata, beside the cursor.

    ``log_epoch``: which log of the partition the cursor is an offset of (the served
    buffer state's :attr:`~txnstream.buffer.served.BufferView.log_epoch`; None where not
    known: a partition read plain, or metadata written before version 2). A reader whose
    view is of a newer epoch knows the cursor belongs to a log that is gone (the topic
    was recreated). ``checkpoint``: the latest pending-ack checkpoint. Tens of bytes of
    Kafka's 4 KiB (``offset.metadata.max.bytes``).
    """

    log_epoch: int | None = None
    checkpoint: Checkpointed | None = None

    def to_metadata(self) -> str | None:
        """Version 2 text; version 1 (or None) on the first log.

        Epoch 0 and "not known" mean the same log, and the previous release reads
        version 1 too.
        """
        c = self.checkpoint
        if self.log_epoch is None or self.log_epoch <= 0:
            return c.to_metadata() if c is not None else None
        where = f"{c.position}:{c.at}" if c is not None else ":"
        return f"{METADATA_PREFIX_V2}{self.log_epoch}:{where}"

    @classmethod
    def from_metadata(cls, text: str | None) -> CursorMetadata:
        """Parse version 1 or 2; empty for none, another tool's or garbled metadata."""
        try:
            if text and text.startswith(METADATA_PREFIX):
                pos, at = text[len(METADATA_PREFIX):].split(":")
                return cls(None, Checkpointed(int(pos), int(at)))
            if text and text.startswith(METADATA_PREFIX_V2):
                epoch, pos, at = text[len(METADATA_PREFIX_V2):].split(":")
                return cls(int(epoch) if epoch else None,
                           Checkpointed(int(pos), int(at)) if pos and at else None)
        except ValueError:
            pass
        return cls()
