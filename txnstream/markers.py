"""Commit/abort marker records in data partitions (DESIGN.md section 4).

A marker is a Kafka record with headers ``txn.marker`` (``COMMIT``/``ABORT``) and
``txn.id`` (16 bytes), no key, and an Avro :class:`TxnMarker` value that also carries
the coordinator's low watermark. Transactional data records carry only ``txn.id``.
Markers are written by the coordinator and never delivered to users.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from txnstream.codec import codec
from txnstream.errors import CorruptRecordError
from txnstream.types import TxnID

__all__ = [
    "TXN_ID_HEADER",
    "TXN_MARKER_HEADER",
    "MarkerKind",
    "TxnMarker",
    "RecordKind",
    "classify_headers",
]

TXN_ID_HEADER = "txn.id"
TXN_MARKER_HEADER = "txn.marker"

Headers = Sequence[tuple[str, bytes | None]] | None


class MarkerKind(enum.Enum):
    """What a marker says about its transaction."""

    COMMIT = "COMMIT"
    ABORT = "ABORT"


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """The value of a marker record; mirrors ``schemas/txn_marker.avsc``."""

    txn_id: TxnID
    kind: MarkerKind
    lwm: int

    def headers(self) -> list[tuple[str, str | bytes | None]]:
        """The record headers a marker is written with (as ``Producer.produce`` takes them)."""
        return [(TXN_MARKER_HEADER, self.kind.value.encode()),
                (TXN_ID_HEADER, self.txn_id.to_bytes())]

    def encode(self) -> bytes:
        """The record value."""
        return codec("txn_marker").encode({
            "most_bits": self.txn_id.most_bits,
            "least_bits": self.txn_id.least_bits,
            "kind": self.kind.value,
            "lwm": self.lwm,
        })

    @classmethod
    def decode(cls, value: bytes | None) -> TxnMarker:
        """Parse a marker value; ``CorruptRecordError`` if it is not one."""
        rec = codec("txn_marker").decode(value)
        try:
            txn_id = TxnID(rec["most_bits"], rec["least_bits"])
            return cls(txn_id, MarkerKind(rec["kind"]), rec["lwm"])
        except ValueError as exc:
            raise CorruptRecordError(f"txn_marker: {exc}") from exc


class RecordKind(enum.Enum):
    """What a data-partition record is, judged by its headers."""

    PLAIN = "plain"
    TXN = "txn"
    MARKER = "marker"


def classify_headers(headers: Headers) -> tuple[RecordKind, TxnID | None]:
    """Classify a data record by its headers: plain, transactional (with TxnID) or marker.

    Raises ``CorruptRecordError`` for a malformed ``txn.id`` header or a ``txn.marker``
    header without a valid ``txn.id``; callers log the position and skip the record.
    """
    if not headers:
        return RecordKind.PLAIN, None
    txn_raw: bytes | None = None
    is_marker = False
    for key, value in headers:
        if key == TXN_ID_HEADER:
            txn_raw = value
        elif key == TXN_MARKER_HEADER:
            is_marker = True
    if txn_raw is None:
        if is_marker:
            raise CorruptRecordError("marker record without a txn.id header")
        return RecordKind.PLAIN, None
    try:
        txn_id = TxnID.from_bytes(txn_raw)
    except ValueError as exc:
        raise CorruptRecordError(f"malformed txn.id header: {exc}") from exc
    return (RecordKind.MARKER if is_marker else RecordKind.TXN), txn_id
