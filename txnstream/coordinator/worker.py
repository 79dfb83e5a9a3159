"""``CoordinatorWorker``: hosts the transaction coordinators whose log partitions it owns.

A worker wires four parts, each in its own module, and runs them in one loop on one
thread:

* :mod:`~txnstream.coordinator.ownership`: which TCs it owns (the ``<prefix>-coordinators``
  consumer group over ``__txn_log``), each an incarnation replayed from its log, fenced by
  a newer EPOCH, restarted after a failed append;
* :mod:`~txnstream.coordinator.txn_log`: the log itself behind the ``TransactionLog``
  Protocol (append, tail, watermarks, truncation);
* :mod:`~txnstream.coordinator.handlers`: what each request op does to a TC's store;
* :mod:`~txnstream.coordinator.finalizer`: markers, pending-ack marks, END replies and
  final records of decided txns.

Each turn:

1. **Tail the log.** The group consumer reads every owned log partition from its start.
   While replaying, records rebuild the :class:`TransactionMetadataStore`. At the end of
   the replay the worker appends an ``EPOCH`` record; once it reads that record back it
   serves TC ``p``. Any later foreign ``EPOCH`` (a newer owner after a rebalance this
   worker missed, e.g. it was SIGSTOPped) fences it: it drops TC ``p`` at once and sends
   no reply it still held.
2. **Handle a batch of requests** that clients sent over the direct line
   (:mod:`txnstream.coordinator.transport`; a TC's owner publishes its address to
   ``<prefix>_tc_endpoints`` once its EPOCH reads back) plus due timeouts. A request for
   a TC this worker does not serve is answered ``NotCoordinatorError`` at once. The
   store applies each change immediately and returns log entries.
3. **Group-commit the log.** All entries of the batch (what the store queued in
   :meth:`TransactionMetadataStore.unlogged`, failed requests' entries included) are
   produced and flushed once, then read back through the tailing consumer. A TC's
   replies are sent only by the same incarnation (the same ``TcIncarnation`` object, not
   just the same id) that appended the batch, still serving, and only if every entry
   came back (a foreign EPOCH before one fences the TC at once); a TC that appended
   nothing this turn replies if it is still that incarnation. A crash here leaves entries in the log
   without replies: the client retries with the same request id and the new owner,
   having replayed them, answers from the log.
4. **Finalize** every COMMITTING/ABORTING txn: (a) write COMMIT/ABORT markers (with the
   TC's low watermark) to each produced partition and commit/abort marks to each acked
   subscription's pending-ack log, one flush for all; (b) reply to the END requests;
   (c) log COMMITTED/ABORTED. A crash after (a) leaves COMMITTING in the log: the next
   owner finds it on replay and writes the markers again (markers are idempotent for
   readers). A failed marker write is retried with backoff until it succeeds.
5. **Checkpoint and truncate** now and then: a renewal EPOCH (read back first), a
   CHECKPOINT record carrying the sequence counter and recent group keys, then
   ``delete_records`` drops the prefix no longer needed, cutting at the EPOCH that
   governs the first record still needed
   (:meth:`TransactionMetadataStore.truncation_point`). A crash anywhere here leaves a
   valid log: the renewal and the checkpoint change no txn, and ``delete_records`` only
   removes what no replay needs.

**A failed append** (delivery error, flush timeout, ``produce()`` refusing the record)
means the in-memory store may be ahead of the log. That incarnation of the TC is dropped
at once with every reply it held, whichever step found out (the batch append, the
read-back, the delivery report of an unawaited COMMITTED/ABORTED record), and the TC is
replayed from its log after a backoff that doubles with each failure in a row (see
:mod:`~txnstream.coordinator.ownership`), so a log that keeps refusing never becomes a
tight restart loop. The CHECKPOINT is appended on its own: it changes no state, so its
failure costs only that checkpoint (and, if the log found it too large, the oldest group
outcomes, see :meth:`TransactionMetadataStore.shrink_groups`), never a restart.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from txnstream import metrics
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.buffer.worker import BufferWorker
from txnstream.config import Config, load_tc_users
from txnstream.coordinator.endpoints import TcEndpoint
from txnstream.coordinator.finalizer import TxnFinalizer
from txnstream.coordinator.handlers import Caller, TcRequestHandler
from txnstream.coordinator.ownership import TcIncarnation, TcOwnership, TcPhase
from txnstream.coordinator.protocol import TcOp, TcReply, TcRequest
from txnstream.coordinator.transport import (
    Endpoint,
    LineLimits,
    Listener,
    ServerConnection,
    server_ssl_context,
)
from txnstream.coordinator.txn_log import (
    PRODUCER_SETTINGS,
    KafkaClients,
    KafkaTransactionLog,
    TransactionLog,
)
from txnstream.errors import (
    ConfigError,
    CorruptRecordError,
    InvalidRequestError,
    KafkaClientError,
    NotCoordinatorError,
    TooManyRequestsError,
)
from txnstream.kafka.topics import LOOKUP_TIMEOUT_S, PartitionCatalog, metadata_lookup
from txnstream.markers import TXN_MAC_HEADER, MarkerSigner
from txnstream.types import TopicPartition

__all__ = ["CoordinatorWorker", "WorkerSettings"]

log = logging.getLogger(__name__)

# The names these had when they lived here (tests still import them from here).
_Phase = TcPhase
_Tc = TcIncarnation

_WATCHED = frozenset({TcOp.NEW, TcOp.ACTIVATE, TcOp.ADD_PARTITIONS, TcOp.ADD_SUBSCRIPTIONS})
"""Requests whose connection is told when their txn ends without its own END."""
METRICS_EXPORT_S = 1.0
"""How often the per-TC gauges are recomputed (each is a pass over live txns)."""
ORIGINS_SWEEP_AT = 10_000
"""Requests awaiting a reply past this many: those past their deadline are forgotten
(their client gave up on them; a resend brings its connection again)."""


def line_users(config: Config) -> dict[str, str]:
    """Every principal a worker lets in by secret: its own, and the users file's."""
    users = load_tc_users(config.tc_users_file) if config.tc_users_file else {}
    if config.tc_secret:
        users.setdefault(config.tc_principal, config.tc_secret)
    return users


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Tuning of a coordinator worker; each value says why."""

    session_timeout_ms: int = 10_000
    """How long a silent worker keeps its TCs: failover time is about this long."""
    heartbeat_interval_ms: int = 1_000
    batch_max: int = 2_000
    """Requests handled per turn: one log flush and one marker flush for all of them."""
    idle_poll_s: float = 0.05
    readback_timeout_s: float = 15.0
    """Longer than any healthy append; past it the worker re-replays that TC."""
    checkpoint_interval_s: float = 30.0
    end_retention_ms: int = 300_000
    """Ended txns stay in the log this long, so a client retrying its commit sees the outcome."""
    finalize_backoff_max_s: float = 5.0
    buffer_role: bool = True
    """Also host the buffer role (:class:`~txnstream.buffer.worker.BufferWorker`): readers
    of transactional topics need one somewhere."""
    buffer_topics: tuple[str, ...] | None = None
    """Serve only these data topics (names, or regexes starting with ``^``); None: all."""
    buffer_snapshot_interval_s: float = 10.0
    endpoint_republish_s: float = 30.0
    """Each served TC's endpoint record is written again this often: ``_tc_endpoints``
    is compacted by TC and clients keep the records they read last, so a forged record
    written after the genuine one hides it for at most this long (DESIGN.md section 10)."""
    listen: str = "127.0.0.1:0"
    """Address of the direct line to clients (port 0: any free port); every TC it serves
    is reached there."""
    advertise: str | None = None
    """Address clients are told (``host:port``); default: the listen host and the port
    bound (this host's name when listening on every interface). Give it behind a NAT."""
    allow_unauthenticated: bool = False
    """Serve a line beyond loopback with no authentication (no secret, no mutual TLS):
    refused by default, since anyone who reaches the port could then act as anyone."""
    max_connections: int = 1_024
    """Open client connections; one more is refused (closed after a ``NO`` naming this)."""
    max_inflight_per_connection: int = 1_000
    """Requests of one connection awaiting their reply; past it the connection is refused
    further requests with ``TooManyRequestsError`` until replies drain."""
    max_request_bytes: int = 1 << 20
    """A request frame larger than this closes its connection (the largest honest request,
    a RESERVE or an ADD of many partitions, is a few KB)."""
    idle_timeout_s: float = 600.0
    """A connection with no frame in this long is closed (clients reconnect on demand)."""
    max_open_txns_per_principal: int = 10_000
    """Open txns one principal may hold on one TC (reserved ones included); a NEW or
    RESERVE past it is refused with ``TooManyRequestsError``."""


class CoordinatorWorker:
    """A process-level host of transaction coordinators (TC roles of ``txnstream worker``)."""

    def __init__(self, config: Config, worker_id: str | None = None,
                 settings: WorkerSettings | None = None) -> None:
        self.config = config
        self.settings = settings or WorkerSettings()
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        t = config.topics
        s = self.settings
        self._kafka = KafkaClients(
            Consumer(config.consumer(
                f"{t.prefix}-coordinators",
                **{"session.timeout.ms": s.session_timeout_ms,
                   "heartbeat.interval.ms": s.heartbeat_interval_ms,
                   "max.poll.interval.ms": max(60_000, s.session_timeout_ms * 3),
                   "fetch.wait.max.ms": 20, "client.id": f"tc-log-{self.worker_id}"})),
            Producer(config.producer(**PRODUCER_SETTINGS, **{"client.id": f"tc-{self.worker_id}"})),
            AdminClient(config.admin()))
        self._txn_log: TransactionLog = KafkaTransactionLog(
            self._kafka, t.log, flush_timeout_s=s.readback_timeout_s,
            admin_timeout_s=config.admin_timeout_s,
            where=f"worker {self.worker_id} log consumer")
        self._unpublished: set[int] = set()
        """TC ids whose endpoint record is not written yet (retried every turn)."""
        self._republish_at_ms = int(time.time() * 1000) + int(s.endpoint_republish_s * 1000)
        self._ownership = TcOwnership(
            self._txn_log, t.log, self.worker_id, readback_timeout_s=s.readback_timeout_s,
            checkpoint_interval_s=s.checkpoint_interval_s, on_serving=self._serving_started,
            on_dropped=self._unpublished.discard)
        partitions = PartitionCatalog(metadata_lookup(
            self._kafka.producer, min(LOOKUP_TIMEOUT_S, config.admin_timeout_s)))
        self._handler = TcRequestHandler(config, self.worker_id, self._ownership.restarts,
                                         s.max_open_txns_per_principal, partitions)
        self._finalizer = TxnFinalizer(
            self._ownership, self._kafka, t.pending_ack, self.worker_id, self._reply,
            flush_timeout_s=s.readback_timeout_s, backoff_max_s=s.finalize_backoff_max_s,
            partitions=partitions)
        self._inbox: queue.SimpleQueue[tuple[bytes, ServerConnection]] = queue.SimpleQueue()
        self._origins: dict[str, tuple[ServerConnection, int, float, str]] = {}
        """request id -> (connection, deadline, perf_counter at arrival, op)."""
        self._metrics_at = 0.0
        self._exported_tcs: set[int] = set()
        self._sweep_origins_at = ORIGINS_SWEEP_AT
        """Request id -> the connection to answer on, and the request's deadline."""
        bind = Endpoint.parse(s.listen)
        users = line_users(config)
        if not users and not config.tc_tls_client_auth and not _loopback(bind.host) \
                and not s.allow_unauthenticated:
            raise ConfigError(
                f"worker {self.worker_id} would serve the coordinator line on {s.listen} "
                "with no authentication: anyone who reaches it could end every txn. Set a "
                "secret (TXNSTREAM_TC_SECRET / TXNSTREAM_TC_SECRET_FILE, or "
                "--tc-users-file), mutual TLS (--tls-client-auth), listen on loopback, or "
                "pass --allow-unauthenticated")
        self._listener = Listener(bind.host, bind.port,
                                  lambda data, conn: self._inbox.put((data, conn)),
                                  users=users, tls=server_ssl_context(config),
                                  name=f"tc-listener-{self.worker_id}",
                                  limits=LineLimits(s.max_connections, s.max_request_bytes,
                                                    s.idle_timeout_s))
        if s.advertise:
            self.address = Endpoint.parse(s.advertise)
        elif bind.host in ("0.0.0.0", "::", ""):  # every interface: tell the host's name
            self.address = Endpoint(socket.gethostname(), self._listener.address.port)
        else:
            self.address = self._listener.address
        """Where clients reach this worker (published per TC it serves)."""
        self._registered: set[TopicPartition] = set()
        """Data partitions whose registration (they are served) this worker wrote."""
        self._registry = TransactionBufferSnapshotStore(config)
        self.buffers: BufferWorker | None = None
        if s.buffer_role:
            self.buffers = BufferWorker(
                config, list(s.buffer_topics) if s.buffer_topics is not None else None,
                snapshot_interval_s=s.buffer_snapshot_interval_s, member=self.worker_id,
                session_timeout_ms=s.session_timeout_ms)

    @property
    def tcs(self) -> dict[int, TcIncarnation]:
        """TC id -> the incarnation this worker holds (replaying or serving)."""
        return self._ownership.tcs

    @property
    def _log(self) -> Consumer:
        """The group consumer over the log (a test may put a fake in its place)."""
        return self._kafka.consumer

    @_log.setter
    def _log(self, consumer: Consumer) -> None:
        self._kafka.consumer = consumer

    @property
    def _producer(self) -> Producer:
        """The producer of log entries, markers and endpoints (a test may fake it)."""
        return self._kafka.producer

    @_producer.setter
    def _producer(self, producer: Producer) -> None:
        self._kafka.producer = producer

    # ------------------------------------------------------------ lifecycle

    def start(self) -> CoordinatorWorker:
        """Run the loop in a daemon thread (for tests and embedding)."""
        self._thread = threading.Thread(target=self.run, name=f"tc-worker-{self.worker_id}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        """Leave the group cleanly and stop the loop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def serving(self) -> list[int]:
        """TC ids this worker serves right now."""
        return self._ownership.serving_ids()

    def run(self) -> None:
        """The loop; returns when :meth:`stop` is called."""
        try:
            if self.config.tc_secret:
                self._finalizer.signer = self._marker_signer()
                if self._finalizer.signer is None:
                    return  # stopped before the broker answered
            else:
                log.warning("worker %s: no workers' secret (tc_secret): markers are not "
                            "signed, so any producer that may write a data topic can forge "
                            "one (docs/security.md)", self.worker_id)
            self._ownership.subscribe()
            log.info("worker %s joined %s", self.worker_id, self.config.topics.log)
            if self.buffers is not None:
                self.buffers.start()
            while not self._stop.is_set():
                try:
                    self._turn()
                except KafkaClientError:
                    # A fatal client error (message_error raised it): these Kafka clients
                    # cannot go on. Leave the group (finally) so other workers take the
                    # TCs, and fail loudly.
                    log.critical("worker %s: fatal Kafka error; leaving the group",
                                 self.worker_id, exc_info=True)
                    raise
                except Exception:
                    # In-memory state may now be ahead of the log: rebuild every TC from
                    # its log rather than serve from a state nobody can vouch for.
                    log.exception("worker %s: unexpected error; replaying its TCs again",
                                  self.worker_id)
                    for tc in list(self.tcs.values()):
                        self._ownership.restart(tc, "unexpected error")
                    time.sleep(0.5)
        finally:
            self._ownership.drop_all("worker stopping")
            if self.buffers is not None:
                self.buffers.stop()
            self._kafka.producer.flush(5)
            self._txn_log.close()
            self._listener.close()

    def _marker_signer(self) -> MarkerSigner | None:
        """The workers' marker signer; waits for the broker's cluster id (None: stopped).

        No TC is served before it: an unsigned marker would not count at buffer owners.
        """
        while not self._stop.is_set():
            try:
                md = self._kafka.producer.list_topics(timeout=self.config.admin_timeout_s)
                if md.cluster_id:
                    assert self.config.tc_secret
                    return MarkerSigner.from_secret(self.config.tc_secret, md.cluster_id)
                log.warning("worker %s: the broker reported no cluster id yet", self.worker_id)
            except KafkaException as exc:
                log.warning("worker %s: no cluster id for the marker key yet: %s",
                            self.worker_id, exc)
            self._stop.wait(1.0)
        return None

    # ------------------------------------------------------------ endpoints

    def _serving_started(self, tc: TcIncarnation) -> None:
        """TC ``tc`` read its EPOCH back: tell clients where it is served."""
        self._unpublished.add(tc.tc_id)
        self._publish_endpoints()
        log.info("tc %d: %s serving at %s (epoch at offset %d, next seq %d, %d txns, lwm %d)",
                 tc.tc_id, self.worker_id, self.address, tc.epoch_write,
                 tc.store.next_sequence, len(tc.store.txns), tc.store.low_watermark)

    def _publish_endpoints(self) -> None:
        """Tell clients where the TCs that just started serving are (retried if refused).

        Written after the EPOCH read back, so a client never finds an owner that cannot
        serve yet; a client that reaches an owner fenced since is told NotCoordinator.
        """
        for tc_id in list(self._unpublished):
            tc = self.tcs.get(tc_id)
            if tc is None or tc.epoch_write is None:
                self._unpublished.discard(tc_id)
                continue
            rec = TcEndpoint(tc_id, self.worker_id, self.address, tc.epoch_write,
                             self._listener.tls)
            value = rec.encode()
            signer = self._finalizer.signer
            tag: list[tuple[str, str | bytes | None]] | None = None if signer is None else [
                (TXN_MAC_HEADER, signer.tag(self.config.topics.endpoints, tc_id, value))]

            def delivered(err: KafkaError | None, _m: Message, tc_id: int = tc_id) -> None:
                if err is not None:
                    log.warning("tc %d: endpoint not published (%s); retrying", tc_id, err)
                    if tc_id in self.tcs:
                        self._unpublished.add(tc_id)
            try:
                self._kafka.producer.produce(self.config.topics.endpoints, value,
                                             key=str(tc_id).encode(), partition=tc_id,
                                             headers=tag, on_delivery=delivered)
                self._unpublished.discard(tc_id)
            except (KafkaException, BufferError) as exc:
                log.warning("tc %d: endpoint not published (%s); retrying", tc_id, exc)
        self._kafka.producer.poll(0)

    # ------------------------------------------------------------ the turn

    def _turn(self) -> None:
        t0 = time.perf_counter()
        self._turn_once()
        metrics.TURN_SECONDS.observe(time.perf_counter() - t0)
        if t0 >= self._metrics_at:
            self._metrics_at = t0 + METRICS_EXPORT_S
            self._export_metrics()

    def _export_metrics(self) -> None:
        """Per-TC gauges (open txns, the oldest one's age, pending-ack subscriptions).

        Once a second, not per turn: each costs a pass over the TC's live txns. A TC this
        worker no longer serves has its series removed, so a dashboard never shows one
        TC twice (old owner and new) after a failover.
        """
        metrics.TCS_SERVED.set(len(self.serving()))
        now_ms = int(time.time() * 1000)
        served: set[int] = set()
        for tc in list(self.tcs.values()):
            if not self._ownership.serving(tc):
                continue
            served.add(tc.tc_id)
            live = tc.store.handed_out()  # reserved TxnIDs are no writer's txns yet
            label = str(tc.tc_id)
            metrics.OPEN_TXNS.labels(label).set(len(live))
            metrics.RESERVED_TXNS.labels(label).set(tc.store.reserved_count())
            oldest = min((m.open_time_ms for m in live), default=None)
            metrics.OLDEST_OPEN_TXN_SECONDS.labels(label).set(
                0.0 if oldest is None else max(0.0, (now_ms - oldest) / 1000))
            metrics.PENDING_ACK_SUBSCRIPTIONS.labels(label).set(
                sum(len(m.subscriptions) for m in live))
        gone = [(str(tc_id),) for tc_id in self._exported_tcs - served]
        for gauge in (metrics.OPEN_TXNS, metrics.RESERVED_TXNS, metrics.OLDEST_OPEN_TXN_SECONDS,
                      metrics.PENDING_ACK_SUBSCRIPTIONS):
            metrics.remove_series(gauge, gone)
        self._exported_tcs = served

    def _turn_once(self) -> None:
        busy = any(tc.phase is TcPhase.SERVING for tc in self.tcs.values())
        self._ownership.poll(0.0 if busy else self.settings.idle_poll_s)
        if not busy:
            return
        now_ms = int(time.time() * 1000)
        handled: dict[int, TcIncarnation] = {}
        replies: dict[int, list[tuple[TcRequest, TcReply]]] = defaultdict(list)
        # Block on requests (returns as soon as one arrives) unless finalization work waits.
        idle = not any(tc.store.ending() for tc in self.tcs.values()
                       if tc.phase is TcPhase.SERVING)
        if now_ms >= self._republish_at_ms:
            self._republish_at_ms = now_ms + int(self.settings.endpoint_republish_s * 1000)
            self._unpublished.update(tc.tc_id for tc in self.tcs.values()
                                     if self._ownership.serving(tc))
        if self._unpublished:
            self._publish_endpoints()
        for data, conn in self._take_requests(self.settings.idle_poll_s if idle else 0):
            try:
                req = TcRequest.decode(data)
            except CorruptRecordError as exc:
                log.error("worker %s: skipping a corrupt request from %s: %s", self.worker_id,
                          conn.peer, exc)
                continue
            if req.deadline_ms < now_ms:
                continue  # the client gave up on it; it retries under the same id
            tc = self.tcs.get(req.tc_id)
            if tc is None or tc.phase is not TcPhase.SERVING:
                conn.send(TcReply.failure(req, NotCoordinatorError(
                    f"worker {self.worker_id} does not serve coordinator {req.tc_id}"),
                    self.worker_id).encode())
                continue
            earlier = self._origins.get(req.request_id)
            if earlier is not None:  # a resend: it takes the earlier attempt's place
                earlier[0].inflight -= 1
            elif conn.inflight >= self.settings.max_inflight_per_connection:
                conn.send(TcReply.failure(req, TooManyRequestsError(
                    f"this connection has {conn.inflight} requests awaiting replies from "
                    f"worker {self.worker_id}, its limit (max_inflight_per_connection)"),
                    self.worker_id).encode())
                continue
            conn.inflight += 1
            self._origins[req.request_id] = (conn, req.deadline_ms, time.perf_counter(),
                                             req.op.value)
            handled[tc.tc_id] = tc
            caller = Caller(conn.principal, admin=conn.principal in self.config.admins
                            or not self._listener.authenticates)
            try:
                reply = self._handler.handle(tc, req, now_ms, caller)
            except Exception as exc:  # a bug, not the request's fault: this TC only
                log.exception("worker %s: tc %d failed on a %s request from %s; replaying "
                              "it", self.worker_id, tc.tc_id, req.op.value, conn.peer)
                self._ownership.restart(tc, f"request handling failed: {exc!r}")
                self._reply(req, TcReply.failure(req, InvalidRequestError(
                    f"coordinator {tc.tc_id} could not handle this {req.op.value} request "
                    f"({type(exc).__name__}); it was not applied"), self.worker_id))
                continue
            if reply is not None and reply.error_kind is None and req.op in _WATCHED:
                seq = reply.txn_seq if req.op is TcOp.NEW else req.txn_seq
                tc.watchers[seq] = conn
            metrics.REQUESTS.labels(req.op.value,
                                    reply.error_kind if reply and reply.error_kind else "ok").inc()
            if reply is not None:
                replies[tc.tc_id].append((req, reply))
        # 1. Append every entry the requests and expired timeouts planned, failed requests'
        #    included (a commit that found its txn expired logged the abort), one flush.
        want: dict[int, tuple[TcIncarnation, int]] = {}
        appended: set[int] = set()
        for tc in list(self.tcs.values()):
            if not self._ownership.serving(tc):
                continue  # e.g. dropped by a delivery report during another TC's flush
            tc.store.expire(now_ms)
            batch = tc.store.unlogged()
            if not batch:
                continue
            appended.add(tc.tc_id)
            offsets = self._ownership.append(tc, batch)
            if offsets is not None:
                want[tc.tc_id] = (tc, offsets[-1])
        # 2. The checkpoint on its own: it changes no state, so a refusal costs only it.
        for tc in list(self.tcs.values()):
            if self._ownership.serving(tc) and time.monotonic() >= tc.next_checkpoint:
                offset = self._checkpoint(tc)
                if offset is not None:
                    want[tc.tc_id] = (tc, max(offset, want.get(tc.tc_id, (tc, -1))[1]))
        # 3. Read back; reply only as the incarnation that handled the requests, still
        #    serving, and (if it appended) with every entry read back; a partition's
        #    first registration only once its buffer registration is written.
        confirmed = self._ownership.read_back(want) if want else set()
        unregistered = self._register_partitions(replies)
        for tc_id, pairs in replies.items():
            tc = handled[tc_id]
            if not self._ownership.serving(tc) or (tc_id in appended and tc_id not in confirmed):
                continue
            for req, reply in pairs:
                if req.op is TcOp.ADD_PARTITIONS and unregistered.intersection(req.partitions):
                    continue  # the client retries; the registration is tried again
                self._reply(req, reply)
        self._ownership.appended(appended & confirmed)
        self._finalizer.finalize(now_ms)
        self._truncate(now_ms)
        if len(self._origins) > self._sweep_origins_at:
            kept = {k: v for k, v in self._origins.items() if v[1] >= now_ms}
            for k, v in self._origins.items():
                if k not in kept:
                    v[0].inflight -= 1
            self._origins = kept
            # many still waiting (END waiters): sweep again only once as many came in
            self._sweep_origins_at = max(ORIGINS_SWEEP_AT, 2 * len(self._origins))

    def _take_requests(self, timeout: float) -> list[tuple[bytes, ServerConnection]]:
        """The requests that have arrived, waiting up to ``timeout`` for the first."""
        try:
            out = [self._inbox.get(timeout=timeout) if timeout > 0
                   else self._inbox.get_nowait()]
        except queue.Empty:
            return []
        while len(out) < self.settings.batch_max:
            try:
                out.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        return out

    def _register_partitions(self, replies: dict[int, list[tuple[TcRequest, TcReply]]]
                             ) -> set[TopicPartition]:
        """Register the data partitions txns add for the first time; those not written.

        A topic becomes served (DESIGN.md section 6) the first time a txn registers one of
        its partitions: every partition of it is registered, in the snapshot topic, before
        the registration is confirmed, so a reader that finds no registration knows no
        txn record precedes it there.
        """
        new = {p for pairs in replies.values() for req, reply in pairs
               if req.op is TcOp.ADD_PARTITIONS and reply.error_kind is None
               for p in req.partitions} - self._registered
        if not new:
            return set()
        todo = set(new)
        for topic in {p.topic for p in new}:
            try:
                meta = self._kafka.producer.list_topics(topic, timeout=self.config.admin_timeout_s)
                t = meta.topics.get(topic)
                if t is not None and t.error is None:
                    todo |= {TopicPartition(topic, p) for p in t.partitions}
            except KafkaException as exc:  # the partitions asked for are registered anyway
                log.warning("registering %s: partitions unknown (%s)", topic, exc)
        todo -= self._registered
        if not self._registry.register(sorted(todo), self.settings.readback_timeout_s):
            return new
        self._registered |= todo
        return set()

    def _checkpoint(self, tc: TcIncarnation) -> int | None:
        """Renew the epoch, then append a CHECKPOINT; the checkpoint's offset, or None.

        1. A renewal EPOCH (:meth:`TransactionMetadataStore.renewal_entry`), appended
           alone and read back before anything else is written: from then on this
           incarnation's records carry it, and truncation may cut there, past the
           takeover EPOCH. If it is not appended (or not read back) in time it may still
           land, and the records written after it under the old epoch would be invalid:
           the TC restarts (replays), as after any failed append.
        2. The CHECKPOINT. A refusal restarts nothing (it only restates what the log
           holds): the next one comes after a normal interval, and if the log found it
           too large (its topic's ``max.message.bytes`` is below
           ``MAX_CHECKPOINT_BYTES``) it carries fewer group outcomes. No truncation until
           one is read back.
        """
        tc.next_checkpoint = time.monotonic() + self.settings.checkpoint_interval_s
        renewed = self._ownership.append(tc, [tc.store.renewal_entry()])
        if renewed is None or tc.tc_id not in self._ownership.read_back(
                {tc.tc_id: (tc, renewed[0])}):
            return None
        if tc.store.own_epoch != renewed[0]:  # read back, yet not taken as ours
            self._ownership.restart(tc, f"epoch renewal at offset {renewed[0]} not in effect")
            return None
        entry = tc.store.checkpoint_entry()
        offsets = self._ownership.append(tc, [entry], restart=False)
        if offsets is None:
            err = tc.last_error
            too_large = getattr(err, "code", lambda: None)() == KafkaError.MSG_SIZE_TOO_LARGE
            if too_large:
                tc.store.shrink_groups()
            log.error("tc %d: checkpoint not appended (%s)%s; no truncation until one is",
                      tc.tc_id, err, "; carrying fewer group outcomes next time"
                      if too_large else "")
            return None
        tc.truncate_pending = True
        return offsets[0]

    def _reply(self, req: TcRequest, reply: TcReply) -> None:
        """Answer on the connection the request came in on.

        If it has closed, the client resends under the same request id on another and
        gets the answer again.
        """
        origin = self._origins.pop(req.request_id, None)
        if origin is not None:
            origin[0].inflight -= 1
            origin[0].send(reply.encode())
            metrics.REQUEST_SECONDS.labels(origin[3]).observe(time.perf_counter() - origin[2])

    def _truncate(self, now_ms: int) -> None:
        """Drop the log prefix below each checkpointed TC's truncation point."""
        for tc in list(self.tcs.values()):
            if not tc.truncate_pending or not self._ownership.serving(tc):
                continue
            tc.truncate_pending = False
            point = tc.store.truncation_point(now_ms, self.settings.end_retention_ms)
            if point <= 0:
                continue
            try:
                self._txn_log.truncate(tc.tc_id, point)
            except Exception as exc:
                log.warning("tc %d: truncation below %d failed: %s", tc.tc_id, point, exc)
                continue
            dropped = tc.store.forget_before(point)
            log.info("tc %d: log truncated below offset %d (%d ended txns forgotten)",
                     tc.tc_id, point, dropped)
