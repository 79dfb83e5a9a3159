"""``Transaction``: the client's handle on one coordinator transaction, and how it ends.

What its writers share (registrations, sends, flushes) is
:class:`~txnstream.txn_handle.TxnHandle`'s; here are the ends: ``commit()`` waits for the
sends first, then one END carries what is unconfirmed; ``abort()``; ``prepare()``
(two-phase: docs/api.md, *Prepared transactions*).

The deadline counts from the NEW reply (never earlier than the coordinator's). Past it,
while OPEN, :attr:`~TxnHandle.status` reads TIMED_OUT and ``commit()`` raises
``TransactionTimeoutError`` at once (an abort goes out in the background).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future

from txnstream.coordinator.protocol import TcOp
from txnstream.errors import (
    InvalidTxnStatusError,
    RequestTimeoutError,
    TransactionOutcomeUnknownError,
    TransactionTimeoutError,
    TxnStreamError,
)
from txnstream.pipeline import end_in_background
from txnstream.txn_handle import (
    ABORT_FLUSH_TIMEOUT_S,
    MAX_CARRIED_PARTITIONS,
    SEND_DRAIN_TIMEOUT_S,
    TxnHandle,
)
from txnstream.types import TxnStatus

__all__ = ["ABORT_FLUSH_TIMEOUT_S", "MAX_CARRIED_PARTITIONS", "SEND_DRAIN_TIMEOUT_S",
           "Transaction"]

log = logging.getLogger(__name__)


class Transaction(TxnHandle):
    """One open transaction; usable from many threads, producers and consumers at once."""

    # ------------------------------------------------------------ ends

    def commit(self) -> None:
        """Commit: 1. flush the sends, 2. END (commit) carrying what is unconfirmed.

        Returns once the decision is durable (docs/api.md). The END carries the pipelined
        registrations and activation (one turn, docs/coordinator.md). Raises (after
        aborting) if abort-only: a failed registration's own error, else
        ``TxnStreamError`` naming the failed send or ack; ``TransactionTimeoutError``
        past the deadline; ``TransactionOutcomeUnknownError`` if unanswered (the status
        stays COMMITTING; ``commit()`` again asks); ``RecordsExcludedError`` if another
        handle committed it first and some records landed after its marker.
        """
        with self._lock:
            if self._status is TxnStatus.COMMITTED:
                return
            if self._timed_out or (self._status is TxnStatus.OPEN and self._expired()):
                self._time_out()
            if self._status is TxnStatus.PREPARED:  # its records were flushed by prepare()
                self._set_status(TxnStatus.COMMITTING)
            elif self._status is not TxnStatus.COMMITTING:  # a retry skips straight to END
                self._close(TxnStatus.COMMITTING, "commit")
            parts, act = self._carried
            try:  # a retry carries them again: the coordinator answers as it decided
                reply = self._tc.request(TcOp.END, self.id.tc_id, txn_seq=self.id.least_bits,
                                         commit=True, partitions=parts,
                                         open_time_ms=act[0] if act else 0,
                                         timeout_ms=act[1] if act else 0)
            except RequestTimeoutError as exc:
                raise TransactionOutcomeUnknownError(
                    f"commit of {self.id} got no answer: it may have committed or not; "
                    f"call commit() again to learn which (never redo its work as if it "
                    f"aborted)", self.id) from exc
            except (TransactionTimeoutError, InvalidTxnStatusError) as exc:
                self._ended(TxnStatus.ABORTED)  # the coordinator says it is not committed
                raise exc
            self._ended(TxnStatus.COMMITTED)
            if reply.already:  # decided by another END: were all our records before it?
                self._check_fate(TxnStatus.COMMITTED)

    def _close(self, status: TxnStatus, what: str) -> None:
        """Leave OPEN for ``status``: no more sends; flush; abort (and raise) if abort-only."""
        self._check_open(what)
        self._leave_open(status)
        try:
            self._run_flushers()
        except Exception as exc:
            self.mark_abort_only(exc)
        self._carried = self._requests.carried(MAX_CARRIED_PARTITIONS)
        if self._abort_only is not None:
            cause = self._abort_only
            self._set_status(TxnStatus.ABORTING)
            self._send_abort()
            failed = self._requests.error
            if isinstance(failed, TxnStreamError) and not isinstance(
                    failed, RequestTimeoutError):
                raise failed  # the coordinator's verdict: timed out, aborted, ...
            done = {"commit": "committed", "prepare": "prepared"}[what]
            raise TxnStreamError(f"transaction {self.id} was aborted instead of {done}: "
                                 f"{cause}", self.id) from cause

    def prepare(self) -> None:
        """Prepare (the first phase of a two-phase commit): flush, then log PREPARED.

        Returns once PREPARED is durable. The txn can no longer change (sends, acks and
        registrations are refused), its timeout stops and its maximum prepared age runs
        instead (``max_prepared_s`` of ``new_transaction``); any process of its owner
        completes it (``client.complete_transaction``), or this handle (:meth:`commit`,
        :meth:`abort`). Fails as :meth:`commit` does (after aborting, if abort-only);
        ``TransactionOutcomeUnknownError`` if unanswered (``prepare()`` again asks).
        """
        with self._lock:
            if self._status is TxnStatus.PREPARED and self._prepared:
                return
            if self._timed_out or (self._status is TxnStatus.OPEN and self._expired()):
                self._time_out()
            if self._status is not TxnStatus.PREPARED:
                self._close(TxnStatus.PREPARED, "prepare")
            parts, act = self._carried
            try:
                self._tc.request(TcOp.PREPARE, self.id.tc_id, txn_seq=self.id.least_bits,
                                 partitions=parts, open_time_ms=act[0] if act else 0,
                                 timeout_ms=act[1] if act else 0,
                                 max_prepared_ms=int((self.max_prepared_s or 0) * 1000))
            except RequestTimeoutError as exc:
                raise TransactionOutcomeUnknownError(
                    f"prepare of {self.id} got no answer: call prepare() again to learn "
                    "whether it is prepared", self.id) from exc
            except (TransactionTimeoutError, InvalidTxnStatusError):
                self._ended(TxnStatus.ABORTED)  # the coordinator says it is not prepared
                raise
            self._prepared = True
            self.prepared_at_s = self._clock()

    def commit_async(self) -> Future[None]:
        """Commit in the background; ``future.result()`` gives :meth:`commit`'s outcome."""
        return end_in_background(self._pipeline, self.commit)

    def abort(self) -> None:
        """Abort; its writes are never delivered and its acks are undone.

        Waits (briefly) for its outstanding sends first, as Pulsar's abort does.
        ``TransactionOutcomeUnknownError`` if unanswered: ``abort()`` asks again.
        """
        with self._lock:
            if self._status is TxnStatus.ABORTED:
                return
            if self._status is TxnStatus.COMMITTED:
                raise InvalidTxnStatusError(self.id, TxnStatus.OPEN, self._status)
            if self._status is TxnStatus.OPEN:
                self._leave_open(TxnStatus.ABORTING)
                # Registrations first, so the ABORT markers reach every partition written.
                self._requests.wait(ABORT_FLUSH_TIMEOUT_S)
                self._run_flushers(deadline=time.monotonic() + ABORT_FLUSH_TIMEOUT_S)
            self._send_abort()

    def _time_out(self) -> None:
        """Past the deadline: TIMED_OUT, an abort asked in the background, and raise.

        Best effort: the coordinator aborts it at its own deadline anyway.
        """
        if self._status is TxnStatus.OPEN:
            self._timed_out = True
            self._leave_open(TxnStatus.TIMED_OUT)
            job = self._abort_in_background
            if self._pipeline is None or self._pipeline.submit(job) is None:
                threading.Thread(target=job, name=f"txnstream-abort-{self.id}",
                                 daemon=True).start()
        raise TransactionTimeoutError(
            f"transaction {self.id} timed out after {int(self.timeout_s * 1000)} ms (its "
            f"client-side deadline passed); it was aborted", self.id)

    def _abort_in_background(self) -> None:
        try:
            with self._lock:
                if self._status is not TxnStatus.TIMED_OUT:
                    return  # abort() got there first
                self._requests.wait(ABORT_FLUSH_TIMEOUT_S)
                self._send_abort()
        except Exception as exc:  # noqa: BLE001 - best effort: the coordinator aborts it
            log.debug("abort of timed-out %s not confirmed: %s", self.id, exc)

    def _send_abort(self) -> None:
        # An aborted txn (timeout, admin) aborts again; a committing or committed one: refused.
        try:
            self._tc.request(TcOp.END, self.id.tc_id, txn_seq=self.id.least_bits,
                             commit=False)
        except RequestTimeoutError as exc:
            raise TransactionOutcomeUnknownError(
                f"abort of {self.id} got no answer; call abort() again (the "
                f"coordinator also aborts it at its timeout)", self.id) from exc
        except InvalidTxnStatusError:
            self._ended(TxnStatus.COMMITTED)
            raise
        self._ended(TxnStatus.ABORTED)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # Commit on a clean exit, abort on an exception; a txn the block already ended
        # (``txn.abort()`` inside it) is left as it is.
        if self._status is TxnStatus.OPEN:
            (self.commit if exc_type is None else self.abort)()


