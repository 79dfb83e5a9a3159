"""Identity types shared by every component: ``TxnID``, ``TxnStatus``, ``TopicPartition``.

These mirror Pulsar's ``TxnID`` and ``TxnStatus`` (``pulsar-transaction/common``) so a
reader who knows Pulsar finds the same names and the same transition table.
"""

from __future__ import annotations

import enum
import re
import struct
from dataclasses import dataclass

__all__ = ["TxnID", "TxnStatus", "COORDINATOR_STATUSES", "TopicPartition", "TC_ID_BITS",
           "MAX_TC_ID", "ANONYMOUS"]

ANONYMOUS = "anonymous"
"""The principal of a client on a worker that authenticates nobody (loopback only), and
the owner of txns logged before owners were (docs/security.md)."""

TC_ID_BITS = 16
"""``most_bits`` carries the TC id; Pulsar reserves 16 bits for it."""
MAX_TC_ID = (1 << TC_ID_BITS) - 1

_TXN_TEXT = re.compile(r"^\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
_PACK = struct.Struct(">qq")


@dataclass(frozen=True, order=True, slots=True)
class TxnID:
    """A transaction id: ``most_bits`` = coordinator id, ``least_bits`` = per-TC sequence.

    The text form is Pulsar's ``"(most,least)"``; the wire form (the ``txn.id`` record
    header) is 16 bytes, two big-endian signed 64-bit integers.
    """

    most_bits: int
    least_bits: int

    def __post_init__(self) -> None:
        if not 0 <= self.most_bits <= MAX_TC_ID:
            raise ValueError(f"TxnID most_bits (TC id) must be in 0..{MAX_TC_ID}: {self.most_bits}")
        if not 0 <= self.least_bits < (1 << 63):
            raise ValueError(f"TxnID least_bits must be a non-negative int64: {self.least_bits}")

    @property
    def tc_id(self) -> int:
        """The id of the coordinator (= ``__txn_log`` partition) that owns this txn."""
        return self.most_bits

    @property
    def sequence(self) -> int:
        """The per-coordinator sequence number."""
        return self.least_bits

    def __str__(self) -> str:
        return f"({self.most_bits},{self.least_bits})"

    def to_bytes(self) -> bytes:
        """The 16-byte header form."""
        return _PACK.pack(self.most_bits, self.least_bits)

    @classmethod
    def from_bytes(cls, data: bytes) -> TxnID:
        """Parse the 16-byte header form; ``ValueError`` names what is wrong."""
        if len(data) != _PACK.size:
            raise ValueError(f"txn.id header must be {_PACK.size} bytes, got {len(data)}")
        most, least = _PACK.unpack(data)
        return cls(most, least)

    @classmethod
    def parse(cls, text: str) -> TxnID:
        """Parse Pulsar's text form ``"(most,least)"`` (also accepts ``"most:least"``)."""
        m = _TXN_TEXT.match(text.strip())
        if m is None:
            parts = text.strip().split(":")
            if len(parts) == 2 and all(p.isdigit() for p in parts):
                return cls(int(parts[0]), int(parts[1]))
            raise ValueError(f"not a TxnID: {text!r} (expected '(most,least)', e.g. '(0,42)')")
        return cls(int(m.group(1)), int(m.group(2)))


class TxnStatus(enum.Enum):
    """Transaction status, as Pulsar's ``TxnStatus`` (plus the client's TIMED_OUT)."""

    OPEN = "OPEN"
    PREPARED = "PREPARED"
    """``txn.prepare()`` logged it: it can no longer change, its timeout clock stopped
    (its own maximum prepared age runs instead), and any process of its owner completes
    it (``client.complete_transaction``). Not Pulsar's: docs/api.md, *Prepared
    transactions*."""
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    ABORTING = "ABORTING"
    ABORTED = "ABORTED"
    TIMED_OUT = "TIMED_OUT"
    """Client side only (Pulsar's client ``State.TIME_OUT``): a ``Transaction`` reads it
    once its deadline passed while it was OPEN; the coordinator aborts such a txn, so its
    own status goes OPEN -> ABORTING -> ABORTED and never takes this value."""

    def can_transition_to(self, new: TxnStatus) -> bool:
        """Pulsar's ``TransactionUtil.canTransitionTo``; a repeat of the same status is allowed."""
        return new in _ALLOWED[self]

    @property
    def is_final(self) -> bool:
        """COMMITTED or ABORTED: nothing can change any more."""
        return self in (TxnStatus.COMMITTED, TxnStatus.ABORTED)

    @property
    def is_ending(self) -> bool:
        """COMMITTING or ABORTING: the outcome is decided, finalization is under way."""
        return self in (TxnStatus.COMMITTING, TxnStatus.ABORTING)


_ALLOWED: dict[TxnStatus, frozenset[TxnStatus]] = {
    TxnStatus.OPEN: frozenset({TxnStatus.OPEN, TxnStatus.PREPARED, TxnStatus.COMMITTING,
                               TxnStatus.ABORTING}),
    TxnStatus.PREPARED: frozenset({TxnStatus.PREPARED, TxnStatus.COMMITTING,
                                   TxnStatus.ABORTING}),
    TxnStatus.COMMITTING: frozenset({TxnStatus.COMMITTING, TxnStatus.COMMITTED}),
    TxnStatus.ABORTING: frozenset({TxnStatus.ABORTING, TxnStatus.ABORTED}),
    TxnStatus.COMMITTED: frozenset({TxnStatus.COMMITTED}),
    TxnStatus.ABORTED: frozenset({TxnStatus.ABORTED}),
    TxnStatus.TIMED_OUT: frozenset(),  # never a coordinator's status: no transition
}

COORDINATOR_STATUSES: tuple[TxnStatus, ...] = (
    TxnStatus.OPEN, TxnStatus.COMMITTING, TxnStatus.COMMITTED, TxnStatus.ABORTING,
    TxnStatus.ABORTED, TxnStatus.PREPARED)
"""The statuses a coordinator keeps and logs (``schemas/txn_log_entry.avsc``); TIMED_OUT
is the client's alone."""


@dataclass(frozen=True, order=True, slots=True)
class TopicPartition:
    """A Kafka topic partition; text form ``topic-partition`` like Kafka's tools print."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"

    @classmethod
    def parse(cls, text: str) -> TopicPartition:
        """Parse ``topic-3`` or ``topic:3``."""
        for sep in (":", "-"):
            topic, found, part = text.rpartition(sep)
            if found and topic and part.isdigit():
                return cls(topic, int(part))
        raise ValueError(f"not a topic partition: {text!r} (expected 'topic-N', e.g. 'orders-0')")
