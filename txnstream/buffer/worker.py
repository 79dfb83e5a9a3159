"""``BufferWorker``: the buffer role of ``txnstream worker``: serves transaction buffers.

Ownership (as coordinators own ``__txn_log`` partitions): the buffer slots are the
partitions of the buffer-state topic; workers form the consumer group
``<prefix>-buffers`` over it, and the member assigned slot ``s`` owns every data
partition whose snapshot key falls in slot ``s`` (Java's murmur2 of ``topic-partition``).
Starting more workers spreads the slots. Which partitions are transactional is learnt
from the registrations coordinators write to the snapshot topic (a topic becomes served
the first time a txn registers one of its partitions); ``topics`` may restrict it.

Claiming slot ``s`` (in order; a crash after any step leaves the previous owner's
snapshots and deltas valid, and the next claim starts over):

1. append an OWNER record to state partition ``s`` and wait for it: its offset is this
   owner's generation. Readers refuse deltas of lower generations from then on (a
   zombie owner is fenced); this owner stops serving ``s`` when it reads a newer OWNER
   there (a newer claim);
2. scan snapshot partition ``s``: every registered partition, and its newest snapshot
   (given up when the worker stops: a scan can take seconds, and the slot is held);
3. per partition: restore from the snapshot if it is at or above the log start, else
   fold from the log start (:meth:`_serve`, the one place a fold starts);
4. tail snapshot partition ``s`` from where the scan ended, for new registrations.

Serving a partition, every turn: fold the new records (read as runs, cut in C where it
can: :mod:`txnstream.buffer.scan`); publish a DELTA (what was hidden or aborted since the
last one, and the new max read position) at once, so readers see a commit within a
fetch round trip; every ``snapshot_interval_s`` trim below the log start and publish a
snapshot that names the state offset of its last delta (readers start from it). Every
second, a recreated topic's partition restarts from the new log's start one log epoch
up (:meth:`_restart`, :mod:`txnstream.buffer.recreation`). Every
``lwm_check_interval_s`` the ongoing-txn check (:mod:`txnstream.buffer.ongoing`) asks
the coordinator of each txn still ongoing here about it and writes the marker its
answer calls for, signed with the workers' key (only signed markers count in folds).

The worker thread outlives every Kafka error: each step fails alone, is logged, runs again next
turn. An undelivered delta leaves readers a gap: they reload from a snapshot, published at once.

Bounds: per partition, the fold's state above the log start (:mod:`.transaction_buffer`);
per snapshot record, ``MAX_SNAPSHOT_RECORD_BYTES``; per delta, what one turn folded.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from functools import partial

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from txnstream import metrics
from txnstream.buffer import slot_group
from txnstream.buffer.gauges import BufferGauges
from txnstream.buffer.marker_writer import MarkerWriter
from txnstream.buffer.ongoing import OngoingTxnCheck
from txnstream.buffer.publisher import BufferPublisher, OwnedSlot, ServedPartition
from txnstream.buffer.recreation import (
    RECREATION_CHECK_S,
    LogRestarts,
    Restart,
    TopicIds,
    fresh_state,
    idle_consumer,
)
from txnstream.buffer.scan import PACED_FETCH, DataScan
from txnstream.buffer.served import BufferStateKind, BufferStateRecord
from txnstream.buffer.snapshot_store import (
    ScanStopped,
    TransactionBufferSnapshotStore,
    registered_partition,
)
from txnstream.buffer.transaction_buffer import Journal, TransactionBuffer
from txnstream.config import Config
from txnstream.errors import KafkaClientError, message_error
from txnstream.fencing import supersedes, write_owner_record
from txnstream.kafka import clients
from txnstream.kafka.clients import CONFLUENT_KAFKA, KafkaClientFactory, close_producer
from txnstream.kafka.fetch import KnownTopics, consume, learn_topic
from txnstream.kafka.offsets import LogBounds
from txnstream.kafka.topics import (
    LOOKUP_TIMEOUT_S,
    NO_AUTO_CREATE,
    PartitionCatalog,
    metadata_lookup,
)
from txnstream.markers import MarkerSigner
from txnstream.ratelog import RateLimitedLog
from txnstream.types import TopicPartition
from txnstream.workers_key import warn_unsigned, worker_config, workers_signer

__all__ = ["BufferWorker"]

log = logging.getLogger(__name__)
_rate_limited = RateLimitedLog(log)

ERROR_BACKOFF_S = 1.0
"""Pause after a failed fold step: no busy loop on a broker that is down, and short next
to the session timeout, so the group keeps the member."""
FOLD_WAIT_S = 0.005  # how long one turn waits for data records (a marker's latency)
CLAIM_TIMEOUT_S = 10.0  # how long the OWNER record of a claim may take to be written


class BufferWorker:
    """Owns buffer slots; folds and publishes their partitions; unblocks stuck ones."""

    def __init__(self, config: Config, topics: list[str] | None = None,
                 snapshot_interval_s: float = 10.0, lwm_check_interval_s: float = 5.0,
                 member: str | None = None, session_timeout_ms: int | None = None, *,
                 kafka: KafkaClientFactory = CONFLUENT_KAFKA, unsigned: bool = False,
                 store: TransactionBufferSnapshotStore | None = None,
                 assignment_strategy: str = clients.COOPERATIVE) -> None:
        """A buffer role member; nothing runs before :meth:`start`.

        ``kafka`` makes its Kafka clients and ``store`` is its snapshot store (defaults: the
        real ones; a test gives fakes); the rest as in ``WorkerSettings``.
        """
        self.config = config = worker_config(config, unsigned)  # no key: refused here
        self._unsigned = unsigned
        self._kafka = kafka
        self.topics = topics
        """Serve only these topics (names, or regexes starting with ``^``); None: all."""
        self._topic_res = [re.compile(t) for t in topics or () if t.startswith("^")]
        self.snapshot_interval_s = snapshot_interval_s
        self.lwm_check_interval_s = lwm_check_interval_s
        self.member = member or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        self._session_timeout_ms = session_timeout_ms
        self._strategy = assignment_strategy  # cooperative: only the slots that move move
        self.slots: dict[int, OwnedSlot] = {}
        self.served: dict[TopicPartition, ServedPartition] = {}
        self._store = store if store is not None else TransactionBufferSnapshotStore(config)
        self._state_topic = config.topics.buffer_state
        self._group = self._new_group_consumer()
        self._bounds = LogBounds(config, self.member, kafka)
        data_id = f"tb-data-{self.member}"
        self._data = kafka.consumer(config.consumer(
            f"{config.topics.prefix}-tb-data-{uuid.uuid4().hex[:8]}",
            **PACED_FETCH, **{"client.id": data_id}))
        self._data_topics = KnownTopics(self._data, config.admin_timeout_s)
        self._scan = DataScan(self._data, data_id, pace_s=FOLD_WAIT_S, resume_at=lambda tp: (
            s.buf.last_offset + 1 if (s := self.served.get(tp)) is not None else None))
        self._registry = kafka.consumer(config.consumer(
            f"{config.topics.prefix}-tb-reg-{uuid.uuid4().hex[:8]}",
            **{"fetch.wait.max.ms": 50, "client.id": f"tb-reg-{self.member}"}))
        # Its markers go to data topics that may be deleted: it never creates a topic.
        self._producer = kafka.producer(config.producer(**NO_AUTO_CREATE, **{
            "linger.ms": 0, "client.id": f"tb-{self.member}"}))
        partitions = PartitionCatalog(metadata_lookup(
            self._data, min(LOOKUP_TIMEOUT_S, config.admin_timeout_s)))
        self._markers = MarkerWriter(self._producer, partitions)
        self._ongoing = OngoingTxnCheck(config, self._bounds, partitions, self._markers)
        self._gauges = BufferGauges(self._data)
        self._publisher = BufferPublisher(self._producer, self._state_topic, self._store,
                                          self._data, self.member, config.admin_timeout_s)
        self._retry_claim: dict[int, float] = {}
        self._logs = LogRestarts(self._data, TopicIds(
            lambda: kafka.admin(config.admin()), config.admin_timeout_s,
            idle_consumer(kafka, config, self.member)), self.member, config.admin_timeout_s)
        self._signer: MarkerSigner | None = None  # signs its markers, checks folded ones
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.consumers_renewed = 0

    def _new_group_consumer(self) -> Consumer:
        return slot_group.group_consumer(self._kafka, self.config, self.member,
                                         self._session_timeout_ms, self._strategy)

    @property
    def markers_written(self) -> int:
        """Markers this worker has produced."""
        return self._markers.written

    @property
    def snapshots_published(self) -> int:
        """Snapshots this worker published."""
        return self._publisher.snapshots_published

    @property
    def snapshot_failures(self) -> int:
        """Snapshots this worker could not publish."""
        return self._publisher.snapshot_failures

    @property
    def deltas_published(self) -> int:
        """Deltas delivered to the buffer-state topic."""
        return self._publisher.deltas_published

    @property
    def delta_failures(self) -> int:
        """Deltas the buffer-state topic did not take."""
        return self._publisher.delta_failures

    def serves_topic(self, topic: str) -> bool:
        """Whether ``topics`` lets this worker serve ``topic``."""
        if self.topics is None:
            return True
        return topic in self.topics or any(r.match(topic) for r in self._topic_res)

    # ------------------------------------------------------------ lifecycle

    def owned_slots(self) -> list[int]:
        """Buffer slots this worker has claimed and serves right now (any thread)."""
        return sorted(self.slots.copy())

    def start(self) -> BufferWorker:
        """Run in a daemon thread."""
        self._thread = threading.Thread(target=self.run, name="tb-worker", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Publish final snapshots and leave the group."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def run(self) -> None:
        """The loop: each step fails alone and runs again at its next turn."""
        if self._unsigned:
            warn_unsigned(log, f"buffer worker {self.member}")
        else:  # no fold before the signer: an unchecked fold would honour forged markers
            while not self._stop.is_set() and not self._step("marker key", self._make_signer):
                self._stop.wait(ERROR_BACKOFF_S)
        self._subscribe()
        next_snap = time.monotonic() + self.snapshot_interval_s
        next_lwm = time.monotonic() + self.lwm_check_interval_s
        next_check = time.monotonic() + RECREATION_CHECK_S
        try:
            while not self._stop.is_set():
                self._step("group poll", self._poll_group)
                self._step("registrations", self._poll_registrations)
                if not self._step("fold", self._fold_new):
                    self._stop.wait(ERROR_BACKOFF_S)
                self._step("deltas", self._publish_deltas)
                now = time.monotonic()
                if self._retry_claim:
                    self._step("claims", self._retry_claims)
                due = now >= next_snap
                if due or self._publisher.due:
                    self._step("snapshot", partial(self._publish_snapshots, force=due))
                    if due:
                        next_snap = now + self.snapshot_interval_s
                if now >= next_check:
                    self._step("recreated logs check", self._check_logs)
                    next_check = now + RECREATION_CHECK_S
                if (ask := now >= next_lwm) or self._ongoing.answered:  # never waits
                    self._step("ongoing txns check", partial(self._ongoing.run, self.served, ask))
                    next_lwm = now + self.lwm_check_interval_s if ask else next_lwm
        finally:
            self._step("final deltas", self._publish_deltas)
            self._step("final snapshots", lambda: self._publish_snapshots(force=True))
            for what, close in (("snapshot store close", lambda: self._store.close()),
                                ("group close", lambda: clients.close_member(
                                    self._group, self._strategy)),
                                ("data scan close", self._scan.close),
                                ("data close", self._data.close),
                                ("registry close", self._registry.close),
                                ("log bounds close", self._bounds.close),
                                ("coordinator client close", self._ongoing.close),
                                ("topic ids close", self._logs.topic_ids.close),
                                ("producer close", lambda: close_producer(self._producer, 5))):
                self._step(what, close)

    def _make_signer(self) -> None:
        cluster = self._producer.list_topics(timeout=self.config.admin_timeout_s).cluster_id
        if not cluster:
            raise RuntimeError("the broker reported no cluster id: markers cannot be signed")
        self._signer = self._markers.signer = workers_signer(self.config, cluster)

    def _step(self, what: str, fn: Callable[[], object]) -> bool:
        """Run one step; a failure is logged, never raised. Whether it succeeded."""
        try:
            fn()
            return True
        except KafkaClientError as exc:  # the group consumer is done for: rejoin
            log.error("buffer worker: %s: %s; renewing the group consumer", what, exc)
            self._renew_group()
        except Exception:  # a step that fails every turn logs once per 10 s
            _rate_limited.error(f"step {what}", "buffer worker: %s failed; retrying at its "
                                "next turn\n%s", what, traceback.format_exc().rstrip())
        return False

    def _subscribe(self) -> None:
        self._group.subscribe([self._state_topic], on_assign=self._on_assign,
                              on_revoke=self._on_revoke, on_lost=self._on_lost)

    def _renew_group(self) -> None:
        old, self._group = self._group, self._new_group_consumer()
        try:
            old.close()
        except Exception as exc:  # already failed; the new member matters now
            log.warning("buffer worker: closing the failed consumer: %s", exc)
        for slot in list(self.slots):
            self._drop_slot(slot, "group consumer renewed")
        self.consumers_renewed += 1
        self._subscribe()

    # ------------------------------------------------------------ slots

    def _on_assign(self, consumer: Consumer, parts: list[KafkaTP]) -> None:
        clients.assign_by(consumer, parts, self._strategy)
        for p in parts:
            if not self._stop.is_set():  # leaving: the next owner claims the rest
                self._claim(p.partition)

    def _on_revoke(self, consumer: Consumer, parts: list[KafkaTP]) -> None:
        self._publish_deltas()  # what changed since the last delta, for readers
        self._publish_snapshots(force=True, slots={p.partition for p in parts})
        self._step("snapshot flush", lambda: self._store.flush())
        for p in parts:
            self._drop_slot(p.partition, "revoked")
        clients.unassign_by(consumer, parts, self._strategy)

    def _on_lost(self, consumer: Consumer, parts: list[KafkaTP]) -> None:
        for p in parts:  # another member may own them already: publish nothing more
            self._drop_slot(p.partition, "lost")
        clients.unassign_by(consumer, parts, self._strategy)

    def _claim(self, slot: int) -> None:
        """Claim ``slot`` (steps 1-4 of the module docstring); retried if it fails."""
        t0 = time.monotonic()
        try:
            generation = self._write_owner(slot)
            t1 = time.monotonic()
            scan, end = self._store.scan_slot(slot, self._stop)
        except ScanStopped:  # leaving: the next owner claims it
            return
        except Exception as exc:
            log.warning("buffer worker %s: cannot claim slot %d yet (%s); retrying",
                        self.member, slot, exc)
            self._retry_claim[slot] = time.monotonic() + ERROR_BACKOFF_S
            return
        self._retry_claim.pop(slot, None)
        self.slots[slot] = OwnedSlot(generation)
        mine = {tp: found.best for tp, found in scan.finders.items()
                if found.registered and self.serves_topic(tp.topic)}
        self._serve_all(slot, mine)
        learn_topic(self._registry, self._store.topic, self.config.admin_timeout_s)
        self._registry.incremental_assign([KafkaTP(self._store.topic, slot, end)])
        log.info("buffer worker %s: owns slot %d (generation %d), serving %d partitions "
                 "(claimed in %.0f ms, scan %.0f ms)", self.member, slot, generation,
                 len(self.slots[slot].served), (time.monotonic() - t0) * 1000,
                 (time.monotonic() - t1) * 1000)

    def _retry_claims(self) -> None:
        now = time.monotonic()
        assigned = {p.partition for p in self._group.assignment()}
        for slot, at in list(self._retry_claim.items()):
            if slot not in assigned:
                del self._retry_claim[slot]
            elif at <= now:
                self._claim(slot)

    def _write_owner(self, slot: int) -> int:
        """Append this owner's OWNER record to state partition ``slot``; its offset."""
        rec = BufferStateRecord(BufferStateKind.OWNER, self.member, -1, "", slot,
                                ts_ms=int(time.time() * 1000))
        w = write_owner_record(self._producer, self._state_topic, slot, str(slot).encode(),
                               rec.encode(), CLAIM_TIMEOUT_S)
        if w.offset is None:
            raise KafkaException(w.error or "OWNER record not delivered in time")
        return w.offset

    def _drop_slot(self, slot: int, why: str) -> None:
        self._retry_claim.pop(slot, None)
        s = self.slots.pop(slot, None)
        if s is None:
            return
        gone = [KafkaTP(tp.topic, tp.partition) for tp in s.served]
        for tp in s.served:
            self.served.pop(tp, None)
            self._logs.identity.forget(tp)
            self._scan.forget(tp)
        for c, parts in ((self._data, gone), (self._registry, [KafkaTP(self._store.topic, slot)])):
            try:
                if parts:
                    c.incremental_unassign(parts)
            except KafkaException as exc:
                log.debug("unassign %s: %s", parts, exc)
        log.info("buffer worker %s: slot %d %s (%d partitions)", self.member, slot, why,
                 len(gone))

    def _serve_all(self, slot: int, snaps: dict) -> None:  # type: ignore[type-arg]
        """Serve each partition of ``snaps`` not served yet, from its snapshot (or None)."""
        new = {tp: snap for tp, snap in snaps.items() if tp not in self.served}
        if not new:
            return
        self._data_topics.ensure(new, {tp.topic for tp in self.served})
        bounds = self._bounds.get(new)
        ids = self._logs.topic_ids.get({tp.topic for tp in new})
        for tp, snap in new.items():
            if isinstance(b := bounds[tp], KafkaException):
                log.warning("%s: log start unknown (%s); folding from the earliest", tp, b)
            low, high = b if not isinstance(b, KafkaException) else (0, 0)
            buf, due = self._logs.start_state(tp, snap, low, ids.get(tp.topic, ""))
            # A partition with a usable snapshot needs none now (readers start from it
            # and follow the deltas); one without gets its first at once.
            self._start_fold(tp, slot, buf, low, snapshot_due=due, log_end=high)

    def _start_fold(self, tp: TopicPartition, slot: int, buf: TransactionBuffer, low: int,
                    snapshot_due: bool, log_end: int = 0) -> None:
        """Serve ``tp`` from ``buf`` on (log ``low``..``log_end``): where every fold starts."""
        buf.trim(low)
        buf.journal = Journal()
        buf.attach_signer(self._signer, log_end)
        self.served[tp] = s = ServedPartition(buf, slot, next_from=buf.last_offset + 1,
                                              snapshot_due=snapshot_due)
        if snapshot_due:
            self._publisher.snapshot_due(tp, s)
        self.slots[slot].served.add(tp)
        self._scan.attach(tp)
        self._data.incremental_assign([KafkaTP(tp.topic, tp.partition, buf.last_offset + 1)])

    def _check_logs(self) -> None:
        for tp, why, topic_id in self._logs.check(self.served):
            self._restart(tp, self.served[tp], why, topic_id)

    def _restart(self, tp: TopicPartition, s: ServedPartition, why: Restart,
                 topic_id: str) -> None:
        """Serve ``tp`` again from its new log's start, one log epoch up.

        A fresh fold; its first DELTA (readers drop their views) and snapshot go out at
        the next snapshot step; a log not known now (its topic has fewer) waits.
        """
        old = s.buf
        try:
            low, high = self._bounds.one(tp)
        except KafkaException as exc:  # the others are restarted all the same
            log.debug("%s: not restarted now: %s", tp, exc)
            return
        epoch = old.log_epoch + 1
        self._logs.warn(tp, old.last_offset, old.max_read_position, why, low, high, epoch)
        try:
            self._data.incremental_unassign([KafkaTP(tp.topic, tp.partition)])
        except KafkaException as exc:
            log.debug("unassign %s: %s", tp, exc)
        del self.served[tp]
        self._logs.identity.forget(tp)
        self._start_fold(tp, s.slot, fresh_state(tp, low, epoch, topic_id or old.topic_id),
                         low, snapshot_due=True)

    def _poll_group(self) -> None:
        """Serve rebalance callbacks; a newer OWNER in an owned slot fences this owner."""
        for m in consume(self._group, 100, 0):
            if message_error(m, "buffer worker group", log):
                continue
            slot = self.slots.get(m.partition())
            if slot is None or not supersedes(m.offset(), slot.generation):
                continue
            try:
                rec = BufferStateRecord.decode(m.value())
            except Exception:
                continue
            if rec.kind is BufferStateKind.OWNER and rec.member != self.member:
                log.warning("buffer worker %s: fenced on slot %d by %s", self.member,
                            m.partition(), rec.member)
                self._drop_slot(m.partition(), "fenced by a newer owner")
                self._retry_claim[m.partition()] = time.monotonic() + 10.0

    def _poll_registrations(self) -> None:
        if not self.slots:
            return
        new: dict[int, dict[TopicPartition, None]] = {}
        for m in consume(self._registry, 100, 0):
            if message_error(m, "buffer worker registrations", log):
                continue
            tp = registered_partition(m.key(), m.value())
            if tp is not None and m.partition() in self.slots and self.serves_topic(tp.topic):
                new.setdefault(m.partition(), {})[tp] = None
        for slot, tps in new.items():
            self._serve_all(slot, tps)

    # ------------------------------------------------------------ folding

    def _fold_new(self) -> None:
        if not self.served:
            self._stop.wait(FOLD_WAIT_S)
            return
        for (topic, partition), entries in self._scan.read(5000, FOLD_WAIT_S).items():
            s = self.served.get(TopicPartition(topic, partition))
            if s is not None and (n := s.buf.fold_entries(entries)):
                self._publisher.folded(TopicPartition(topic, partition), s)
                metrics.BUFFER_RECORDS_FOLDED.inc(n)
                if s.buf.journal is not None and s.buf.journal.unmarked:
                    self._markers.abort_ended(TopicPartition(topic, partition),
                                              s.buf.journal.take_unmarked())

    def _publish_deltas(self) -> None:
        """One DELTA per partition that folded something since the last one."""
        self._publisher.deltas(self.served, self.slots)
        self._gauges.turn(self.slots, self.served)

    def _publish_snapshots(self, force: bool, slots: set[int] | None = None) -> None:
        """Snapshot partitions (of ``slots``) that changed (``force``) or are due."""
        self._publisher.snapshots(self.served, self.slots, force, slots)
