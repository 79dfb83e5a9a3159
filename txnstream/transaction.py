"""``Transaction``: the client's handle on one coordinator transaction.

Produced partitions and acked subscriptions are registered with the coordinator before
the first write/ack to them (once per transaction, cached here). ``commit()`` first
waits for the transaction's outstanding sends; a failed send makes the transaction
abort-only, so its commit raises and aborts instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from txnstream.coordinator.log_entry import SubscriptionRef
from txnstream.coordinator.protocol import TcOp, TxnInfo
from txnstream.errors import InvalidTxnStatusError, TxnStreamError
from txnstream.types import TopicPartition, TxnID, TxnStatus

if TYPE_CHECKING:
    from txnstream.coordinator.client import TransactionCoordinatorClient

__all__ = ["Transaction"]


class Transaction:
    """One open transaction; usable from many threads, producers and consumers at once."""

    def __init__(self, tc: TransactionCoordinatorClient, txn_id: TxnID, timeout_s: float) -> None:
        self._tc = tc
        self.id = txn_id
        self.timeout_s = timeout_s
        self._status = TxnStatus.OPEN
        self._partitions: set[TopicPartition] = set()
        self._subscriptions: set[SubscriptionRef] = set()
        self._lock = threading.RLock()
        self._abort_only: BaseException | None = None
        self._flushers: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"Transaction({self.id}, {self._status.value})"

    @property
    def status(self) -> TxnStatus:
        """The client's view of the status (the coordinator's is ``info().status``)."""
        return self._status

    def _check_open(self, what: str) -> None:
        if self._status is not TxnStatus.OPEN:
            raise InvalidTxnStatusError(
                self.id, TxnStatus.OPEN, self._status,
                f"cannot {what} with transaction {self.id}: it is {self._status.value}")

    def register_partitions(self, tps: Iterable[TopicPartition]) -> None:
        """Tell the coordinator about produced partitions (before writing to them)."""
        tps = list(tps)
        if self._status is TxnStatus.OPEN and all(tp in self._partitions for tp in tps):
            return  # the hot path of every send: known partitions, no lock, no request
        with self._lock:
            self._check_open("produce")
            new = set(tps) - self._partitions
            if not new:
                return
            self._tc.request(TcOp.ADD_PARTITIONS, self.id.tc_id, txn_seq=self.id.least_bits,
                             partitions=tuple(sorted(new)))
            self._partitions |= new

    def register_subscriptions(self, subs: Iterable[SubscriptionRef]) -> None:
        """Tell the coordinator about acked subscriptions (before acking on them)."""
        with self._lock:
            self._check_open("acknowledge")
            new = set(subs) - self._subscriptions
            if not new:
                return
            self._tc.request(TcOp.ADD_SUBSCRIPTIONS, self.id.tc_id, txn_seq=self.id.least_bits,
                             subscriptions=tuple(sorted(new)))
            self._subscriptions |= new

    def add_flusher(self, flush: Callable[[], None]) -> None:
        """Called by producers: ``flush`` waits for this txn's outstanding sends."""
        with self._lock:
            if flush not in self._flushers:
                self._flushers.append(flush)

    def mark_abort_only(self, cause: BaseException) -> None:
        """A send or ack failed: the transaction can only abort now."""
        with self._lock:
            if self._abort_only is None:
                self._abort_only = cause

    def flush(self) -> None:
        """Wait for this txn's sends; ``TxnStreamError`` if any failed (it is abort-only).

        What :meth:`commit` checks before committing, for writers whose commit is done
        elsewhere (the Spark sink's tasks, whose driver commits them as a group).
        """
        with self._lock:
            flushers = list(self._flushers)
        for flush in flushers:
            flush()
        cause = self._abort_only
        if cause is not None:
            raise TxnStreamError(f"transaction {self.id} can only abort: {cause}",
                                 self.id) from cause

    def commit(self) -> None:
        """Flush this txn's sends, then commit. Raises (after aborting) if abort-only."""
        with self._lock:
            if self._status is TxnStatus.COMMITTED:
                return
            self._check_open("commit")
            try:
                for flush in self._flushers:
                    flush()
            except Exception as exc:
                self.mark_abort_only(exc)
            if self._abort_only is not None:
                cause = self._abort_only
                self.abort()
                raise TxnStreamError(
                    f"transaction {self.id} was aborted instead of committed: {cause}",
                    self.id) from cause
            self._status = TxnStatus.COMMITTING
            try:
                self._tc.request(TcOp.END, self.id.tc_id, txn_seq=self.id.least_bits, commit=True)
            except TxnStreamError:
                self._status = TxnStatus.ABORTED
                raise
            self._status = TxnStatus.COMMITTED

    def abort(self) -> None:
        """Abort; its writes are never delivered and its acks are undone."""
        with self._lock:
            if self._status is TxnStatus.ABORTED:
                return
            if self._status is TxnStatus.COMMITTED:
                raise InvalidTxnStatusError(self.id, TxnStatus.OPEN, self._status)
            self._status = TxnStatus.ABORTING
            # Aborting an already aborted txn (timeout, admin) succeeds; a committed one raises.
            self._tc.request(TcOp.END, self.id.tc_id, txn_seq=self.id.least_bits, commit=False)
            self._status = TxnStatus.ABORTED

    def info(self) -> TxnInfo:
        """The coordinator's view of this transaction."""
        return self._tc.request(TcOp.GET, self.id.tc_id, txn_seq=self.id.least_bits).txns[0]

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # Commit on a clean exit, abort on an exception; a txn the block already ended
        # (``txn.abort()`` inside it) is left as it is.
        if self._status is not TxnStatus.OPEN:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()
