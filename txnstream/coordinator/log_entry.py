"""Records of the transaction log (``__txn_log``), mirroring ``schemas/txn_log_entry.avsc``.

Pulsar's model is ``TransactionMetadataEntry``; here one flat record type covers:

- ``EPOCH``: a worker took ownership of the partition (fencing, DESIGN.md section 5).
- ``TXN``: a status change and/or added partitions/subscriptions of one transaction.
- ``GROUP_END``: several transactions of this TC end together under an idempotency key.
- ``CHECKPOINT``: the sequence counter and recent group keys, so prefix truncation of
  the log forgets neither.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from txnstream.codec import codec
from txnstream.errors import CorruptRecordError
from txnstream.types import TopicPartition, TxnStatus

__all__ = ["LogEntryKind", "SubscriptionRef", "GroupOutcome", "TransactionLogEntry"]


class LogEntryKind(enum.Enum):
    """What a transaction-log record is."""

    EPOCH = "EPOCH"
    TXN = "TXN"
    GROUP_END = "GROUP_END"
    CHECKPOINT = "CHECKPOINT"


@dataclass(frozen=True, order=True, slots=True)
class SubscriptionRef:
    """A subscription (consumer group) on one topic partition that a txn acked on."""

    topic: str
    partition: int
    subscription: str

    @property
    def tp(self) -> TopicPartition:
        """The acked topic partition."""
        return TopicPartition(self.topic, self.partition)

    def __str__(self) -> str:
        return f"{self.subscription}@{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class GroupOutcome:
    """The outcome of one group end, remembered by key."""

    key: str
    status: TxnStatus
    seqs: tuple[int, ...]

    def encoded_size(self) -> int:
        """Bytes this outcome adds to a CHECKPOINT record's Avro encoding (exact).

        The coordinator bounds its checkpoints by adding these up, without encoding.
        """
        key = self.key.encode()
        seqs = 1 if not self.seqs else (
            _varint_size(len(self.seqs)) + sum(_varint_size(s) for s in self.seqs) + 1)
        return _varint_size(len(key)) + len(key) + 1 + seqs


def _varint_size(n: int) -> int:
    """Length of Avro's zig-zag varint encoding of ``n``."""
    z = (n << 1) ^ (n >> 63)
    size = 1
    while z > 0x7F:
        z >>= 7
        size += 1
    return size


@dataclass(frozen=True, slots=True)
class TransactionLogEntry:
    """One ``__txn_log`` record; field for field as the Avro schema."""

    kind: LogEntryKind
    epoch_offset: int
    owner_id: str
    request_id: str | None = None
    txn_seq: int = -1
    status: TxnStatus | None = None
    open_time_ms: int = 0
    timeout_ms: int = 0
    partitions: tuple[TopicPartition, ...] = ()
    subscriptions: tuple[SubscriptionRef, ...] = ()
    reason: str | None = None
    group_key: str | None = None
    group_seqs: tuple[int, ...] = ()
    next_sequence: int = 0
    group_keys: tuple[GroupOutcome, ...] = field(default=())
    principal: str | None = None
    """TXN OPEN: who opened the txn (its owner)."""

    def to_avro(self) -> dict[str, Any]:
        """The dict fastavro writes."""
        return {
            "kind": self.kind.value,
            "epoch_offset": self.epoch_offset,
            "owner_id": self.owner_id,
            "request_id": self.request_id,
            "txn_seq": self.txn_seq,
            "status": self.status.value if self.status else None,
            "open_time_ms": self.open_time_ms,
            "timeout_ms": self.timeout_ms,
            "partitions": [{"topic": p.topic, "partition": p.partition} for p in self.partitions],
            "subscriptions": [
                {"topic": s.topic, "partition": s.partition, "subscription": s.subscription}
                for s in self.subscriptions
            ],
            "reason": self.reason,
            "group_key": self.group_key,
            "group_seqs": list(self.group_seqs),
            "next_sequence": self.next_sequence,
            "group_keys": [
                {"key": g.key, "status": g.status.value, "seqs": list(g.seqs)}
                for g in self.group_keys
            ],
            "principal": self.principal,
        }

    @classmethod
    def from_avro(cls, rec: dict[str, Any]) -> TransactionLogEntry:
        """Inverse of :meth:`to_avro`."""
        return cls(
            kind=LogEntryKind(rec["kind"]),
            epoch_offset=rec["epoch_offset"],
            owner_id=rec["owner_id"],
            request_id=rec["request_id"],
            txn_seq=rec["txn_seq"],
            status=TxnStatus(rec["status"]) if rec["status"] else None,
            open_time_ms=rec["open_time_ms"],
            timeout_ms=rec["timeout_ms"],
            partitions=tuple(TopicPartition(p["topic"], p["partition"]) for p in rec["partitions"]),
            subscriptions=tuple(
                SubscriptionRef(s["topic"], s["partition"], s["subscription"])
                for s in rec["subscriptions"]
            ),
            reason=rec["reason"],
            group_key=rec["group_key"],
            group_seqs=tuple(rec["group_seqs"]),
            next_sequence=rec["next_sequence"],
            group_keys=tuple(
                GroupOutcome(g["key"], TxnStatus(g["status"]), tuple(g["seqs"]))
                for g in rec["group_keys"]
            ),
            principal=rec["principal"],
        )

    def encode(self) -> bytes:
        """Version byte + Avro."""
        return codec("txn_log_entry").encode(self.to_avro())

    @classmethod
    def decode(cls, data: bytes | None) -> TransactionLogEntry:
        """Parse a log record; ``CorruptRecordError`` on garbage or an unknown version."""
        rec = codec("txn_log_entry").decode(data)
        try:
            return cls.from_avro(rec)
        except (ValueError, KeyError) as exc:
            raise CorruptRecordError(f"txn_log_entry: {exc!r}") from exc
