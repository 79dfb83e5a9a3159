"""Commit/abort marker records in data partitions (DESIGN.md section 4).

A marker is a Kafka record with headers ``txn.marker`` (``COMMIT``/``ABORT``) and
``txn.id`` (16 bytes), no key, and an Avro :class:`TxnMarker` value that also carries
the coordinator's low watermark. Transactional data records carry only ``txn.id``.
Markers are written by the coordinator and never delivered to users.

Data topics are writable by ordinary producers, so a marker counts only if a worker
wrote it (DESIGN.md section 10): with a worker secret, every marker also carries
``txn.mac``, an HMAC over the Kafka cluster id, its topic, partition and value, keyed
from the workers' secret (:class:`MarkerSigner`). The buffer owner folds a marker whose
tag does not verify as it folds a straggler: hidden, changing nothing. Binding the tag
to the cluster and the partition means a marker copied elsewhere (MirrorMaker into
another txnstream cluster, even one with the same secret, or into another partition)
never counts there.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message, Producer

from txnstream.codec import codec
from txnstream.errors import CorruptRecordError
from txnstream.membership import MembershipKey, hkdf_sha256, workers_root_key
from txnstream.message import (
    RESERVED_HEADERS,
    TXN_ID_HEADER,
    TXN_MAC_HEADER,
    TXN_MARKER_HEADER,
    TXN_TAG_HEADER,
    Headers,
    split_headers,
)
from txnstream.types import TopicPartition, TxnID

__all__ = [
    "TXN_ID_HEADER",
    "TXN_MARKER_HEADER",
    "TXN_MAC_HEADER",
    "TXN_TAG_HEADER",
    "RESERVED_HEADERS",
    "MarkerKind",
    "MarkerSigner",
    "TxnMarker",
    "RecordKind",
    "classify_headers",
    "produce_marker",
]

MAC_BYTES = 16
"""HMAC-SHA256 truncated to 128 bits, as the line's frame tags."""

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


class MarkerSigner:
    """Signs the markers a worker writes and checks the ones a buffer owner folds.

    Every worker of a cluster derives the same key from the workers' secret
    (``tc_secret`` of the workers' principal), so any worker's marker verifies at any
    buffer owner; nobody without that secret can make one that does.
    """

    def __init__(self, key: bytes, cluster_id: str,
                 membership: MembershipKey | None = None,
                 legacy_key: bytes | None = None) -> None:
        if len(key) < 16:
            raise ValueError("a marker key must be at least 16 bytes")
        self._key = key
        self._legacy_key = legacy_key
        self._cluster = cluster_id.encode()
        self.membership = membership
        """The workers' membership key (:mod:`txnstream.membership`): txn keys the
        coordinators hand out, tags the buffer owners check. None: records are not
        checked for membership (a signer made from a bare key, in tests)."""

    @classmethod
    def from_root(cls, root: bytes, cluster_id: str,
                  legacy_secret: str | None = None) -> MarkerSigner:
        """The signer of the workers whose root key is ``root`` (:mod:`txnstream.workers_key`).

        Its marker key and membership key are HKDF subkeys of the root; with
        ``legacy_secret`` it also knows version 1's marker key (one HMAC of that
        secret), for markers judged by the rules of their time.
        """
        legacy = None if legacy_secret is None else hmac.new(
            legacy_secret.encode(), b"txnstream marker key v1", hashlib.sha256).digest()
        return cls(hkdf_sha256(root, b"txnstream marker key v2"), cluster_id,
                   MembershipKey.from_root(root, cluster_id), legacy)

    @classmethod
    def from_secret(cls, secret: str, cluster_id: str) -> MarkerSigner:
        """The signer of the workers holding ``secret`` (and no key file)."""
        return cls.from_root(workers_root_key(secret), cluster_id, secret)

    def tag(self, topic: str, partition: int, value: bytes,
            key: bytes | None = None) -> bytes:
        """The ``txn.mac`` of a marker with ``value`` in ``topic``-``partition``."""
        t = topic.encode()
        msg = b"".join((struct.pack(">H", len(self._cluster)), self._cluster,
                        struct.pack(">H", len(t)), t, struct.pack(">i", partition), value))
        return hmac.new(key or self._key, msg, hashlib.sha256).digest()[:MAC_BYTES]

    def headers(self, marker: TxnMarker, topic: str, partition: int,
                value: bytes) -> list[tuple[str, str | bytes | None]]:
        """The headers of ``marker`` (encoded as ``value``) written to that partition."""
        return [*marker.headers(), (TXN_MAC_HEADER, self.tag(topic, partition, value))]

    def verify(self, topic: str, partition: int, value: bytes | None, headers: Headers,
               legacy: bool = False) -> bool:
        """Whether a marker record's ``txn.mac`` header is this cluster's tag for it.

        ``legacy``: the record is judged by the rules of version 1, whose marker key
        (one HMAC of the secret) is accepted too.
        """
        if value is None:
            return False
        mac = next((v for k, v in headers or () if k == TXN_MAC_HEADER), None)
        if mac is None:
            return False
        if hmac.compare_digest(mac, self.tag(topic, partition, value)):
            return True
        return legacy and self._legacy_key is not None and hmac.compare_digest(
            mac, self.tag(topic, partition, value, self._legacy_key))


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
    txn_raw, is_marker, _, _ = split_headers(headers)
    if txn_raw is None:
        if is_marker:
            raise CorruptRecordError("marker record without a txn.id header")
        return RecordKind.PLAIN, None
    try:
        txn_id = TxnID.from_bytes(txn_raw)
    except ValueError as exc:
        raise CorruptRecordError(f"malformed txn.id header: {exc}") from exc
    return (RecordKind.MARKER if is_marker else RecordKind.TXN), txn_id


def produce_marker(producer: Producer, tp: TopicPartition, marker: TxnMarker,
                   signer: MarkerSigner | None, value: bytes | None = None,
                   on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
                   ) -> None:
    """Produce ``marker`` to ``tp``: the one way a marker is written.

    Signed with the workers' key when there is a ``signer`` (an unsigned marker counts
    nowhere once the workers have a secret). ``value``: the marker already encoded (one
    encoding for all of a txn's partitions). Raises what ``Producer.produce`` raises;
    the caller decides what a failure means (retry, drop, or leave it to the check).
    """
    value = marker.encode() if value is None else value
    headers = (marker.headers() if signer is None
               else signer.headers(marker, tp.topic, tp.partition, value))
    if on_delivery is None:
        producer.produce(tp.topic, value, partition=tp.partition, headers=headers)
    else:
        producer.produce(tp.topic, value, partition=tp.partition, headers=headers,
                         on_delivery=on_delivery)
