"""``Consumer``: committed-only reads with Pulsar-style acks (subscription = consumer group).

Reads filter by position (DESIGN.md section 6): the buffer role of ``txnstream worker``
folds each transactional partition once and serves its state; a
:class:`~txnstream.buffer.state_store.BufferStateFollower` keeps this consumer's view of
it. Per assigned partition the consumer delivers, in offset order, only records at or
below the served ``max_read_position`` that the view does not skip (markers, aborted
txns' records, stragglers). It never holds or re-reads: at the first record past the
max read position it pauses the partition there and resumes when the position moves.
A partition no txn ever registered is read plain (it pays nothing) until a record with
txn headers shows up; from then on it waits for served state, so no txn record is ever
delivered unfiltered. Memory is bounded by one fetch, whatever an open txn holds back.

Acks: the group's committed Kafka offset is the cursor (mark-delete position), so lag
tools keep working. ``acknowledge`` acks one record; the cursor moves to the lowest
delivered-but-unacked offset. ``acknowledge_cumulative`` acks everything up to a record.
``acknowledge_batch`` acks many records with one pending-ack record per partition.
``negative_acknowledge`` redelivers the record after ``nack_delay_s``;
``redeliver_unacknowledged`` at once (a batch that will not ack what it took).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.buffer.state_store import BufferStateFollower, ServeStatus
from txnstream.coordinator.log_entry import SubscriptionRef
from txnstream.errors import (
    ConfigError,
    KafkaErrorKind,
    NotAuthorizedError,
    TransactionNotFoundError,
    TxnStreamError,
    classify_kafka_error,
    message_error,
)
from txnstream.kafka.fetch import KafkaRecord, drain
from txnstream.markers import TXN_ID_HEADER, TXN_MARKER_HEADER
from txnstream.pendingack.handle import PendingAckHandle, PendingAckStats
from txnstream.pendingack.records import PendingAckEntry, PendingAckKind
from txnstream.pendingack.store import Checkpointed, PendingAckStore
from txnstream.types import TopicPartition, TxnID, TxnStatus

if TYPE_CHECKING:
    from txnstream.client import Client
    from txnstream.transaction import Transaction

__all__ = ["Consumer", "Message"]

log = logging.getLogger(__name__)

FETCH_BATCH = 5000
"""Records taken from the fetcher per call: one Python call per batch, not per record."""
DATA_FETCH_WAIT_MS = 5
"""The broker's long-poll wait for data fetches. A reader pauses a partition at the max
read position and resumes it when a commit moves it: a fetch still parked on the broker
(librdkafka's default 500 ms) would delay the records the commit made visible."""
TXN_ID_CACHE = 10_000
"""Parsed ``txn.id`` headers kept per consumer (one per txn in flight, cleared past it)."""
POLL_SLICE_S = 0.1
"""Longest single wait inside receive: rebalances and retakes are served between waits."""
READ_BACK_TIMEOUT_S = 30.0
"""How long a commit waits to read its own ack records back; a healthy tail takes ms."""
COMMIT_INTERVAL_S = 0.5
"""Cursor commits are batched: at most two offset commits a second per consumer."""
RETAKE_AFTER_S = 10.0
"""After a newer owner fenced this member on a partition the group still assigns to it,
wait this long (about a session timeout: the group settles who owns it meanwhile, and
a revoke cancels the retake) before replaying and claiming it again."""
CHECKPOINT_INTERVAL_S = 10.0
"""How often an owner checkpoints a partition's pending acks (when they changed): a new
owner replays the pending-ack log from the latest checkpoint, so its replay reads about
this many seconds of the log, never the whole log."""
CLAIM_RETRY_S = 1.0
"""A takeover that failed (log not readable yet) is tried again after this long."""


@dataclass(frozen=True, slots=True)
class Message:
    """A delivered record: only user headers; ``txn_id`` if it was written in a txn."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int
    txn_id: TxnID | None = None

    @property
    def tp(self) -> TopicPartition:
        """Where it came from."""
        return TopicPartition(self.topic, self.partition)


@dataclass
class _PartitionReader:
    """Position filter + in-order delivery for one partition."""

    tp: TopicPartition
    status: ServeStatus
    deliver_pos: int
    """Next offset to deliver (or skip)."""
    wait_at: int | None = None
    """Paused here (sought back) until the served max read position reaches it."""
    unacked: dict[int, Message] = field(default_factory=dict)
    """Delivered (or queued) and not yet acked, by offset."""
    committed: int = -1
    handle: PendingAckHandle | None = None
    inflight: dict[int, Message] = field(default_factory=dict)
    """Delivered messages acked in a still-open txn: redelivered if it aborts."""
    held_back: dict[int, Message] = field(default_factory=dict)
    """Messages a previous owner's open txn acked: delivered only if that txn aborts."""
    checkpoint: Checkpointed | None = None
    """The latest pending-ack checkpoint; committed with the cursor as offset metadata."""
    checkpoint_due: float = 0.0
    pointer_dirty: bool = False

    def cursor(self) -> int:
        """The group offset to commit: below every unacked or pending offset."""
        lows = [self.deliver_pos]
        if self.unacked:
            lows.append(min(self.unacked))
        if self.handle is not None and (held := self.handle.lowest_held()) is not None:
            lows.append(held)
        return min(lows)


class Consumer:
    """Committed-only consumer; use ``client.subscribe(...)``."""

    def __init__(self, client: Client, topics: str | Sequence[str], subscription: str,
                 initial_position: str = "earliest",
                 max_buffered_bytes: int | None = None,
                 nack_delay_s: float = 1.0,
                 checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
                 abort_predecessor_txns: bool = False,
                 **kafka: object) -> None:
        if initial_position not in ("earliest", "latest"):
            raise ConfigError(f"initial_position must be 'earliest' or 'latest', "
                              f"got {initial_position!r}")
        if not subscription:
            raise ConfigError("subscription (the consumer group) must not be empty")
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.subscription = subscription
        self._client = client
        self._initial = initial_position
        del max_buffered_bytes  # accepted for compatibility: nothing is held any more
        self._nack_delay = nack_delay_s
        self._checkpoint_interval = checkpoint_interval_s
        self._abort_predecessors = bool(abort_predecessor_txns)
        """Abort at a takeover the OPEN txns of earlier owners that hold acks here (the
        exactly-once processor's txns live and die with its member). Off by default: a
        consumer's txn belongs to its client, which may still commit it after a
        rebalance (a pending ack survives an owner change, as in Pulsar)."""
        self._closed = False
        self._lock = threading.RLock()
        self._readers: dict[TopicPartition, _PartitionReader] = {}
        self._ready: deque[Message] = deque()
        self._nacked: list[tuple[float, int, Message]] = []
        self._nack_seq = 0
        self._last_commit = 0.0
        self.member_id = f"{subscription}-{uuid.uuid4().hex[:8]}"
        self._acks = PendingAckStore(client.config, subscription, self.member_id)
        self._follower = BufferStateFollower(client.config, name=self.member_id)
        self._txn_ids: dict[bytes, TxnID] = {}
        self._txns: dict[TxnID, Transaction] = {}
        """Txns that acked through this consumer, until they end (bounded by txns in
        flight: ended ones are dropped at their mark or at their local end)."""
        self._txn_tps: dict[TxnID, set[TopicPartition]] = {}
        self._owned: set[TopicPartition] = set()
        """Partitions the group assigns to this member (whether or not claimed yet)."""
        self._retake: dict[TopicPartition, float] = {}
        """Owned partitions to (re)claim, with when: failed takeovers and fenced ones."""
        self._kafka = KafkaConsumer(client.config.consumer(
            subscription, **{"auto.offset.reset": initial_position,
                             "partition.assignment.strategy": "cooperative-sticky",
                             "fetch.wait.max.ms": DATA_FETCH_WAIT_MS}, **kafka))
        self._kafka.subscribe(self.topics, on_assign=self._on_assign,
                              on_revoke=self._on_revoke, on_lost=self._on_lost)

    # ------------------------------------------------------------ assignment

    def _on_assign(self, consumer: KafkaConsumer, parts: list[KafkaTP]) -> None:
        # A rebalance callback must never raise (it would surface from poll() and end the
        # caller): a takeover that fails is retried from receive(). librdkafka's
        # assignment always equals the group's (a partition not taken yet, or fenced,
        # stays assigned but paused), else its automatic unassign on the next revoke
        # fails inside poll().
        ready, waiting = [], []
        for p in parts:
            tp = TopicPartition(p.topic, p.partition)
            with self._lock:
                self._owned.add(tp)
            try:
                ready.append(self._take(tp))
            except (TxnStreamError, KafkaException) as exc:
                log.warning("%s: cannot take %s yet (%s); retrying in %.0fs", self.member_id,
                            tp, exc, CLAIM_RETRY_S)
                waiting.append(KafkaTP(p.topic, p.partition))
                with self._lock:
                    self._retake[tp] = time.monotonic() + CLAIM_RETRY_S
        consumer.incremental_assign([*ready, *waiting])
        if ready:  # a partition paused (not taken, fenced) before a revoke stays paused
            consumer.resume(ready)
        if waiting:
            consumer.pause(waiting)

    def _take(self, tp: TopicPartition) -> KafkaTP:
        """Become the owner of ``tp``: replay its pending acks, claim it.

        Returns where to start fetching (the caller assigns it). Nothing is delivered
        before the claim's OWNER record is in the log and every record before it is
        folded (a zombie's late ack included).
        """
        timeout = self._client.config.admin_timeout_s
        ktp = KafkaTP(tp.topic, tp.partition)
        found = self._kafka.committed([ktp], timeout=timeout)[0]
        committed = found.offset
        pointer = Checkpointed.from_metadata(found.metadata)
        with self._lock:
            status = self._follower.follow(tp)
        low, high = self._kafka.get_watermark_offsets(ktp, timeout=timeout)
        if committed >= 0:
            start = committed
        elif self._initial == "earliest":
            start = low
        else:  # latest: the committed end (Kafka's LSO) as of now
            start = high
            if status is not ServeStatus.PLAIN:
                start = self._committed_end(tp, high, low, timeout)
        # Rebuild the pending acks before delivering anything, then claim the partition.
        handle = self._acks.replay(tp, pointer)
        start = max(start, handle.cursor, low)
        owner_at = self._acks.claim(handle, cursor=start)
        self._end_predecessors(tp, handle)
        reader = _PartitionReader(tp, self._follower.status.get(tp, status), deliver_pos=start,
                                  committed=committed, handle=handle, checkpoint=pointer)
        with self._lock:
            self._readers[tp] = reader
            self._retake.pop(tp, None)
            # The tail passes what follows the OWNER to this reader from now on: under
            # the consumer lock, as every reader of the tail runs.
            self._acks.resume_tail(tp, owner_at + 1)
        return KafkaTP(tp.topic, tp.partition, start)

    def _end_predecessors(self, tp: TopicPartition, handle: PendingAckHandle) -> None:
        """After a claim, end at once the txns of fenced owners that hold acks on ``tp``.

        (Step 1, the abort of an OPEN txn, only with ``abort_predecessor_txns``: the
        exactly-once processor's setting.)

        Every txn pending in ``handle`` now acked under an older generation than this
        claim's OWNER: its member is fenced (it can only abort: its read-back meets this
        OWNER) or dead. Waiting for its timeout would hold those inputs back while later
        ones are processed (input order broken, a stall of the txn timeout); Kafka's
        ``initTransactions`` aborts a predecessor's txn at once, and so does this. Per
        txn, before anything of ``tp`` is delivered:

        1. an OPEN txn is aborted through its coordinator (``admin.abort_transaction``;
           the reply comes once its ABORT marks are written) and its acks are dropped
           here, so its inputs are delivered first, in offset order;
        2. an ended txn (a late ack of it outlived ``CHECKPOINT_ENDED_MAX``, or its mark
           is still on the way) gets its outcome applied; one the coordinator no longer
           knows ended long ago: its acks here are late ones and are dropped;
        3. a COMMITTING/ABORTING txn is left to its mark (the coordinator is ending it).

        The abort is authorized like any other: the principal that opened the txn or an
        admin. A member whose principal differs (and is no admin) gets
        ``NotAuthorizedError``: it logs a warning and the txn ends at its timeout, as
        before. Any other failure (a coordinator not answering) falls back the same way;
        nothing here raises.
        """
        admin = self._client.admin
        for txn_id in sorted(handle.pending_txns()):
            try:
                info = admin.get_transaction(txn_id)
                if info.status is TxnStatus.OPEN and not self._abort_predecessors:
                    continue  # its client may still commit it: its acks stay pending
                if info.status is TxnStatus.OPEN:
                    log.warning("%s: %s is held by %s of a fenced or dead owner; aborting it",
                                self.member_id, tp, txn_id)
                    info = admin.abort_transaction(txn_id)
            except TransactionNotFoundError:
                handle.abort(txn_id)
                continue
            except NotAuthorizedError as exc:
                log.warning("%s: %s holds acks on %s but this member may not abort it (%s); "
                            "its inputs wait for its timeout", self.member_id, txn_id, tp, exc)
                continue
            except TxnStreamError as exc:
                log.warning("%s: could not end %s, which holds acks on %s (%s); its inputs "
                            "wait for its end", self.member_id, txn_id, tp, exc)
                continue
            if info.status is TxnStatus.ABORTED:
                handle.abort(txn_id)
            elif info.status is TxnStatus.COMMITTED:
                handle.commit(txn_id)

    def _committed_end(self, tp: TopicPartition, high: int, low: int, timeout_s: float) -> int:
        """Where ``latest`` starts on a served partition: the committed end as of now.

        That is its max read position + 1 once the owner has folded up to ``high``
        (records before it may belong to a txn still open, which ``high`` itself would
        skip). An owner that does not get there in ``timeout_s`` leaves the served
        position so far (a warning says so).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                self._follower.catch_up([tp], timeout_s=max(0.1, deadline - time.monotonic()))
                view = self._follower.views.get(tp)
            if view is not None and view.position >= high - 1:
                return min(high, view.max_read_position + 1)
            if time.monotonic() >= deadline:
                at = view.max_read_position + 1 if view is not None else low
                log.warning("%s: the buffer owner of %s has not folded to its end (%d) in "
                            "%.0fs; 'latest' starts at the served position %d", self.member_id,
                            tp, high, timeout_s, at)
                return max(low, at)
            time.sleep(0.05)

    def _on_revoke(self, consumer: KafkaConsumer, parts: list[KafkaTP]) -> None:
        """A clean revoke: our acks are made durable and the cursor committed first."""
        self._acks.flush()  # acks land before the next owner's OWNER: they stay valid
        with self._lock:
            self._commit(force=True)
        self._release_partitions(consumer, parts, lost=False)

    def _on_lost(self, consumer: KafkaConsumer, parts: list[KafkaTP]) -> None:
        """Lost (the session timed out, e.g. this process was paused past it).

        Another member may own these already, so nothing is committed for them, and our
        txns that acked on them can only abort (their acks may land after the new
        owner's OWNER).
        """
        self._release_partitions(consumer, parts, lost=True)

    def _release_partitions(self, consumer: KafkaConsumer, parts: list[KafkaTP],
                            lost: bool) -> None:
        tps = {TopicPartition(p.topic, p.partition) for p in parts}
        with self._lock:
            for tp in tps:
                self._owned.discard(tp)
                self._retake.pop(tp, None)
                self._drop_reader(tp, f"partition {'lost' if lost else 'revoked'}",
                                  fence_txns=lost)
        try:
            # librdkafka's assignment is the group's (see _on_assign), so these are all
            # assigned. Always called: a callback that calls no unassign makes the client
            # unassign by itself, and that error escapes poll() (or close()). Nothing
            # else is asked of the handle here: during close() it is being destroyed.
            consumer.incremental_unassign(parts)
        except KafkaException as exc:  # librdkafka already dropped them (lost)
            log.info("%s: unassign %s: %s", self.member_id, parts, exc)

    def _drop_reader(self, tp: TopicPartition, why: str, fence_txns: bool) -> None:
        """Stop delivering ``tp`` (consumer lock held); its undelivered messages go."""
        self._readers.pop(tp, None)
        self._follower.unfollow(tp)
        self._ready = deque(m for m in self._ready if m.tp != tp)
        self._nacked = [n for n in self._nacked if n[2].tp != tp]
        heapq.heapify(self._nacked)
        if fence_txns:
            for txn_id, tps in self._txn_tps.items():
                txn = self._txns.get(txn_id)
                if tp in tps and txn is not None:
                    txn.mark_abort_only(TxnStreamError(
                        f"consumer {self.member_id} of {self.subscription!r} lost {tp} "
                        f"({why}) while {txn_id} held acks on it", txn_id))

    # ------------------------------------------------------------ reading

    def receive(self, timeout_s: float = 5.0) -> Message | None:
        """The next committed record, or None if none came within ``timeout_s``."""
        got = self.receive_batch(1, timeout_s)
        return got[0] if got else None

    def receive_batch(self, max_records: int = 1000, timeout_s: float = 5.0) -> list[Message]:
        """Up to ``max_records`` committed records (Pulsar's ``batchReceive``).

        Waits up to ``timeout_s`` for the first; returns what is ready then, in offset
        order per partition (at most ``max_records``); ``[]`` if nothing came.
        """
        if max_records < 1:
            raise ConfigError(f"max_records must be at least 1, got {max_records}")
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                out = self._take_ready(max_records)
                if out:
                    return out
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            self._pump(min(left, POLL_SLICE_S), max(max_records, 500))

    def receive_arrow(self, max_records: int = 10_000, timeout_s: float = 5.0) -> Any:
        """Up to ``max_records`` committed records as one Arrow ``RecordBatch``.

        The columns of :mod:`txnstream.arrow` (the Spark source's); ``None`` if nothing
        came within ``timeout_s``. Acknowledge the rows with :meth:`acknowledge_rows`.
        """
        from txnstream.arrow import to_record_batch

        msgs = self.receive_batch(max_records, timeout_s)
        return to_record_batch(msgs) if msgs else None

    def acknowledge_rows(self, batch: Any, txn: Transaction | None = None) -> None:
        """Ack every row of a batch from :meth:`receive_arrow` (individually, in ``txn``)."""
        topics = batch.column("topic").to_pylist()
        parts = batch.column("partition").to_pylist()
        offsets = batch.column("offset").to_pylist()
        for topic, part, off in zip(topics, parts, offsets, strict=True):
            with self._lock:
                r = self._readers.get(TopicPartition(topic, part))
                msg = None if r is None else (r.unacked.get(off) or r.inflight.get(off))
            if msg is None:
                raise TxnStreamError(f"cannot ack {topic}-{part}@{off}: not a message "
                                     f"delivered to this consumer of {self.subscription!r} "
                                     "and still unacked")
            self.acknowledge(msg, txn)

    def _take_ready(self, n: int) -> list[Message]:
        out: list[Message] = []
        nacked, now = self._nacked, time.monotonic()
        while nacked and nacked[0][0] <= now and len(out) < n:
            out.append(heapq.heappop(nacked)[2])
        ready = self._ready
        if len(out) + len(ready) <= n:
            out.extend(ready)
            ready.clear()
        else:
            while ready and len(out) < n:
                out.append(ready.popleft())
        return out

    def _pump(self, timeout_s: float, max_records: int) -> None:
        """One round: served state first, then records; acks' marks; the cursor."""
        self._retake_due()
        with self._lock:
            readers = list(self._readers.values())
        blocked = bool(readers) and all(r.wait_at is not None or r.status is ServeStatus.WAITING
                                        for r in readers)
        # Waiting on served state only: block on it (a commit shows up as a delta).
        moved = self._follower.poll(timeout_s if blocked else 0.0)
        with self._lock:
            self._unblock(moved)
        batch = drain(self._kafka, max_records, 0.0 if blocked else timeout_s)
        with self._lock:
            self._ingest_batch(batch)
            self._apply_marks()
            self._commit()
            for r in self._readers.values():
                view = self._follower.views.get(r.tp)
                if view is not None:  # below the cursor nothing is asked again
                    view.trim(min(r.cursor(), r.deliver_pos))

    def _unblock(self, moved: set[TopicPartition]) -> None:
        """Resume partitions whose served max read position reached where they wait."""
        for r in self._readers.values():
            if r.status is ServeStatus.WAITING:
                r.status = self._follower.status.get(r.tp, ServeStatus.WAITING)
            if r.wait_at is None or (r.tp not in moved and r.status is not ServeStatus.SERVED):
                continue
            view = self._follower.views.get(r.tp)
            if view is not None and view.max_read_position >= r.wait_at:
                # Seek again after the resume: a resumed partition alone is fetched again
                # only at librdkafka's next periodic fetch decision (~1 s later).
                ktp = KafkaTP(r.tp.topic, r.tp.partition, r.wait_at)
                try:
                    self._kafka.resume([ktp])
                    self._kafka.seek(ktp)
                except KafkaException as exc:
                    log.warning("%s: resume %s: %s", self.member_id, r.tp, exc)
                    continue
                r.wait_at = None

    def _wait_at(self, r: _PartitionReader, offset: int) -> None:
        """Stop fetching ``r`` at ``offset`` until the served state covers it.

        The rest of the current fetch batch for it is ignored (``wait_at`` is set); the
        seek makes the fetcher drop what it prefetched beyond.
        """
        r.wait_at = offset
        ktp = KafkaTP(r.tp.topic, r.tp.partition, offset)
        try:
            self._kafka.pause([ktp])
            self._kafka.seek(ktp)
        except KafkaException as exc:
            log.warning("%s: pause %s at %d: %s", self.member_id, r.tp, offset, exc)

    def buffer_status(self) -> dict[TopicPartition, tuple[str, float | None]]:
        """Per assigned partition: plain, waiting (and for how long, s) or served."""
        with self._lock:
            return {tp: (r.status.value, self._follower.waiting_for(tp))
                    for tp, r in self._readers.items()}

    def _retake_due(self) -> None:
        """(Re)claim owned partitions whose takeover failed or whose claim was fenced."""
        if not self._retake:
            return
        now = time.monotonic()
        with self._lock:
            due = [tp for tp, at in self._retake.items() if at <= now and tp in self._owned]
            for tp in due:
                self._retake[tp] = now + CLAIM_RETRY_S  # until _take succeeds
        for tp in due:
            try:
                start = self._take(tp)
            except (TxnStreamError, KafkaException) as exc:
                log.warning("%s: cannot take %s yet (%s)", self.member_id, tp, exc)
                continue
            # It is in librdkafka's assignment, paused: assign it again at the start.
            with self._lock:
                if tp not in self._owned:  # revoked meanwhile (inside a poll)
                    self._readers.pop(tp, None)
                    continue
                try:
                    self._kafka.incremental_unassign([KafkaTP(tp.topic, tp.partition)])
                    self._kafka.incremental_assign([start])
                    self._kafka.resume([start])  # a partition's pause outlives unassign
                    log.warning("%s: took %s again", self.member_id, tp)
                except KafkaException as exc:
                    log.warning("%s: cannot assign %s again (%s)", self.member_id, tp, exc)
                    self._readers.pop(tp, None)
                    self._retake[tp] = time.monotonic() + CLAIM_RETRY_S
                    self._keep_assigned_paused(tp)

    def _keep_assigned_paused(self, tp: TopicPartition) -> None:
        """Put ``tp`` back in librdkafka's assignment, paused (it is the group's)."""
        ktp = KafkaTP(tp.topic, tp.partition)
        try:
            if (tp.topic, tp.partition) not in {(p.topic, p.partition)
                                                for p in self._kafka.assignment()}:
                self._kafka.incremental_assign([ktp])
            self._kafka.pause([ktp])
        except KafkaException as exc:
            log.warning("%s: cannot keep %s assigned (%s)", self.member_id, tp, exc)

    def _ingest_batch(self, batch: list[KafkaRecord]) -> None:
        """Deliver what the served state says is committed; wait at the first that is not.

        The hot path of every reader: per run of one partition's records, the reader,
        its view and its pending-ack state are looked up once; per record, a few
        comparisons and the :class:`Message` (the same object a hand-written
        ``read_committed`` loop builds). Records of a partition after the one it waits at
        are ignored (the seek fetches them again).
        """
        ready, unacked_of, views = self._ready, None, self._follower.views
        ids = self._txn_ids
        key: tuple[str, int] | None = None
        r: _PartitionReader | None = None
        view = None
        quiet = False
        for m in batch:
            if m.error() is not None:
                message_error(m, f"consumer {self.subscription}", log)
                continue
            topic, part = m.topic(), m.partition()
            if (topic, part) != key:
                key = (topic, part)
                r = self._readers.get(TopicPartition(topic, part))
                view = views.get(r.tp) if r is not None else None
                h = r.handle if r is not None else None
                # no pending or individual acks here: every record at or above the cursor
                # is deliverable, without asking the handle per record
                quiet = h is None or (not h.pending and h.cumulative is None and not h.acked)
                unacked_of = r.unacked if r is not None else None
            if r is None or r.wait_at is not None:
                continue
            off = m.offset()
            if off < r.deliver_pos:
                continue
            txn_raw = None
            marker = False
            user: list[tuple[str, bytes]] = []
            for k, v in m.headers() or ():
                if k == TXN_ID_HEADER:
                    txn_raw = v
                elif k == TXN_MARKER_HEADER:
                    marker = True
                else:
                    user.append((k, v))
            if r.status is ServeStatus.PLAIN:
                if txn_raw is None and not marker:
                    r.deliver_pos = off + 1
                    self._queue(r, Message(topic, part, off, m.key(), m.value(), tuple(user),
                                           m.timestamp()[1], None))
                    continue
                # The partition's first txn record: it is transactional from here on.
                log.info("%s: %s has txn records from offset %d on: reading served state",
                         self.member_id, r.tp, off)
                self._follower.unfollow(r.tp)
                r.status = self._follower.follow(r.tp, plain_ok=False)
                view = views.get(r.tp)
            if view is None or off > view.max_read_position:
                self._wait_at(r, off)
                continue
            r.deliver_pos = off + 1
            if marker or not view.visible(off, txn_raw):
                continue
            txn_id = None
            if txn_raw is not None:
                txn_id = ids.get(txn_raw)
                if txn_id is None:
                    try:
                        txn_id = TxnID.from_bytes(txn_raw)
                    except ValueError:
                        continue  # the fold hid it too; never delivered
                    if len(ids) >= TXN_ID_CACHE:
                        ids.clear()
                    ids[txn_raw] = txn_id
            msg = Message(topic, part, off, m.key(), m.value(), tuple(user), m.timestamp()[1],
                          txn_id)
            if quiet and (r.handle is None or off >= r.handle.cursor):
                ready.append(msg)
                assert unacked_of is not None
                unacked_of[off] = msg  # queued counts as unacked: the cursor stays below it
            else:
                self._queue(r, msg)

    def _queue(self, r: _PartitionReader, msg: Message) -> None:
        off = msg.offset
        if r.handle is not None and r.handle.pending_txn(off) is not None:
            r.held_back[off] = msg  # acked in an open txn: wait for its outcome
        elif r.handle is None or r.handle.is_deliverable(off):
            self._ready.append(msg)
            r.unacked[off] = msg  # queued counts as unacked: the cursor stays below it

    # ------------------------------------------------------------ acks

    def acknowledge(self, msg: Message, txn: Transaction | None = None) -> None:
        """Ack one record; with ``txn`` the ack takes effect only if ``txn`` commits.

        A transactional ack is logged to the pending-ack log before ``txn`` can commit;
        a conflict (another txn, or a plain ack, touching the same message) raises
        ``TransactionConflictError`` and makes ``txn`` abort-only.
        """
        self._ack([msg], txn, cumulative=False)

    def acknowledge_cumulative(self, msg: Message, txn: Transaction | None = None) -> None:
        """Ack every delivered record of the partition up to and including ``msg``."""
        self._ack([msg], txn, cumulative=True)

    def cumulative_coverage(self, msg: Message) -> list[int]:
        """The offsets ``acknowledge_cumulative(msg)`` would ack now.

        Every unacked one of ``msg``'s partition up to it, including messages queued for
        redelivery (after an abort) and not received again yet. A processor that
        cumulatively acks a batch checks they are all its own inputs first.
        """
        with self._lock:
            r = self._reader_for(msg)
            return sorted(o for o in r.unacked if o <= msg.offset)

    def acknowledge_batch(self, msgs: Sequence[Message], txn: Transaction | None = None
                          ) -> None:
        """Ack exactly ``msgs``: one pending-ack record per partition, not one per record.

        Per partition (as Kafka's ``send_offsets_to_transaction`` commits one offset):
        a cumulative ack of its last record where that acks the same records, i.e. they
        are every delivered and unacked record of the partition up to it and no other
        txn holds an ack below it; else one individual ack listing their offsets (out
        of order, with gaps). Each partition's ack is all or nothing; a failure raises
        (a txn becomes abort-only) and leaves the later partitions unacked.
        """
        by_tp: dict[TopicPartition, list[Message]] = {}
        for m in msgs:
            by_tp.setdefault(m.tp, []).append(m)
        for tp_msgs in by_tp.values():
            tp_msgs.sort(key=lambda m: m.offset)
            self._ack(tp_msgs, txn, cumulative=None)

    def redeliver_unacknowledged(self, msgs: Sequence[Message] | None = None) -> int:
        """Deliver again, at once, records taken and not acked (``msgs``, or all).

        Pulsar's ``redeliverUnacknowledgedMessages``: what a caller took but will not
        ack (its batch aborted before the acks) comes back in offset order, ahead of
        later records. A record acked in a txn is not: the txn's abort redelivers it, its
        commit acks it. A partition no longer assigned here is skipped: its next owner
        starts at the committed cursor, which stays below every unacked record. Returns
        how many records were queued again.
        """
        with self._lock:
            def key(m: Message) -> tuple[str, int, int]:
                return (m.topic, m.partition, m.offset)

            waiting = {key(m) for m in self._ready} | {key(n[2]) for n in self._nacked}
            if msgs is None:
                found = [m for r in self._readers.values() for m in r.unacked.values()]
            else:
                found = []
                for m in msgs:
                    r = self._readers.get(m.tp)
                    if r is not None and (mine := r.unacked.get(m.offset)) is not None:
                        found.append(mine)
            back = {key(m): m for m in found if key(m) not in waiting}
            if back:
                self._ready = deque(sorted([*self._ready, *back.values()], key=key))
            return len(back)

    def _ack(self, msgs: list[Message], txn: Transaction | None,
             cumulative: bool | None) -> None:
        """Ack ``msgs`` (one partition, in offset order) with one pending-ack record.

        ``cumulative``: everything up to the last one; False: exactly these; None:
        cumulative where that acks exactly these (:meth:`acknowledge_batch`).
        """
        msg = msgs[-1]
        with self._lock:
            r = self._reader_for(msg)
            # Never delivered: beyond what was released, or not a visible record there.
            # (An already acked one is the handle's call: a conflict in a txn, else a no-op.)
            for m in msgs:
                if m.offset >= r.deliver_pos or not self._was_visible(r, m):
                    raise TxnStreamError(
                        f"cannot ack {m.tp}@{m.offset}: not a message delivered to this "
                        f"consumer of {self.subscription!r}")
        if txn is not None:
            txn.register_subscriptions([SubscriptionRef(msg.topic, msg.partition,
                                                        self.subscription)])
        with self._lock:
            r = self._reader_for(msg)  # may have been revoked while registering
            assert r.handle is not None
            txn_id = txn.id if txn else None
            offsets = sorted({m.offset for m in msgs})
            if cumulative is None:
                cumulative = self._cumulative_is_exact(r, offsets, txn_id)
            covered = sorted(o for o in r.unacked if o <= msg.offset) if cumulative else offsets
            try:
                if cumulative:
                    r.handle.ack_cumulative(msg.offset, txn_id)
                else:
                    r.handle.ack_individual(offsets, txn_id)
            except TxnStreamError as exc:
                if txn is not None:
                    txn.mark_abort_only(exc)
                raise
            if txn is not None:
                kind, logged = ((PendingAckKind.ACK_CUMULATIVE, (msg.offset,)) if cumulative
                                else (PendingAckKind.ACK_INDIVIDUAL, tuple(offsets)))
                self._acks.append(PendingAckEntry(
                    kind, self.subscription, msg.topic, msg.partition, txn.id, logged,
                    r.handle.generation, self.member_id))
                self._txn_tps.setdefault(txn.id, set()).add(msg.tp)
                if txn.id not in self._txns:
                    self._txns[txn.id] = txn
                    txn.add_flusher(partial(self._confirm_acks, txn.id), key=self)
                    txn.add_end_listener(partial(self._on_txn_end, txn.id), key=self)
                for o in covered:
                    if o in r.unacked:
                        r.inflight[o] = r.unacked.pop(o)
            else:
                above = [] if cumulative else [o for o in offsets if o >= r.handle.cursor]
                if above:
                    # Above the cursor: the group offset cannot say it; the log keeps it.
                    self._acks.append_plain(PendingAckEntry(
                        PendingAckKind.ACK_INDIVIDUAL, self.subscription, msg.topic,
                        msg.partition, None, tuple(above), r.handle.generation,
                        self.member_id))
                for o in covered:
                    r.unacked.pop(o, None)
            self._commit()

    @staticmethod
    def _cumulative_is_exact(r: _PartitionReader, offsets: list[int],
                             txn_id: TxnID | None) -> bool:
        """Whether a cumulative ack of ``offsets[-1]`` acks exactly ``offsets`` now.

        It does if no other delivered record below it is unacked (queued, nacked or
        redelivered after an abort), none is held back or pending in another txn, and
        no other txn's cumulative ack is pending (consumer lock held). Records below
        it that are acked already, or invisible (markers, aborted), change nothing.
        """
        h = r.handle
        assert h is not None
        last = offsets[-1]
        if last < h.cursor or (h.cumulative is not None and h.cumulative[0] != txn_id):
            return False
        mine = set(offsets)
        return (all(o in mine for o in r.unacked if o <= last)
                and not any(o <= last for o in r.held_back)
                and not any(o <= last and t != txn_id for o, t in h.pending.items()))

    def _was_visible(self, r: _PartitionReader, msg: Message) -> bool:
        view = self._follower.views.get(r.tp)
        if view is None or msg.offset < view.trimmed_below:
            return True  # plain, or below the cursor (the handle decides)
        return view.visible(msg.offset, msg.txn_id.to_bytes() if msg.txn_id else None)

    def _confirm_acks(self, txn_id: TxnID) -> None:
        """Before ``txn_id`` commits: its ack records are durable and were read back.

        Reading them back passes every record before them; a newer OWNER among those
        fences this member and makes the txn abort-only (its commit then aborts), the
        same read-back rule the coordinator applies to its own log.
        """
        self._acks.flush_txn(txn_id)
        if self._closed:
            if not self._acks.read_back(txn_id):
                raise TxnStreamError(f"acks of {txn_id} cannot be confirmed: the consumer "
                                     f"of {self.subscription!r} that made them is closed",
                                     txn_id)
            return  # confirmed before the close: the next owner knows them
        deadline = time.monotonic() + READ_BACK_TIMEOUT_S
        while not self._acks.read_back(txn_id):
            if time.monotonic() > deadline:
                raise TxnStreamError(f"acks of {txn_id} were not read back in "
                                     f"{READ_BACK_TIMEOUT_S:.0f}s", txn_id)
            with self._lock:
                self._apply_marks()
            time.sleep(0.002)
        with self._lock:
            self._apply_marks()
        self._acks.confirmed(txn_id)

    def _on_txn_end(self, txn_id: TxnID, committed: bool) -> None:
        """The coordinator confirmed ``txn_id``'s end, after writing its marks.

        Applied now, so the next ack or receive sees it; the mark read later is a no-op.
        """
        with self._lock:
            for tp in self._txn_tps.get(txn_id, ()):
                self._end_acks(tp, txn_id, committed)
            self._forget_txn(txn_id)

    def _forget_txn(self, txn_id: TxnID) -> None:
        self._txns.pop(txn_id, None)
        self._txn_tps.pop(txn_id, None)
        self._acks.forget(txn_id)

    def _end_acks(self, tp: TopicPartition, txn_id: TxnID, committed: bool) -> None:
        """Apply ``txn_id``'s outcome to the acks it holds on ``tp`` (idempotent)."""
        r = self._readers.get(tp)
        if r is None or r.handle is None:
            return
        if committed:
            eff = r.handle.commit(txn_id)
            for o in [o for o in r.inflight if o < eff.cursor or o in eff.acked
                      or o in r.handle.acked]:
                del r.inflight[o]
            for o in [o for o in r.held_back if not r.handle.is_deliverable(o)
                      and r.handle.pending_txn(o) is None]:
                del r.held_back[o]
            return
        eff = r.handle.abort(txn_id)
        back = []
        for o in eff.redeliver:
            m = r.inflight.pop(o, None) or r.held_back.pop(o, None)
            if m is not None:
                back.append(m)
                r.unacked[o] = m
        if back:
            # Redelivered in offset order, ahead of later records not yet received
            # (Pulsar redelivers 0, 1, 2 before 3, 4).
            self._ready = deque(sorted([*self._ready, *back],
                                       key=lambda m: (m.topic, m.partition, m.offset)))

    def _apply_marks(self) -> None:
        """Coordinator marks end pending acks; a newer OWNER fences this member."""
        for e in self._acks.poll_marks():
            if e.kind is PendingAckKind.OWNER:
                if e.member_id != self.member_id:
                    self._fenced(e)
                continue
            if e.txn_id is None or e.kind not in (PendingAckKind.COMMIT_MARK,
                                                  PendingAckKind.ABORT_MARK):
                continue
            self._end_acks(e.tp, e.txn_id, e.kind is PendingAckKind.COMMIT_MARK)
            tps = self._txn_tps.get(e.txn_id)
            if tps is not None:
                tps.discard(e.tp)
                if not tps:
                    self._forget_txn(e.txn_id)

    def _fenced(self, owner: PendingAckEntry) -> None:
        """Another member claimed ``owner.tp``: our txns that acked there can only abort.

        That is every txn with an individual or a cumulative pending ack there, or acks
        not yet read back; this member stops delivering the partition. If the group
        still assigns the partition here after :data:`RETAKE_AFTER_S`, it is replayed
        and claimed again (the other claim was a zombie's); a revoke cancels that.
        """
        tp = owner.tp
        r = self._readers.get(tp)
        mine = r is not None and r.handle is not None and owner.generation > r.handle.generation
        for txn_id, tps in self._txn_tps.items():
            txn = self._txns.get(txn_id)
            if tp in tps and txn is not None and (mine or r is None):
                txn.mark_abort_only(TxnStreamError(
                    f"consumer lost {tp} to a newer owner {owner.member_id} "
                    f"(generation {owner.generation})", txn_id))
        if not mine:
            return
        log.warning("%s: fenced on %s by %s (generation %d)", self.member_id, tp,
                    owner.member_id, owner.generation)
        self._drop_reader(tp, "fenced", fence_txns=False)
        try:  # stays in librdkafka's assignment (it is the group's), paused
            self._kafka.pause([KafkaTP(tp.topic, tp.partition)])
        except KafkaException as exc:
            log.debug("pause %s: %s", tp, exc)
        if tp in self._owned:
            self._retake[tp] = time.monotonic() + RETAKE_AFTER_S

    def negative_acknowledge(self, msg: Message) -> None:
        """Redeliver ``msg`` after the nack delay."""
        with self._lock:
            self._reader_for(msg)
            self._nack_seq += 1
            heapq.heappush(self._nacked, (time.monotonic() + self._nack_delay, self._nack_seq,
                                          msg))

    def _reader_for(self, msg: Message) -> _PartitionReader:
        r = self._readers.get(msg.tp)
        if r is None:
            raise TxnStreamError(
                f"cannot ack {msg.tp}@{msg.offset}: partition {msg.tp} is not assigned to this "
                f"consumer of subscription {self.subscription!r} (rebalanced away?)")
        return r

    def _commit(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_commit < COMMIT_INTERVAL_S:
            return
        offsets = []
        for r in self._readers.values():
            c = r.cursor()
            self._maybe_checkpoint(r, now)
            if c > r.committed or r.pointer_dirty:
                offsets.append((r, c))
        self._last_commit = now
        if not offsets:
            return
        try:
            tps = [KafkaTP(r.tp.topic, r.tp.partition, max(c, r.committed),
                           metadata=r.checkpoint.to_metadata() if r.checkpoint else None)
                   for r, c in offsets]
            if force:
                self._kafka.commit(offsets=tps, asynchronous=False)
            else:
                self._kafka.commit(offsets=tps, asynchronous=True)
        except KafkaException as exc:
            # The group moved on (member unknown, rebalance in progress): the next owner
            # starts from the last committed cursor and the pending-ack log, so nothing
            # is lost; a fatal error still surfaces.
            if classify_kafka_error(exc) is KafkaErrorKind.FATAL and exc.args[0].fatal():
                raise
            log.warning("%s: cursor commit failed (%s); the next commit retries",
                        self.member_id, exc)
            return
        for r, c in offsets:
            r.committed = max(c, r.committed)
            r.pointer_dirty = False

    def _maybe_checkpoint(self, r: _PartitionReader, now: float) -> None:
        """Checkpoint ``r``'s pending acks when due (consumer lock held).

        Under the lock the handle reflects every record the tail has read (each
        ``poll_marks`` batch is applied in the same locked call), so the tail position
        is the checkpoint's replay position.
        """
        if r.handle is None or now < r.checkpoint_due:
            return
        r.checkpoint_due = now + self._checkpoint_interval
        position = self._acks.tail_position(r.tp)
        if position < 0 or (r.checkpoint is not None and r.checkpoint.position >= position):
            return  # nothing new in the log since the last one
        done = self._acks.checkpoint(r.handle, position)
        if done is not None:
            r.checkpoint = done
            r.pointer_dirty = True

    def close(self) -> None:
        """Commit the cursor and leave the group."""
        with self._lock:
            self._commit(force=True)
            self._closed = True
        try:
            self._kafka.close()
        except KafkaException as exc:  # the group is gone already: nothing left to leave
            log.info("%s: close: %s", self.member_id, exc)
        self._acks.close()
        self._follower.close()

    def pending_ack_stats(self, tp: TopicPartition) -> PendingAckStats:
        """The pending-ack state of one owned partition."""
        r = self._readers.get(tp)
        if r is None or r.handle is None:
            raise TxnStreamError(f"{tp} is not assigned to this consumer")
        return r.handle.stats()

