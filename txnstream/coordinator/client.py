"""``TransactionCoordinatorClient``: how every ``Client`` talks to the coordinators.

A request goes straight to the worker that owns its TC, over the direct line of
:mod:`txnstream.coordinator.transport` (one connection per worker, multiplexed by
request id). Where each TC is served comes from ``<prefix>_tc_endpoints``: its owner
writes its address there once its EPOCH has read back, and an :class:`EndpointDirectory`
tails that compacted topic, so a failover reaches every client within a fetch.

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

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTP
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_delay,
)

from txnstream.codec import codec
from txnstream.config import Config
from txnstream.coordinator.protocol import (
    ENDED_NOTICE,
    TcOp,
    TcReply,
    TcRequest,
    error_from_reply,
)
from txnstream.coordinator.transport import (
    ClientConnection,
    Endpoint,
    IoLoop,
    client_ssl_context,
)
from txnstream.errors import (
    CoordinatorAuthError,
    CoordinatorNotFoundError,
    CorruptRecordError,
    InvalidRequestError,
    KafkaClientError,
    NotCoordinatorError,
    RequestTimeoutError,
    WorkerIdentityError,
    message_error,
)
from txnstream.kafka.fetch import drain
from txnstream.markers import MarkerSigner
from txnstream.ratelog import RateLimitedLog
from txnstream.types import TxnID

__all__ = ["TransactionCoordinatorClient", "EndpointDirectory", "TcEndpoint", "TxnIdPool"]

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
DIRECTORY_FETCH_WAIT_MS = 100
CANDIDATES_PER_TC = 8
"""Endpoint records kept per TC (newest first): the fallbacks past forged ones."""
MAX_DISTRUSTED = 4096
"""Endpoint records remembered as impostors (forgotten all at once past this)."""
"""The directory's fetch wait: an idle client sends ten fetches a second, and learns a
new owner within about this long."""


MAX_REQUEST_BYTES = 1 << 20
"""A worker closes a connection that sends a larger request (its ``max_request_bytes``
default): refused here first, with an error that says so."""

HAND_OUT_WINDOW_S = 10.0
"""How long after its ``RESERVE`` went out a block's TxnIDs are handed out; a block used
up within a quarter of it doubles the next one."""
LEASE_CLOCK_SLACK_S = 2.0
"""Allowance for the wall clocks of the client and of the TC's owners (old and new, after
a failover) to disagree: NTP keeps hosts within milliseconds of each other."""
RESERVE_FIRST = 4
RESERVE_MAX = 128
"""Block sizes: a block used up within a quarter of its lease doubles the next one."""


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


class TcEndpoint:
    """Mirrors ``schemas/tc_endpoint.avsc``: where TC ``tc_id`` is served, and since when."""

    __slots__ = ("tc_id", "owner_id", "endpoint", "epoch_offset", "tls")

    def __init__(self, tc_id: int, owner_id: str, endpoint: Endpoint, epoch_offset: int,
                 tls: bool = False) -> None:
        self.tc_id, self.owner_id, self.endpoint = tc_id, owner_id, endpoint
        self.epoch_offset, self.tls = epoch_offset, tls

    def __repr__(self) -> str:
        return (f"TcEndpoint(tc {self.tc_id} at {self.endpoint}, owner {self.owner_id}, "
                f"epoch {self.epoch_offset})")

    def encode(self) -> bytes:
        """Version byte + Avro."""
        return codec("tc_endpoint").encode({
            "tc_id": self.tc_id, "owner_id": self.owner_id, "host": self.endpoint.host,
            "port": self.endpoint.port, "epoch_offset": self.epoch_offset, "tls": self.tls})

    @classmethod
    def decode(cls, data: bytes | None) -> TcEndpoint:
        """Parse; ``CorruptRecordError`` on garbage."""
        r = codec("tc_endpoint").decode(data)
        return cls(r["tc_id"], r["owner_id"], Endpoint(r["host"], r["port"]),
                   r["epoch_offset"], r["tls"])


class EndpointDirectory:
    """Where each TC is served: a tail of ``<prefix>_tc_endpoints`` in a daemon thread.

    The newest owner of a TC is the one with the highest EPOCH offset (a zombie's late
    record never displaces it). The topic is internal, but a record there steers every
    client, so none is taken on its word (DESIGN.md section 10):

    * a directory given the workers' ``signer`` (the workers' own clients) keeps only
      records whose ``txn.mac`` tag verifies: only a worker wrote them;
    * any client drops an endpoint whose worker fails to prove itself in the handshake
      (:meth:`distrust`, on :class:`~txnstream.errors.WorkerIdentityError`) and goes
      back to the newest other record of that TC, so a forged record with a huge epoch
      costs one refused connection, not the TC. It keeps the
      :data:`CANDIDATES_PER_TC` records per TC it read last for that (tried highest
      epoch first). A worker re-publishes the record of each TC it serves every
      ``endpoint_republish_s``, so a flood of forged records, or compaction keeping
      only a forged one, hides it from new clients for at most that long.
    """

    def __init__(self, config: Config, num_coordinators: int,
                 on_change: Callable[[TcEndpoint], None] | None = None,
                 signer: MarkerSigner | None = None) -> None:
        self.config = config
        self._on_change = on_change
        """Called (on the tail thread) with each TC's new owner."""
        self._signer = signer
        self._candidates: dict[int, list[TcEndpoint]] = {}
        """Per TC, the records last read (highest EPOCH offset first), distrusted ones out."""
        self._arrivals: dict[int, list[TcEndpoint]] = {}
        """Per TC, the same records in the order they were read (the first is evicted)."""
        self._distrusted: set[tuple[int, int, Endpoint]] = set()
        self._changed = threading.Condition()
        self._closed = threading.Event()
        self._caught_up = threading.Event()
        topic = config.topics.endpoints
        self._consumer = Consumer(config.consumer(
            f"{config.topics.prefix}-endpoints-{uuid.uuid4().hex[:12]}",
            **{"fetch.wait.max.ms": DIRECTORY_FETCH_WAIT_MS}))
        parts = [KafkaTP(topic, p, OFFSET_BEGINNING) for p in range(num_coordinators)]
        self._ends = {p.partition: self._end_of(topic, p.partition) for p in parts}
        self._consumer.assign(parts)
        self._thread = threading.Thread(target=self._tail, name="txnstream-tc-endpoints",
                                        daemon=True)
        self._thread.start()

    def _end_of(self, topic: str, partition: int) -> int:
        """The partition's end now; 0 if the cluster does not say (a broker down).

        The tail then reads what it can, and lookups wait for records as they come.
        """
        try:
            return int(self._consumer.get_watermark_offsets(
                KafkaTP(topic, partition), timeout=self.config.admin_timeout_s)[1])
        except KafkaException as exc:
            _rate_limited.warning("endpoint ends", "tc endpoint directory: no end offset "
                                  "of %s[%d] (%s): not waiting to catch up", topic,
                                  partition, exc)
            return 0

    @property
    def _known(self) -> dict[int, TcEndpoint]:
        return {tc: eps[0] for tc, eps in self._candidates.items() if eps}

    def _verified(self, m: Any) -> bool:
        if self._signer is None:
            return True
        if self._signer.verify(m.topic(), m.partition(), m.value(), m.headers()):
            return True
        _rate_limited.warning(f"endpoint tag {m.partition()}", "ignoring the endpoint record "
                              "at %s[%d]@%d: its txn.mac does not verify (not written by a "
                              "worker of this cluster)", m.topic(), m.partition(), m.offset())
        return False

    def _take(self, ep: TcEndpoint) -> None:
        """Add a record to its TC's candidates (under the lock); notify a new owner."""
        with self._changed:
            eps = self._candidates.setdefault(ep.tc_id, [])
            have = eps[0] if eps else None
            if (ep.tc_id, ep.epoch_offset, ep.endpoint) in self._distrusted:
                return
            # Evict by arrival, not by epoch: a flood of forged records with huge epochs
            # cannot push out a worker's record that it re-publishes after them.
            arrived = [e for e in self._arrivals.setdefault(ep.tc_id, [])
                       if e.epoch_offset != ep.epoch_offset and e in eps] + [ep]
            del arrived[:-CANDIDATES_PER_TC]
            self._arrivals[ep.tc_id] = arrived
            eps[:] = sorted(arrived, key=lambda e: -e.epoch_offset)
            newer = have is None or ep.epoch_offset > have.epoch_offset
            if eps[0] is ep:
                self._changed.notify_all()
        if newer and have is not None and self._on_change is not None:
            self._on_change(ep)

    def has_fallback(self, ep: TcEndpoint) -> bool:
        """Whether TC ``ep.tc_id`` has another record, at another address, to try."""
        with self._changed:
            return any(e.endpoint != ep.endpoint
                       for e in self._candidates.get(ep.tc_id, ()) if e is not ep)

    def distrust(self, ep: TcEndpoint) -> None:
        """``ep``'s worker did not prove itself: never use that record again."""
        with self._changed:
            if len(self._distrusted) >= MAX_DISTRUSTED:
                self._distrusted.clear()
            self._distrusted.add((ep.tc_id, ep.epoch_offset, ep.endpoint))
            eps = self._candidates.get(ep.tc_id, [])
            eps[:] = [e for e in eps if e is not ep and not (
                e.epoch_offset == ep.epoch_offset and e.endpoint == ep.endpoint)]
            self._changed.notify_all()

    def _tail(self) -> None:
        pending = {p for p, end in self._ends.items() if end > 0}
        if not pending:
            self._caught_up.set()
        while not self._closed.is_set():
            try:
                msgs = drain(self._consumer, 500, 0.1)
            except RuntimeError:  # closed under us
                return
            for m in msgs:
                try:
                    if message_error(m, "tc endpoint directory", log):
                        continue
                except KafkaClientError as exc:
                    log.error("tc endpoint directory stopped: %s", exc)
                    return
                if pending and m.offset() + 1 >= self._ends.get(m.partition(), 0):
                    pending.discard(m.partition())
                if not self._verified(m):
                    continue
                try:
                    ep = TcEndpoint.decode(m.value())
                except CorruptRecordError as exc:
                    _rate_limited.error(f"endpoint corrupt {m.partition()}", "skipping a bad "
                                        "endpoint record at %s[%d]@%d: %s", m.topic(),
                                        m.partition(), m.offset(), exc)
                    continue
                if ep.tc_id != m.partition():
                    _rate_limited.error(f"endpoint tc {m.partition()}", "skipping the endpoint "
                                        "record at %s[%d]@%d: it names coordinator %d",
                                        m.topic(), m.partition(), m.offset(), ep.tc_id)
                    continue
                self._take(ep)
            if pending and not msgs:
                for p in list(pending):
                    [at] = self._consumer.position([KafkaTP(self.config.topics.endpoints, p)])
                    if at.offset >= self._ends[p]:
                        pending.discard(p)
            if not pending and not self._caught_up.is_set():
                self._caught_up.set()
                with self._changed:
                    self._changed.notify_all()

    def lookup(self, tc_id: int, timeout_s: float, newer_than: int | None = None,
               skip: frozenset[tuple[int, Endpoint]] = frozenset()) -> TcEndpoint | None:
        """TC ``tc_id``'s owner, waiting up to ``timeout_s`` for one.

        With ``newer_than`` (an EPOCH offset), waits for a newer owner; after the wait,
        the last known one, or None. ``skip``: ``(epoch, endpoint)`` records a request
        could not reach; the newest other one is returned instead, if there is one.
        """
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                eps = self._candidates.get(tc_id, ())
                ep = next((e for e in eps if (e.epoch_offset, e.endpoint) not in skip),
                          eps[0] if eps else None)
                if ep is not None and (newer_than is None or ep.epoch_offset > newer_than):
                    return ep
                left = deadline - time.monotonic()
                if left <= 0:
                    return ep
                self._changed.wait(left)

    def known(self) -> dict[int, TcEndpoint]:
        """Every TC's owner known now."""
        with self._changed:
            return dict(self._known)

    def close(self) -> None:
        """Stop tailing."""
        self._closed.set()
        self._thread.join(2)
        self._consumer.close()


class TxnIdPool:
    """TxnIDs reserved in blocks (``RESERVE``), handed out without a round trip each.

    Each block comes from the next coordinator in turn, so txns still spread over every
    TC. The lease contract, which makes a handed-out TxnID live for the timeout its user
    asked even when its activation meets a failover:

    1. The client hands a block's TxnIDs out only for :data:`HAND_OUT_WINDOW_S` after it
       sent the ``RESERVE`` (by its monotonic clock, so never later than the window
       after the TC opened the block).
    2. A handed-out TxnID's ``ACTIVATE`` is an ordinary request: retried through
       failovers until ``Config.request_timeout_s`` (R) after the hand-out, and dropped
       by any worker once that deadline has passed.
    3. The block's lease, after which the TC aborts a TxnID not activated yet (a logged
       abort every later owner agrees with), is the window plus R plus
       :data:`LEASE_CLOCK_SLACK_S`: :attr:`lease_s`.

    So no activation can still be on its way when the lease ends: either it was durable
    before (the txn's deadline is then its hand-out plus its own timeout), or its
    request deadline passed first and the client got ``RequestTimeoutError`` for it, as
    it would for a ``NEW`` sent at the same moment. A failover only delays activations
    like any other request. The cost: an unused TxnID holds its TC's low watermark for at
    most :attr:`lease_s` (42 s with the defaults). What is left of a block after its
    window is not used (the TC aborts those at their lease), and :meth:`release` aborts
    a closing client's leftovers at once.
    """

    def __init__(self, tc: TransactionCoordinatorClient,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._tc = tc
        self._clock = clock
        self._lock = threading.Lock()
        self._tc_id = -1
        self._seqs: list[int] = []
        self._usable_until = 0.0
        self._granted_at = 0.0
        self._size = RESERVE_FIRST
        self.request_timeout_s = tc.config.request_timeout_s
        """R: how long an ``ACTIVATE`` is retried (the client's request deadline)."""
        self.lease_s = HAND_OUT_WINDOW_S + self.request_timeout_s + LEASE_CLOCK_SLACK_S
        """The lease each ``RESERVE`` asks for (see the class docstring)."""

    def take(self) -> tuple[int, int]:
        """``(tc_id, seq)`` of a fresh OPEN txn to activate; reserves a block if needed.

        A block whose ``RESERVE`` reply came after its hand-out window closed (a slow
        failover) is left to its lease and another is reserved, until the request
        deadline; then ``RequestTimeoutError``.
        """
        with self._lock:
            give_up = self._clock() + self.request_timeout_s
            while not self._seqs or self._clock() >= self._usable_until:
                left = give_up - self._clock()
                if left <= 0:
                    raise RequestTimeoutError(
                        f"no block of TxnIDs reserved within {self.request_timeout_s:.0f}s "
                        "that could still be handed out: are the coordinators reachable?")
                self._refill(left)
            return self._tc_id, self._seqs.pop(0)

    def activation(self, tc_id: int, seq: int, timeout_ms: int) -> Callable[[], TcReply]:
        """The ``ACTIVATE`` of a TxnID handed out now, to send now or on a pipeline.

        Its open time and its request deadline (R) run from now, however long it waits
        for a pipeline thread: step 2 of the lease contract.
        """
        open_time_ms = int(time.time() * 1000)
        give_up = self._clock() + self.request_timeout_s

        def activate() -> TcReply:
            left = give_up - self._clock()
            if left <= 0:
                raise RequestTimeoutError(
                    f"the activation of transaction {TxnID(tc_id, seq)} did not start "
                    f"within {self.request_timeout_s:.0f}s of its hand-out")
            return self._tc.request(TcOp.ACTIVATE, tc_id, timeout_s=left, txn_seq=seq,
                                    timeout_ms=timeout_ms, open_time_ms=open_time_ms)

        return activate

    def _refill(self, timeout_s: float) -> None:
        sent = self._clock()
        if self._granted_at and not self._seqs \
                and sent - self._granted_at < HAND_OUT_WINDOW_S / 4:
            self._size = min(RESERVE_MAX, self._size * 2)  # used up fast: bigger blocks
        tc_id = self._tc.pick_coordinator()
        reply = self._tc.request(TcOp.RESERVE, tc_id, timeout_s=timeout_s, count=self._size,
                                 timeout_ms=int(self.lease_s * 1000))
        self._tc_id, self._seqs = tc_id, list(reply.group_seqs)
        self._granted_at = sent
        self._usable_until = sent + HAND_OUT_WINDOW_S

    def release(self) -> None:
        """Abort the TxnIDs never handed out (a closing client), best effort."""
        with self._lock:
            seqs, self._seqs = self._seqs, []
            if not seqs or self._clock() >= self._granted_at + self.lease_s:
                return
            try:
                self._tc.request(TcOp.END_GROUP, self._tc_id, timeout_s=5.0,
                                 group_key=f"release-{self._tc.client_id}-{seqs[0]}",
                                 group_seqs=tuple(seqs), commit=False)
            except Exception as exc:  # their lease ends them anyway
                log.debug("releasing reserved txns %s: %s", seqs, exc)


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
            meta = probe.list_topics(timeout=config.admin_timeout_s)
        finally:
            probe.close()
        t = config.topics
        for name in (t.log, t.endpoints):
            if name not in meta.topics or meta.topics[name].error is not None:
                raise CoordinatorNotFoundError(
                    f"topic {name} does not exist on {config.bootstrap_servers}: run "
                    f"`txnstream init` (prefix {t.prefix!r}) and start a `txnstream worker`")
        self.num_coordinators = len(meta.topics[t.log].partitions)
        self._tls = client_ssl_context(config)
        self._io = IoLoop("txnstream-tc-client")
        self._conns: dict[Endpoint, ClientConnection] = {}
        self._conn_lock = threading.Lock()
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
            conn = self._conns.get(endpoint)
            if conn is not None and not conn.closed.is_set():
                return conn
            try:
                conn = ClientConnection.open(self._io, endpoint, self.config.tc_secret,
                                             self._tls, self._on_reply, self._on_close,
                                             CONNECT_TIMEOUT_S, self.config.tc_principal)
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
        if reply.request_id.startswith(ENDED_NOTICE):
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
        err = error_from_reply(notice)
        if txn is not None and err is not None:
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
        deadline_s = timeout_s if timeout_s is not None else self.config.request_timeout_s
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

        def attempt() -> TcReply:
            ep = self.directory.lookup(req.tc_id, ATTEMPT_TIMEOUT_S,
                                       stale[-1] if stale else None, frozenset(unreachable))
            if ep is None or (ep.epoch_offset, ep.endpoint) in unreachable:
                if refused:  # every other record failed too: the refusal stands
                    raise refused[0]
                if ep is None:
                    raise _NoReply()
                unreachable.clear()  # every record failed once: try them all again
            try:
                conn = self._connection(ep.endpoint)
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
                # TC's newest other record (a real failover's new owner is newest).
                unreachable.add((ep.epoch_offset, ep.endpoint))
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
                stale.append(ep.epoch_offset)
                raise _Unreachable(reply.error_message)
            return reply

        retrying = Retrying(retry=retry_if_exception(_should_resend),
                            stop=stop_after_delay(deadline_s), wait=_resend_wait, reraise=False)
        try:
            return retrying(attempt)
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
            conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            c.close()
        self._io.close()
        self.directory.close()


def _run_all(fns: list[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=f, daemon=True) for f in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
