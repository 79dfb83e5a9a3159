"""``TransactionMetadataStore``: the pure state machine of one transaction coordinator.

Plain Python over plain data, no Kafka (Pulsar pairs ``InMemTransactionMetadataStore``
with ``MLTransactionMetadataStore``; here the store is pure and the Kafka log is an
adapter around it, see :mod:`txnstream.coordinator.txn_log`).

Two ways in, one state (the :class:`~txnstream.coordinator.txn_table.TxnMetaTable`):

* **Replay** (:meth:`~txnstream.coordinator.epochs.EpochFencedTable.replay`): every
  record of ``__txn_log[p]`` in offset order, valid or not by the EPOCH fencing rule of
  :mod:`txnstream.coordinator.epochs` (DESIGN.md section 5).
* **Requests** (``new_txn``, ``add_partitions``, ``end_txn``, ...): the owner plans a
  change, the store applies it at once (so later requests of the same batch see it) and
  returns the log entry to append. Every entry applied this way is also queued until the
  owner takes it with :meth:`unlogged`, *also when the request then fails*: a commit that
  finds its txn expired aborts it and raises, and that abort must reach the log before
  the error reply and before any marker. The owner appends what :meth:`unlogged` gives
  and replies to a client only after it has read those entries back as valid. If an
  append fails or it finds itself fenced instead, it throws the whole store away without
  replying: the log, not this object, is the truth, and the new owner rebuilds from it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from txnstream.coordinator.epochs import EpochFencedTable
from txnstream.coordinator.log_entry import (
    LogEntryKind,
    SubscriptionRef,
    TransactionLogEntry,
)
from txnstream.coordinator.meta import TxnMeta
from txnstream.coordinator.txn_table import (
    ABORT_CLIENT,
    ABORT_GROUP,
    ABORT_PREPARED,
    ABORT_TIMEOUT,
    RESERVED,
)
from txnstream.errors import InvalidTxnStatusError, TransactionTimeoutError
from txnstream.types import ANONYMOUS, COORDINATOR_STATUSES, TopicPartition, TxnID, TxnStatus

__all__ = ["TransactionMetadataStore", "EndResult", "GroupEndResult", "StoreStats"]

log = logging.getLogger(__name__)


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


class TransactionMetadataStore(EpochFencedTable):
    """All transactions of coordinator ``tc_id``, rebuilt from and kept in step with its log.

    Which records are valid, and what they fold into, is the :class:`EpochFencedTable`
    it extends; this class plans the entries of each request.
    """

    def __init__(self, tc_id: int, owner_id: str = "") -> None:
        super().__init__(tc_id, owner_id)
        self._unlogged: list[TransactionLogEntry] = []
        self.ended: dict[str, int] = {TxnStatus.COMMITTED.value: 0, TxnStatus.ABORTED.value: 0}
        """Txns this incarnation finalized, by outcome (rates; a new owner starts at 0)."""

    def shrink_groups(self) -> None:
        """Carry fewer group outcomes in checkpoints (see :meth:`GroupOutcomes.shrink`).

        For a log that refused a checkpoint as too large.
        """
        self.outcomes.shrink()

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

    def prepare(self, seq: int, max_prepared_ms: int, now_ms: int,
                request_id: str | None = None) -> TransactionLogEntry | None:
        """Log the txn PREPARED: it can no longer change, and may stay so ``max_prepared_ms``.

        Its timeout stops; its maximum prepared age runs from now (logged, so a new owner
        after failover keeps the same deadline). Repeating it is idempotent (no entry).
        An OPEN txn past its deadline is aborted (reason ``timeout``) and
        ``TransactionTimeoutError`` raised, as a commit would; one that is not OPEN
        raises ``InvalidTxnStatusError``.
        """
        meta = self.get(seq)
        if meta.status is TxnStatus.PREPARED:
            return None
        if meta.status is TxnStatus.OPEN and now_ms >= meta.deadline_ms:
            self.end_txn(seq, False, now_ms, ABORT_TIMEOUT)
            raise TransactionTimeoutError(
                f"transaction {meta.txn_id} timed out after {meta.timeout_ms} ms before it "
                "was prepared; it was aborted", meta.txn_id)
        self._check_alive(meta, now_ms)
        meta.check_open("prepare")
        entry = self._entry(kind=LogEntryKind.TXN, request_id=request_id, txn_seq=seq,
                            status=TxnStatus.PREPARED, open_time_ms=now_ms,
                            timeout_ms=max_prepared_ms)
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
        deadline = meta.prepared_deadline_ms
        if commit and meta.status is TxnStatus.PREPARED and deadline is not None \
                and now_ms >= deadline:
            self.end_txn(seq, False, now_ms, ABORT_PREPARED)
            raise TransactionTimeoutError(_prepared_too_long(meta), meta.txn_id)
        if meta.status in (TxnStatus.OPEN, TxnStatus.PREPARED):
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
        if commit and meta.abort_reason == ABORT_PREPARED:
            raise TransactionTimeoutError(_prepared_too_long(meta), meta.txn_id)
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
        2. Committing needs every txn OPEN and alive, and ``key`` not a stream version
           whose outcome may be forgotten (:meth:`GroupOutcomes.forgotten_through`). If
           not, every OPEN txn of the group is aborted and the error says why: all or none.
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
        if commit and (forgotten := self.outcomes.forgotten_through(key)) is not None:
            error = (f"the outcomes of its stream up to version {forgotten} are no longer "
                     "remembered (a coordinator keeps a bounded number per principal, "
                     "docs/coordinator.md): it may have committed before, so it is refused "
                     "rather than committed twice")
        timed_out = False
        for seq in () if error else seqs:
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
        """Abort every OPEN txn past its deadline, and every PREPARED one past its age.

        Reasons ``timeout`` and ``prepared-age`` (the latter logged: it blocked its
        partitions' readers all along).
        """
        out = []
        for seq in self.timeouts.pop_expired(now_ms):
            meta = self.txns.get(seq)
            if meta is None or meta.status not in (TxnStatus.OPEN, TxnStatus.PREPARED):
                continue
            prepared = meta.status is TxnStatus.PREPARED
            if prepared:
                log.warning("tc %d: %s; aborting it", self.tc_id, _prepared_too_long(meta))
            res = self.end_txn(seq, False, now_ms, ABORT_PREPARED if prepared else ABORT_TIMEOUT)
            if res.entry is not None:
                out.append(res.entry)
        return out

    def checkpoint_entry(self) -> TransactionLogEntry:
        """A CHECKPOINT carrying the sequence floor and recent group keys."""
        return self._entry(kind=LogEntryKind.CHECKPOINT, next_sequence=self.next_sequence,
                           group_keys=tuple(self.groups.values()))

    # ----------------------------------------------------------------- queries

    def stats(self, now_ms: int) -> StoreStats:
        """Counts by status, LWM, sequence counter, oldest open txn age (no scan)."""
        by: dict[str, int] = {s.value: 0 for s in COORDINATOR_STATUSES}
        by[RESERVED] = 0
        by.update(self.index.counts)
        opened = self.index.oldest_open_time()
        oldest = None if opened is None else now_ms - opened
        return StoreStats(self.tc_id, self.epoch_offset, self.epoch_owner, self.next_sequence,
                          self.low_watermark, by, self.invalid_records, oldest)


def _prepared_too_long(meta: TxnMeta) -> str:
    return (f"transaction {meta.txn_id} stayed PREPARED past its maximum prepared age of "
            f"{meta.max_prepared_ms} ms without being completed; it was aborted")
