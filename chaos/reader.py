"""The checker's two views of the data topics: raw, and committed-only.

**Raw** (:func:`read_raw`): plain confluent-kafka, every record of every partition from
the log start to the high watermark, markers included, classified by the headers of
DESIGN.md section 4 (``txn.id``: 16 bytes, two big-endian int64; ``txn.marker``:
``COMMIT``/``ABORT``; ``txn.mac``: the workers' tag, checked here with the workers'
key file and the cluster id, so a forged marker is no marker), parsed here so the checker
does not trust the code it checks. A record the hostile profile's forger wrote (its
value says ``"forged": true``) or a marker whose tag does not verify is ``forged``.

**Committed-only** (:func:`read_committed`): a txnstream consumer on a fresh
subscription, as a user would read, until every partition has delivered up to the last
record the raw view says is committed (or nothing came for ``idle_s``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer
from confluent_kafka import TopicPartition as KafkaTP

from chaos.truth import decode_value
from txnstream import Client, Config

__all__ = ["RawRecord", "RawPartition", "Delivered", "MarkerCheck", "read_raw",
           "read_committed", "max_record_bytes", "record_ages"]

_TXN = struct.Struct(">qq")


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record as stored."""

    offset: int
    txn: str | None
    """``(most,least)`` from the ``txn.id`` header."""
    marker: str | None
    """``COMMIT``/``ABORT`` for a marker, else None."""
    value: dict[str, Any] | None
    forged: bool = False
    """Written by the hostile profile's forger, or a marker that does not verify."""


@dataclass
class RawPartition:
    """A partition's records and, per txn, its first marker there (kind, offset)."""

    topic: str
    partition: int
    records: list[RawRecord] = field(default_factory=list)
    first_marker: dict[str, tuple[str, int]] = field(default_factory=dict)
    markers: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def expected_visible(self, rec: RawRecord) -> bool:
        """Whether the simplest reading of the fold shows ``rec``.

        Plain, or before its txn's first marker there, which is a COMMIT (the LWM rule
        is left out: this is for diagnosis and for knowing where a read may stop).
        """
        if rec.marker is not None or rec.forged:
            return False
        if rec.txn is None:
            return True
        m = self.first_marker.get(rec.txn)
        return m is not None and m[0] == "COMMIT" and rec.offset < m[1]

    def last_expected_visible(self) -> int:
        """Offset of the last record a committed reader must get, -1 if none."""
        for rec in reversed(self.records):
            if self.expected_visible(rec):
                return rec.offset
        return -1


def _classify(headers: list[tuple[str, bytes]] | None) -> tuple[str | None, str | None]:
    txn = marker = None
    for k, v in headers or ():
        if k == "txn.id" and v is not None and len(v) == _TXN.size:
            most, least = _TXN.unpack(v)
            txn = f"({most},{least})"
        elif k == "txn.marker" and v is not None:
            marker = v.decode(errors="replace")
    return txn, marker


def _scan(config: Config, topics: list[str], timeout_s: float, keep_values: bool = True
          ) -> dict[tuple[str, int], list[Any]]:
    """Every message of ``topics`` from the log start to the current end."""
    c = Consumer(config.consumer(f"chaos-raw-{uuid.uuid4().hex[:8]}",
                                 **{"enable.partition.eof": False}))
    try:
        meta = c.list_topics(timeout=15).topics
        ends: dict[tuple[str, int], int] = {}
        assign = []
        for t in topics:
            for p in meta[t].partitions:
                lo, hi = c.get_watermark_offsets(KafkaTP(t, p), timeout=15)
                if hi > lo:
                    ends[(t, p)] = hi
                    assign.append(KafkaTP(t, p, OFFSET_BEGINNING))
        out: dict[tuple[str, int], list[Any]] = {k: [] for k in ends}
        if not assign:
            return out
        c.assign(assign)
        pos = {k: -1 for k in ends}
        deadline = time.monotonic() + timeout_s
        while any(pos[k] < ends[k] - 1 for k in ends):
            if time.monotonic() > deadline:
                short = {f"{t}-{p}": (pos[(t, p)], ends[(t, p)]) for t, p in ends
                         if pos[(t, p)] < ends[(t, p)] - 1}
                raise RuntimeError(f"raw read did not reach the end of {short}")
            for m in c.consume(1000, 0.5):
                if m.error():
                    continue
                k = (m.topic(), m.partition())
                pos[k] = m.offset()
                out[k].append(m if keep_values else (m.offset(), len(m.value() or b"")))
        return out
    finally:
        c.close()


MARKER_KEY_INFO = b"txnstream marker key v2"
"""The marker key: the HKDF-SHA256 subkey of the root key for this purpose."""


def _hkdf_sha256(root: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 (RFC 5869) with an all-zero salt."""
    prk = hmac.new(b"\x00" * 32, root, hashlib.sha256).digest()
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:length]


class MarkerCheck:
    """The workers' marker tag, computed here from their key (not by the code checked).

    The marker key is HKDF-SHA256 (RFC 5869, zero salt, 32 bytes) of the workers' root
    key with info ``txnstream marker key v2``; the tag, the first 16 bytes of its
    HMAC-SHA256 over the cluster id, the topic, the partition and the marker's value.
    """

    def __init__(self, root_key: bytes, cluster_id: str) -> None:
        self._key = _hkdf_sha256(root_key, MARKER_KEY_INFO)
        self._cluster = cluster_id.encode()

    @classmethod
    def from_key_file(cls, path: str | os.PathLike[str], cluster_id: str) -> MarkerCheck:
        """The check of the workers whose key file (hex) is ``path``."""
        with open(path) as f:
            return cls(bytes.fromhex(f.read().strip()), cluster_id)

    def genuine(self, topic: str, partition: int, value: bytes | None,
                headers: list[tuple[str, bytes]] | None) -> bool:
        """Whether a marker record at ``topic``-``partition`` carries the workers' tag."""
        mac = next((v for k, v in headers or () if k == "txn.mac"), None)
        if mac is None or value is None:
            return False
        t = topic.encode()
        msg = (struct.pack(">H", len(self._cluster)) + self._cluster + struct.pack(">H", len(t))
               + t + struct.pack(">i", partition) + value)
        return hmac.compare_digest(mac, hmac.new(self._key, msg, hashlib.sha256).digest()[:16])


def read_raw(config: Config, topics: list[str], timeout_s: float = 180.0,
             check: MarkerCheck | None = None) -> dict[tuple[str, int], RawPartition]:
    """Every record of ``topics``, markers included, with each txn's first marker.

    With ``check``, only markers whose tag verifies count as markers.
    """
    out = {}
    for (t, p), msgs in _scan(config, topics, timeout_s).items():
        rp = RawPartition(t, p)
        for m in msgs:
            txn, marker = _classify(m.headers())
            value = None if marker else decode_value(m.value())
            forged = bool(value and value.get("forged"))
            if marker is not None and check is not None and not check.genuine(
                    t, p, m.value(), m.headers()):
                # a forged marker is no record of its txn: it needs no marker of its own
                txn, marker, forged = None, None, True
            rec = RawRecord(m.offset(), txn, marker if not forged else None, value, forged)
            rp.records.append(rec)
            if forged:
                continue
            if marker is not None and txn is not None:
                rp.markers[txn].append(marker)
                rp.first_marker.setdefault(txn, (marker, m.offset()))
        out[(t, p)] = rp
    return out


def max_record_bytes(config: Config, topic: str, timeout_s: float = 120.0) -> int:
    """The largest record value in ``topic`` (snapshot sizes)."""
    sizes = [n for msgs in _scan(config, [topic], timeout_s, keep_values=False).values()
             for _, n in msgs]
    return max(sizes, default=0)


def record_ages(config: Config, topic: str, now_ms: int | None = None,
                timeout_s: float = 120.0) -> dict[str, Any]:
    """How old the records ``topic`` retains are, by their timestamps.

    It tells a log truncated late from one that grows with the rate: ``oldest_s`` per
    partition, the topic's ``oldest_s`` and its record counts by age (``by_minute``:
    index i counts records i to i+1 minutes old).
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    oldest: dict[str, float] = {}
    by_minute: list[int] = []
    for (_, part), msgs in sorted(_scan(config, [topic], timeout_s).items()):
        ages = [max(0.0, (now_ms - m.timestamp()[1]) / 1000.0) for m in msgs]
        if not ages:
            continue
        oldest[str(part)] = round(max(ages), 1)
        for a in ages:
            i = int(a // 60)
            by_minute.extend([0] * (i + 1 - len(by_minute)))
            by_minute[i] += 1
    return {"oldest_s": max(oldest.values(), default=0.0), "by_partition": oldest,
            "by_minute": by_minute}


@dataclass(frozen=True, slots=True)
class Delivered:
    """One record a committed-only reader got."""

    topic: str
    partition: int
    offset: int
    txn: str | None
    value: dict[str, Any] | None


def read_committed(config: Config, topics: list[str], targets: dict[tuple[str, int], int],
                   idle_s: float = 20.0, timeout_s: float = 300.0) -> list[Delivered]:
    """Read ``topics`` committed-only from the start, as a new subscription.

    Stops when every partition delivered up to its ``targets`` offset, when nothing came
    for ``idle_s``, or at ``timeout_s``.
    """
    out: list[Delivered] = []
    reached: dict[tuple[str, int], int] = defaultdict(lambda: -1)
    todo = {k: v for k, v in targets.items() if v >= 0}
    with Client(config=config) as client:
        consumer = client.subscribe(topics, subscription=f"chaos-check-{uuid.uuid4().hex[:8]}",
                                    **{"session.timeout.ms": 10_000})
        try:
            t0 = last = time.monotonic()
            while time.monotonic() - t0 < timeout_s:
                if all(reached[k] >= v for k, v in todo.items()):
                    break
                msg = consumer.receive(timeout_s=1.0)
                if msg is None:
                    if time.monotonic() - last > idle_s:
                        break
                    continue
                last = time.monotonic()
                k = (msg.topic, msg.partition)
                reached[k] = max(reached[k], msg.offset)
                out.append(Delivered(msg.topic, msg.partition, msg.offset,
                                     None if msg.txn_id is None else str(msg.txn_id),
                                     decode_value(msg.value)))
        finally:
            consumer.close()
    return out
