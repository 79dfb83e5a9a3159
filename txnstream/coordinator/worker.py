"""``CoordinatorWorker``: hosts the transaction coordinators whose log partitions it owns.

A worker wires four parts (a module each) and runs them in one loop on one thread:

* :mod:`~txnstream.coordinator.ownership`: which TCs it owns (the ``<prefix>-coordinators``
  consumer group over ``__txn_log``), each an incarnation replayed from its log, fenced by
  a newer EPOCH, restarted after a failed append;
* :mod:`~txnstream.coordinator.txn_log`: the log itself behind the ``TransactionLog``
  Protocol (append, tail, watermarks, truncation);
* :mod:`~txnstream.coordinator.handlers`: what each request op does to a TC's store;
* :mod:`~txnstream.coordinator.finalizer`: markers, pending-ack marks, END replies and
  final records of decided txns.

Helpers: ``endpoint_publisher`` (where its TCs are served), ``buffer_registrar`` (data
partitions for the buffer role), ``gauges`` (per-TC metrics), ``kafka_clients`` (its Kafka
clients, from a factory it is given: the real ones by default).

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
   nothing this turn replies if it is still that incarnation. A crash here leaves logged
   entries without replies: the client retries with the same request id, and the new
   owner, having replayed them, answers from the log.
4. **Finalize** every COMMITTING/ABORTING txn: (a) write COMMIT/ABORT markers (with the
   TC's low watermark) to each produced partition and commit/abort marks to each acked
   subscription's pending-ack log, one flush for all; (b) reply to the END requests;
   (c) log COMMITTED/ABORTED. A crash after (a) leaves COMMITTING in the log: the next
   owner finds it on replay and writes the markers again (markers are idempotent for
   readers). A failed marker write is retried with backoff until it succeeds.
5. **Checkpoint and truncate** now and then: a renewal EPOCH (read back first), a
   CHECKPOINT record carrying the sequence counter and recent group keys, then
   ``delete_records`` drops the prefix no longer needed, cutting at the EPOCH governing
   the first record still needed (:meth:`TransactionMetadataStore.truncation_point`),
   without waiting for the broker's answer (``TcOwnership.truncate``). A crash anywhere
   here leaves a valid log: the renewal and the checkpoint change no txn, and
   ``delete_records`` only removes what no replay needs.

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

import logging
import os
import socket
import threading
import time
import uuid
from collections import defaultdict

from confluent_kafka import KafkaError, KafkaException

from txnstream import metrics
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.buffer.worker import BufferWorker
from txnstream.config import Config
from txnstream.coordinator.buffer_registrar import BufferRegistrar
from txnstream.coordinator.endpoint_publisher import EndpointPublisher
from txnstream.coordinator.finalizer import TxnFinalizer
from txnstream.coordinator.gauges import TcGauges
from txnstream.coordinator.handlers import Caller, TcRequestHandler
from txnstream.coordinator.inbox import FairInbox, ReadQuota
from txnstream.coordinator.kafka_clients import worker_clients
from txnstream.coordinator.line_security import (
    cluster_identity,
    guarded_line_users,
    server_ssl_context,
)
from txnstream.coordinator.origins import Origins
from txnstream.coordinator.ownership import TcIncarnation, TcOwnership, TcPhase
from txnstream.coordinator.protocol import TcOp, TcReply, TcRequest
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.transport import Endpoint, LineLimits, Listener, ServerConnection
from txnstream.coordinator.txn_log import KafkaTransactionLog, TransactionLog
from txnstream.errors import (
    CorruptRecordError,
    InvalidRequestError,
    KafkaClientError,
    NotCoordinatorError,
    TooManyRequestsError,
)
from txnstream.kafka.clients import CONFLUENT_KAFKA, KafkaClientFactory, close_producer
from txnstream.kafka.topics import LOOKUP_TIMEOUT_S, PartitionCatalog, metadata_lookup
from txnstream.ratelog import RateLimitedLog
from txnstream.types import TopicPartition
from txnstream.workers_key import warn_unsigned, worker_config, workers_signer

__all__ = ["CoordinatorWorker"]

log = logging.getLogger(__name__)

_READS = frozenset({TcOp.GET, TcOp.LIST, TcOp.STATS})
"""Requests that change nothing: not handled once their connection is gone (a peer that
pipelined thousands and went away left a backlog that held others' commits for seconds)."""
_WATCHED = frozenset({TcOp.NEW, TcOp.ACTIVATE, TcOp.ADD_PARTITIONS, TcOp.ADD_SUBSCRIPTIONS})
"""Requests whose connection is told when their txn ends without its own END."""


class CoordinatorWorker:
    """A process-level host of transaction coordinators (TC roles of ``txnstream worker``)."""

    def __init__(self, config: Config, worker_id: str | None = None,
                 settings: WorkerSettings | None = None,
                 kafka: KafkaClientFactory = CONFLUENT_KAFKA) -> None:
        """``kafka`` makes the worker's Kafka clients (a test gives a factory of fakes)."""
        self.settings = settings or WorkerSettings()
        # no key (unless unsigned), a bad key file or a weak secret: refused right here
        self.config = config = worker_config(config, self.settings.unsigned)
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._rate_limited = RateLimitedLog(log)  # per peer host: what clients send
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        t = config.topics
        s = self.settings
        self._kafka = worker_clients(config, self.worker_id, s, kafka)
        self._txn_log: TransactionLog = KafkaTransactionLog(
            self._kafka, t.log, flush_timeout_s=s.readback_timeout_s,
            admin_timeout_s=config.admin_timeout_s,
            where=f"worker {self.worker_id} log consumer",
            strategy=s.tc_assignment_strategy)
        self._ownership = TcOwnership(
            self._txn_log, t.log, self.worker_id, readback_timeout_s=s.readback_timeout_s,
            checkpoint_interval_s=s.checkpoint_interval_s, on_serving=self._serving_started,
            on_dropped=self._dropped)
        partitions = PartitionCatalog(metadata_lookup(
            self._kafka.producer, min(LOOKUP_TIMEOUT_S, config.admin_timeout_s)))
        self._handler = TcRequestHandler(config, self.worker_id, self._ownership.restarts,
                                         s.max_open_txns_per_principal, partitions)
        self._finalizer = TxnFinalizer(
            self._ownership, self._kafka, t.pending_ack, self.worker_id, self._reply,
            flush_timeout_s=s.readback_timeout_s, backoff_max_s=s.finalize_backoff_max_s,
            partitions=partitions)
        exempt = self.config.admins | {self.config.tc_principal}  # and lines without principals
        self._inbox = FairInbox(s.batch_max, ReadQuota(s.read_share, s.read_burst_s, lambda p: (
            p in exempt or not self._listener.authenticates)))
        self._origins = Origins(self.worker_id, s.slow_request_s)  # taken, not answered
        self._gauges = TcGauges(self._ownership)
        bind = Endpoint.parse(s.listen)
        users = guarded_line_users(config, s.listen, s.allow_unauthenticated,
                                   f"worker {self.worker_id}")
        self._listener = Listener(bind.host, bind.port,
                                  self._received,
                                  users=users, tls=server_ssl_context(config),
                                  name=f"tc-listener-{self.worker_id}",
                                  limits=LineLimits(
                                      s.max_connections, s.max_request_bytes, s.idle_timeout_s,
                                      s.max_handshakes, s.max_handshakes_per_host,
                                      s.max_queued_per_connection,
                                      s.max_queued_bytes_per_connection, s.max_queued_bytes),
                                  cluster=None)  # named in run(), once the broker says
        if s.advertise:
            self.address = Endpoint.parse(s.advertise)
        elif bind.host in ("0.0.0.0", "::", ""):  # every interface: tell the host's name
            self.address = Endpoint(socket.gethostname(), self._listener.address.port)
        else:
            self.address = self._listener.address
        """Where clients reach this worker (published per TC it serves)."""
        self._endpoints = EndpointPublisher(self._kafka.producer, t.endpoints, self.worker_id,
                                            self.address, self._listener.tls,
                                            s.endpoint_republish_s)
        self._registrar = BufferRegistrar(TransactionBufferSnapshotStore(config),
                                          self._kafka.producer, config.admin_timeout_s,
                                          s.readback_timeout_s)
        self.buffers: BufferWorker | None = None
        if s.buffer_role:
            self.buffers = BufferWorker(
                config, list(s.buffer_topics) if s.buffer_topics is not None else None,
                snapshot_interval_s=s.buffer_snapshot_interval_s, member=self.worker_id,
                session_timeout_ms=s.session_timeout_ms, unsigned=s.unsigned,
                assignment_strategy=s.tc_assignment_strategy)

    @property
    def tcs(self) -> dict[int, TcIncarnation]:
        """TC id -> the incarnation this worker holds (replaying or serving)."""
        return self._ownership.tcs

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
            cluster_id = self._cluster_id()
            if cluster_id is None:
                return  # stopped before the broker answered
            self._listener.cluster = cluster_identity(cluster_id, self.config.topics.prefix)
            if self.settings.unsigned:
                warn_unsigned(log, f"worker {self.worker_id}")
            else:
                signer = workers_signer(self.config, cluster_id)
                if signer is None:
                    return  # no key (its constructor resolved one; as before, not served)
                self._finalizer.signer = self._endpoints.signer = signer
                self._handler.membership = signer.membership
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
            self._txn_log.close()
            self._listener.close()
            close_producer(self._kafka.producer, 5)

    def _cluster_id(self) -> str | None:
        """The broker's cluster id, waited for (None: stopped first).

        No TC is served before it: the marker key and the line's hello name it.
        """
        while not self._stop.is_set():
            try:
                md = self._kafka.producer.list_topics(timeout=self.config.admin_timeout_s)
                if md.cluster_id:
                    return str(md.cluster_id)
                log.warning("worker %s: the broker reported no cluster id yet", self.worker_id)
            except KafkaException as exc:
                log.warning("worker %s: no cluster id for the marker key yet: %s",
                            self.worker_id, exc)
            self._stop.wait(1.0)
        return None

    # ------------------------------------------------------------ endpoints

    def _serving_started(self, tc: TcIncarnation) -> None:
        """TC ``tc`` read its EPOCH back: tell clients where it is served."""
        self._endpoints.add(tc.tc_id)
        self._endpoints.publish(self.tcs)
        log.info("tc %d: %s serving at %s (epoch at offset %d, next seq %d, %d txns, lwm %d)",
                 tc.tc_id, self.worker_id, self.address, tc.epoch_write,
                 tc.store.next_sequence, len(tc.store.txns), tc.store.low_watermark)

    def _dropped(self, tc_id: int) -> None:
        """TC ``tc_id`` stopped serving here: its endpoint record is no longer due."""
        self._endpoints.discard(tc_id)

    # ------------------------------------------------------------ the turn

    def _turn(self) -> None:
        t0 = time.perf_counter()
        self._turn_once()
        metrics.TURN_SECONDS.observe(time.perf_counter() - t0)
        self._gauges.turn(t0)

    def _turn_once(self) -> None:
        busy = any(tc.phase is TcPhase.SERVING for tc in self.tcs.values())
        self._ownership.poll(0.0 if busy else self.settings.idle_poll_s)
        if not busy:
            return
        now_ms = int(time.time() * 1000)
        handled: dict[int, TcIncarnation] = {}
        # each reply encoded as its request is handled: a principal's turn budget pays
        # for its replies (a LIST page's), not the turn's other principals after it
        replies: dict[int, list[tuple[TcRequest, TcReply, bytes]]] = defaultdict(list)
        carried: set[TopicPartition] = set()
        # Block on requests (returns as soon as one arrives) until finalization work is due.
        due = self._finalizer.due_in()
        wait = self.settings.idle_poll_s if due is None else min(self.settings.idle_poll_s, due)
        self._endpoints.turn(now_ms, self.tcs, (tc.tc_id for tc in self.tcs.values()
                                                 if self._ownership.serving(tc)))
        self._origins.turn_started()
        for req, conn in self._inbox.take(wait):
            if req.deadline_ms < now_ms:
                continue  # the client gave up on it; it retries under the same id
            if req.op in _READS:
                self._inbox.read()  # its handling counts against its principal's quota
                if conn.gone():
                    continue  # a read no one can receive: its peer is gone (reset it)
            tc = self.tcs.get(req.tc_id)
            if tc is None or tc.phase is not TcPhase.SERVING:
                conn.send(TcReply.failure(req, NotCoordinatorError(
                    f"worker {self.worker_id} does not serve coordinator {req.tc_id}"),
                    self.worker_id).encode())
                continue
            earlier = self._origins.get(req.request_id)
            if earlier is not None:  # a resend: it takes the earlier attempt's place
                earlier.conn.inflight -= 1
            elif conn.inflight >= self.settings.max_inflight_per_connection:
                conn.send(TcReply.failure(req, TooManyRequestsError(
                    f"this connection has {conn.inflight} requests awaiting replies from "
                    f"worker {self.worker_id}, its limit (max_inflight_per_connection)"),
                    self.worker_id).encode())
                continue
            conn.inflight += 1
            self._origins.add(req, conn, self._inbox.arrived)
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
            if req.op in (TcOp.END, TcOp.PREPARE) and req.partitions and (
                    reply is None or reply.error_kind is None):
                carried.update(req.partitions)  # registered by the commit/prepare (handlers)
            if reply is not None and reply.error_kind is None and req.op in _WATCHED:
                seq = reply.txn_seq if req.op is TcOp.NEW else req.txn_seq
                if (m := tc.store.txns.get(seq)) is None or not m.status.is_final:
                    tc.watch(seq, conn)
            elif req.op is TcOp.END and reply is not None and reply.error_kind is None:
                tc.watchers.get(req.txn_seq, {}).pop(conn, None)  # its reply tells it
            metrics.REQUESTS.labels(req.op.value,
                                    reply.error_kind if reply and reply.error_kind else "ok").inc()
            if reply is not None:
                replies[tc.tc_id].append((req, reply, reply.encode()))
        self._origins.stage("handled")
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
        self._origins.stage("appended")
        confirmed = self._ownership.read_back(want) if want else set()
        self._origins.stage("read back")
        unregistered = self._registrar.register(
            [*(p for pairs in replies.values() for req, reply, _ in pairs
               if req.op is TcOp.ADD_PARTITIONS and reply.error_kind is None
               for p in req.partitions), *carried])
        if unregistered & carried:  # decided: the client registered their topics before
            log.warning("worker %s: buffer registration of %s (carried by a commit) not "
                        "written; their topics were registered before", self.worker_id,
                        sorted(map(str, unregistered & carried))[:5])
        self._origins.stage("registered")
        for tc_id, pairs in replies.items():
            tc = handled[tc_id]
            if not self._ownership.serving(tc) or (tc_id in appended and tc_id not in confirmed):
                continue
            for req, reply, data in pairs:
                if req.op is TcOp.ADD_PARTITIONS and unregistered.intersection(req.partitions):
                    continue  # the client retries; the registration is tried again
                self._reply(req, reply, data)
        self._ownership.appended(appended & confirmed)
        self._finalizer.finalize(now_ms)
        self._truncate(now_ms)
        self._origins.sweep(now_ms)

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

    def _received(self, data: bytes, conn: ServerConnection) -> None:
        """A frame read from ``conn`` (the listener's thread): decoded into the inbox.

        Garbage closes the connection at once, as Kafka's network thread closes one whose
        request does not parse: not once a turn reaches it, which a throttled principal's
        requests, or a worker serving no TC, may not do for a minute (seed 66).
        """
        if conn.closed.is_set():  # closed at an earlier frame: nothing after it is taken
            conn.took(len(data))
            return
        try:
            self._inbox.put(TcRequest.decode(data), conn, len(data))
        except CorruptRecordError as exc:  # not this line, or hostile: closed
            conn.took(len(data))
            conn.close()
            self._rate_limited.error(f"corrupt {conn.peer.rsplit(':', 1)[0]}", "worker %s: "
                                     "closing the connection from %s (principal %s): a "
                                     "corrupt request: %s", self.worker_id, conn.peer,
                                     conn.principal, exc)

    def _reply(self, req: TcRequest, reply: TcReply, data: bytes | None = None) -> None:
        """Answer on the connection the request came in on (``data``: ``reply`` encoded).

        If it has closed, the client resends under the same request id on another and
        gets the answer again.
        """
        origin = self._origins.pop(req.request_id)
        if origin is not None:
            origin.conn.inflight -= 1
            origin.conn.send(reply.encode() if data is None else data)
            metrics.REQUEST_SECONDS.labels(origin.op).observe(time.monotonic() - origin.arrived)

    def _truncate(self, now_ms: int) -> None:
        """Truncate each checkpointed TC's log prefix, without waiting (TcOwnership)."""
        self._ownership.truncate(list(self.tcs.values()), now_ms,
                                 self.settings.end_retention_ms)
