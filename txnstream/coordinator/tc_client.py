"""``TransactionCoordinatorClient``: how every ``Client`` talks to the coordinators.

A request goes straight to the worker that owns its TC, over the direct line of
:mod:`txnstream.coordinator.transport` (one connection per worker, multiplexed by
request id). Where each TC is served comes from ``<prefix>_tc_endpoints``: its owner
writes its address there once its EPOCH has read back, and an
:class:`~txnstream.coordinator.endpoints.EndpointDirectory` tails that compacted topic, so
a failover reaches every client within a fetch. New txns take their TxnID from a
:class:`~txnstream.coordinator.txn_ids.TxnIdPool` of blocks reserved ahead.

A request that gets no reply inside one attempt is sent again with the *same* request
id (handling is idempotent) until the request deadline, so a client rides through a
coordinator failover: a worker that does not serve the TC (any more) answers
``NotCoordinatorError`` and the client waits for a newer owner in the directory; a
worker that cannot be reached is retried with a short backoff. Failed replies are raised
as the same error class the coordinator raised; a refused credential
(``CoordinatorAuthError``) is raised at once, since resending cannot heal it.
"""

from __future__ import annotations

import functools
import itertools
import logging
import random
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_delay,
    wait_fixed,
)

from txnstream.config import Config
from txnstream.coordinator.client_connection import ClientConnection
from txnstream.coordinator.endpoints import EndpointDirectory, TcEndpoint
from txnstream.coordinator.line_security import client_ssl_context, cluster_identity
from txnstream.coordinator.protocol import (
    COMMITTED_NOTICE,
    ENDED_NOTICE,
    TcOp,
    TcReply,
    TcRequest,
    error_from_reply,
)
from txnstream.coordinator.transport import Endpoint, IoLoop
from txnstream.coordinator.txn_ids import TxnIdPool
from txnstream.errors import (
    CoordinatorAuthError,
    CoordinatorNotFoundError,
    CorruptRecordError,
    InvalidRequestError,
    NotCoordinatorError,
    RequestTimeoutError,
    TxnStreamError,
    UnknownPartitionError,
    WorkerIdentityError,
    WrongClusterError,
)
from txnstream.kafka.topics import cluster_metadata
from txnstream.markers import MarkerSigner
from txnstream.ratelog import RateLimitedLog
from txnstream.types import TxnID

__all__ = ["TransactionCoordinatorClient"]

log = logging.getLogger(__name__)
_rate_limited = RateLimitedLog(log)

ATTEMPT_TIMEOUT_S = 3.0
"""Wait for one attempt's reply; a healthy round trip takes well under a millisecond
plus the log append, and resending sooner than a broker hiccup would only duplicate
work the coordinator dedups anyway."""
CONNECT_TIMEOUT_S = 2.0
"""Connect and handshake with a worker; a stopped (SIGSTOPped) one never answers."""
RESEND_BACKOFF_FIRST_S = 0.05
"""Wait before trying a worker that could not be reached (restarting, or dead and not
yet replaced in the directory)."""
RESEND_BACKOFF_MAX_S = 1.0
"""Cap of that doubling wait, well inside the default 30 s request deadline."""
UNKNOWN_PARTITION_WAIT_S = 3.0
"""How long a request the coordinator refused as naming a partition it does not see
(``UnknownPartitionError``: nothing applied) is sent again, as Kafka's producer retries
``UNKNOWN_TOPIC_OR_PARTITION``. A client names a partition its own metadata shows, so
the coordinator's view is behind (it looks a topic up again at most once a second): a
partition just added."""
SLOW_REQUEST_S = 1.0
"""A request answered this long after it was first sent is logged (WARNING) with each of
its attempts: which worker, what came of it, how long it took (the worker logs its own
side: :mod:`txnstream.coordinator.origins`)."""
MAX_REQUEST_BYTES = 1 << 20
"""A worker closes a connection that sends a larger request (its ``max_request_bytes``
default): refused here first, with an error that says so."""


class _NoReply(Exception):
    pass


class _Unreachable(Exception):
    pass


def _should_resend(exc: BaseException) -> bool:
    """The retry decision: no reply yet, or the worker could not be reached."""
    return isinstance(exc, (_NoReply, _Unreachable))


def _resend_wait(state: RetryCallState) -> float:
    """No wait after a silent attempt (it waited already); backoff after an unreachable one."""
    exc = state.outcome.exception() if state.outcome is not None else None
    if isinstance(exc, _NoReply):
        return 0.0
    return float(min(RESEND_BACKOFF_MAX_S,
                     RESEND_BACKOFF_FIRST_S * 2 ** (state.attempt_number - 1)))


_Try = tuple[tuple[TcEndpoint, float] | None, BaseException | None, float]
"""One attempt of a request: the endpoint found and the lookup's wait, its error (None:
the answer), its time."""


def _slow_attempts(tries: list[_Try]) -> str:
    """A slow request's attempts, for its log line: where, what came of it, how long."""
    out = []
    for found, error, secs in tries:
        where = (f"{found[0].endpoint} (epoch at {found[0].epoch_offset}, found in "
                 f"{found[1]:.3f} s)" if found else "no endpoint")
        what = ("answered" if error is None else
                f"{type(error).__name__.lstrip('_')} {error}".strip()[:160])
        out.append(f"{where}: {what} after {secs:.3f} s")
    return "; ".join(out)


class _Pending:
    __slots__ = ("event", "reply", "conn", "tc_id", "epoch")

    def __init__(self, tc_id: int) -> None:
        self.event = threading.Event()
        self.reply: TcReply | None = None
        self.conn: ClientConnection | None = None
        """The connection the last attempt went out on; its close wakes the waiter."""
        self.tc_id = tc_id
        self.epoch = -1
        """EPOCH offset of the owner the last attempt went to; a newer owner wakes it."""


class TransactionCoordinatorClient:
    """Sends requests to coordinators and waits for their replies."""

    def __init__(self, config: Config, signer: MarkerSigner | None = None) -> None:
        """``signer``: the workers' (their own clients): endpoint records must verify."""
        self.config = config
        self.client_id = f"c-{uuid.uuid4().hex[:12]}"
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._rr = itertools.count(random.randrange(1 << 16))
        probe = Consumer(config.consumer(f"{config.topics.prefix}-probe"))
        try:
            meta = cluster_metadata(probe, config.admin_timeout_s,
                                    f"finding the coordinators on {config.bootstrap_servers}")
        finally:
            probe.close()
        t = config.topics
        for name in (t.log, t.endpoints):
            if name not in meta.topics or meta.topics[name].error is not None:
                raise CoordinatorNotFoundError(
                    f"topic {name} does not exist on {config.bootstrap_servers}: run "
                    f"`txnstream init` (prefix {t.prefix!r}) and start a `txnstream worker`")
        self.num_coordinators = len(meta.topics[t.log].partitions)
        self.cluster = cluster_identity(meta.cluster_id, t.prefix)
        """The cluster whose workers alone this client talks to."""
        self._tls = client_ssl_context(config)
        self._io = IoLoop("txnstream-tc-client")
        self._conns: dict[Endpoint, ClientConnection] = {}
        self._conn_lock = threading.Lock()
        self._closed = False
        self.directory = EndpointDirectory(config, self.num_coordinators,
                                           self._on_owner_change, signer)
        self.live_txns: weakref.WeakValueDictionary[TxnID, Any] = \
            weakref.WeakValueDictionary()
        """This client's transaction handles, told when the coordinator ends one."""
        self.txn_ids = TxnIdPool(self)
        """TxnIDs reserved in blocks: ``new_transaction`` takes one without a round trip."""

    def pick_coordinator(self) -> int:
        """Round-robin over the coordinators, spreading new txns."""
        return next(self._rr) % self.num_coordinators

    # ------------------------------------------------------------ connections

    def _connection(self, endpoint: Endpoint) -> ClientConnection:
        """The open connection to ``endpoint``, made if needed (one per worker)."""
        with self._conn_lock:
            if self._closed:  # a request begun before close() ends here, not retried
                raise self._closed_error()
            conn = self._conns.get(endpoint)
            if conn is not None and not conn.closed.is_set():
                return conn
            try:
                conn = ClientConnection.open(self._io, endpoint, self.config.tc_secret,
                                             self._tls, self._on_reply, self._on_close,
                                             CONNECT_TIMEOUT_S, self.config.tc_principal,
                                             self.cluster)
            except OSError as exc:  # refused, reset, unreachable, no handshake
                raise _Unreachable(f"{endpoint}: {exc}") from exc
            self._conns[endpoint] = conn
            return conn

    def _on_reply(self, data: bytes) -> None:
        try:
            reply = TcReply.decode(data)
        except CorruptRecordError as exc:
            log.error("client %s: skipping a bad reply: %s", self.client_id, exc)
            return
        if reply.request_id.startswith((ENDED_NOTICE, COMMITTED_NOTICE)):
            self._txn_ended(reply)
            return
        with self._lock:
            pending = self._pending.get(reply.request_id)
        if pending is None or pending.reply is not None:
            return  # a reply to an attempt given up on, or a duplicate
        pending.reply = reply
        pending.event.set()

    def _txn_ended(self, notice: TcReply) -> None:
        """A coordinator ended one of this client's txns without its END.

        Its handle fails every later send at once (Kafka fences the producer the same way).
        """
        txn = self.live_txns.get(TxnID(notice.tc_id, notice.txn_seq))
        if txn is None:
            return
        if notice.request_id.startswith(COMMITTED_NOTICE):
            txn.ended_remotely(None)
        elif (err := error_from_reply(notice)) is not None:
            txn.ended_remotely(err)

    def _on_owner_change(self, ep: TcEndpoint) -> None:
        """A TC has a newer owner: attempts waiting on the old one resend now.

        A failover, or its owner took it again after a rebalance (its old incarnation's
        replies died with it): without this they would wait out their attempt timeout.
        """
        with self._lock:
            waiting = [p for p in self._pending.values()
                       if p.tc_id == ep.tc_id and p.reply is None and p.epoch < ep.epoch_offset]
        for p in waiting:
            p.event.set()

    def _on_close(self, conn: ClientConnection) -> None:
        with self._lock:
            waiting = [p for p in self._pending.values() if p.conn is conn]
        for p in waiting:  # their attempt is lost: wake them to resend
            p.event.set()

    # ------------------------------------------------------------ requests

    def request(self, op: TcOp, tc_id: int, *, timeout_s: float | None = None,
                **fields: Any) -> TcReply:
        """Send one request and return its successful reply, or raise its error.

        Raises the coordinator's error class for a failed reply, ``RequestTimeoutError``
        if no reply came in time (outcome unknown), ``CoordinatorAuthError`` at once if a
        worker refuses this client's credentials.
        """
        if not 0 <= tc_id < self.num_coordinators:
            raise CoordinatorNotFoundError(
                f"coordinator {tc_id} does not exist: there are {self.num_coordinators} "
                f"(0..{self.num_coordinators - 1})")
        if self._closed:
            raise self._closed_error()
        deadline_s = timeout_s if timeout_s is not None else self.config.request_timeout_s
        try:
            return self._request(op, tc_id, deadline_s, fields)
        except UnknownPartitionError:
            pass  # not applied: sent again, below
        retrying = Retrying(retry=retry_if_exception_type(UnknownPartitionError),
                            stop=stop_after_delay(min(UNKNOWN_PARTITION_WAIT_S, deadline_s)),
                            wait=wait_fixed(0.25), reraise=True)
        for attempt in retrying:
            with attempt:
                return self._request(op, tc_id, deadline_s, fields)
        raise AssertionError("unreachable: tenacity reraises")

    def _request(self, op: TcOp, tc_id: int, deadline_s: float, fields: dict[str, Any]
                 ) -> TcReply:
        """One request under a new id until answered (:meth:`request`)."""
        request_id = uuid.uuid4().hex
        req = TcRequest(request_id, self.client_id, -1, op, tc_id,
                        int((time.time() + deadline_s) * 1000), **fields)
        pending = _Pending(tc_id)
        with self._lock:
            self._pending[request_id] = pending
        try:
            reply = self._send_until_answered(req, pending, deadline_s)
        finally:
            with self._lock:
                self._pending.pop(request_id, None)
        err = error_from_reply(reply)
        if err is not None:
            raise err
        return reply

    def _send_until_answered(self, req: TcRequest, pending: _Pending,
                             deadline_s: float) -> TcReply:
        payload = req.encode()
        if len(payload) > MAX_REQUEST_BYTES:
            raise InvalidRequestError(
                f"{req.op.value} request of {len(payload)} bytes is over the line's "
                f"{MAX_REQUEST_BYTES}-byte bound (a group key or partition list too long)")
        stale: list[int] = []  # EPOCH offset of an owner that said it no longer serves
        refused: list[CoordinatorAuthError] = []  # refusals that led to another endpoint
        unreachable: set[tuple[int, Endpoint]] = set()  # records this request could not reach
        tries: list[_Try] = []  # formatted only if the request was slow (_slow_attempts)
        looked_up: list[tuple[TcEndpoint, float]] = []
        started = time.monotonic()

        def timed() -> TcReply:
            t0, n, error = time.monotonic(), len(looked_up), None
            try:
                return attempt()
            except BaseException as exc:
                error = exc
                raise
            finally:
                tries.append((looked_up[-1] if len(looked_up) > n else None, error,
                              time.monotonic() - t0))

        def attempt() -> TcReply:
            t0 = time.monotonic()
            ep = self.directory.lookup(req.tc_id, ATTEMPT_TIMEOUT_S,
                                       stale[-1] if stale else None, frozenset(unreachable))
            if ep is not None:
                looked_up.append((ep, time.monotonic() - t0))
            if ep is None or (ep.epoch_offset, ep.endpoint) in unreachable:
                if refused:  # every other record failed too: the refusal stands
                    raise refused[0]
                if ep is None:
                    raise _NoReply()
                unreachable.clear()  # every record failed once: try them all again
            try:
                conn = self._connection(ep.endpoint)
            except WrongClusterError as exc:
                # Another cluster's worker took the address of a stale record (or a forged
                # one names it): never that record again; wait for the TC's real owner.
                unreachable.add((ep.epoch_offset, ep.endpoint))
                self.directory.distrust(ep)
                _rate_limited.warning(f"other cluster {ep.tc_id}", "coordinator %d: not "
                                      "using %r: %s", ep.tc_id, ep, exc)
                raise _Unreachable(str(exc)) from exc
            except CoordinatorAuthError as exc:
                # An impostor behind a forged endpoint record cannot prove itself (never
                # used again), or refuses everyone (skipped for this request): go back to
                # the TC's newest other record. A refusal that every other record
                # confirms, or with no other record at another address, is about this
                # client's credentials: raised at once.
                if not self.directory.has_fallback(ep):
                    raise
                refused.append(exc)
                unreachable.add((ep.epoch_offset, ep.endpoint))
                if isinstance(exc, WorkerIdentityError):
                    self.directory.distrust(ep)
                    _rate_limited.warning(f"impostor {ep.tc_id}", "coordinator %d: not "
                                          "using %r: %s", ep.tc_id, ep, exc)
                raise _Unreachable(str(exc)) from exc
            except _Unreachable:
                # A forged record may name a dead address: the next attempt tries the
                # TC's newest other record (a real failover's new owner is newest), and
                # so do later requests for a while (a tarpit costs one attempt).
                unreachable.add((ep.epoch_offset, ep.endpoint))
                self.directory.set_aside(ep)
                raise
            pending.reply = None
            pending.event.clear()
            pending.conn = conn
            pending.epoch = ep.epoch_offset
            conn.send(payload)
            if not pending.event.wait(ATTEMPT_TIMEOUT_S):
                raise _NoReply()
            reply = pending.reply
            if reply is None:  # the connection closed, or a newer owner took the TC
                raise _Unreachable(f"{ep.endpoint} closed the connection"
                                   if conn.closed.is_set() else
                                   f"coordinator {req.tc_id} has a newer owner")
            if reply.error_kind == NotCoordinatorError.__name__:
                # A genuine worker that does not serve the TC: its record is stale (a
                # failover), or forged to send clients to it. The TC's other records
                # are tried first; with none, a newer one is waited for.
                stale.append(ep.epoch_offset)
                unreachable.add((ep.epoch_offset, ep.endpoint))
                self.directory.set_aside(ep)
                raise _Unreachable(reply.error_message)
            self.directory.answered(ep)
            return reply

        retrying = Retrying(retry=retry_if_exception(_should_resend),
                            stop=stop_after_delay(deadline_s), wait=_resend_wait, reraise=False)
        try:
            answered = retrying(timed)
            if (took := time.monotonic() - started) >= SLOW_REQUEST_S:
                _rate_limited.warning(f"slow {req.op.value}", "client %s: %s to coordinator "
                                      "%d answered %.3f s after it was first sent; %d "
                                      "attempts: %s", self.client_id, req.op.value,
                                      req.tc_id, took, len(tries), _slow_attempts(tries[-5:]))
            return answered
        except RetryError as exc:
            if refused:
                raise refused[0] from exc
            last = exc.last_attempt.exception()
            why = f" (last: {last})" if isinstance(last, _Unreachable) else ""
            raise RequestTimeoutError(
                f"no reply from coordinator {req.tc_id} to {req.op.value} within "
                f"{deadline_s:.0f}s{why}: is a `txnstream worker` running against "
                f"{self.config.bootstrap_servers} with prefix {self.config.topics.prefix!r}?"
            ) from exc

    def broadcast(self, op: TcOp, **fields: Any) -> list[TcReply]:
        """The same request to every coordinator (admin listing and stats)."""
        out: list[TcReply] = []
        errors: list[Exception] = []
        lock = threading.Lock()

        def one(tc: int) -> None:
            try:
                r = self.request(op, tc, **fields)
                with lock:
                    out.append(r)
            except Exception as exc:
                with lock:
                    errors.append(exc)

        _run_all([functools.partial(one, tc) for tc in range(self.num_coordinators)])
        if errors and not out:
            raise errors[0]
        return sorted(out, key=lambda r: r.tc_id)

    def close(self) -> None:
        """Release unused TxnIDs, close every connection and stop the directory."""
        pool = getattr(self, "txn_ids", None)
        if pool is not None:
            pool.release()
        with self._conn_lock:
            self._closed = True
            conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            c.close()
        self._io.close()
        self.directory.close()

    def _closed_error(self) -> TxnStreamError:
        return TxnStreamError(f"coordinator client {self.client_id} is closed: nothing is "
                              "sent after close()")


def _run_all(fns: list[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=f, daemon=True) for f in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
