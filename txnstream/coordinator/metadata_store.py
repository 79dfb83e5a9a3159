"""``TransactionMetadataStore``: the pure state machine of one transaction coordinator.

Plain Python over plain data, no Kafka (Pulsar pairs ``InMemTransactionMetadataStore``
with ``MLTransactionMetadataStore``; here the store is pure and the Kafka log is an
adapter around it, see :mod:`txnstream.coordinator.txn_log`).

Two ways in, one state:

* **Replay** (:meth:`replay`): every record of ``__txn_log[p]`` in offset order. The
  fencing rule of DESIGN.md section 5 decides validity: a *takeover* ``EPOCH`` (written
  by a new owner after its replay, ``epoch_offset`` -1) is always valid and becomes the
  current epoch; any other record is valid only if its ``epoch_offset`` equals the offset
  of the latest valid ``EPOCH`` before it. Invalid records change nothing (they only
  raise the sequence floor, so a TxnID a zombie handed out can never be handed out
  again).
* **Epoch renewal**: the owner appends, before each checkpoint, a *renewal* ``EPOCH``
  naming its current epoch (:meth:`renewal_entry`). Valid by the rule above, it becomes
  the current epoch and the owner's records carry it from then on; a zombie's renewal
  names an epoch that is no longer current, so it is invalid and fences nobody. A
  renewal at the very start of the log (where a truncation left it) is taken as valid:
  only an owner that read it back as valid truncates there. Renewals let truncation pass
  the takeover EPOCH of a long-lived owner: :meth:`truncation_point` cuts at the EPOCH
  that governs the first record still needed, never between that EPOCH and the record.
* **Requests** (``new_txn``, ``add_partitions``, ``end_txn``, ...): the owner plans a
  change, the store applies it at once (so later requests of the same batch see it) and
  returns the log entry to append. Every entry applied this way is also queued until the
  owner takes it with :meth:`unlogged`, *also when the request then fails*: a commit that
  finds its txn expired aborts it and raises, and that abort must reach the log before
  the error reply and before any marker. The owner appends what :meth:`unlogged` gives
  and replies to a client only after it has read those entries back as valid. If an
  append fails or it finds itself fenced instead, it throws the whole store away without
  replying: the log, not this object, is the truth, and the new owner rebuilds from it.

Records the owner wrote come back through :meth:`replay` too; they carry the owner's
own epoch and were applied already, so only their offsets are noted.
"""

from __future__ import annotations

import bisect
import heapq
import logging
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from txnstream.coordinator.log_entry import (
    GroupOutcome,
    LogEntryKind,
    SubscriptionRef,
    TransactionLogEntry,
)
from txnstream.coordinator.meta import TxnMeta
from txnstream.coordinator.timeout_tracker import TransactionTimeoutTracker
from txnstream.errors import (
    InvalidTxnStatusError,
    TransactionNotFoundError,
    TransactionTimeoutError,
)
from txnstream.types import ANONYMOUS, COORDINATOR_STATUSES, TopicPartition, TxnID, TxnStatus

__all__ = ["TransactionMetadataStore", "EndResult", "GroupEndResult", "StoreStats"]

log = logging.getLogger(__name__)

MAX_REMEMBERED_REQUESTS = 100_000
"""NEW request ids remembered for idempotent replay; a client retries within seconds."""
MAX_REMEMBERED_GROUPS = 10_000
"""Committed group keys carried in checkpoints; Spark replays only its last batches."""
MAX_CHECKPOINT_BYTES = 256 * 1024
"""Upper bound of one encoded CHECKPOINT record. It must fit in one Kafka message: the
broker's default ``max.message.bytes`` is 1 MiB and librdkafka refuses a message over
``message.max.bytes`` (1,000,000) at ``produce()``. A quarter of that leaves room for a
cluster configured below the default and for batch overhead, and still carries about
2,300 outcomes of 16-txn groups (~110 bytes each): Spark replays only the last batch of a
query after a driver restart, so a TC would need that many queries committing between a
batch and its replay to forget the batch. Before this bound, 10,000 such outcomes made a
1.1 MB checkpoint: refused, the TC restarted at every checkpoint and truncation stopped."""
CHECKPOINT_FIXED_BYTES = 4 * 1024
"""Share of :data:`MAX_CHECKPOINT_BYTES` kept for the fields other than group outcomes
(owner id, offsets, sequence floor, framing: about 100 bytes with a usual owner id)."""

ABORT_TIMEOUT = "timeout"
ABORT_CLIENT = "client"
ABORT_ADMIN = "admin"
ABORT_GROUP = "group"
RESERVED = "reserved"
"""The ``reason`` of the OPEN records of a RESERVE: not handed out to a writer yet."""


@dataclass(frozen=True, slots=True)
class EndResult:
    """What an end request decided: the entry to log (None if nothing changes)."""

    meta: TxnMeta
    entry: TransactionLogEntry | None


@dataclass(frozen=True, slots=True)
class GroupEndResult:
    """Outcome of a group end: the status every txn of the group goes to."""

    status: TxnStatus
    seqs: tuple[int, ...]
    entries: tuple[TransactionLogEntry, ...]
    already: bool
    """True if the key had been ended before: nothing of this request was committed."""
    error: str | None = None
    timed_out: bool = False
    """The error is a txn of the group past its timeout (the client names its setting)."""


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Numbers for ``coordinator_stats()``."""

    tc_id: int
    epoch_offset: int
    owner_id: str | None
    next_sequence: int
    low_watermark: int
    by_status: dict[str, int]
    invalid_records: int
    oldest_open_ms: int | None


class TransactionMetadataStore:
    """All transactions of coordinator ``tc_id``, rebuilt from and kept in step with its log."""

    def __init__(self, tc_id: int, owner_id: str = "") -> None:
        self.tc_id = tc_id
        self.owner_id = owner_id
        self.txns: dict[int, TxnMeta] = {}
        self.next_sequence = 0
        self.epoch_offset = -1
        self.epoch_owner: str | None = None
        self._own_epoch: int | None = None
        self._own_epochs: set[int] = set()
        self.open_by_owner: Counter[str] = Counter()
        """OPEN txns (reserved ones included) per owning principal: a principal's limit."""
        self.fenced = False
        self.diverged = False
        """One of this owner's own records read back invalid: its memory holds what the
        log does not. Never expected (see :meth:`renewal_entry`); the owner must replay."""
        self._epochs: list[int] = []
        """Offsets of the valid EPOCH records since the log start (truncation points)."""
        self.checkpoint_offset = -1
        self.invalid_records = 0
        self.groups: OrderedDict[str, GroupOutcome] = OrderedDict()
        self.group_bytes = 0
        """Encoded size of :attr:`groups` in a checkpoint (kept under its budget)."""
        self.group_budget = MAX_CHECKPOINT_BYTES - CHECKPOINT_FIXED_BYTES
        """Bytes of group outcomes a checkpoint may carry (see :meth:`shrink_groups`)."""
        self._requests: OrderedDict[str, int] = OrderedDict()
        self._open_by_group: dict[str, set[int]] = {}
        """OPEN txns opened for a group key, so a group end finds its orphans at once."""
        self._unlogged: list[TransactionLogEntry] = []
        self.timeouts = TransactionTimeoutTracker()
        self._live: set[int] = set()
        self.ended: dict[str, int] = {TxnStatus.COMMITTED.value: 0, TxnStatus.ABORTED.value: 0}
        """Txns this incarnation finalized, by outcome (rates; a new owner starts at 0)."""
        """Txns not final yet; with :attr:`_live_heap` (stale entries skipped lazily),
        the low watermark without a scan of every txn remembered."""
        self._live_heap: list[int] = []
        self._ending_seqs: set[int] = set()
        """COMMITTING/ABORTING txns: what the finalizer works on, every turn."""

    # ------------------------------------------------------------------ replay

    @property
    def own_epoch(self) -> int | None:
        """Offset of this owner's current EPOCH record, once read back.

        None while replaying. Moves to each renewal of the owner as it is read back.
        """
        return self._own_epoch

    @own_epoch.setter
    def own_epoch(self, offset: int | None) -> None:
        self._own_epoch = offset
        if offset is not None:
            self._own_epochs.add(offset)

    def is_valid(self, entry: TransactionLogEntry) -> bool:
        """The fencing rule for ``entry``.

        A takeover EPOCH is always valid; a renewal EPOCH or any other record only under
        the latest valid EPOCH (a renewal also at the log start, before any EPOCH).
        """
        if entry.kind is LogEntryKind.EPOCH and (entry.epoch_offset < 0 or self.epoch_offset < 0):
            return True
        return entry.epoch_offset == self.epoch_offset

    def replay(self, offset: int, entry: TransactionLogEntry,
               timestamp_ms: int | None = None) -> bool:
        """Fold one log record read at ``offset``; returns whether it was valid.

        ``timestamp_ms`` is the record's Kafka timestamp; it dates the end of a txn
        that finalizes here, for truncation retention after failover.

        Sets :attr:`fenced` when a valid EPOCH of someone else follows our own: the
        caller must stop serving this coordinator at once. Our own renewal moves
        :attr:`own_epoch` to it instead.
        """
        if entry.kind is LogEntryKind.EPOCH and self.is_valid(entry):
            if self.own_epoch is not None:
                if entry.epoch_offset >= 0 and entry.epoch_offset == self.own_epoch:
                    self.own_epoch = offset  # our renewal, read back
                elif offset != self.own_epoch:
                    self.fenced = True
            self.epoch_offset = offset
            self.epoch_owner = entry.owner_id
            self.next_sequence = max(self.next_sequence, entry.next_sequence)
            self._epochs.append(offset)
            return True
        if not self.is_valid(entry):
            self.invalid_records += 1
            if entry.epoch_offset in self._own_epochs:
                self.diverged = True
            if entry.txn_seq >= 0:
                self.next_sequence = max(self.next_sequence, entry.txn_seq + 1)
            log.warning("tc %d: ignoring record at offset %d with stale epoch %d (current %d)",
                        self.tc_id, offset, entry.epoch_offset, self.epoch_offset)
            return False
        own = self.own_epoch is not None and entry.epoch_offset == self.own_epoch
        if not own:
            self.apply(entry, timestamp_ms)
        self._note_offset(offset, entry)
        return True

    def _note_offset(self, offset: int, entry: TransactionLogEntry) -> None:
        if entry.kind is LogEntryKind.CHECKPOINT:
            self.checkpoint_offset = offset
        seqs = entry.group_seqs if entry.kind is LogEntryKind.GROUP_END else (entry.txn_seq,)
        for seq in seqs:
            meta = self.txns.get(seq)
            if meta is not None:
                if meta.first_offset is None:
                    meta.first_offset = offset
                meta.last_offset = offset

    def apply(self, entry: TransactionLogEntry, now_ms: int | None = None) -> None:
        """Apply a valid entry to the state (shared by replay and request handling)."""
        if entry.kind is LogEntryKind.CHECKPOINT:
            self.next_sequence = max(self.next_sequence, entry.next_sequence)
            for g in entry.group_keys:
                self._remember_group(g)
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
                self._remember_group(GroupOutcome(entry.group_key, entry.status, entry.group_seqs))
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
                self._track(meta)
                meta.end_time_ms = now_ms
                return
            else:
                log.warning("tc %d: record for unknown txn %d (%s) ignored",
                            self.tc_id, seq, entry.status)
                return
        if entry.status is None and entry.timeout_ms > 0 and meta.status is TxnStatus.OPEN:
            # a reserved txn handed out (ACTIVATE): its deadline runs from then
            meta.open_time_ms, meta.timeout_ms = entry.open_time_ms, entry.timeout_ms
            meta.reserved = False
            self.timeouts.track(seq, meta.deadline_ms)
        if entry.partitions:
            meta.partitions |= set(entry.partitions)
        if entry.subscriptions:
            meta.subscriptions |= set(entry.subscriptions)
        if entry.status is not None and entry.status is not meta.status:
            self._move(meta, entry.status, entry.reason, now_ms)

    def _move(self, meta: TxnMeta, status: TxnStatus, reason: str | None,
              now_ms: int | None) -> None:
        if not meta.status.can_transition_to(status):
            log.warning("tc %d: txn %s cannot go %s -> %s; record ignored",
                        self.tc_id, meta.txn_id, meta.status.value, status.value)
            return
        if meta.status is TxnStatus.OPEN and status is not TxnStatus.OPEN:
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
        if status is not TxnStatus.OPEN:
            self.timeouts.untrack(meta.txn_id.least_bits)
        if status is TxnStatus.ABORTING and reason:
            meta.abort_reason = reason
        if status.is_final:
            meta.end_time_ms = now_ms
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

    def _remember_group(self, outcome: GroupOutcome) -> None:
        """Keep ``outcome`` as the newest; forget the oldest past the count or byte bound.

        What is remembered is exactly what the next checkpoint carries, so a new owner
        that replays the checkpoint recognises the same keys as this one.
        """
        size = outcome.encoded_size()
        if size > self.group_budget:
            # Idempotency needs the key and the status; the txns of the first commit are
            # only reported back. A group too big to carry whole is kept without them.
            log.warning("tc %d: group %r ends %d txns, too many to carry in a checkpoint; "
                        "remembering its key and outcome only", self.tc_id,
                        outcome.key[:100], len(outcome.seqs))
            outcome = GroupOutcome(outcome.key, outcome.status, ())
            size = outcome.encoded_size()
            if size > self.group_budget:
                log.error("tc %d: group key of %d bytes is too long to remember; a replay "
                          "of it will not be recognised", self.tc_id, size)
                return
        old = self.groups.pop(outcome.key, None)
        if old is not None:
            self.group_bytes -= old.encoded_size()
        self.groups[outcome.key] = outcome
        self.group_bytes += size
        self._trim_groups()

    def _trim_groups(self) -> None:
        while self.groups and (len(self.groups) > MAX_REMEMBERED_GROUPS
                               or self.group_bytes > self.group_budget):
            _, gone = self.groups.popitem(last=False)
            self.group_bytes -= gone.encoded_size()

    def shrink_groups(self) -> None:
        """Halve the checkpoint's group budget, forgetting the oldest outcomes.

        For a log that refused a checkpoint as too large (its topic's
        ``max.message.bytes`` is below :data:`MAX_CHECKPOINT_BYTES`): the next checkpoint
        fits instead of failing forever.
        """
        self.group_budget = max(1024, self.group_budget // 2)
        self._trim_groups()

    # ---------------------------------------------------------------- requests

    def _entry(self, **fields: object) -> TransactionLogEntry:
        return TransactionLogEntry(epoch_offset=self.epoch_offset, owner_id=self.owner_id,
                                   **fields)  # type: ignore[arg-type]

    def _apply_new(self, entry: TransactionLogEntry, now_ms: int) -> None:
        """Apply an entry planned by a request and queue it for the log."""
        self.apply(entry, now_ms)
        self._unlogged.append(entry)

    def unlogged(self) -> list[TransactionLogEntry]:
        """Take every entry applied by requests since the last call, in order.

        The owner appends them, and reads them back, before it replies to any request of
        the batch or writes any marker: they include entries of requests that failed
        (a commit that found its txn expired logs the timeout abort and raises).
        """
        out, self._unlogged = self._unlogged, []
        return out

    def epoch_entry(self) -> TransactionLogEntry:
        """The takeover EPOCH record a new owner appends after replay."""
        return TransactionLogEntry(kind=LogEntryKind.EPOCH, epoch_offset=-1,
                                   owner_id=self.owner_id, next_sequence=self.next_sequence)

    def renewal_entry(self) -> TransactionLogEntry:
        """An EPOCH renewing the owner's current epoch (see the module docstring).

        The owner appends it alone and reads it back before it writes anything else: a
        record it wrote under the old epoch that landed after the renewal would be
        invalid. Until the renewal is read back, :meth:`replay` keeps the old epoch.
        """
        assert self.own_epoch is not None and self.epoch_offset == self.own_epoch
        return TransactionLogEntry(kind=LogEntryKind.EPOCH, epoch_offset=self.epoch_offset,
                                   owner_id=self.owner_id, next_sequence=self.next_sequence)

    @property
    def seen_requests(self) -> Mapping[str, int]:
        """NEW/RESERVE request ids remembered (a resend returns what the first opened)."""
        return self._requests

    def get(self, seq: int) -> TxnMeta:
        """The txn with sequence ``seq``, or ``TransactionNotFoundError``."""
        meta = self.txns.get(seq)
        if meta is None:
            raise TransactionNotFoundError(
                f"transaction {TxnID(self.tc_id, seq)} is not known to coordinator {self.tc_id} "
                "(never opened, or ended and truncated)", TxnID(self.tc_id, seq))
        return meta

    def new_txn(self, request_id: str, timeout_ms: int, now_ms: int,
                group_key: str | None = None, principal: str = ANONYMOUS
                ) -> tuple[TxnMeta, TransactionLogEntry | None]:
        """Open a txn; a repeated request id returns the txn it opened before.

        ``group_key``: the group commit this txn is meant for (a Spark sink task's
        ``(query id, batch id)``). When that group ends, every other txn still OPEN under
        the same key is aborted: the txns of attempts whose driver died before
        reporting them, which would otherwise block readers until their timeout.
        """
        seen = self._requests.get(request_id)
        if seen is not None and seen in self.txns:
            return self.txns[seen], None
        seq = self.next_sequence
        entry = self._entry(kind=LogEntryKind.TXN, request_id=request_id, txn_seq=seq,
                            status=TxnStatus.OPEN, open_time_ms=now_ms, timeout_ms=timeout_ms,
                            group_key=group_key, principal=principal)
        self._apply_new(entry, now_ms)
        return self.txns[seq], entry

    def reserve(self, request_id: str, count: int, lease_ms: int, now_ms: int,
                principal: str = ANONYMOUS) -> list[int]:
        """Open ``count`` txns at once, each alive for ``lease_ms`` until activated.

        A client takes TxnIDs from such a block without a round trip per txn and
        activates each as it hands it out (:meth:`activate`). The txns are ordinary OPEN
        txns: the low watermark waits for them, an unused one times out at its lease
        like any other (logged, so every owner agrees), and a TxnID is never reused. A
        repeated request id returns the block it opened before.
        """
        seen = self._requests.get(request_id)
        if seen is not None and seen in self.txns:
            return self._logged_block(seen, count)
        first = self.next_sequence
        for i in range(count):
            self._apply_new(self._entry(
                kind=LogEntryKind.TXN, request_id=request_id if i == 0 else None,
                txn_seq=first + i, status=TxnStatus.OPEN, open_time_ms=now_ms,
                timeout_ms=lease_ms, reason=RESERVED, principal=principal), now_ms)
        return list(range(first, first + count))

    def _logged_block(self, first: int, count: int) -> list[int]:
        """The TxnIDs a RESERVE that opened ``first`` holds in this store.

        Its entries are one record per TxnID, so an append that failed midway leaves a
        prefix of the block in the log; what follows the prefix was never this request's
        (nobody's yet, or another request's: a txn opened by a request id starts another
        block). A resent RESERVE gets the prefix, never a TxnID no owner knows.
        """
        starts = set(self._requests.values())
        owner = self.txns[first].owner
        out = [first]
        for seq in range(first + 1, first + count):
            meta = self.txns.get(seq)
            if meta is None or seq in starts or meta.owner != owner:
                break
            out.append(seq)
        return out

    def activate(self, seq: int, timeout_ms: int, open_time_ms: int, now_ms: int,
                 request_id: str | None = None) -> TransactionLogEntry | None:
        """A reserved txn handed out at ``open_time_ms``: its deadline runs from then.

        The open time is kept between the reservation and now (a client clock ahead or
        behind cannot stretch a txn's life). Raises ``TransactionTimeoutError`` if its
        lease ran out first (it was aborted), like any request on an expired txn.
        Repeating it is idempotent.
        """
        meta = self.get(seq)
        self._check_alive(meta, now_ms)
        meta.check_open("activate")
        opened = min(max(open_time_ms, meta.open_time_ms), now_ms)
        if (opened, timeout_ms) == (meta.open_time_ms, meta.timeout_ms):
            return None
        entry = self._entry(kind=LogEntryKind.TXN, request_id=request_id, txn_seq=seq,
                            open_time_ms=opened, timeout_ms=timeout_ms)
        self._apply_new(entry, now_ms)
        return entry

    def _check_alive(self, meta: TxnMeta, now_ms: int) -> None:
        expired = meta.status is TxnStatus.OPEN and now_ms >= meta.deadline_ms
        if meta.reserved and (expired or meta.abort_reason == ABORT_TIMEOUT):
            # Never handed out as far as this TC knows: the lease ran out, not a timeout
            # the user chose (see TxnIdPool for why an activation is never that late).
            raise TransactionTimeoutError(
                f"transaction {meta.txn_id} was reserved with a lease of {meta.timeout_ms} "
                "ms that ended before its activation arrived (its coordinator was out of "
                "reach for longer than the client's request deadline); it was aborted",
                meta.txn_id)
        if expired:
            raise TransactionTimeoutError(
                f"transaction {meta.txn_id} timed out after {meta.timeout_ms} ms", meta.txn_id)
        if meta.abort_reason == ABORT_TIMEOUT:
            raise TransactionTimeoutError(
                f"transaction {meta.txn_id} was aborted at its timeout of {meta.timeout_ms} ms",
                meta.txn_id)

    def add_partitions(self, seq: int, tps: Iterable[TopicPartition], now_ms: int,
                       request_id: str | None = None) -> TransactionLogEntry | None:
        """Register produced partitions; None if all were known already."""
        meta = self.get(seq)
        self._check_alive(meta, now_ms)
        new = set(tps) - meta.partitions
        meta.check_open("add a produced partition")
        if not new:
            return None
        entry = self._entry(kind=LogEntryKind.TXN, request_id=request_id, txn_seq=seq,
                            partitions=tuple(sorted(new)))
        self._apply_new(entry, now_ms)
        return entry

    def add_subscriptions(self, seq: int, subs: Iterable[SubscriptionRef], now_ms: int,
                          request_id: str | None = None) -> TransactionLogEntry | None:
        """Register acked subscriptions; None if all were known already."""
        meta = self.get(seq)
        self._check_alive(meta, now_ms)
        new = set(subs) - meta.subscriptions
        meta.check_open("add an acked subscription")
        if not new:
            return None
        entry = self._entry(kind=LogEntryKind.TXN, request_id=request_id, txn_seq=seq,
                            subscriptions=tuple(sorted(new)))
        self._apply_new(entry, now_ms)
        return entry

    def end_txn(self, seq: int, commit: bool, now_ms: int, reason: str = ABORT_CLIENT,
                request_id: str | None = None) -> EndResult:
        """Decide a txn's outcome: log COMMITTING or ABORTING.

        Repeating the same decision is idempotent (no entry). Committing an expired txn
        aborts it (reason ``timeout``) and raises ``TransactionTimeoutError``: the ABORTING
        entry is not returned but queued in :meth:`unlogged`, and the owner must log it
        before the error reply and the ABORT markers (otherwise a new owner replays the
        txn as OPEN while its partitions hold ABORT markers). Committing an aborted one
        (or aborting a committed one) raises ``InvalidTxnStatusError``.
        """
        meta = self.get(seq)
        target = TxnStatus.COMMITTING if commit else TxnStatus.ABORTING
        if commit and meta.status is TxnStatus.OPEN and now_ms >= meta.deadline_ms:
            self.end_txn(seq, False, now_ms, ABORT_TIMEOUT)
            raise TransactionTimeoutError(
                f"transaction {meta.txn_id} timed out after {meta.timeout_ms} ms; it was aborted",
                meta.txn_id)
        if meta.status is TxnStatus.OPEN:
            entry = self._entry(kind=LogEntryKind.TXN, request_id=request_id, txn_seq=seq,
                                status=target, reason=None if commit else reason)
            self._apply_new(entry, now_ms)
            return EndResult(meta, entry)
        same_way = {TxnStatus.COMMITTING, TxnStatus.COMMITTED} if commit else {
            TxnStatus.ABORTING, TxnStatus.ABORTED}
        if meta.status in same_way:
            return EndResult(meta, None)
        if commit and meta.abort_reason == ABORT_TIMEOUT:
            raise TransactionTimeoutError(
                f"transaction {meta.txn_id} was aborted at its timeout of {meta.timeout_ms} ms",
                meta.txn_id)
        raise InvalidTxnStatusError(
            meta.txn_id, TxnStatus.OPEN, meta.status,
            f"cannot {'commit' if commit else 'abort'} transaction {meta.txn_id}: "
            f"it is {meta.status.value}")

    def end_group(self, key: str, seqs: Iterable[int], commit: bool, now_ms: int,
                  request_id: str | None = None) -> GroupEndResult:
        """End several txns of this TC as one, under an idempotency ``key``.

        1. If ``key`` committed before, nothing of this request commits: its txns that
           are not part of the first group are aborted (a replayed Spark batch), and the
           first outcome is reported with ``already=True``.
        2. Committing needs every txn OPEN and alive. If one is not, every OPEN txn of
           the group is aborted and the error names the culprit: all or none.
        3. Otherwise one GROUP_END record moves them all to COMMITTING (or ABORTING).

        In every case, txns opened for ``key`` (see :meth:`new_txn`) that are still OPEN
        and not in the group are aborted: orphans of earlier attempts.
        """
        seqs = tuple(sorted(set(seqs)))
        target = TxnStatus.COMMITTING if commit else TxnStatus.ABORTING
        orphans = sorted(s for s in self._open_by_group.get(key, ()) if s not in seqs)
        prior = self.groups.get(key)
        if prior is not None:
            extra = [s for s in seqs if s not in prior.seqs]
            entries = self._abort_open([*extra, *orphans], now_ms, ABORT_GROUP)
            return GroupEndResult(prior.status, prior.seqs, tuple(entries), already=True)
        error = None
        timed_out = False
        for seq in seqs:
            meta = self.txns.get(seq)
            if meta is None:
                error = (f"transaction {TxnID(self.tc_id, seq)} is not known to "
                         f"coordinator {self.tc_id}")
            elif meta.status is not TxnStatus.OPEN:
                why = (f" (aborted at its timeout of {meta.timeout_ms} ms)"
                       if meta.abort_reason == ABORT_TIMEOUT else "")
                error = f"transaction {meta.txn_id} is {meta.status.value}{why}"
                timed_out = meta.abort_reason == ABORT_TIMEOUT
            elif now_ms >= meta.deadline_ms:
                error = f"transaction {meta.txn_id} timed out after {meta.timeout_ms} ms"
                timed_out = True
            if error:
                break
        if error is not None or not commit:
            entries = self._abort_open(seqs, now_ms, ABORT_GROUP if commit else ABORT_CLIENT)
            entries += self._abort_open(orphans, now_ms, ABORT_GROUP)
            return GroupEndResult(TxnStatus.ABORTING, seqs, tuple(entries), already=False,
                                  error=error, timed_out=timed_out)
        entry = self._entry(kind=LogEntryKind.GROUP_END, request_id=request_id, status=target,
                            group_key=key, group_seqs=seqs)
        self._apply_new(entry, now_ms)
        return GroupEndResult(target, seqs,
                              (entry, *self._abort_open(orphans, now_ms, ABORT_GROUP)),
                              already=False)

    def _abort_open(self, seqs: Iterable[int], now_ms: int,
                    reason: str) -> list[TransactionLogEntry]:
        out = []
        for seq in seqs:
            meta = self.txns.get(seq)
            if meta is not None and meta.status is TxnStatus.OPEN:
                res = self.end_txn(seq, False, now_ms, reason)
                if res.entry is not None:
                    out.append(res.entry)
        return out

    def finalize(self, seq: int, now_ms: int) -> TransactionLogEntry | None:
        """After markers and marks are written: log COMMITTED/ABORTED."""
        meta = self.get(seq)
        if meta.status is TxnStatus.COMMITTING:
            final = TxnStatus.COMMITTED
        elif meta.status is TxnStatus.ABORTING:
            final = TxnStatus.ABORTED
        else:
            return None
        entry = self._entry(kind=LogEntryKind.TXN, txn_seq=seq, status=final)
        self._apply_new(entry, now_ms)
        self.ended[final.value] += 1
        return entry

    def expire(self, now_ms: int) -> list[TransactionLogEntry]:
        """Abort every OPEN txn past its deadline (reason ``timeout``)."""
        out = []
        for seq in self.timeouts.pop_expired(now_ms):
            meta = self.txns.get(seq)
            if meta is not None and meta.status is TxnStatus.OPEN:
                res = self.end_txn(seq, False, now_ms, ABORT_TIMEOUT)
                if res.entry is not None:
                    out.append(res.entry)
        return out

    def checkpoint_entry(self) -> TransactionLogEntry:
        """A CHECKPOINT carrying the sequence floor and recent group keys."""
        return self._entry(kind=LogEntryKind.CHECKPOINT, next_sequence=self.next_sequence,
                           group_keys=tuple(self.groups.values()))

    # ----------------------------------------------------------------- queries

    def live(self) -> list[TxnMeta]:
        """Txns not yet final (OPEN, reserved, COMMITTING, ABORTING)."""
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

    def truncation_point(self, now_ms: int, retention_ms: int) -> int:
        """The first log offset to keep; everything below may be deleted.

        Always the offset of a valid EPOCH record, so a replay from there starts under
        an epoch.

        Needed: every record of a txn not final, or final for less than
        ``retention_ms`` (so a client retrying its commit still finds the outcome), and
        the latest CHECKPOINT; the point is the latest EPOCH at or before the first of
        them (their validity hangs on it, and on the renewals after it). Returns -1 when
        nothing may be deleted yet.
        """
        if self.checkpoint_offset < 0 or not self._epochs:
            return -1
        needed = self.checkpoint_offset
        for meta in self.txns.values():
            recent = meta.end_time_ms is None or now_ms - meta.end_time_ms < retention_ms
            if (not meta.status.is_final or recent) and meta.first_offset is not None:
                needed = min(needed, meta.first_offset)
        i = bisect.bisect_right(self._epochs, needed) - 1
        return self._epochs[i] if i >= 0 else -1

    def forget_before(self, offset: int) -> int:
        """Drop final txns whose records all lie below ``offset`` (after truncation)."""
        gone = [s for s, m in self.txns.items()
                if m.status.is_final and m.last_offset is not None and m.last_offset < offset]
        for s in gone:
            del self.txns[s]
        self._epochs = [e for e in self._epochs if e >= offset]
        return len(gone)

    def stats(self, now_ms: int) -> StoreStats:
        """Counts by status, LWM, sequence counter, oldest open txn age."""
        by: dict[str, int] = {s.value: 0 for s in COORDINATOR_STATUSES}
        by[RESERVED] = 0
        oldest: int | None = None
        for m in self.txns.values():
            if m.reserved and m.status is TxnStatus.OPEN:
                by[RESERVED] += 1  # no writer holds it: not an open txn
                continue
            by[m.status.value] += 1
            if m.status is TxnStatus.OPEN:
                age = now_ms - m.open_time_ms
                oldest = age if oldest is None else max(oldest, age)
        return StoreStats(self.tc_id, self.epoch_offset, self.epoch_owner, self.next_sequence,
                          self.low_watermark, by, self.invalid_records, oldest)
