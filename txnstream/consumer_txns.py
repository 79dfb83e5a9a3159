"""The txns that acked through one consumer: what their commits wait for, and their ends.

A transactional ack is logged to the pending-ack log; before its txn commits, the
consumer confirms the log has it (:meth:`TxnAcks.confirm`, the txn's flusher: flushed
and read back, which also passes any newer ``OWNER`` that fences this member). When the
txn ends (the coordinator's reply to this client's END, or its mark in the log for a
txn ended elsewhere) its acks are applied: a commit acks the records for good, an abort
redelivers them in offset order. A newer owner's ``OWNER`` record, or a lost partition,
makes every txn holding acks there abort-only.

**The log's order is the state's.** The coordinator answers an END once its decision
is durable, before its marks reach the pending-ack log (Kafka's order), and the end is
applied here at that answer. An ack made after it may depend on it (a cumulative ack
above the ended txn's, an ack of records its abort gave back): logged before the mark,
a replay would fold it while the ended txn still holds those records, refuse it as a
conflict, and a new owner would deliver again records a committed txn acked. So a
transactional ack on a partition where an end was applied ahead of its mark waits for
that mark to be read back first (:meth:`TxnAcks.await_marks`): a few ms, once per
ended txn and partition.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from typing import TYPE_CHECKING

from txnstream import metrics
from txnstream.errors import TxnStreamError
from txnstream.pendingack.records import PendingAckEntry, PendingAckKind
from txnstream.types import TopicPartition, TxnID

if TYPE_CHECKING:
    from txnstream.consumer_group import GroupMember
    from txnstream.delivery import ReadyQueue
    from txnstream.pendingack.store import PendingAckStore
    from txnstream.transaction import Transaction

__all__ = ["TxnAcks"]

log = logging.getLogger("txnstream.consumer")

READ_BACK_TIMEOUT_S = 30.0
"""How long a commit waits to read its own ack records back; a healthy tail takes ms."""
MARK_WAIT_S = 30.0
"""How long an ack waits for the mark of a txn whose end was applied at its reply. The
coordinator writes it right after that reply, or again after a failover; one not read
by then was not written (a force-ended txn): the ack fails (its txn can only abort) and
acks after it no longer wait for that mark."""


class TxnAcks:
    """The txns that acked through one consumer, until they end.

    Bounded by the txns in flight: ended ones are dropped at their mark or at their
    local end. Every method but :meth:`confirm` runs under the consumer's lock.
    """

    def __init__(self, acks: PendingAckStore, group: GroupMember, queue: ReadyQueue,
                 lock: threading.RLock) -> None:
        self._acks = acks
        self._group = group
        self._queue = queue
        self._lock = lock
        self._txns: dict[TxnID, Transaction] = {}
        self._tps: dict[TxnID, set[TopicPartition]] = {}
        """Per txn, the partitions where it acked and whose mark was not read yet."""
        self._unmarked: dict[TopicPartition, dict[TxnID, float]] = {}
        """Per partition, the txns ended here at their reply whose mark was not read yet,
        with when: acks there wait for those marks. Bounded by the ends in flight (an
        entry goes at its mark, at :data:`MARK_WAIT_S`, or with the partition)."""
        self.closed = False
        """The consumer closed: a commit can only confirm acks already read back."""

    def tracked(self) -> tuple[int, int, int]:
        """``(txns, txns with partitions, ends awaiting their mark)``: a bound test reads it."""
        return len(self._txns), len(self._tps), sum(map(len, self._unmarked.values()))

    def joined(self, txn: Transaction, tp: TopicPartition) -> None:
        """``txn`` acked on ``tp``: its commit waits for the acks, its end applies here.

        (:meth:`confirm` is its flusher, :meth:`ended` its end listener.)
        """
        self._tps.setdefault(txn.id, set()).add(tp)
        if txn.id not in self._txns:
            self._txns[txn.id] = txn
            txn.add_flusher(partial(self.confirm, txn.id), key=self)
            txn.add_end_listener(partial(self.ended, txn.id), key=self)

    def fence(self, tp: TopicPartition, why: str) -> None:
        """Every txn holding acks on ``tp`` can only abort now."""
        for txn_id, tps in self._tps.items():
            txn = self._txns.get(txn_id)
            if tp in tps and txn is not None:
                txn.mark_abort_only(TxnStreamError(
                    f"{why} while {txn_id} held acks on it", txn_id))

    def confirm(self, txn_id: TxnID) -> None:
        """Before ``txn_id`` commits: its ack records are durable and were read back.

        Reading them back passes every record before them; a newer OWNER among those
        fences this member and makes the txn abort-only (its commit then aborts), the
        same read-back rule the coordinator applies to its own log.
        """
        self._acks.flush_txn(txn_id)
        if self.closed:
            if not self._acks.read_back(txn_id):
                raise TxnStreamError(f"acks of {txn_id} cannot be confirmed: the consumer "
                                     f"of {self._group.subscription!r} that made them is closed",
                                     txn_id)
            return  # confirmed before the close: the next owner knows them
        deadline = time.monotonic() + READ_BACK_TIMEOUT_S
        while not self._acks.read_back(txn_id):
            if time.monotonic() > deadline:
                raise TxnStreamError(f"acks of {txn_id} were not read back in "
                                     f"{READ_BACK_TIMEOUT_S:.0f}s", txn_id)
            with self._lock:
                self.apply_marks()
            time.sleep(0.002)
        with self._lock:
            self.apply_marks()
        self._acks.confirmed(txn_id)

    def ended(self, txn_id: TxnID, committed: bool) -> None:
        """The coordinator confirmed ``txn_id``'s end (durable; its marks may follow).

        Applied now, so the next receive sees it (the mark read later is a no-op); the
        next transactional ack on its partitions waits for the mark
        (:meth:`await_marks`).
        """
        with self._lock:
            now = time.monotonic()
            for tp in self._tps.get(txn_id, ()):  # those whose mark was not read yet
                self.end_acks(tp, txn_id, committed)
                if tp in self._group.readers:
                    self._unmarked.setdefault(tp, {})[txn_id] = now
            self._forget(txn_id)

    def marks_pending(self, tp: TopicPartition) -> bool:
        """Whether an end applied here on ``tp`` still waits for its mark (lock held)."""
        return tp in self._unmarked

    def await_marks(self, tp: TopicPartition, txn: TxnID) -> None:
        """Until the marks of the ends applied on ``tp`` ahead of them are read back.

        Called without the consumer's lock, before ``txn`` logs an ack on ``tp``.
        ``TxnStreamError`` after :data:`MARK_WAIT_S` (those ends then stop holding acks).
        """
        while True:
            with self._lock:
                if tp not in self._unmarked:
                    return  # the common case: no tail read here
                self.apply_marks()
                waiting = self._unmarked.get(tp)
                if not waiting:
                    return
                since = min(waiting.values())
                if time.monotonic() - since > MARK_WAIT_S:
                    late = sorted(map(str, waiting))
                    del self._unmarked[tp]
                    raise TxnStreamError(
                        f"cannot log the ack of {txn} on {tp}: the mark of {', '.join(late)} "
                        f"(ended {MARK_WAIT_S:.0f}s ago) is not in the pending-ack log, and a "
                        "replay must find it before this ack", txn)
            time.sleep(0.002)

    def dropped(self, tp: TopicPartition) -> None:
        """``tp`` is no longer delivered here (lock held): nothing waits on its marks."""
        self._unmarked.pop(tp, None)

    def end_acks(self, tp: TopicPartition, txn_id: TxnID, committed: bool) -> None:
        """Apply ``txn_id``'s outcome to the acks it holds on ``tp`` (idempotent).

        An abort's inputs come back in offset order, ahead of later records.
        """
        r = self._group.readers.get(tp)
        if r is not None and (back := r.end_txn(txn_id, committed)):
            metrics.REDELIVERED.labels(self._acks.subscription).inc(len(back))
            self._queue.redeliver(back)

    def _forget(self, txn_id: TxnID) -> None:
        self._txns.pop(txn_id, None)
        self._tps.pop(txn_id, None)
        self._acks.forget(txn_id)

    def apply_marks(self) -> None:
        """Coordinator marks end pending acks; a newer OWNER fences this member."""
        for e in self._acks.poll_marks():
            if e.kind is PendingAckKind.OWNER:
                if e.member_id != self._group.member_id:
                    self._fenced(e)
                continue
            if e.txn_id is None or e.kind not in (PendingAckKind.COMMIT_MARK,
                                                  PendingAckKind.ABORT_MARK):
                continue
            self.end_acks(e.tp, e.txn_id, e.kind is PendingAckKind.COMMIT_MARK)
            if (waiting := self._unmarked.get(e.tp)) is not None:
                waiting.pop(e.txn_id, None)
                if not waiting:
                    del self._unmarked[e.tp]
            tps = self._tps.get(e.txn_id)
            if tps is not None:
                tps.discard(e.tp)
                if not tps:
                    self._forget(e.txn_id)

    def _fenced(self, owner: PendingAckEntry) -> None:
        """Another member claimed ``owner.tp``: our txns that acked there can only abort.

        That is every txn with an individual or a cumulative pending ack there, or acks
        not yet read back; this member stops delivering the partition. If the group
        still assigns the partition here after ``RETAKE_AFTER_S``, it is replayed
        and claimed again (the other claim was a zombie's); a revoke cancels that.
        """
        tp = owner.tp
        r = self._group.readers.get(tp)
        mine = r is not None and r.handle is not None and owner.generation > r.handle.generation
        for txn_id, tps in self._tps.items():
            txn = self._txns.get(txn_id)
            if tp in tps and txn is not None and (mine or r is None):
                txn.mark_abort_only(TxnStreamError(
                    f"consumer lost {tp} to a newer owner {owner.member_id} "
                    f"(generation {owner.generation})", txn_id))
        if not mine:
            return
        log.warning("%s: fenced on %s by %s (generation %d)", self._group.member_id, tp,
                    owner.member_id, owner.generation)
        self._group.fenced(tp)
