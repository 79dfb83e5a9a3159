"""Membership of a record in a transaction: a fact, not a claim (DESIGN.md section 10).

A ``txn.id`` header is a claim anyone who may write the topic can make. What makes a
record a member of its txn is the ``txn.tag`` header beside it: 16 bytes that only the
txn's writers can compute.

* The workers hold a **membership key**, derived from the workers' secret through
  scrypt (a memory-hard KDF: a guess of the secret costs tens of milliseconds, not one
  HMAC) and HKDF (RFC 5869) for its purpose, so it is never the line's secret itself.
* Each txn has a **txn key**: ``HMAC(membership key, cluster id | TxnID)``, 16 bytes. A
  coordinator hands it out with the TxnID (``NEW``, ``RESERVE``) and to whoever may
  attach to the txn (``GET`` by its owner or an admin); it is never logged or written
  to a data topic, and any worker recomputes it from the TxnID.
* A record's tag is ``HMAC(txn key, topic | partition)``: computed once per txn and
  partition by the writer (no per-record cryptography), checked once per txn and
  partition by the buffer owner, which folds a record whose tag is not its txn's for
  that partition as **junk**: hidden, ending, blocking and joining nothing, and never
  costing a marker. Binding the partition means a tag copied into another partition
  (or another cluster) is junk there.

What a tag does not stop: a writer of the topic that can also *read* a genuine record
of a live txn may copy its two headers onto records of its own in the same partition
before the txn's marker; those join the txn (as records any writer of the topic could
write plainly anyway). They cannot end, block or poison any txn.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections import OrderedDict

from txnstream.message import TXN_ID_HEADER, TXN_TAG_HEADER
from txnstream.types import TopicPartition, TxnID

__all__ = ["TAG_BYTES", "TXN_KEY_BYTES", "MembershipKey", "hkdf_sha256", "partition_tag",
           "txn_headers", "workers_root_key"]

TAG_BYTES = 16
"""A record's ``txn.tag``: HMAC-SHA256 truncated to 128 bits, as the line's frame tags."""
TXN_KEY_BYTES = 16
"""A txn key: 128 bits, unguessable."""

SCRYPT_N = 1 << 15
"""scrypt's cost (32 MiB with r=8): about 50 ms per guess of the secret here, once per
worker start."""
SCRYPT_SALT = b"txnstream workers' root key v1"
TAG_CACHE = 4096
"""Tags a :class:`MembershipKey` keeps: the (txn, partition) pairs a fold is working on."""


def hkdf_sha256(root: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 (RFC 5869): a subkey of ``root`` for the purpose named by ``info``."""
    prk = hmac.new(b"\x00" * 32, root, hashlib.sha256).digest()
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:length]


def workers_root_key(secret: str) -> bytes:
    """The workers' root key: scrypt of their secret (every worker derives the same)."""
    return hashlib.scrypt(secret.encode(), salt=SCRYPT_SALT, n=SCRYPT_N, r=8, p=1,
                          maxmem=64 * 1024 * 1024, dklen=32)


def partition_tag(txn_key: bytes, topic: str, partition: int) -> bytes:
    """The ``txn.tag`` of a record of the txn with ``txn_key`` in ``topic``-``partition``."""
    t = topic.encode()
    msg = struct.pack(">H", len(t)) + t + struct.pack(">i", partition)
    return hmac.new(txn_key, msg, hashlib.sha256).digest()[:TAG_BYTES]


def txn_headers(txn_id: TxnID, txn_key: bytes | None, topic: str,
                partition: int) -> list[tuple[str, str | bytes | None]]:
    """The headers that make a record at ``topic``-``partition`` a member of ``txn_id``.

    ``txn.id``, and ``txn.tag`` when its coordinator gave a txn key (None: the workers
    check no membership). One HMAC: a producer takes it once per txn and partition.
    """
    headers: list[tuple[str, str | bytes | None]] = [(TXN_ID_HEADER, txn_id.to_bytes())]
    if txn_key is not None:
        headers.append((TXN_TAG_HEADER, partition_tag(txn_key, topic, partition)))
    return headers


class MembershipKey:
    """The workers' membership key on one Kafka cluster: txn keys and tags."""

    def __init__(self, key: bytes, cluster_id: str) -> None:
        if len(key) < 16:
            raise ValueError("a membership key must be at least 16 bytes")
        self._key = key
        self._cluster = cluster_id.encode()
        self._tags: OrderedDict[tuple[TxnID, TopicPartition], bytes] = OrderedDict()

    @classmethod
    def from_root(cls, root: bytes, cluster_id: str) -> MembershipKey:
        """The membership key of the workers whose root key is ``root``."""
        return cls(hkdf_sha256(root, b"txnstream membership key v1"), cluster_id)

    def txn_key(self, txn_id: TxnID) -> bytes:
        """The key of ``txn_id`` that its writers hold."""
        msg = struct.pack(">H", len(self._cluster)) + self._cluster + txn_id.to_bytes()
        return hmac.new(self._key, msg, hashlib.sha256).digest()[:TXN_KEY_BYTES]

    def tag(self, txn_id: TxnID, tp: TopicPartition) -> bytes:
        """The ``txn.tag`` a member record of ``txn_id`` carries at ``tp`` (cached)."""
        k = (txn_id, tp)
        tags = self._tags
        tag = tags.get(k)
        if tag is None:
            tag = tags[k] = partition_tag(self.txn_key(txn_id), tp.topic, tp.partition)
            if len(tags) > TAG_CACHE:
                tags.popitem(last=False)
        return tag

    def is_member(self, txn_id: TxnID, tp: TopicPartition, tag: bytes | None) -> bool:
        """Whether a record of ``txn_id`` at ``tp`` carrying ``tag`` belongs to that txn."""
        return tag is not None and hmac.compare_digest(tag, self.tag(txn_id, tp))
