"""The served transaction buffer: what an owner publishes and what a reader keeps.

Pulsar keeps the transaction buffer in the broker (``maxReadPosition`` and the aborted
txn list); Kafka keeps the last stable offset and an aborted-transaction index on the
broker. Here the buffer role of ``txnstream worker`` folds each data partition once
(:class:`~txnstream.buffer.TransactionBuffer`) and publishes what readers need as
:class:`BufferStateRecord` deltas; a reader keeps a :class:`BufferView` per partition
and only compares positions:

* never past ``max_read_position``;
* never an offset in ``hidden`` (markers, stragglers, undecodable records);
* never a record whose ``txn.id`` is an aborted txn whose span ``[first, last]`` holds
  the offset (Kafka's aborted-transaction index: a span and an id, not every offset);
* a record in a ``delayed`` run no earlier than its time (:mod:`txnstream.buffer.delays`:
  what the Spark planner defers; a consumer reads the delay header itself).

Both are pure: the I/O is in :mod:`txnstream.buffer.follower`. A view is sized by
markers and aborted txns above the reader's position (:meth:`BufferView.trim`), never
by committed records.

Deltas are idempotent (set unions, a maximum): a reader may apply overlapping deltas
(a new owner re-folds from its snapshot), in any owner's order as long as they are
contiguous with what it has (``from_position <= position + 1``); a delta that leaves a
gap is refused and the reader reloads from a snapshot.

The one exception to "positions only grow": a **log epoch**. When the topic is deleted
and recreated (or its log truncated below the fold position), the owner restarts the
partition's state from the new log's start with ``log_epoch`` one higher
(:mod:`txnstream.buffer.recreation`). A view never takes a delta of another epoch: a
newer one makes the reader reload from a snapshot of that epoch, where
``max_read_position`` is the new log's, possibly far below the old one
(:attr:`BufferView.log_epoch`, :attr:`BufferView.restarts`).
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from txnstream.buffer.delays import EXPIRED_AFTER_MS, DelayRuns
from txnstream.buffer.snapshot import TransactionBufferSnapshot
from txnstream.buffer.transaction_buffer import BufferStats, TransactionBuffer
from txnstream.codec import codec
from txnstream.errors import CorruptRecordError
from txnstream.types import TopicPartition, TxnID

__all__ = ["BufferStateKind", "BufferStateRecord", "BufferView", "ServeStatus", "take_delta"]


class BufferStateKind(enum.Enum):
    """What a state record is."""

    OWNER = "OWNER"
    DELTA = "DELTA"


class ServeStatus(enum.Enum):
    """What a reader knows of a partition."""

    PLAIN = "plain"
    """Never registered in a txn: every record is visible (until a txn record appears)."""
    WAITING = "waiting"
    """Registered, but no served state yet (no buffer owner, or a gap being reloaded)."""
    SERVED = "served"


@dataclass(frozen=True, slots=True)
class BufferStateRecord:
    """Mirrors ``schemas/txn_buffer_state.avsc`` (offsets as absolute values here)."""

    kind: BufferStateKind
    member: str
    generation: int
    topic: str
    partition: int
    from_position: int = 0
    position: int = -1
    max_read_position: int = -1
    hidden: tuple[int, ...] = ()
    aborted: tuple[tuple[TxnID, int, int], ...] = ()
    ongoing: int = 0
    aborted_txns: int = 0
    blocking_txn: TxnID | None = None
    blocking_offset: int = -1
    blocking_since_ms: int = -1
    log_start: int = 0
    ts_ms: int = 0
    log_epoch: int = 0
    """The log epoch of the owner's state (a DELTA): see :attr:`BufferView.log_epoch`."""
    delayed: tuple[tuple[int, int, int], ...] = ()
    """Records that became visible in this delta, not due yet: (first, last, due ms)."""

    @property
    def tp(self) -> TopicPartition:
        """The data partition a DELTA is about."""
        return TopicPartition(self.topic, self.partition)

    def to_avro(self) -> dict[str, Any]:
        """The dict fastavro writes."""
        gaps, prev = [], 0
        for o in self.hidden:
            gaps.append(o - prev)
            prev = o
        b = self.blocking_txn
        return {
            "kind": self.kind.value, "member": self.member, "generation": self.generation,
            "topic": self.topic, "partition": self.partition,
            "from_position": self.from_position, "position": self.position,
            "max_read_position": self.max_read_position, "hidden_gaps": gaps,
            "aborted": [{"most_bits": t.most_bits, "least_bits": t.least_bits, "first": f,
                         "last": la} for t, f, la in self.aborted],
            "ongoing": self.ongoing, "aborted_txns": self.aborted_txns,
            "blocking_most_bits": b.most_bits if b else -1,
            "blocking_least_bits": b.least_bits if b else -1,
            "blocking_offset": self.blocking_offset, "blocking_since_ms": self.blocking_since_ms,
            "log_start": self.log_start, "ts_ms": self.ts_ms, "log_epoch": self.log_epoch,
            "delayed": [{"first": f, "last": la, "due_ms": d} for f, la, d in self.delayed],
        }

    def encode(self) -> bytes:
        """Version byte + Avro."""
        return codec("txn_buffer_state").encode(self.to_avro())

    @classmethod
    def decode(cls, data: bytes | None) -> BufferStateRecord:
        """Parse; ``CorruptRecordError`` on garbage or an unknown version."""
        r = codec("txn_buffer_state").decode(data)
        try:
            hidden, at = [], 0
            for g in r["hidden_gaps"]:
                at += g
                hidden.append(at)
            bm, bl = r["blocking_most_bits"], r["blocking_least_bits"]
            return cls(
                BufferStateKind(r["kind"]), r["member"], r["generation"], r["topic"],
                r["partition"], r["from_position"], r["position"], r["max_read_position"],
                tuple(hidden),
                tuple((TxnID(a["most_bits"], a["least_bits"]), a["first"], a["last"])
                      for a in r["aborted"]),
                r["ongoing"], r["aborted_txns"], TxnID(bm, bl) if bm >= 0 else None,
                r["blocking_offset"], r["blocking_since_ms"], r["log_start"], r["ts_ms"],
                r["log_epoch"], tuple((d["first"], d["last"], d["due_ms"]) for d in r["delayed"]))
        except (ValueError, KeyError) as exc:
            raise CorruptRecordError(f"txn_buffer_state: {exc!r}") from exc


def take_delta(buf: TransactionBuffer, member: str, generation: int, from_position: int,
               log_start: int, now_ms: int) -> BufferStateRecord:
    """The delta of ``buf`` since ``from_position``: what its journal noted; clears it.

    ``buf.journal`` must have been set when the owner started folding at
    ``from_position`` (everything it hid or aborted since is in it).
    """
    journal = buf.journal
    assert journal is not None, "take_delta needs a buffer with a journal"
    st = buf.stats(now_ms)
    hidden = tuple(sorted(set(journal.hidden)))
    aborted = tuple(journal.aborted)
    delayed = tuple(journal.delayed)
    journal.clear()
    if buf.delayed:  # what no reader can be early for any more (its snapshots drop it)
        buf.delayed.expire(now_ms - EXPIRED_AFTER_MS)
    blocking_since = -1
    if st.blocking_txn is not None:
        entry = buf.ongoing.get(st.blocking_txn)
        if entry is not None and entry.first_timestamp_ms is not None:
            blocking_since = entry.first_timestamp_ms
    return BufferStateRecord(
        BufferStateKind.DELTA, member, generation, buf.tp.topic, buf.tp.partition,
        from_position, buf.last_offset, buf.max_read_position, hidden, aborted,
        len(buf.ongoing), len(buf.aborted), st.blocking_txn,
        st.blocking_offset if st.blocking_offset is not None else -1, blocking_since,
        log_start, now_ms, buf.log_epoch, delayed)


@dataclass
class BufferView:
    """What a reader knows of one partition's buffer: filter by position, nothing else.

    Bound: ``hidden`` and ``aborted`` hold what lies at or above :attr:`trimmed_below`
    (a reader trims below what it delivered), so markers and aborted txns ahead of the
    reader, never committed records.
    """

    tp: TopicPartition
    position: int = -1
    """Last offset the deltas applied so far cover."""
    max_read_position: int = -1
    generation: int = -1
    """The owner generation whose deltas are applied (older owners' are fenced)."""
    hidden: set[int] = field(default_factory=set)
    aborted: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    """Raw ``txn.id`` header -> (first, last) offset of that aborted txn here."""
    trimmed_below: int = 0
    last: BufferStateRecord | None = None
    """The latest delta applied (stats: ongoing, blocking txn)."""
    fenced: int = 0
    """Deltas refused because a newer owner's were seen."""
    log_epoch: int = 0
    """Which log of the partition this view describes: 0 for the first, one more each
    time its owner restarted the partition's state on a new log (the topic was deleted
    and recreated, or its log truncated below the fold position). Offsets of one epoch
    say nothing about another's log: a reader that remembers positions (a cursor, a
    planned range, a checkpoint) compares this number with the one it noted beside them,
    and where it grew, the log they were taken on is gone."""
    topic_id: str = ""
    """The Kafka topic id of the log this view describes, as its snapshot named it ("":
    not known). A reader that finds the topic's id now different knows the view is of a
    log gone, before its owner has restarted the state on the new one."""
    restarts: int = 0
    """How many times the reader that keeps this view (a
    :class:`~txnstream.buffer.follower.BufferStateFollower`) restarted it on a newer log
    epoch while following the partition: its :attr:`position` and
    :attr:`max_read_position` then moved *back*, to the new log's. Never changes
    otherwise (0 for a view that started on the newest epoch)."""
    delayed: DelayRuns = field(default_factory=DelayRuns)
    """Visible records not due when they became visible, with their times."""
    _hidden_order: list[int] = field(default_factory=list, repr=False)
    _aborted_order: list[tuple[int, bytes]] = field(default_factory=list, repr=False)

    # ---------------------------------------------------------------- build

    @classmethod
    def from_snapshot(cls, snap: TransactionBufferSnapshot) -> BufferView:
        """The view an owner's snapshot describes (readers start from it)."""
        view = cls(TopicPartition(snap.topic, snap.partition), snap.position,
                   snap.max_read_position, snap.generation, log_epoch=snap.log_epoch,
                   topic_id=snap.topic_id)
        for txn, offs in snap.aborted:
            if offs:
                view._add_span(txn.to_bytes(), offs[0], offs[-1])
        view._add_hidden(snap.hidden)  # no aborted txn's records: the spans skip those
        view.delayed = DelayRuns(snap.delayed)
        # what the stats say until the first delta: the snapshot's open txns
        first = min(snap.ongoing, key=lambda o: o[1][0], default=None)
        view.last = BufferStateRecord(
            BufferStateKind.DELTA, "", snap.generation, snap.topic, snap.partition,
            snap.position + 1, snap.position, snap.max_read_position,
            ongoing=len(snap.ongoing), aborted_txns=len(snap.aborted),
            blocking_txn=first[0] if first else None,
            blocking_offset=first[1][0] if first else -1,
            blocking_since_ms=first[2] if first and first[2] is not None else -1,
            log_epoch=snap.log_epoch)
        return view

    def _add_hidden(self, offsets: Any) -> None:
        floor, hidden, order = self.trimmed_below, self.hidden, self._hidden_order
        for o in offsets:
            if o >= floor and o not in hidden:
                hidden.add(o)
                heapq.heappush(order, o)

    def _add_span(self, raw: bytes, first: int, last: int) -> None:
        if last < self.trimmed_below or raw in self.aborted:
            return
        self.aborted[raw] = (first, last)
        heapq.heappush(self._aborted_order, (last, raw))

    def apply(self, delta: BufferStateRecord) -> bool:
        """Apply a delta; False if it is fenced (older owner), leaves a gap, or is newer.

        Newer: of a newer log epoch; the caller reloads from a snapshot of that epoch
        (the view of one log is never continued on another's). A delta entirely below
        :attr:`position` adds nothing new but is harmless, and so is one of an older
        log epoch (applied to nothing).
        """
        if delta.generation < self.generation:
            self.fenced += 1
            return False
        if delta.log_epoch < self.log_epoch:
            return True  # the earlier log's, read again after a reload: nothing of it
        if delta.log_epoch > self.log_epoch:
            return False
        if delta.from_position > self.position + 1:
            return False  # a gap: the caller reloads from a snapshot
        self.generation = delta.generation
        self._add_hidden(delta.hidden)
        for txn, first, last in delta.aborted:
            self._add_span(txn.to_bytes(), first, last)
        for first, last, due in delta.delayed:
            if last >= self.trimmed_below:
                self.delayed.add(max(first, self.trimmed_below), last, due)
        if delta.position > self.position:
            self.position = delta.position
        if delta.max_read_position > self.max_read_position:
            self.max_read_position = delta.max_read_position
        if self.last is None or delta.position >= self.last.position:
            self.last = delta
        return True

    # --------------------------------------------------------------- queries

    def visible(self, offset: int, txn_raw: bytes | None) -> bool:
        """Whether a committed-only reader may deliver the record at ``offset``.

        ``txn_raw`` is its ``txn.id`` header (None for a plain record).
        """
        if offset > self.max_read_position or offset in self.hidden:
            return False
        if txn_raw is not None:
            span = self.aborted.get(txn_raw)
            if span is not None and span[0] <= offset <= span[1]:
                return False
        return True

    def all_visible(self, offsets: Sequence[int]) -> bool:
        """Whether the records at ``offsets`` (ascending) are all visible, whatever their txns.

        None is beyond the read position or hidden, and no aborted span is among them.
        False only says: ask :meth:`visible` of each (a batch's cheap test).
        """
        first, last = offsets[0], offsets[-1]
        return (last <= self.max_read_position and self.hidden.isdisjoint(offsets)
                and not any(f <= last and la >= first for f, la in self.aborted.values()))

    def skip_in(self, start: int, end: int) -> tuple[list[int], list[tuple[bytes, int, int]]]:
        """What a range ``[start, end)`` must skip: hidden offsets, aborted spans in it."""
        hidden = sorted(o for o in self.hidden if start <= o < end)
        spans = [(raw, f, la) for raw, (f, la) in self.aborted.items()
                 if f < end and la >= start]
        return hidden, spans

    def delays_in(self, start: int, end: int, now_ms: int) -> list[tuple[int, int, int]]:
        """Runs of ``[start, end)`` not due at ``now_ms``: (first, last, due ms)."""
        return self.delayed.in_range(start, end, now_ms) if self.delayed else []

    def trim(self, below: int) -> None:
        """Forget what only offsets below ``below`` need (the reader is past them)."""
        if below <= self.trimmed_below:
            return
        self.trimmed_below = below
        order, hidden = self._hidden_order, self.hidden
        while order and order[0] < below:
            hidden.discard(heapq.heappop(order))
        spans, by_last = self.aborted, self._aborted_order
        while by_last and by_last[0][0] < below:
            _, raw = heapq.heappop(by_last)
            span = spans.get(raw)
            if span is not None and span[1] < below:
                del spans[raw]
        if self.delayed:
            self.delayed.trim(below)

    def stats(self, now_ms: int) -> BufferStats:
        """How far readers may go and what blocks them (as the owner last said)."""
        d = self.last
        blocking = d.blocking_txn if d is not None else None
        age = None
        if d is not None and blocking is not None and d.blocking_since_ms >= 0:
            age = max(0.0, (now_ms - d.blocking_since_ms) / 1000)
        return BufferStats(self.tp, self.position, self.max_read_position,
                           d.ongoing if d else 0, d.aborted_txns if d else len(self.aborted),
                           blocking, d.blocking_offset if blocking is not None and d else None,
                           age)
