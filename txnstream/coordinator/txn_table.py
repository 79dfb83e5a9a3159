"""``TxnMetaTable``: every ``TxnMeta`` of one TC, and the indexes kept in step with them.

What the valid records of a TC's log fold into, by :meth:`TxnMetaTable.apply`: plain
Python over plain data, no Kafka and no fencing. Replay and request handling share it
(:class:`~txnstream.coordinator.metadata_store.TransactionMetadataStore` decides which
records are valid and plans the entries of requests); the indexes answer what a turn of
the worker asks every time without a scan of every txn remembered: the live and ending
txns, the low watermark, the open txns per principal and per group key, the deadlines
(:class:`~txnstream.coordinator.timeout_tracker.TransactionTimeoutTracker`), the request
ids of NEW and RESERVE (idempotent resends) and the group outcomes
(:class:`~txnstream.coordinator.group_outcomes.GroupOutcomes`).
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter, OrderedDict
from collections.abc import Mapping

from txnstream.coordinator.group_outcomes import GroupOutcomes
from txnstream.coordinator.log_entry import GroupOutcome, LogEntryKind, TransactionLogEntry
from txnstream.coordinator.meta import TxnMeta
from txnstream.coordinator.timeout_tracker import TransactionTimeoutTracker
from txnstream.coordinator.txn_index import RESERVED, TxnIndex, state_of
from txnstream.errors import TransactionNotFoundError
from txnstream.types import ANONYMOUS, TxnID, TxnStatus

__all__ = [
    "ABORT_ADMIN",
    "ABORT_CLIENT",
    "ABORT_GROUP",
    "ABORT_PREPARED",
    "ABORT_TIMEOUT",
    "MAX_REMEMBERED_REQUESTS",
    "RESERVED",
    "TxnMetaTable",
]

log = logging.getLogger(__name__)

MAX_REMEMBERED_REQUESTS = 100_000
"""NEW request ids remembered for idempotent replay; a client retries within seconds."""

ABORT_TIMEOUT = "timeout"
ABORT_CLIENT = "client"
ABORT_ADMIN = "admin"
ABORT_GROUP = "group"
ABORT_PREPARED = "prepared-age"
"""A PREPARED txn not completed within its maximum prepared age."""


class TxnMetaTable:
    """The txns of coordinator ``tc_id`` as the valid records of its log leave them."""

    def __init__(self, tc_id: int) -> None:
        self.tc_id = tc_id
        self.txns: dict[int, TxnMeta] = {}
        self.next_sequence = 0
        self.open_by_owner: Counter[str] = Counter()
        """OPEN txns (reserved ones included) per owning principal: a principal's limit."""
        self.index = TxnIndex(self.txns)
        """What LIST and STATS read (sequences in order, counts per state)."""
        self.outcomes = GroupOutcomes(tc_id)
        """Recent group outcomes: what a checkpoint carries."""
        self._requests: OrderedDict[str, int] = OrderedDict()
        self._open_by_group: dict[str, set[int]] = {}
        """OPEN txns opened for a group key, so a group end finds its orphans at once."""
        self.timeouts = TransactionTimeoutTracker()
        self._live: set[int] = set()
        """Txns not final yet; with :attr:`_live_heap` (stale entries skipped lazily),
        the low watermark without a scan of every txn remembered."""
        self._live_heap: list[int] = []
        self._ending_seqs: set[int] = set()
        """COMMITTING/ABORTING txns: what the finalizer works on, every turn."""

    @property
    def groups(self) -> Mapping[str, GroupOutcome]:
        """Recent group outcomes by key, oldest first (what the next checkpoint carries)."""
        return self.outcomes.by_key

    @property
    def seen_requests(self) -> Mapping[str, int]:
        """NEW/RESERVE request ids remembered (a resend returns what the first opened)."""
        return self._requests

    def apply(self, entry: TransactionLogEntry, now_ms: int | None = None) -> None:
        """Apply a valid entry to the state (shared by replay and request handling)."""
        if entry.kind is LogEntryKind.CHECKPOINT:
            self.next_sequence = max(self.next_sequence, entry.next_sequence)
            for g in entry.group_keys:
                self.outcomes.remember(g)
            return
        if entry.kind is LogEntryKind.GROUP_END:
            assert entry.status is not None and entry.group_key is not None
            for seq in entry.group_seqs:
                meta = self.txns.get(seq)
                if meta is None:
                    log.warning("tc %d: group end names unknown txn %d", self.tc_id, seq)
                    continue
                self._move(meta, entry.status, ABORT_GROUP, now_ms)
                meta.group_key = entry.group_key
            if entry.status is TxnStatus.COMMITTING:
                self.outcomes.remember(
                    GroupOutcome(entry.group_key, entry.status, entry.group_seqs))
            return
        if entry.kind is not LogEntryKind.TXN:
            return
        seq = entry.txn_seq
        self.next_sequence = max(self.next_sequence, seq + 1)
        meta = self.txns.get(seq)
        if meta is None:
            if entry.status is TxnStatus.OPEN and entry.timeout_ms > 0:
                meta = TxnMeta(TxnID(self.tc_id, seq), TxnStatus.OPEN, entry.open_time_ms,
                               entry.timeout_ms, group_key=entry.group_key,
                               owner=entry.principal or ANONYMOUS,
                               reserved=entry.reason == RESERVED)
                self.txns[seq] = meta
                self.index.add(meta)
                self.open_by_owner[meta.owner] += 1
                self._track(meta)
                self.timeouts.track(seq, meta.deadline_ms)
                if entry.group_key is not None:
                    self._open_by_group.setdefault(entry.group_key, set()).add(seq)
                if entry.request_id:
                    self._remember_request(entry.request_id, seq)
            elif entry.status is not None and entry.status.is_final:
                # Its earlier records were truncated away; keep the outcome.
                meta = TxnMeta(TxnID(self.tc_id, seq), entry.status, entry.open_time_ms, 0)
                self.txns[seq] = meta
                self.index.add(meta)
                self._track(meta)
                meta.end_time_ms = now_ms
                return
            else:
                log.warning("tc %d: record for unknown txn %d (%s) ignored",
                            self.tc_id, seq, entry.status)
                return
        if entry.status is None and entry.timeout_ms > 0 and meta.status is TxnStatus.OPEN:
            # a reserved txn handed out (ACTIVATE): its deadline runs from then
            was = state_of(meta)
            meta.open_time_ms, meta.timeout_ms = entry.open_time_ms, entry.timeout_ms
            meta.reserved = False
            self.index.changed(meta, was)
            self.timeouts.track(seq, meta.deadline_ms)
        if entry.partitions:
            meta.partitions |= set(entry.partitions)
        if entry.subscriptions:
            meta.subscriptions |= set(entry.subscriptions)
        if entry.status is not None and entry.status is not meta.status:
            if meta.status in (TxnStatus.OPEN, TxnStatus.PREPARED) and entry.status in (
                    TxnStatus.COMMITTING, TxnStatus.ABORTING):
                meta.decided_by = entry.request_id
            if entry.status is TxnStatus.PREPARED:
                meta.prepared_at_ms, meta.max_prepared_ms = entry.open_time_ms, entry.timeout_ms
            self._move(meta, entry.status, entry.reason, now_ms)

    def _move(self, meta: TxnMeta, status: TxnStatus, reason: str | None,
              now_ms: int | None) -> None:
        if not meta.status.can_transition_to(status):
            log.warning("tc %d: txn %s cannot go %s -> %s; record ignored",
                        self.tc_id, meta.txn_id, meta.status.value, status.value)
            return
        was = state_of(meta)
        held = (TxnStatus.OPEN, TxnStatus.PREPARED)  # what a principal's limit counts
        if meta.status in held and status not in held:
            left = self.open_by_owner[meta.owner] - 1
            if left > 0:
                self.open_by_owner[meta.owner] = left
            else:
                self.open_by_owner.pop(meta.owner, None)
        if meta.status is TxnStatus.OPEN and status is not TxnStatus.OPEN \
                and meta.group_key is not None:
            opened = self._open_by_group.get(meta.group_key)
            if opened is not None:
                opened.discard(meta.txn_id.least_bits)
                if not opened:
                    del self._open_by_group[meta.group_key]
        meta.status = status
        if status is TxnStatus.PREPARED and meta.prepared_deadline_ms is not None:
            self.timeouts.track(meta.txn_id.least_bits, meta.prepared_deadline_ms)
        elif status is not TxnStatus.OPEN:
            self.timeouts.untrack(meta.txn_id.least_bits)
        if status is TxnStatus.ABORTING and reason:
            meta.abort_reason = reason
        if status.is_final:
            meta.end_time_ms = now_ms
        self.index.changed(meta, was)
        self._track(meta)

    def _track(self, meta: TxnMeta) -> None:
        """Keep the live and ending indexes in step with ``meta``'s status."""
        seq = meta.txn_id.least_bits
        if meta.status.is_final:
            self._live.discard(seq)
            self._ending_seqs.discard(seq)
            return
        if seq not in self._live:
            self._live.add(seq)
            heapq.heappush(self._live_heap, seq)
        if meta.status.is_ending:
            self._ending_seqs.add(seq)
        else:
            self._ending_seqs.discard(seq)

    def _remember_request(self, request_id: str, seq: int) -> None:
        self._requests[request_id] = seq
        while len(self._requests) > MAX_REMEMBERED_REQUESTS:
            self._requests.popitem(last=False)


    def get(self, seq: int) -> TxnMeta:
        """The txn with sequence ``seq``, or ``TransactionNotFoundError``."""
        meta = self.txns.get(seq)
        if meta is None:
            raise TransactionNotFoundError(
                f"transaction {TxnID(self.tc_id, seq)} is not known to coordinator {self.tc_id} "
                "(never opened, or ended and truncated)", TxnID(self.tc_id, seq))
        return meta


    # ----------------------------------------------------------------- queries

    def live(self) -> list[TxnMeta]:
        """Txns not yet final (OPEN, reserved, PREPARED, COMMITTING, ABORTING)."""
        return [self.txns[s] for s in self._live if s in self.txns]

    def handed_out(self) -> list[TxnMeta]:
        """:meth:`live` without the reserved txns no writer holds yet (what gauges count)."""
        return [m for m in self.live() if not (m.reserved and m.status is TxnStatus.OPEN)]

    def reserved_count(self) -> int:
        """Reserved txns not handed out yet: not open txns, but the LWM waits for them."""
        return sum(1 for m in self.live() if m.reserved and m.status is TxnStatus.OPEN)

    def ending(self) -> list[TxnMeta]:
        """Txns whose outcome is decided but not yet finalized (COMMITTING/ABORTING)."""
        return [self.txns[s] for s in sorted(self._ending_seqs)]

    @property
    def low_watermark(self) -> int:
        """Every txn of this TC with a lower sequence has ended (COMMITTED/ABORTED)."""
        heap = self._live_heap
        while heap and heap[0] not in self._live:
            heapq.heappop(heap)
        return heap[0] if heap else self.next_sequence
