"""``TxnHandle``: a transaction's state on the client, what every writer of it uses.

Partitions and subscriptions are registered once per txn; a failed send or registration
makes the txn abort-only. Registration is pipelined (:mod:`txnstream.pipeline`) except a
topic's first by the client; an ack waits for its subscription's (maybe sent ahead); the
END carries what is unconfirmed. How a txn ends is :class:`~txnstream.transaction.Transaction`'s.

Sends racing an end: a send checks OPEN and hands its record to librdkafka inside one
guarded section (:meth:`TxnHandle.sending`); an end leaves OPEN first, then waits for the
sends inside it, so each is flushed before the END or fails with ``InvalidTxnStatusError``.
A handle whose txn another handle ended (an attached one, or an opener whose txn another
process committed) learns which of its records are in by the readers' rule
(:mod:`txnstream.fate`): ``RecordsExcludedError`` names those that are not.

Locks: ``_lock`` serialises the ends (commit/abort/prepare) and registrations and is held
while flushers and end listeners run (they take a consumer's or producer's lock).
``_state_lock`` (a Condition on ``_state_mutex``) is a leaf: consumers and producers
call :meth:`TxnHandle.mark_abort_only`, :meth:`TxnHandle.add_flusher`,
:meth:`TxnHandle.add_end_listener` and :meth:`TxnHandle.sending` under their own locks,
and those take only it: no lock order cycle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from txnstream.coordinator.log_entry import SubscriptionRef
from txnstream.coordinator.protocol import TcOp, TxnInfo
from txnstream.errors import (
    InvalidTxnStatusError,
    NotAuthorizedError,
    RecordsExcludedError,
    TransactionNotFoundError,
    TransactionTimeoutError,
    TxnStreamError,
)
from txnstream.fate import DeliveredOffsets, excluded
from txnstream.pipeline import BackgroundRequests, RequestPipeline
from txnstream.types import TopicPartition, TxnID, TxnStatus

if TYPE_CHECKING:
    from txnstream.coordinator.tc_client import TransactionCoordinatorClient

__all__ = ["TxnHandle", "ABORT_FLUSH_TIMEOUT_S", "MAX_CARRIED_PARTITIONS", "SEND_DRAIN_TIMEOUT_S"]

log = logging.getLogger(__name__)

_ENDED_ERRORS = (TransactionTimeoutError, InvalidTxnStatusError, NotAuthorizedError,
                 TransactionNotFoundError)
"""A registration refused with one of these: the txn is not (any more) open to its writer."""
ABORT_FLUSH_TIMEOUT_S = 10.0
"""How long ``abort()`` waits for the txn's outstanding sends (Pulsar's abort waits for
them too); their records are dropped by readers either way, so it need not wait long."""
MAX_CARRIED_PARTITIONS = 1000
"""Unconfirmed registrations one END carries; a commit with more waits for them."""
SEND_DRAIN_TIMEOUT_S = 30.0
"""How long an end waits for sends that passed the OPEN check to reach librdkafka; a
send holds the guard only for one ``produce()`` call (plus librdkafka back-pressure)."""


class TxnHandle:
    """A transaction's client-side state: its writers' checks, registrations and flushes."""

    def __init__(self, tc: TransactionCoordinatorClient, txn_id: TxnID, timeout_s: float,
                 attached: bool = False, *, opened_at: float | None = None,
                 pipeline: RequestPipeline | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 key: bytes | None = None) -> None:
        """Made by ``Client.new_transaction`` / ``attach_transaction``.

        ``opened_at``: when the txn opened, on ``clock`` (default: now); ``pipeline``:
        the client's background registrations (None: every registration is awaited);
        ``key``: its txn key (:mod:`txnstream.membership`), None without one.
        """
        self._tc = tc
        self.id = txn_id
        self.key = key  # what makes its writers' records members of it (txn.tag)
        self.delivered = DeliveredOffsets()  # where its records landed (txnstream.fate)
        self.timeout_s = timeout_s
        self.attached = attached
        """True for a handle on a txn another process opened (``attach_transaction``)."""
        self._clock = clock
        self.deadline_s = (clock() if opened_at is None else opened_at) + timeout_s
        """When the coordinator will have aborted it if still open (on ``clock``)."""
        self._pipeline = pipeline
        self._requests = BackgroundRequests(txn_id, pipeline, self._request_failed)
        self._timed_out = False
        """commit() found the deadline passed: every later commit() says so again."""
        self._status = TxnStatus.OPEN
        self._carried: tuple[tuple[TopicPartition, ...], tuple[int, int] | None] = ((), None)
        """What the commit's END carries (:meth:`BackgroundRequests.carried`)."""
        self._partitions: set[TopicPartition] = set()
        self._subscriptions: set[SubscriptionRef] = set()
        self._lock = threading.RLock()
        self._state_mutex = threading.Lock()
        self._state_lock = threading.Condition(self._state_mutex)
        self._sending = 0
        self._abort_only: BaseException | None = None
        self._flushers: dict[object, Callable[[], None]] = {}
        self._end_listeners: dict[object, Callable[[bool], None]] = {}
        self._remote_end: TxnStreamError | None = None  # ended without our END: sends raise it
        self._remote_commit = False  # ... by another handle's commit: flush() checks the fate
        self.max_prepared_s: float | None = None
        """How long it may stay prepared (None: the coordinator's default)."""
        self._prepared = False  # the coordinator confirmed PREPARED
        self.prepared_at_s: float | None = None
        """When ``prepare()`` was confirmed (on its clock; None: not prepared)."""
        live = getattr(tc, "live_txns", None)
        if live is not None:
            live[txn_id] = self  # the coordinator's "ended" notice finds it there

    def __repr__(self) -> str:
        return f"Transaction({self.id}, {self.status.value})"

    @property
    def status(self) -> TxnStatus:
        """The client's view of the status (the coordinator's is ``info().status``).

        COMMITTING or ABORTING after an end raised ``TransactionOutcomeUnknownError``
        (``commit()`` or ``abort()`` again asks). TIMED_OUT once the deadline passed while
        OPEN (no request is made): it can only abort; ABORTED once confirmed.
        """
        status = self._status
        if status is TxnStatus.OPEN and self._expired():
            return TxnStatus.TIMED_OUT
        return status

    def _expired(self) -> bool:
        return self._clock() >= self.deadline_s

    def _check_open(self, what: str) -> None:
        """``InvalidTxnStatusError`` unless OPEN; a write also fails once another ended it."""
        if self._status is not TxnStatus.OPEN:
            raise InvalidTxnStatusError(
                self.id, TxnStatus.OPEN, self._status,
                f"cannot {what} with transaction {self.id}: it is {self._status.value}")
        if self._remote_end is not None and what != "commit":
            raise self._remote_end

    def _set_status(self, status: TxnStatus) -> None:
        with self._state_lock:
            self._status = status

    # ------------------------------------------------------------ writers

    def sending(self, n: int = 1) -> _SendGuard:
        """Guard ``n`` sends: ``InvalidTxnStatusError`` unless OPEN.

        An end waits until the guarded block (the ``produce()`` calls) is done. On every
        send's path: a plain object on the bare lock, waking an end only if it waits.
        """
        return _SendGuard(self, n)

    def _admit_sends(self, n: int) -> None:
        """Count ``n`` sends in, or raise why not (``_state_mutex`` held)."""
        self._check_open("produce")
        if self._expired():
            raise TransactionTimeoutError(
                f"transaction {self.id} timed out after {int(self.timeout_s * 1000)} ms "
                "(its coordinator aborts it): the record was not sent", self.id)
        self._sending += n

    def _leave_open(self, status: TxnStatus) -> None:
        """Move to COMMITTING/ABORTING; wait for sends that passed the OPEN check."""
        with self._state_lock:
            self._status = status
            if not self._state_lock.wait_for(lambda: not self._sending,
                                             SEND_DRAIN_TIMEOUT_S):
                raise TxnStreamError(f"{self._sending} sends of {self.id} did not finish "
                                     f"within {SEND_DRAIN_TIMEOUT_S:.0f}s", self.id)

    def register_partitions(self, tps: Iterable[TopicPartition]) -> None:
        """Tell the coordinator about produced partitions (before writing to them).

        Pipelined (in the background; :meth:`flush` waits for it, ``commit()`` carries
        it, a failure makes the txn abort-only) once this client registered each topic;
        else it waits for the coordinator and raises its error.
        """
        tps = list(tps)
        if self._status is TxnStatus.OPEN and all(tp in self._partitions for tp in tps):
            return  # the hot path of every send: known partitions, no lock, no request
        with self._lock:
            self._check_open("produce")
            new = set(tps) - self._partitions
            if not new:
                return
            parts = tuple(sorted(new))
            pipeline = self._pipeline
            if pipeline is not None and all(pipeline.knows(tp.topic) for tp in parts) \
                    and self._requests.send_registration(parts, self._add_partitions):
                self._partitions |= new
                return
            self._add_partitions(parts)
            self._partitions |= new
            if pipeline is not None:
                pipeline.confirm(tp.topic for tp in parts)

    def _add_partitions(self, parts: tuple[TopicPartition, ...]) -> None:
        self._tc.request(TcOp.ADD_PARTITIONS, self.id.tc_id, txn_seq=self.id.least_bits,
                         partitions=parts)

    def activate_in_background(self, open_time_ms: int, timeout_ms: int,
                               request: Callable[[], object]) -> bool:
        """Send its ACTIVATE on the pipeline (a commit before the reply carries it)."""
        return self._requests.send_activation(open_time_ms, timeout_ms, request)

    def in_background(self, request: Callable[[], object]) -> bool:
        """Send a coordinator ``request`` of this txn on the client's pipeline.

        False if there is none (the caller sends it). ``commit()`` and :meth:`flush`
        wait for it; its failure makes the txn abort-only (the commit raises it).
        """
        return self._requests.send(request)

    def _request_failed(self, exc: BaseException) -> None:
        """A background request failed or was not confirmed: the txn can only abort."""
        self.mark_abort_only(exc)
        if isinstance(exc, _ENDED_ERRORS):
            self.ended_remotely(exc)

    def register_subscriptions(self, subs: Iterable[SubscriptionRef], wait: bool = True
                               ) -> None:
        """Tell the coordinator about acked subscriptions (before acking on them).

        An ack waits for its registration: the coordinator marks only the subscriptions
        it knows, and nothing else ends a pending ack there (module docstring).
        ``wait=False`` sends it ahead in the background, e.g. as a batch's inputs arrive;
        the ack then waits for that request (and raises its error) instead of its own.
        """
        with self._lock:
            self._check_open("acknowledge")
            new = set(subs) - self._subscriptions
            if not new:
                return
            if not wait:
                self._requests.send_ahead(new, self._add_subscriptions)
                return
            if not self._requests.wait_ahead(new):
                self._add_subscriptions(tuple(sorted(new)))
            self._subscriptions |= new

    def _add_subscriptions(self, refs: tuple[SubscriptionRef, ...]) -> None:
        self._tc.request(TcOp.ADD_SUBSCRIPTIONS, self.id.tc_id, txn_seq=self.id.least_bits,
                         subscriptions=refs)

    def add_flusher(self, flush: Callable[[], None], key: object = None) -> None:
        """Called by producers and consumers: ``flush`` waits for this txn's sends/acks.

        One flusher per ``key`` (the producer or consumer); a new one replaces the old.
        """
        with self._state_lock:
            self._flushers[flush if key is None else key] = flush

    def add_end_listener(self, listener: Callable[[bool], None], key: object) -> None:
        """``listener(committed)`` runs once the coordinator confirmed the end."""
        with self._state_lock:
            self._end_listeners[key] = listener

    def ended_remotely(self, error: TxnStreamError | None) -> None:
        """Ended without this handle's END: later sends raise.

        ``error`` (an abort's): a commit raises it too. None: another handle committed it;
        :meth:`flush` and ``commit()`` say which of this handle's records are in.
        """
        with self._state_lock:
            if self._status is not TxnStatus.OPEN or self._remote_end is not None:
                return  # this handle is ending it itself (its own end's notice), or knows
            if error is None:
                self._remote_commit = True
                error = InvalidTxnStatusError(
                    self.id, TxnStatus.OPEN, TxnStatus.COMMITTED, f"transaction {self.id} "
                    "was committed by another handle: a record sent to it now would follow "
                    "its markers, and no reader would deliver it; it was not sent")
            else:
                self._requests.keep(error)
                self._abort_only = self._abort_only or error
            self._remote_end = error

    def mark_abort_only(self, cause: BaseException) -> None:
        """A send or ack failed: the transaction can only abort now."""
        with self._state_lock:
            if self._abort_only is None:
                self._abort_only = cause

    def _run_flushers(self, deadline: float | None = None) -> None:
        """Wait for every producer's and consumer's sends and acks of this txn.

        With ``deadline`` (an abort's): until then at most, and failures are ignored
        (an aborted txn's records are dropped by readers either way).
        """
        with self._state_lock:
            flushers = list(self._flushers.values())
        for flush in flushers:
            if deadline is None:
                flush()
                continue
            if time.monotonic() > deadline:
                return
            try:
                flush()
            except Exception:  # noqa: BLE001 - failed sends are dropped anyway
                pass

    def flush(self) -> None:
        """Wait for the registrations and sends; ``TxnStreamError`` (abort-only) if one failed.

        For writers whose commit is done elsewhere (Spark tasks, an attached handle). An
        attached handle (or one told another handle committed) then asks the coordinator:
        still OPEN, every record flushed precedes the markers; committed,
        ``RecordsExcludedError`` names any that landed after them (:mod:`txnstream.fate`);
        aborted, ``InvalidTxnStatusError``.
        """
        self._requests.wait()  # the registrations sent so far
        self._run_flushers()
        if self._remote_end is not None and not self._remote_commit:
            raise self._remote_end
        cause = self._abort_only
        if cause is not None:
            raise TxnStreamError(f"transaction {self.id} can only abort: {cause}",
                                 self.id) from cause
        if self.attached or self._remote_commit:
            status = TxnStatus.COMMITTED if self._remote_commit else self.info().status
            if status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED):
                self._check_fate(status)  # its opener committed: which records are in?
            elif status is not TxnStatus.OPEN:
                raise InvalidTxnStatusError(
                    self.id, TxnStatus.OPEN, status,
                    f"transaction {self.id} is {status.value}: records sent to it after it "
                    f"ended are dropped by every reader; they were not part of it")

    def _check_fate(self, outcome: TxnStatus) -> None:
        """``RecordsExcludedError`` if a record of this handle landed after the marker."""
        config = self._tc.config
        out = excluded(config, self.id, self.delivered.snapshot(self.id), config.request_timeout_s)
        if out:
            raise RecordsExcludedError(self.id, out, outcome.value)


    def _ended(self, status: TxnStatus) -> None:  # the outcome: listeners told once
        with self._state_lock:
            self._status = status
            listeners = list(self._end_listeners.values())
            self._end_listeners.clear()
            self._flushers.clear()
            self._requests.clear()
        for listener in listeners:
            listener(status is TxnStatus.COMMITTED)


    def info(self) -> TxnInfo:
        """The coordinator's view of this transaction."""
        return self._tc.request(TcOp.GET, self.id.tc_id, txn_seq=self.id.least_bits).txns[0]


class _SendGuard:
    """``with txn.sending(n):``, the guarded block of ``n`` sends (:meth:`sending`)."""

    __slots__ = ("_txn", "_n")

    def __init__(self, txn: TxnHandle, n: int) -> None:
        self._txn, self._n = txn, n

    def __enter__(self) -> None:
        with self._txn._state_mutex:
            self._txn._admit_sends(self._n)

    def __exit__(self, *exc: object) -> None:
        txn = self._txn
        with txn._state_mutex:
            txn._sending -= self._n
            if not txn._sending and txn._status is not TxnStatus.OPEN:
                txn._state_lock.notify_all()  # an end waits for them

