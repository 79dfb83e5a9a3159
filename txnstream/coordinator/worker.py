"""``CoordinatorWorker``: hosts the transaction coordinators whose log partitions it owns.

Ownership is Kafka consumer-group assignment: every worker joins one group over
``__txn_log``; the member assigned partition ``p`` is TC ``p`` (DESIGN.md section 5).
One loop, one thread; each turn:

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
   replies are sent only by the same incarnation (the same ``_Tc`` object, not just the
   same id) that appended the batch, still serving, and only if every entry came back
   (a foreign EPOCH before one fences the TC at once); a TC that appended nothing this
   turn replies if it is still that incarnation. A crash here leaves entries in the log
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
replayed from its log after a backoff that doubles with each failure in a row
(:data:`RESTART_BACKOFF_FIRST_S` .. :data:`RESTART_BACKOFF_MAX_S`), so a log that keeps
refusing never becomes a tight restart loop. The CHECKPOINT is appended on its own: it
changes no state, so its failure costs only that checkpoint (and, if the log found it too
large, the oldest group outcomes, see :meth:`TransactionMetadataStore.shrink_groups`),
never a restart.
"""

from __future__ import annotations

import enum
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
)
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from txnstream import metrics
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.buffer.worker import BufferWorker
from txnstream.config import Config
from txnstream.coordinator.client import TcEndpoint
from txnstream.coordinator.log_entry import TransactionLogEntry
from txnstream.coordinator.metadata_store import ABORT_ADMIN, ABORT_CLIENT, TransactionMetadataStore
from txnstream.coordinator.protocol import TcOp, TcReply, TcRequest, TxnInfo
from txnstream.coordinator.transport import (
    Endpoint,
    Listener,
    ServerConnection,
    server_ssl_context,
)
from txnstream.errors import (
    CorruptRecordError,
    KafkaClientError,
    NotCoordinatorError,
    TxnStreamError,
    is_retriable_kafka_error,
    message_error,
)
from txnstream.fetch import drain as _drain
from txnstream.markers import MarkerKind, TxnMarker
from txnstream.types import TopicPartition, TxnStatus

__all__ = ["CoordinatorWorker", "WorkerSettings"]

log = logging.getLogger(__name__)

RESTART_BACKOFF_FIRST_S = 0.2
"""Wait before replaying a TC whose append failed: long enough for a leader move or a
busy broker to pass, short against the client's 3 s resend."""
MAX_RESERVE = 256
"""TxnIDs one RESERVE may open (a client's block); bounds one request's log append."""
ORIGINS_SWEEP_AT = 10_000
"""Requests awaiting a reply past this many: those past their deadline are forgotten
(their client gave up on them; a resend brings its connection again)."""
RESTART_BACKOFF_MAX_S = 30.0
"""Cap of the doubling wait: a log that keeps refusing appends (misconfigured topic,
lost ACLs) is retried twice a minute, with an error logged each time, instead of being
replayed in a tight loop."""


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
    listen: str = "127.0.0.1:0"
    """Address of the direct line to clients (port 0: any free port); every TC it serves
    is reached there."""
    advertise: str | None = None
    """Address clients are told (``host:port``); default: the listen host and the port
    bound (this host's name when listening on every interface). Give it behind a NAT."""


class _Phase(enum.Enum):
    REPLAYING = "replaying"
    EPOCH_PENDING = "epoch-pending"
    SERVING = "serving"


@dataclass(eq=False)  # an incarnation is itself: compared by identity, never by id
class _Tc:
    """One incarnation of TC ``tc_id`` on this worker: from a replay until it is dropped.

    A restart makes a new object; whatever the old one planned (replies, waiters, retry
    times) dies with it.
    """

    tc_id: int
    store: TransactionMetadataStore
    replay_end: int
    phase: _Phase = _Phase.REPLAYING
    position: int = -1
    epoch_write: int | None = None
    end_waiters: dict[int, list[TcRequest]] = field(default_factory=lambda: defaultdict(list))
    group_waiters: list[tuple[TcRequest, set[int], TcReply]] = field(default_factory=list)
    retry_at: dict[int, tuple[float, int]] = field(default_factory=dict)
    next_checkpoint: float = 0.0
    truncate_pending: bool = False
    last_error: Any = None
    """Why its last failed append failed (KafkaError, exception or "timeout")."""


class CoordinatorWorker:
    """A process-level host of transaction coordinators (TC roles of ``txnstream worker``)."""

    def __init__(self, config: Config, worker_id: str | None = None,
                 settings: WorkerSettings | None = None) -> None:
        self.config = config
        self.settings = settings or WorkerSettings()
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.tcs: dict[int, _Tc] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        t = config.topics
        s = self.settings
        self._log = Consumer(config.consumer(
            f"{t.prefix}-coordinators",
            **{"session.timeout.ms": s.session_timeout_ms,
               "heartbeat.interval.ms": s.heartbeat_interval_ms,
               "max.poll.interval.ms": max(60_000, s.session_timeout_ms * 3),
               "fetch.wait.max.ms": 20, "client.id": f"tc-log-{self.worker_id}"}))
        self._inbox: queue.SimpleQueue[tuple[bytes, ServerConnection]] = queue.SimpleQueue()
        self._origins: dict[str, tuple[ServerConnection, int]] = {}
        """Request id -> the connection to answer on, and the request's deadline."""
        bind = Endpoint.parse(s.listen)
        self._listener = Listener(bind.host, bind.port,
                                  lambda data, conn: self._inbox.put((data, conn)),
                                  secret=config.tc_secret, tls=server_ssl_context(config),
                                  name=f"tc-listener-{self.worker_id}")
        if s.advertise:
            self.address = Endpoint.parse(s.advertise)
        elif bind.host in ("0.0.0.0", "::", ""):  # every interface: tell the host's name
            self.address = Endpoint(socket.gethostname(), self._listener.address.port)
        else:
            self.address = self._listener.address
        """Where clients reach this worker (published per TC it serves)."""
        self._unpublished: set[int] = set()
        """TC ids whose endpoint record is not written yet (retried every turn)."""
        # linger 0: every turn ends in a flush, so batching comes from the turn itself.
        self._producer = Producer(config.producer(**{"linger.ms": 0,
                                                     "client.id": f"tc-{self.worker_id}"}))
        self._admin = AdminClient(config.admin())
        self._pending_assign: list[int] | None = None
        self._reseek: set[int] = set()
        self._retake_at: dict[int, float] = {}
        """TC id -> when to replay it again after a failed append (see ``_restart``)."""
        self._failures: dict[int, int] = defaultdict(int)
        """Failed appends in a row per TC id, for the restart backoff."""
        self._restarts: dict[int, int] = defaultdict(int)
        """Replays after a failure per TC id since this worker started (in STATS)."""
        self._registered: set[TopicPartition] = set()
        """Data partitions whose registration (they are served) this worker wrote."""
        self._registry = TransactionBufferSnapshotStore(config)
        self.buffers: BufferWorker | None = None
        if s.buffer_role:
            self.buffers = BufferWorker(
                config, list(s.buffer_topics) if s.buffer_topics is not None else None,
                snapshot_interval_s=s.buffer_snapshot_interval_s, member=self.worker_id,
                session_timeout_ms=s.session_timeout_ms)

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
        return sorted(tc.tc_id for tc in self.tcs.values() if tc.phase is _Phase.SERVING)

    def run(self) -> None:
        """The loop; returns when :meth:`stop` is called."""
        self._log.subscribe([self.config.topics.log], on_assign=self._on_assign,
                            on_revoke=self._on_revoke, on_lost=self._on_revoke)
        log.info("worker %s joined %s", self.worker_id, self.config.topics.log)
        if self.buffers is not None:
            self.buffers.start()
        try:
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
                        self._restart(tc, "unexpected error")
                    time.sleep(0.5)
        finally:
            for tc in list(self.tcs.values()):
                self._drop(tc, "worker stopping")
            if self.buffers is not None:
                self.buffers.stop()
            self._producer.flush(5)
            self._log.close()
            self._listener.close()

    # ------------------------------------------------------------ ownership

    def _on_assign(self, consumer: Consumer, parts: list[KafkaTP]) -> None:
        for p in parts:
            p.offset = OFFSET_BEGINNING
        consumer.assign(parts)
        self._pending_assign = (self._pending_assign or []) + [p.partition for p in parts]

    def _on_revoke(self, consumer: Consumer, parts: list[KafkaTP]) -> None:
        gone = {p.partition for p in parts}
        for tc_id in gone:
            tc = self.tcs.get(tc_id)
            if tc is not None:
                self._drop(tc, "partition revoked")
            self._retake_at.pop(tc_id, None)
            self._failures.pop(tc_id, None)
            self._reseek.discard(tc_id)
        if self._pending_assign:
            self._pending_assign = [t for t in self._pending_assign if t not in gone] or None
        consumer.unassign()

    def _take(self, tc_id: int) -> None:
        """Start replaying TC ``tc_id`` (a new incarnation) from its log start."""
        try:
            low, high = self._watermarks(tc_id)
        except KafkaException as exc:
            # Still failing after retries (leader moving, broker busy): try again soon.
            log.warning("tc %d: cannot read log watermarks yet (%s); retrying", tc_id, exc)
            self._reseek.add(tc_id)  # records read meanwhile are skipped: replay again
            self._retake_at[tc_id] = time.monotonic() + RESTART_BACKOFF_FIRST_S
            return
        if tc_id in self._reseek:
            try:
                self._log.seek(KafkaTP(self.config.topics.log, tc_id, low))
            except KafkaException as exc:
                log.warning("tc %d: cannot seek its log yet (%s); retrying", tc_id, exc)
                self._retake_at[tc_id] = time.monotonic() + RESTART_BACKOFF_FIRST_S
                return
            self._reseek.discard(tc_id)
        tc = _Tc(tc_id, TransactionMetadataStore(tc_id, self.worker_id), replay_end=high,
                 position=low)
        self.tcs[tc_id] = tc
        log.info("tc %d: assigned to %s, replaying offsets %d..%d", tc_id, self.worker_id,
                 low, high)
        if low >= high:
            self._write_epoch(tc)

    @retry(retry=retry_if_exception(is_retriable_kafka_error),
           stop=stop_after_delay(10), wait=wait_exponential(0.05, max=1), reraise=True)
    def _watermarks(self, tc_id: int) -> tuple[int, int]:
        low, high = self._log.get_watermark_offsets(
            KafkaTP(self.config.topics.log, tc_id), timeout=self.config.admin_timeout_s)
        return low, high

    def _drop(self, tc: _Tc, why: str) -> None:
        """Stop serving with this incarnation at once; the replies it held die with it."""
        if self.tcs.get(tc.tc_id) is not tc:
            return  # already dropped (a newer incarnation may serve the id)
        del self.tcs[tc.tc_id]
        self._unpublished.discard(tc.tc_id)
        level = logging.INFO if why == "worker stopping" else logging.WARNING
        log.log(level, "tc %d: %s stops serving (%s)", tc.tc_id, self.worker_id, why)

    def _write_epoch(self, tc: _Tc) -> None:
        offsets = self._append(tc, [tc.store.epoch_entry()])
        if offsets is None:
            return
        tc.epoch_write = offsets[0]
        tc.phase = _Phase.EPOCH_PENDING

    def _start_serving(self, tc: _Tc) -> None:
        tc.store.own_epoch = tc.epoch_write
        tc.phase = _Phase.SERVING
        tc.next_checkpoint = time.monotonic() + self.settings.checkpoint_interval_s
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

            def delivered(err: KafkaError | None, _m: Message, tc_id: int = tc_id) -> None:
                if err is not None:
                    log.warning("tc %d: endpoint not published (%s); retrying", tc_id, err)
                    if tc_id in self.tcs:
                        self._unpublished.add(tc_id)
            try:
                self._producer.produce(self.config.topics.endpoints, rec.encode(),
                                       key=str(tc_id).encode(), partition=tc_id,
                                       on_delivery=delivered)
                self._unpublished.discard(tc_id)
            except (KafkaException, BufferError) as exc:
                log.warning("tc %d: endpoint not published (%s); retrying", tc_id, exc)
        self._producer.poll(0)

    # ------------------------------------------------------------ log I/O

    def _poll_log(self, timeout: float) -> None:
        # Replays after a failed append first: their seek must precede the fetch.
        mono = time.monotonic()
        for tc_id, at in list(self._retake_at.items()):
            if at <= mono:
                del self._retake_at[tc_id]
                if tc_id not in self.tcs:  # else a new assignment replays it already
                    self._take(tc_id)
        msgs = _drain(self._log, 2_000, timeout)
        if self._pending_assign:  # assigned during this poll, from the log start
            taken, self._pending_assign = self._pending_assign, None
            for tc_id in taken:
                self._retake_at.pop(tc_id, None)
                self._take(tc_id)
        for m in msgs:
            if message_error(m, f"worker {self.worker_id} log consumer", log):
                continue
            part = m.partition()
            tc = self.tcs.get(part) if part is not None else None
            if tc is None:
                continue
            self._fold(tc, m)

    def _fold(self, tc: _Tc, m: Message) -> None:
        offset = m.offset()
        if offset is None or offset < tc.position:
            return  # fetched before a seek back to the log start; it comes again in order
        tc.position = offset + 1
        try:
            entry = TransactionLogEntry.decode(m.value())
        except CorruptRecordError as exc:
            metrics.INVALID_RECORDS.labels(str(tc.tc_id)).inc()
            log.error("tc %d: skipping corrupt record at %s[%d]@%d: %s", tc.tc_id,
                      m.topic(), m.partition(), offset, exc)
        else:
            ts = m.timestamp()[1]
            tc.store.replay(offset, entry, ts if ts > 0 else None)
            if tc.store.fenced:
                self._drop(tc, f"fenced by a newer EPOCH at offset {offset} "
                               f"(owner {tc.store.epoch_owner})")
                return
            if tc.store.diverged:
                self._restart(tc, f"its own record at offset {offset} read back invalid")
                return
        if tc.phase is _Phase.REPLAYING and tc.position >= tc.replay_end:
            self._write_epoch(tc)
        elif tc.phase is _Phase.EPOCH_PENDING and offset == tc.epoch_write:
            self._start_serving(tc)

    def _produce_all(self, tc: _Tc, entries: list[TransactionLogEntry],
                     on_delivery: Any) -> Exception | None:
        """Produce ``entries`` to TC's log partition; the error if one was refused."""
        for e in entries:
            try:
                self._producer.produce(self.config.topics.log, e.encode(), partition=tc.tc_id,
                                       on_delivery=on_delivery)
            except (KafkaException, BufferError) as exc:
                # e.g. MSG_SIZE_TOO_LARGE over message.max.bytes, or a full local queue.
                # Entries already produced may still land: the replay will read them.
                return exc
        return None

    def _append(self, tc: _Tc, entries: list[TransactionLogEntry],
                restart: bool = True) -> list[int] | None:
        """Produce and flush ``entries`` to TC's log partition; their offsets, or None.

        On failure (``restart``, the default) the TC is restarted: its memory may hold
        what the log does not. Without ``restart`` only the failure is returned (for a
        record that changes no state, the checkpoint); its error is in ``tc.last_error``.
        """
        offsets: list[int] = []
        failed: list[Any] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            offset = msg.offset() if err is None else None
            if offset is None:
                failed.append(err or "no offset")
            else:
                offsets.append(offset)

        refused = self._produce_all(tc, entries, on_delivery)
        if refused is not None:
            failed.append(refused.args[0] if refused.args else refused)
        self._producer.flush(self.settings.readback_timeout_s)
        if failed or len(offsets) != len(entries):
            why = failed[0] if failed else "timeout"
            tc.last_error = why
            if restart:
                log.error("tc %d: log append failed (%s); replaying it again", tc.tc_id, why)
                self._restart(tc, "its log append failed")
            return None
        return sorted(offsets)

    def _restart(self, tc: _Tc, why: str) -> None:
        """Drop this incarnation (its memory may be ahead of the log); replay it later.

        The replay starts after a backoff that doubles per failure in a row.
        Never re-enters an append (no recursion from a failing EPOCH write); safe to call
        from a delivery callback; a no-op for an incarnation already dropped.
        """
        if self.tcs.get(tc.tc_id) is not tc:
            return
        self._drop(tc, f"restarting from the log: {why}")
        self._failures[tc.tc_id] += 1
        self._restarts[tc.tc_id] += 1
        n = self._failures[tc.tc_id]
        delay = min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_FIRST_S * 2 ** (n - 1))
        self._reseek.add(tc.tc_id)
        self._retake_at[tc.tc_id] = time.monotonic() + delay
        log.warning("tc %d: replaying its log in %.1fs (failure %d in a row)", tc.tc_id,
                    delay, n)

    def _serving(self, tc: _Tc) -> bool:
        """Whether this very incarnation still serves (not dropped, restarted, fenced)."""
        return self.tcs.get(tc.tc_id) is tc and tc.phase is _Phase.SERVING

    def _read_back(self, want: dict[int, tuple[_Tc, int]]) -> set[int]:
        """Tail until each TC incarnation has read its offset back.

        Returns the ids of those that did and still serve. One that did not in time is
        restarted.
        """
        deadline = time.monotonic() + self.settings.readback_timeout_s
        while True:
            waiting = [tc for tc, off in want.values()
                       if self._serving(tc) and tc.position <= off]
            if not waiting or time.monotonic() > deadline:
                break
            self._poll_log(0.01)
        ok = set()
        for tc, off in want.values():
            if not self._serving(tc):
                continue  # fenced or restarted meanwhile: its entries vouch for nothing
            if tc.position <= off:
                self._restart(tc, f"offset {off} not read back in time")
                continue
            ok.add(tc.tc_id)
        return ok

    # ------------------------------------------------------------ the turn

    def _turn(self) -> None:
        t0 = time.perf_counter()
        self._turn_once()
        metrics.TURN_SECONDS.observe(time.perf_counter() - t0)
        metrics.TCS_SERVED.set(len(self.serving()))

    def _turn_once(self) -> None:
        busy = any(tc.phase is _Phase.SERVING for tc in self.tcs.values())
        self._poll_log(0.0 if busy else self.settings.idle_poll_s)
        if not busy:
            return
        now_ms = int(time.time() * 1000)
        handled: dict[int, _Tc] = {}
        replies: dict[int, list[tuple[TcRequest, TcReply]]] = defaultdict(list)
        # Block on requests (returns as soon as one arrives) unless finalization work waits.
        idle = not any(tc.store.ending() for tc in self.tcs.values()
                       if tc.phase is _Phase.SERVING)
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
            if tc is None or tc.phase is not _Phase.SERVING:
                conn.send(TcReply.failure(req, NotCoordinatorError(
                    f"worker {self.worker_id} does not serve coordinator {req.tc_id}"),
                    self.worker_id).encode())
                continue
            self._origins[req.request_id] = (conn, req.deadline_ms)
            handled[tc.tc_id] = tc
            reply = self._handle(tc, req, now_ms)
            metrics.REQUESTS.labels(req.op.value,
                                    reply.error_kind if reply and reply.error_kind else "ok").inc()
            if reply is not None:
                replies[tc.tc_id].append((req, reply))
        # 1. Append every entry the requests and expired timeouts planned, failed requests'
        #    included (a commit that found its txn expired logged the abort), one flush.
        want: dict[int, tuple[_Tc, int]] = {}
        appended: set[int] = set()
        for tc in list(self.tcs.values()):
            if not self._serving(tc):
                continue  # e.g. dropped by a delivery report during another TC's flush
            tc.store.expire(now_ms)
            batch = tc.store.unlogged()
            if not batch:
                continue
            appended.add(tc.tc_id)
            offsets = self._append(tc, batch)
            if offsets is not None:
                want[tc.tc_id] = (tc, offsets[-1])
        # 2. The checkpoint on its own: it changes no state, so a refusal costs only it.
        for tc in list(self.tcs.values()):
            if self._serving(tc) and time.monotonic() >= tc.next_checkpoint:
                offset = self._checkpoint(tc)
                if offset is not None:
                    want[tc.tc_id] = (tc, max(offset, want.get(tc.tc_id, (tc, -1))[1]))
        # 3. Read back; reply only as the incarnation that handled the requests, still
        #    serving, and (if it appended) with every entry read back; a partition's
        #    first registration only once its buffer registration is written.
        confirmed = self._read_back(want) if want else set()
        unregistered = self._register_partitions(replies)
        for tc_id, pairs in replies.items():
            tc = handled[tc_id]
            if not self._serving(tc) or (tc_id in appended and tc_id not in confirmed):
                continue
            for req, reply in pairs:
                if req.op is TcOp.ADD_PARTITIONS and unregistered.intersection(req.partitions):
                    continue  # the client retries; the registration is tried again
                self._reply(req, reply)
        for tc_id in appended & confirmed:
            self._failures.pop(tc_id, None)
        self._finalize(now_ms)
        self._truncate(now_ms)
        if len(self._origins) > ORIGINS_SWEEP_AT:
            self._origins = {k: v for k, v in self._origins.items() if v[1] >= now_ms}

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
        new = {p for pairs in replies.values() for req, _ in pairs
               if req.op is TcOp.ADD_PARTITIONS for p in req.partitions} - self._registered
        if not new:
            return set()
        todo = set(new)
        for topic in {p.topic for p in new}:
            try:
                meta = self._producer.list_topics(topic, timeout=self.config.admin_timeout_s)
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

    def _checkpoint(self, tc: _Tc) -> int | None:
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
        renewed = self._append(tc, [tc.store.renewal_entry()])
        if renewed is None or tc.tc_id not in self._read_back({tc.tc_id: (tc, renewed[0])}):
            return None
        if tc.store.own_epoch != renewed[0]:  # read back, yet not taken as ours
            self._restart(tc, f"epoch renewal at offset {renewed[0]} not in effect")
            return None
        entry = tc.store.checkpoint_entry()
        offsets = self._append(tc, [entry], restart=False)
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
            origin[0].send(reply.encode())

    def _handle(self, tc: _Tc, req: TcRequest, now_ms: int) -> TcReply | None:
        """Apply one request to the store; its reply, or None if it waits (END).

        The entries it planned are taken from ``store.unlogged()`` by the caller, also
        when it failed; the reply is sent only after they read back.
        """
        store = tc.store
        ok = TcReply(req.request_id, req.client_id, tc.tc_id, txn_seq=req.txn_seq,
                     owner_id=self.worker_id)
        try:
            if req.op is TcOp.NEW:
                timeout = min(req.timeout_ms or int(self.config.default_txn_timeout_s * 1000),
                              int(self.config.max_txn_timeout_s * 1000))
                meta, _ = store.new_txn(req.request_id, timeout, now_ms, req.group_key)
                return TcReply(req.request_id, req.client_id, tc.tc_id,
                               txn_seq=meta.txn_id.least_bits, owner_id=self.worker_id)
            if req.op is TcOp.RESERVE:
                lease = min(req.timeout_ms or int(self.config.default_txn_timeout_s * 1000),
                            int(self.config.max_txn_timeout_s * 1000))
                count = max(1, min(req.count, MAX_RESERVE))
                seqs = store.reserve(req.request_id, count, lease, now_ms)
                return TcReply(req.request_id, req.client_id, tc.tc_id, txn_seq=seqs[0],
                               group_seqs=tuple(seqs), owner_id=self.worker_id)
            if req.op is TcOp.ACTIVATE:
                timeout = min(req.timeout_ms or int(self.config.default_txn_timeout_s * 1000),
                              int(self.config.max_txn_timeout_s * 1000))
                store.activate(req.txn_seq, timeout, req.open_time_ms, now_ms, req.request_id)
                return ok
            if req.op is TcOp.ADD_PARTITIONS:
                store.add_partitions(req.txn_seq, req.partitions, now_ms, req.request_id)
                return ok
            if req.op is TcOp.ADD_SUBSCRIPTIONS:
                store.add_subscriptions(req.txn_seq, req.subscriptions, now_ms, req.request_id)
                return ok
            if req.op is TcOp.END:
                reason = req.reason if req.reason in (ABORT_ADMIN,) else ABORT_CLIENT
                res = store.end_txn(req.txn_seq, req.commit, now_ms, reason, req.request_id)
                if res.meta.status.is_final:
                    return ok
                tc.end_waiters[req.txn_seq].append(req)
                return None
            if req.op is TcOp.END_GROUP:
                g = store.end_group(req.group_key or "", req.group_seqs, req.commit, now_ms,
                                    req.request_id)
                reply = TcReply(req.request_id, req.client_id, tc.tc_id, already=g.already,
                                group_seqs=g.seqs, owner_id=self.worker_id,
                                error_kind=None if not g.error else (
                                    "TransactionTimeoutError" if g.timed_out
                                    else "InvalidTxnStatusError"),
                                error_message=g.error
                                and f"group {req.group_key} aborted: {g.error}")
                if g.error or g.already:
                    return reply
                pending = {s for s in g.seqs if not store.txns[s].status.is_final}
                tc.group_waiters.append((req, pending, reply))
                return None
            if req.op is TcOp.GET:
                meta = store.get(req.txn_seq)
                return TcReply(req.request_id, req.client_id, tc.tc_id, txn_seq=req.txn_seq,
                               txns=(TxnInfo.of(meta),), owner_id=self.worker_id)
            if req.op is TcOp.LIST:
                metas = [m for m in store.txns.values()
                         if req.min_age_ms <= 0 or (m.status is TxnStatus.OPEN and
                                                    now_ms - m.open_time_ms >= req.min_age_ms)]
                return TcReply(req.request_id, req.client_id, tc.tc_id,
                               txns=tuple(TxnInfo.of(m) for m in metas), owner_id=self.worker_id)
            if req.op is TcOp.STATS:
                st = store.stats(now_ms)
                stats = {f"status.{k}": v for k, v in st.by_status.items()}
                stats.update({"next_sequence": st.next_sequence,
                              "low_watermark": st.low_watermark,
                              "epoch_offset": st.epoch_offset,
                              "invalid_records": st.invalid_records,
                              "oldest_open_ms": st.oldest_open_ms or 0,
                              "log_position": tc.position,
                              "restarts": self._restarts[tc.tc_id]})
                return TcReply(req.request_id, req.client_id, tc.tc_id, stats=stats,
                               owner_id=self.worker_id)
        except TxnStreamError as exc:
            return TcReply.failure(req, exc, self.worker_id)
        raise AssertionError(req.op)

    # ------------------------------------------------------------ finalization

    def _finalize(self, now_ms: int) -> None:
        """Markers and marks for every decided txn, then replies, then COMMITTED/ABORTED.

        Only txns whose COMMITTING/ABORTING entry this incarnation read back reach here
        (an incarnation whose append failed was dropped before this step).
        """
        mono = time.monotonic()
        work: list[tuple[_Tc, int]] = []
        failed: set[tuple[int, int]] = set()
        for tc in list(self.tcs.values()):
            if not self._serving(tc):
                continue
            lwm = tc.store.low_watermark
            for meta in tc.store.ending():
                seq = meta.txn_id.least_bits
                if tc.retry_at.get(seq, (0.0, 0))[0] > mono:
                    continue
                commit = meta.status is TxnStatus.COMMITTING
                key = (tc.tc_id, seq)

                def on_delivery(err: KafkaError | None, _m: Message, key: tuple = key) -> None:
                    if err is not None:
                        failed.add(key)

                marker = TxnMarker(meta.txn_id, MarkerKind.COMMIT if commit else MarkerKind.ABORT,
                                   lwm)
                value = marker.encode()
                headers: list[tuple[str, str | bytes | None]] = list(marker.headers())
                try:
                    for tp in sorted(meta.partitions):
                        self._producer.produce(tp.topic, value, partition=tp.partition,
                                               headers=headers, on_delivery=on_delivery)
                    for sub in sorted(meta.subscriptions):
                        mark = _pending_ack_mark(commit, sub, meta.txn_id)
                        self._producer.produce(self.config.topics.pending_ack, mark.encode(),
                                               key=mark.key(), on_delivery=on_delivery)
                except (KafkaException, BufferError) as exc:
                    log.warning("tc %d: markers for txn %s not produced: %s", tc.tc_id,
                                meta.txn_id, exc)
                    failed.add(key)
                work.append((tc, seq))
        if not work:
            return
        remaining = self._producer.flush(self.settings.readback_timeout_s)
        for tc, seq in work:
            if not self._serving(tc):
                continue  # restarted meanwhile: the replay finds the txn ending and retries
            if remaining or (tc.tc_id, seq) in failed:
                _, tries = tc.retry_at.get(seq, (0.0, 0))
                delay = min(self.settings.finalize_backoff_max_s, 0.1 * 2 ** tries)
                tc.retry_at[seq] = (mono + delay, tries + 1)
                log.warning("tc %d: markers for txn (%d,%d) not written; retry in %.1fs",
                            tc.tc_id, tc.tc_id, seq, delay)
                continue
            tc.retry_at.pop(seq, None)
            entry = tc.store.finalize(seq, now_ms)
            if entry is not None and entry.status is not None:
                metrics.TXN_ENDED.labels(str(tc.tc_id), entry.status.value).inc()
            meta = tc.store.txns[seq]
            for req in tc.end_waiters.pop(seq, []):
                if req.commit == (meta.status is TxnStatus.COMMITTED):
                    self._reply(req, TcReply(req.request_id, req.client_id, tc.tc_id,
                                             txn_seq=seq, owner_id=self.worker_id))
                else:
                    self._reply(req, TcReply.failure(req, _ended_other_way(meta), self.worker_id))
            still = []
            for req, pending, reply in tc.group_waiters:
                pending.discard(seq)
                if pending:
                    still.append((req, pending, reply))
                else:
                    self._reply(req, reply)
            tc.group_waiters = still
        for tc in {tc for tc, _ in work}:
            if self._serving(tc):
                self._append_async(tc, tc.store.unlogged())

    def _append_async(self, tc: _Tc, entries: list[TransactionLogEntry]) -> None:
        """Append COMMITTED/ABORTED records without waiting: nobody waits on them.

        If one is lost, the log still says COMMITTING/ABORTING while the memory of this
        incarnation says final: this incarnation (the very object, not whichever serves
        the id by the time the report comes) is restarted, and its replay finalizes the
        txn again (idempotently).
        """
        if not entries:
            return

        def on_delivery(err: KafkaError | None, _m: Message) -> None:
            if err is not None:
                log.error("tc %d: final record not appended (%s); replaying it again",
                          tc.tc_id, err)
                self._restart(tc, "a final record was not appended")

        refused = self._produce_all(tc, entries, on_delivery)
        if refused is not None:
            log.error("tc %d: final record not appended (%s); replaying it again", tc.tc_id,
                      refused)
            self._restart(tc, "a final record was not appended")
        self._producer.poll(0)

    def _truncate(self, now_ms: int) -> None:
        for tc in list(self.tcs.values()):
            if not tc.truncate_pending or not self._serving(tc):
                continue
            tc.truncate_pending = False
            point = tc.store.truncation_point(now_ms, self.settings.end_retention_ms)
            if point <= 0:
                continue
            fut = self._admin.delete_records(
                [KafkaTP(self.config.topics.log, tc.tc_id, point)])
            try:
                for f in fut.values():
                    f.result(self.config.admin_timeout_s)
            except Exception as exc:
                log.warning("tc %d: truncation below %d failed: %s", tc.tc_id, point, exc)
                continue
            dropped = tc.store.forget_before(point)
            log.info("tc %d: log truncated below offset %d (%d ended txns forgotten)",
                     tc.tc_id, point, dropped)


def _pending_ack_mark(commit: bool, sub: Any, txn_id: Any) -> Any:
    from txnstream.pendingack.records import PendingAckEntry, PendingAckKind

    kind = PendingAckKind.COMMIT_MARK if commit else PendingAckKind.ABORT_MARK
    return PendingAckEntry.mark(kind, sub.subscription, sub.tp, txn_id)


def _ended_other_way(meta: Any) -> TxnStreamError:
    from txnstream.errors import InvalidTxnStatusError, TransactionTimeoutError

    if meta.abort_reason == "timeout":
        return TransactionTimeoutError(
            f"transaction {meta.txn_id} was aborted at its timeout of {meta.timeout_ms} ms",
            meta.txn_id)
    return InvalidTxnStatusError(meta.txn_id, None, meta.status,
                                 f"transaction {meta.txn_id} ended {meta.status.value}")
