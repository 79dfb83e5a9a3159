"""``TransactionBuffer``: which records of one partition a committed-only reader may see.

A pure, deterministic fold over the partition's records in offset order (markers
included): any reader folding the same log reaches the same state (DESIGN.md section 6,
Pulsar's ``TopicTransactionBuffer``). Rules:

* A record of a transaction that has not ended here is **ongoing**: held back.
* A **marker** ends its transaction here: COMMIT releases its records, ABORT drops them.
  Only the first marker of a txn counts; a repeat (a coordinator finalizing again after
  failover, or a buffer worker's ABORT after the TC's COMMIT) changes nothing. The marker
  also carries its coordinator's low watermark (LWM): every *older* still-ongoing txn of
  that TC ended without a marker here, so it is treated as aborted.
* A record of a txn that already ended here, or whose sequence is below its TC's LWM, is
  a **straggler** (written after the end, e.g. by a zombie producer): dropped.
* A **plain** record (no ``txn.id``) is visible, but only in published order: nothing
  beyond ``max_read_position`` is delivered.
* A record whose txn headers do not parse is logged with its position and dropped; it
  changes nothing else.
* With a :class:`~txnstream.markers.MarkerSigner` (:attr:`TransactionBuffer.signer`: the
  owner's, when the workers hold a secret), a marker whose ``txn.mac`` does not verify
  was not written by a worker of this cluster (a producer with write access to the
  topic, or a copy from elsewhere): it is **forged**, hidden like a straggler, and
  changes nothing else (no txn ends, no LWM moves).

``max_read_position`` is one before the first offset of the earliest ongoing txn, else
the last folded offset. An open txn therefore blocks the partition until it ends or
times out (Pulsar's and Kafka's documented behaviour); :meth:`stats` says which txn
blocks and for how long.

Crash/restart: the state is a function of the log alone, so a reader recovers by
loading the latest snapshot (:mod:`txnstream.buffer.snapshot`) at or before its start
offset and folding from the snapshot position on; with no snapshot it folds from the
log start.

Bounds (DESIGN.md section 10): ``ongoing`` holds the open txns with records here;
``ended`` holds, per TC, the sequences ended here at or above that TC's LWM, so at most
the txns a TC ends while its oldest open txn stays open (its rate times the TC's
maximum txn timeout); ``aborted`` and each ongoing txn keep their offsets as runs
(:class:`~txnstream.buffer.offset_runs.OffsetRuns`), so they and the snapshots grow with
txns and interleavings, not records; ``invisible`` (a set, for :meth:`is_visible`) holds
every marker and aborted record. Both are bounded only by :meth:`TransactionBuffer.trim`:
every owner trims below what it no longer needs (the buffer worker below the log start
before each snapshot, readers below what they delivered or planned), and a trim costs
O(k log n) for the k entries it forgets, nothing when there is nothing to forget.
``delayed`` (records not due when visible) is bounded by :mod:`txnstream.buffer.delays`.
"""

from __future__ import annotations

import enum
import heapq
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from txnstream.buffer.delays import DelayRuns, PendingDelays, delay_of, due_at
from txnstream.buffer.offset_runs import OffsetRuns
from txnstream.buffer.runs import Entry, runs_of
from txnstream.errors import CorruptRecordError
from txnstream.markers import (
    TXN_TAG_HEADER,
    MarkerKind,
    MarkerSigner,
    RecordKind,
    TxnMarker,
    classify_headers,
)
from txnstream.message import split_headers
from txnstream.ratelog import RateLimitedLog
from txnstream.types import TopicPartition, TxnID

__all__ = ["TransactionBuffer", "Verdict", "BufferStats", "OngoingTxn", "Journal"]

log = logging.getLogger(__name__)
_rate_limited = RateLimitedLog(log)

Headers = Sequence[tuple[str, bytes | None]] | None


class Record(Protocol):
    """What :meth:`TransactionBuffer.fold_messages` reads of a record (a Kafka ``Message``)."""

    def offset(self) -> int: ...
    def headers(self) -> Headers: ...
    def value(self) -> bytes | None: ...
    def timestamp(self) -> tuple[int, int]: ...


class Verdict(enum.Enum):
    """What the fold decided about one record."""

    PLAIN = "plain"
    TXN_PENDING = "txn-pending"
    STRAGGLER = "straggler"
    MARKER = "marker"
    FORGED = "forged"
    JUNK = "junk"
    """A record naming a txn without its ``txn.tag``: hidden, nothing else changes."""
    CORRUPT = "corrupt"


@dataclass(slots=True)
class OngoingTxn:
    """A txn with records here and no end yet."""

    first_offset: int
    offsets: OffsetRuns
    """Its records here, as runs: an open txn of 200k records is one run."""
    first_timestamp_ms: int | None = None
    delays: PendingDelays | None = None
    """Its delayed records here (:mod:`txnstream.buffer.delays`), due from its commit."""


@dataclass(frozen=True, slots=True)
class BufferStats:
    """What an operator asks: how far readers may go and what holds them back."""

    tp: TopicPartition
    last_offset: int
    max_read_position: int
    ongoing: int
    aborted: int
    blocking_txn: TxnID | None
    blocking_offset: int | None
    blocked_for_s: float | None
    junk: int = 0
    """Records folded that named a txn without being its member (forged ``txn.id``)."""


@dataclass(slots=True)
class Journal:
    """What a fold decided since the owner last published (it clears it then)."""

    hidden: list[int] = field(default_factory=list)
    """Offsets hidden (markers, stragglers, undecodable), in the order folded."""
    aborted: list[tuple[TxnID, int, int]] = field(default_factory=list)
    """Txns that ended aborted here: (txn, first offset, last offset)."""
    delayed: list[tuple[int, int, int]] = field(default_factory=list)
    """Visible records not due yet: (first, last, due epoch ms)."""
    unmarked: dict[TxnID, int] = field(default_factory=dict)
    """Txns with records here that ended without a marker here (ended by a later
    marker's LWM, or a straggler below the LWM) -> that LWM: the owner writes their ABORT
    markers, so no txn record is left without one (:meth:`take_unmarked`). Not cleared
    by :meth:`clear`."""

    def take_unmarked(self) -> dict[TxnID, int]:
        """The txns whose ABORT marker the owner writes now (and forgets here)."""
        out, self.unmarked = self.unmarked, {}
        return out

    def clear(self) -> None:
        """Forget what was published."""
        self.hidden.clear()
        self.aborted.clear()
        self.delayed.clear()


@dataclass
class TransactionBuffer:
    """The fold state of one partition. Feed every record once, in offset order."""

    tp: TopicPartition
    ongoing: dict[TxnID, OngoingTxn] = field(default_factory=dict)
    aborted: dict[TxnID, OffsetRuns] = field(default_factory=dict)
    """Aborted txns with records here -> their offsets as runs (kept until trimmed): one
    run per txn unless other records interleave, so snapshots grow with txns and
    interleavings, not records."""
    ended: dict[int, set[int]] = field(default_factory=dict)
    """TC id -> sequences that ended here at or above that TC's LWM."""
    lwm: dict[int, int] = field(default_factory=dict)
    """TC id -> the highest low watermark seen in its markers."""
    invisible: set[int] = field(default_factory=set)
    """Folded offsets never to deliver: markers, stragglers, undecodable records,
    records of aborted txns (kept until trimmed). Read it, never change it directly:
    :meth:`mark_invisible` keeps the trim order in step."""
    delayed: DelayRuns = field(default_factory=DelayRuns)
    """Visible records (committed or plain) not due when they became visible, with their
    times (:mod:`txnstream.buffer.delays`); bounded, trimmed with the rest."""
    last_offset: int = -1
    max_read_position: int = -1
    trimmed_below: int = 0
    """The highest :meth:`trim` point: nothing below it is kept or added again."""
    _invisible_order: list[int] = field(default_factory=list, repr=False, compare=False)
    """Min-heap of :attr:`invisible`: trim pops what falls below, rebuilds nothing."""
    _aborted_order: list[tuple[int, TxnID]] = field(default_factory=list, repr=False,
                                                    compare=False)
    """Min-heap of (last offset, txn) of :attr:`aborted`, for the same reason."""
    signer: MarkerSigner | None = field(default=None, repr=False, compare=False)
    """If set, only markers it verifies count; others are forged (hidden, nothing else)."""
    forged: int = 0
    """Forged markers folded (not kept in snapshots: a count for stats and metrics)."""
    junk: int = 0
    """Records folded as junk: a ``txn.id`` without its txn's ``txn.tag`` here (a count
    for stats and metrics, not kept in snapshots)."""
    legacy_until: int = 0
    """Records below this offset that carry a ``txn.id`` and no ``txn.tag`` were written
    before the workers checked membership: they follow the rules of that time (held
    until their txn's marker or the owner's check). At and above it such a record is
    junk. 0 (the default): every record is judged by membership. -1: not known (restored
    from a snapshot taken before membership): :meth:`attach_signer` sets it."""
    journal: Journal | None = field(default=None, repr=False, compare=False)
    """If set, what the fold decides is also noted here, for the owner to publish
    (:mod:`txnstream.buffer.served`): hidden offsets and aborted spans."""
    log_epoch: int = 0
    """Which log of the partition this state folds: 0 for the first; its owner adds one
    each time it restarts the state on a new log (the topic deleted and recreated, or its
    log truncated below :attr:`last_offset`: :mod:`txnstream.buffer.recreation`)."""
    topic_id: str = field(default="", compare=False)
    """The Kafka topic id of the log folded ("": not known; not compared: it names the
    log, the fold's state is the rest)."""

    # ------------------------------------------------------------------ fold

    def fold(self, offset: int, headers: Headers, value: bytes | None = None,
             timestamp_ms: int | None = None) -> Verdict:
        """Fold the record at ``offset`` (the next one after :attr:`last_offset`)."""
        if offset <= self.last_offset:
            raise ValueError(f"{self.tp}: offset {offset} folded out of order "
                             f"(last folded {self.last_offset})")
        self.last_offset = offset
        try:
            verdict = self._fold(offset, headers, value, timestamp_ms)
        except CorruptRecordError as exc:
            log.error("%s: dropping record at offset %d: %s", self.tp, offset, exc)
            self._hide(offset)
            verdict = Verdict.CORRUPT
        self._advance()
        return verdict

    def _fold(self, offset: int, headers: Headers, value: bytes | None,
              timestamp_ms: int | None) -> Verdict:
        kind, txn_id = classify_headers(headers)
        if kind is RecordKind.PLAIN:
            if headers:
                self._plain_delay(offset, offset, headers, timestamp_ms)
            return Verdict.PLAIN
        assert txn_id is not None
        if kind is RecordKind.MARKER:
            if self.signer is not None and not self.signer.verify(
                    self.tp.topic, self.tp.partition, value, headers,
                    legacy=offset < self.legacy_until):
                self._hide(offset)
                self.forged += 1
                _rate_limited.warning(
                    f"forged {self.tp}", "%s: hiding the marker of %s at offset %d: it was not "
                    "written by a worker of this cluster (its txn.mac does not verify)",
                    self.tp, txn_id, offset)
                return Verdict.FORGED
            marker = TxnMarker.decode(value)
            if marker.txn_id != txn_id:
                raise CorruptRecordError(
                    f"marker header says {txn_id} but its value says {marker.txn_id}")
            self._hide(offset)
            self._end(txn_id, marker.kind, timestamp_ms)
            self._raise_lwm(txn_id.tc_id, marker.lwm)
            return Verdict.MARKER
        if not self._is_member(offset, txn_id, headers):
            self._hide(offset)
            self.junk += 1
            _rate_limited.warning(
                f"junk {self.tp}", "%s: hiding the record at offset %d: it names %s without "
                "that txn's txn.tag here, so it is no member of it (a forged or copied "
                "txn.id); it ends, blocks and joins nothing", self.tp, offset, txn_id)
            return Verdict.JUNK
        return self._fold_txn_record(offset, txn_id, timestamp_ms, headers)

    @property
    def checks_membership(self) -> bool:
        """Whether this fold judges txn records by their ``txn.tag``."""
        return self.signer is not None and self.signer.membership is not None

    def attach_signer(self, signer: MarkerSigner | None, log_end: int) -> None:
        """Fold on with the owner's ``signer``; the log ends at ``log_end`` now.

        The upgrade path: a state folded before membership was checked (``legacy_until``
        not known) judges what its log holds now by the old rules, and what comes after
        by membership.
        """
        self.signer = signer
        if self.legacy_until < 0 and self.checks_membership:
            self.legacy_until = log_end

    def _is_member(self, offset: int, txn_id: TxnID, headers: Headers) -> bool:
        """Whether a record naming ``txn_id`` belongs to it (:mod:`txnstream.membership`).

        Always, when the fold has no membership key (workers without a secret).
        """
        membership = self.signer.membership if self.signer is not None else None
        if membership is None:
            return True
        tag = next((v for k, v in headers or () if k == TXN_TAG_HEADER), None)
        if tag is None and offset < self.legacy_until:
            return True  # written before membership: judged by the rules of its time
        return membership.is_member(txn_id, self.tp, tag)

    def _fold_txn_record(self, offset: int, txn_id: TxnID, timestamp_ms: int | None,
                         headers: Headers = None) -> Verdict:
        if self._has_ended(txn_id):
            self._hide(offset)
            lwm = self.lwm.get(txn_id.tc_id, 0)
            if self.journal is not None and txn_id.least_bits < lwm:
                # it may have no marker here at all (its first record came after the
                # LWM passed it); an ABORT after a COMMIT changes nothing: first wins
                self.journal.unmarked[txn_id] = lwm
            return Verdict.STRAGGLER
        entry = self.ongoing.get(txn_id)
        if entry is None:
            entry = self.ongoing[txn_id] = OngoingTxn(offset, OffsetRuns((offset,)),
                                                      timestamp_ms)
        else:
            entry.offsets.append(offset)
        if len(headers or ()) > 1 and (delay := delay_of(headers)) is not None:
            if entry.delays is None:
                entry.delays = PendingDelays()
            entry.delays.add(offset, offset, *delay)
        return Verdict.TXN_PENDING

    def _plain_delay(self, first: int, last: int, headers: Headers, ts: int | None) -> None:
        if (delay := delay_of(headers)) is not None and (
                due := due_at(*delay, ts or 0, ts or 0)) > (ts or 0):
            self._add_delayed([(first, last, due)])

    def _add_delayed(self, runs: list[tuple[int, int, int]]) -> None:
        for first, last, due in runs:
            if last >= self.trimmed_below:
                self.delayed.add(max(first, self.trimmed_below), last, due)
                if self.journal is not None:
                    self.journal.delayed.append((first, last, due))

    def _has_ended(self, txn_id: TxnID) -> bool:
        tc, seq = txn_id.tc_id, txn_id.least_bits
        return seq < self.lwm.get(tc, 0) or seq in self.ended.get(tc, ())

    def _end(self, txn_id: TxnID, kind: MarkerKind, marker_ms: int | None = None) -> None:
        if self._has_ended(txn_id):
            return  # first marker wins
        self.ended.setdefault(txn_id.tc_id, set()).add(txn_id.least_bits)
        entry = self.ongoing.pop(txn_id, None)
        if kind is MarkerKind.COMMIT and entry is not None and entry.delays is not None:
            first_ms = entry.first_timestamp_ms or 0
            self._add_delayed(entry.delays.resolve(marker_ms or first_ms, first_ms))
        if kind is MarkerKind.ABORT and entry is not None:
            self.mark_aborted(txn_id, entry.offsets)
            if self.journal is not None:
                self.journal.aborted.append((txn_id, entry.offsets[0], entry.offsets[-1]))

    def _hide(self, offset: int) -> None:
        if offset >= self.trimmed_below and offset not in self.invisible:
            self.invisible.add(offset)
            heapq.heappush(self._invisible_order, offset)
            if self.journal is not None:
                self.journal.hidden.append(offset)

    def mark_invisible(self, offsets: Iterable[int]) -> None:
        """Add ``offsets`` to :attr:`invisible` (those below the trim point are dropped)."""
        new = [o for o in offsets if o >= self.trimmed_below and o not in self.invisible]
        if not new:
            return
        self.invisible.update(new)
        order = self._invisible_order
        if len(new) > len(order):  # a large aborted txn: one heapify, not a push each
            order.extend(new)
            heapq.heapify(order)
        else:
            for o in new:
                heapq.heappush(order, o)

    def mark_aborted(self, txn_id: TxnID, offsets: Sequence[int]) -> None:
        """Record an aborted txn's offsets here (restore); those below the trim point are gone."""
        runs = offsets if isinstance(offsets, OffsetRuns) else OffsetRuns(offsets)
        if runs and runs[0] < self.trimmed_below:
            runs = runs.at_or_above(self.trimmed_below)
        if not runs:
            return
        self.aborted[txn_id] = runs
        heapq.heappush(self._aborted_order, (runs[-1], txn_id))
        self.mark_invisible(runs)

    def _raise_lwm(self, tc: int, lwm: int) -> None:
        if lwm <= self.lwm.get(tc, 0):
            return
        for txn_id in [t for t in self.ongoing if t.tc_id == tc and t.least_bits < lwm]:
            # Ended at its coordinator without a marker here: never committed here.
            self._end(txn_id, MarkerKind.ABORT)
            if self.journal is not None:
                self.journal.unmarked[txn_id] = lwm
        self.lwm[tc] = lwm
        seqs = self.ended.get(tc)
        if seqs:
            self.ended[tc] = {s for s in seqs if s >= lwm}

    def _advance(self) -> None:
        if self.ongoing:
            first = min(e.first_offset for e in self.ongoing.values())
            self.max_read_position = first - 1
        else:
            self.max_read_position = self.last_offset

    # --------------------------------------------------------------- queries

    def is_visible(self, offset: int) -> bool:
        """Whether a committed-only reader may deliver the record at ``offset``."""
        return offset <= self.max_read_position and offset not in self.invisible

    def invisible_in_range(self, start: int, end: int) -> set[int]:
        """Offsets in ``[start, end)`` that must not be delivered (``end`` <= mrp + 1)."""
        return {o for o in self.invisible if start <= o < end}

    def aborted_in_range(self, start: int, end: int) -> set[TxnID]:
        """Aborted txns with a record in ``[start, end)``."""
        return {t for t, offs in self.aborted.items() if offs.intersects(start, end)}

    def ongoing_txns(self) -> dict[TxnID, int]:
        """Ongoing txn -> its first offset here."""
        return {t: e.first_offset for t, e in self.ongoing.items()}

    def trim(self, below: int) -> None:
        """Forget what only offsets below ``below`` need (readers are past them).

        Afterwards the buffer answers only for offsets at or above ``below``: invisible
        offsets below it are dropped, and so are aborted txns whose last record here is
        below it; offsets below it are never added again. Cheap enough to call after
        every batch: O(k log n) for the k entries forgotten, in place (a caller holding
        :attr:`invisible` sees the same set, trimmed), O(1) when nothing is below.
        """
        if below <= self.trimmed_below:
            return
        self.trimmed_below = below
        order, invisible = self._invisible_order, self.invisible
        while order and order[0] < below:
            invisible.discard(heapq.heappop(order))
        aborted, by_last = self.aborted, self._aborted_order
        while by_last and by_last[0][0] < below:
            _, txn_id = heapq.heappop(by_last)
            aborted.pop(txn_id, None)
        if self.delayed:
            self.delayed.trim(below)

    def stats(self, now_ms: int | None = None) -> BufferStats:
        """Ongoing/aborted counts and the txn that blocks the partition, if any."""
        blocking = min(self.ongoing.items(), key=lambda kv: kv[1].first_offset, default=None)
        txn_id = offset = age = None
        if blocking is not None:
            txn_id, entry = blocking
            offset = entry.first_offset
            if entry.first_timestamp_ms is not None:
                now = now_ms if now_ms is not None else int(time.time() * 1000)
                age = max(0.0, (now - entry.first_timestamp_ms) / 1000)
        return BufferStats(self.tp, self.last_offset, self.max_read_position,
                           len(self.ongoing), len(self.aborted), txn_id, offset, age,
                           self.junk)

    def fold_messages(self, records: Iterable[Record]) -> int:
        """Fold many records in offset order: the state :meth:`fold` reaches one by one.

        Records at or below :attr:`last_offset` (a re-delivered prefix) are skipped.
        Returns how many were folded.
        """
        return self.fold_entries(runs_of(records, self.tp.topic, self.tp.partition))

    def fold_entries(self, entries: Iterable[Entry]) -> int:
        """Fold runs of this partition's records (:mod:`txnstream.buffer.runs`), in order.

        The owner's fast path: a run's first record is folded by :meth:`fold`; the rest
        of a plain run or of one ongoing txn's (whose membership its first record
        proved: same ``txn.id`` and ``txn.tag``) cost nothing each, and anything else is
        folded one by one. Offsets at or below :attr:`last_offset` are skipped. Returns
        how many records were folded.
        """
        n = 0
        for _topic, _partition, first, last, headers, value, ts in entries:
            if last <= self.last_offset:
                continue
            first = max(first, self.last_offset + 1)
            n += last - first + 1
            verdict = self.fold(first, headers, value, ts if ts > 0 else None)
            if last == first:
                continue
            if headers is None or verdict is Verdict.PLAIN:  # nothing in it to judge
                if headers is not None:  # all delayed alike
                    self._plain_delay(first + 1, last, headers, ts if ts > 0 else None)
                self.last_offset = last
                self._advance()
                continue
            if verdict is Verdict.TXN_PENDING:
                same = last if len(headers) > 1 or not self.checks_membership \
                    else min(last, self.legacy_until - 1)  # a lone txn.id: legacy only
                if same > first:
                    raw = split_headers(headers)[0]
                    assert raw is not None
                    entry = self.ongoing[TxnID.from_bytes(raw)]
                    entry.offsets.append_range(first + 1, same)
                    if entry.delays is not None and entry.delays.runs[-1][1] == first:
                        entry.delays.extend_to(same)
                    self.last_offset = first = same
            for offset in range(first + 1, last + 1):
                self.fold(offset, headers, None, None)
        return n
