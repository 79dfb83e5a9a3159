"""``PendingAckHandle``: transactional acks of one subscription partition, purely.

Pulsar's ``PendingAckHandleImpl``, as a pure state machine.

State: the cursor (every offset below it is acked; it is the group's committed Kafka
offset), offsets individually acked above it, and the acks still pending in open
transactions (individual offsets, and at most one pending cumulative ack).

Conflict rules (Pulsar's):

* A transactional ack of an offset that another txn holds pending (individually, or
  under its pending cumulative ack) fails with ``TransactionConflictError``; the same
  txn acking again is a no-op.
* A transactional ack of an offset that is already acked fails too (Pulsar: "has been
  acked"); a plain ack of an already acked offset is ignored.
* Only one cumulative ack may be pending at a time; one that covers an offset pending
  individually in another txn conflicts, and vice versa.
* A plain ack of a pending offset conflicts.
* A txn that ended here may not ack again (``InvalidTxnStatusError``).

Commit applies the txn's acks (the cursor advances over contiguous acked offsets; gaps
stay individually acked); abort drops them and names the offsets to redeliver.

Fencing and replay (:meth:`apply`): the log of one subscription partition is folded in
order. An ``OWNER`` record (a new owner after a rebalance or crash) starts a generation;
an ack is valid only if it carries the generation of the latest ``OWNER`` before it, so
a fenced member's late acks are ignored. Marks from the coordinator are decided outcomes
and always apply. Folding the same log gives the same state: that is how a new owner
rebuilds the handle before it delivers anything.

Redelivery counts (:attr:`PendingAckHandle.redeliveries`): each time an offset comes
back (an aborted txn's acks gave it back: from the live outcome or the ``ABORT_MARK``
replayed, so the count survives a crash of the consumer and of the worker; a nack or
``redeliver_unacknowledged``: a ``REDELIVERED`` record naming the new count, so its
replay is idempotent), its count goes up by one; it goes when the offset is acked.
Pulsar's tracker is in the broker's memory and starts over when the topic moves.

Log epochs: the offsets here are of one log of the data partition. A topic deleted and
created again has a new log, its offsets from the start again, and the buffer role
serves it one log epoch up. An ``OWNER`` naming a newer ``log_epoch`` than the state's
starts the state over on that log: its cursor is taken as is (it may be lower), and the
old log's acked offsets and pending acks are dropped (those txns' marks then end
nothing here; their late acks carry an older generation and are ignored). Ended txns
are kept. A state whose epoch is not known (-1: records written before epochs were
noted, a partition read plain, a claim before any served view) counts as epoch 0, the
first log (as :func:`txnstream.delivery.newer_log` decides at a claim).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from txnstream.errors import InvalidTxnStatusError, TransactionConflictError
from txnstream.fencing import admits, supersedes
from txnstream.pendingack.records import PendingAckCheckpoint, PendingAckEntry, PendingAckKind
from txnstream.types import TopicPartition, TxnID, TxnStatus

__all__ = ["PendingAckHandle", "AckEffect", "PendingAckStats"]

MAX_REMEMBERED_ENDED = 10_000
"""Ended txns remembered to refuse late acks; a txn acks within its own lifetime."""
MAX_COUNTED = 100_000
"""Offsets whose redelivery count a handle keeps (unacked ones that came back). Past it
the lowest are forgotten (counted from 0 again): a subscription that holds this many
failed messages unacked on one partition has a dead-letter policy to set."""
CHECKPOINT_ENDED_MAX = 1_000
"""Ended txns a checkpoint carries (the newest, with their outcome), so a late ack of
one that lands after the checkpoint stays refused after a restore. A late ack is a
write of the txn's own member still in flight at its end: it lands within the producer's
delivery timeout, during which fewer than this many txns end on one partition unless
they end faster than ~3 a second (1000 / librdkafka's 300 s). Past the bound a late ack
is taken as pending; the owner that takes the partition over asks the coordinator about
every txn pending there (``Consumer._end_predecessors``) and applies its outcome, so it
is never pending forever."""


@dataclass(frozen=True, slots=True)
class AckEffect:
    """What ending a txn did: the new cursor, offsets acked, offsets to redeliver."""

    cursor: int
    acked: tuple[int, ...] = ()
    redeliver: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PendingAckStats:
    """For ``admin.pending_ack_stats``."""

    subscription: str
    tp: TopicPartition
    cursor: int
    acked_above_cursor: int
    pending_txns: int
    pending_offsets: int
    cumulative_pending: tuple[TxnID, int] | None
    generation: int
    redelivered_offsets: int = 0
    """Unacked offsets that came back at least once (their counts: the pending-ack log)."""
    max_redelivery_count: int = 0
    """The highest redelivery count among them (a poison record shows here)."""


@dataclass
class PendingAckHandle:
    """Acks of one (subscription, topic partition)."""

    subscription: str
    tp: TopicPartition
    cursor: int = 0
    acked: set[int] = field(default_factory=set)
    pending: dict[int, TxnID] = field(default_factory=dict)
    """Offset -> txn holding an individual ack on it."""
    cumulative: tuple[TxnID, int] | None = None
    ended: dict[TxnID, TxnStatus] = field(default_factory=dict)
    generation: int = -1
    owner: str = ""
    """Member id of the latest valid OWNER record."""
    log_epoch: int = -1
    """The log epoch of the data partition the offsets are of; -1 not known."""
    redeliveries: dict[int, int] = field(default_factory=dict)
    """Offset -> how many times it came back unacked (at most :data:`MAX_COUNTED`)."""

    # ------------------------------------------------------------ acks

    def _owner_of(self, offset: int) -> TxnID | None:
        txn = self.pending.get(offset)
        if txn is None and self.cumulative is not None and offset <= self.cumulative[1]:
            txn = self.cumulative[0]
        return txn

    def _is_acked(self, offset: int) -> bool:
        return offset < self.cursor or offset in self.acked

    def _check_live(self, txn: TxnID) -> None:
        status = self.ended.get(txn)
        if status is not None:
            raise InvalidTxnStatusError(
                txn, TxnStatus.OPEN, status,
                f"cannot ack with transaction {txn} on {self.subscription}@{self.tp}: "
                f"it already ended {status.value}")

    def _conflict(self, offset: int, txn: TxnID | None, holder: TxnID | None,
                  why: str) -> TransactionConflictError:
        who = f"transaction {txn}" if txn else "a plain ack"
        held = f" (pending in {holder})" if holder else ""
        return TransactionConflictError(
            f"{who} conflicts on {self.subscription}@{self.tp} offset {offset}: {why}{held}", txn)

    def ack_individual(self, offsets: Iterable[int], txn: TxnID | None) -> None:
        """Ack single offsets, in ``txn`` or plainly; all or nothing."""
        offs = sorted(set(offsets))
        if txn is not None:
            self._check_live(txn)
        for o in offs:
            holder = self._owner_of(o)
            if holder is not None and holder != txn:
                raise self._conflict(o, txn, holder, "already pending-acked")
            if txn is not None and holder is None and self._is_acked(o):
                raise self._conflict(o, txn, None, "has been acked")
        if txn is None:
            for o in offs:
                if o >= self.cursor:
                    self.acked.add(o)
            self._advance()
            return
        for o in offs:
            if self._owner_of(o) is None:
                self.pending[o] = txn

    def ack_cumulative(self, offset: int, txn: TxnID | None) -> None:
        """Ack every offset up to and including ``offset``."""
        if txn is None:
            for o, holder in self.pending.items():
                if o <= offset:
                    raise self._conflict(o, None, holder, "already pending-acked")
            if self.cumulative is not None:
                raise self._conflict(offset, None, self.cumulative[0], "cumulative ack pending")
            self.cursor = max(self.cursor, offset + 1)
            self._advance()
            return
        self._check_live(txn)
        if self.cumulative is not None and self.cumulative[0] != txn:
            raise self._conflict(offset, txn, self.cumulative[0], "another cumulative ack pending")
        for o, holder in self.pending.items():
            if o <= offset and holder != txn:
                raise self._conflict(o, txn, holder, "already pending-acked")
        if offset < self.cursor:
            raise self._conflict(offset, txn, None, "has been acked (below the cursor)")
        prev = self.cumulative[1] if self.cumulative else -1
        self.cumulative = (txn, max(prev, offset))

    # ------------------------------------------------------------ ending

    def commit(self, txn: TxnID) -> AckEffect:
        """Apply ``txn``'s acks; idempotent."""
        mine = sorted(o for o, t in self.pending.items() if t == txn)
        for o in mine:
            del self.pending[o]
            if o >= self.cursor:
                self.acked.add(o)
        if self.cumulative is not None and self.cumulative[0] == txn:
            self.cursor = max(self.cursor, self.cumulative[1] + 1)
            self.cumulative = None
        self._end(txn, TxnStatus.COMMITTED)
        self._advance()
        return AckEffect(self.cursor, tuple(mine))

    def abort(self, txn: TxnID) -> AckEffect:
        """Drop ``txn``'s acks; the offsets it held come back for redelivery."""
        mine = sorted(o for o, t in self.pending.items() if t == txn)
        for o in mine:
            del self.pending[o]
        back = list(mine)
        if self.cumulative is not None and self.cumulative[0] == txn:
            back += [o for o in range(self.cursor, self.cumulative[1] + 1)
                     if o not in self.acked and o not in self.pending]
            self.cumulative = None
        self._end(txn, TxnStatus.ABORTED)
        back = sorted(set(back))
        self.came_back(back)
        return AckEffect(self.cursor, (), tuple(back))

    def came_back(self, offsets: Iterable[int]) -> None:
        """``offsets`` are delivered again (unacked): each one's redelivery count goes up."""
        counts = self.redeliveries
        for o in offsets:
            counts[o] = counts.get(o, 0) + 1
        if len(counts) > MAX_COUNTED:
            for o in sorted(counts)[:len(counts) - MAX_COUNTED]:
                del counts[o]

    def counted(self, offsets: Iterable[int], count: int) -> None:
        """A ``REDELIVERED`` record: ``offsets`` came back ``count`` times in all.

        Idempotent (a replay from a checkpoint taken after the count went up, before
        its record was read back, counts it once); a record without a count (< 1) adds
        one.
        """
        counts = self.redeliveries
        for o in offsets:
            counts[o] = max(counts.get(o, 0), count) if count > 0 else counts.get(o, 0) + 1
        if len(counts) > MAX_COUNTED:
            for o in sorted(counts)[:len(counts) - MAX_COUNTED]:
                del counts[o]

    def redelivery_count(self, offset: int) -> int:
        """How many times ``offset`` came back unacked (0: never)."""
        return self.redeliveries.get(offset, 0)

    def _end(self, txn: TxnID, status: TxnStatus) -> None:
        self.ended.setdefault(txn, status)
        while len(self.ended) > MAX_REMEMBERED_ENDED:
            self.ended.pop(next(iter(self.ended)))

    def _advance(self) -> None:
        while self.cursor in self.acked:
            self.acked.discard(self.cursor)
            self.cursor += 1
        self.acked = {o for o in self.acked if o >= self.cursor}
        if self.redeliveries:  # an acked offset's count goes with it
            self.redeliveries = {o: n for o, n in self.redeliveries.items()
                                 if o >= self.cursor and o not in self.acked}

    # ------------------------------------------------------------ replay

    def apply(self, entry: PendingAckEntry) -> bool:
        """Fold one log record; False if it was ignored (stale generation, conflict)."""
        k = entry.kind
        if k is PendingAckKind.OWNER:
            if not supersedes(entry.generation, self.generation):
                return False
            self.generation = entry.generation
            self.owner = entry.member_id
            if entry.log_epoch > max(self.log_epoch, 0):
                self.new_log(entry.log_epoch, entry.cursor)
                return True
            self.log_epoch = max(self.log_epoch, entry.log_epoch)
            self.cursor = max(self.cursor, entry.cursor)
            self._advance()
            return True
        if k is PendingAckKind.COMMIT_MARK and entry.txn_id is not None:
            self.commit(entry.txn_id)
            return True
        if k is PendingAckKind.ABORT_MARK and entry.txn_id is not None:
            self.abort(entry.txn_id)
            return True
        if not admits(entry.generation, self.generation):
            return False  # written by a fenced owner
        if k is PendingAckKind.REDELIVERED:
            self.counted((o for o in entry.offsets if not self._is_acked(o)), entry.cursor)
            return True
        if entry.txn_id is None and k is not PendingAckKind.ACK_INDIVIDUAL:
            return False
        try:
            if k is PendingAckKind.ACK_INDIVIDUAL:  # txn None: a plain ack above the cursor
                self.ack_individual(entry.offsets, entry.txn_id)
            elif k is PendingAckKind.ACK_CUMULATIVE and entry.offsets:
                self.ack_cumulative(entry.offsets[-1], entry.txn_id)
        except (TransactionConflictError, InvalidTxnStatusError):
            return False
        return True

    def new_log(self, log_epoch: int, cursor: int) -> None:
        """Start over on a new log of the partition (the topic was recreated).

        Every offset held here was of the old log: the cursor becomes ``cursor`` (the new
        log's), acked and pending offsets go. Ended txns stay (TxnIDs are never reused).
        """
        self.log_epoch = log_epoch
        self.cursor = cursor
        self.acked = set()
        self.pending = {}
        self.cumulative = None
        self.redeliveries = {}

    # ------------------------------------------------------------ checkpoints

    def checkpoint(self) -> PendingAckCheckpoint:
        """The state to write to the log, so a new owner need not replay before it."""
        by_txn: dict[TxnID, list[int]] = {}
        for o, t in sorted(self.pending.items()):
            by_txn.setdefault(t, []).append(o)
        return PendingAckCheckpoint(
            self.subscription, self.tp.topic, self.tp.partition, self.generation, self.owner,
            self.cursor, tuple(sorted(self.acked)),
            tuple((t, tuple(offs)) for t, offs in by_txn.items()), self.cumulative,
            tuple((t, s is TxnStatus.COMMITTED)
                  for t, s in list(self.ended.items())[-CHECKPOINT_ENDED_MAX:]),
            self.log_epoch, tuple(sorted(self.redeliveries.items())))

    def restore(self, ckpt: PendingAckCheckpoint) -> None:
        """Take a checkpoint's state (ended txns seen so far are kept, its own added)."""
        self.generation = ckpt.generation
        self.owner = ckpt.member_id
        self.cursor = ckpt.cursor
        self.acked = {o for o in ckpt.acked if o >= ckpt.cursor}
        self.pending = {o: t for t, offs in ckpt.pending for o in offs}
        self.cumulative = ckpt.cumulative
        self.log_epoch = ckpt.log_epoch
        self.redeliveries = {o: n for o, n in ckpt.redeliveries
                             if o >= ckpt.cursor and o not in self.acked and n > 0}
        for t, committed in ckpt.ended:
            self._end(t, TxnStatus.COMMITTED if committed else TxnStatus.ABORTED)

    # ------------------------------------------------------------ queries

    def pending_txns(self) -> set[TxnID]:
        """The txns holding acks here (individual or cumulative)."""
        txns = set(self.pending.values())
        if self.cumulative is not None:
            txns.add(self.cumulative[0])
        return txns

    def pending_txn(self, offset: int) -> TxnID | None:
        """The txn holding ``offset`` pending, if any."""
        return self._owner_of(offset)

    def is_deliverable(self, offset: int) -> bool:
        """Neither acked nor pending: a consumer may deliver it."""
        return not self._is_acked(offset) and self._owner_of(offset) is None

    def lowest_held(self) -> int | None:
        """The lowest offset still pending (the group offset must stay at or below it)."""
        lows = list(self.pending)
        if self.cumulative is not None:
            lows.append(self.cursor)
        return min(lows) if lows else None

    def stats(self) -> PendingAckStats:
        """Counts for operators."""
        return PendingAckStats(self.subscription, self.tp, self.cursor, len(self.acked),
                               len(self.pending_txns()), len(self.pending), self.cumulative,
                               self.generation, len(self.redeliveries),
                               max(self.redeliveries.values(), default=0))
