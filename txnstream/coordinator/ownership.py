"""``TcOwnership``: which TCs a worker serves, each as one incarnation rebuilt from its log.

Ownership is the assignment of log partitions (:meth:`TransactionLog.subscribe`; for
Kafka the ``<prefix>-coordinators`` consumer group over ``__txn_log``): the member
assigned partition ``p`` is TC ``p`` (DESIGN.md section 5). Pulsar's
``TransactionMetadataStoreService`` opens and removes a broker's stores the same way
(``handleTcClientConnect`` / ``removeTransactionMetadataStore``). An assigned TC goes
through three phases (:class:`TcPhase`):

1. **REPLAYING.** A new incarnation (:class:`TcIncarnation`) reads its log from the
   start into a fresh :class:`TransactionMetadataStore`, up to the end it saw when taken.
2. **EPOCH_PENDING.** At the end of the replay it appends a takeover ``EPOCH`` record.
3. **SERVING** once it reads that record back (the worker then publishes where it serves).
   Any later foreign ``EPOCH`` (a newer owner after a rebalance this worker missed, e.g.
   it was SIGSTOPped) fences it: it is dropped at once, with every reply it still held.

**A failed append** (delivery error, flush timeout, the log refusing the record) means
the incarnation's store may be ahead of the log. :meth:`TcOwnership.restart` drops that
incarnation at once with every reply it held, whichever step found out, and replays the
TC from its log after a backoff that doubles with each failure in a row
(:data:`RESTART_BACKOFF_FIRST_S` .. :data:`RESTART_BACKOFF_MAX_S`), so a log that keeps
refusing never becomes a tight restart loop. A revoked partition is dropped the same way,
and its backoff forgotten.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException

from txnstream import metrics
from txnstream.coordinator.log_entry import TransactionLogEntry
from txnstream.coordinator.metadata_store import TransactionMetadataStore
from txnstream.coordinator.protocol import TcReply, TcRequest
from txnstream.coordinator.txn_log import LogRecord, TransactionLog
from txnstream.errors import CorruptRecordError

__all__ = [
    "RESTART_BACKOFF_FIRST_S",
    "RESTART_BACKOFF_MAX_S",
    "TcIncarnation",
    "TcOwnership",
    "TcPhase",
]

log = logging.getLogger(__name__)

RESTART_BACKOFF_FIRST_S = 0.2
"""Wait before replaying a TC whose append failed: long enough for a leader move or a
busy broker to pass, short against the client's 3 s resend."""
RESTART_BACKOFF_MAX_S = 30.0
"""Cap of the doubling wait: a log that keeps refusing appends (misconfigured topic,
lost ACLs) is retried twice a minute, with an error logged each time, instead of being
replayed in a tight loop."""


MAX_TXN_WATCHERS = 64
"""Connections told of one txn's end (its newest writers): a Spark batch's tasks each
write through their own; a writer past the bound learns its records' fate at its flush
or commit (:mod:`txnstream.fate`)."""


class TcPhase(enum.Enum):
    """Where an incarnation is between its assignment and serving."""

    REPLAYING = "replaying"
    EPOCH_PENDING = "epoch-pending"
    SERVING = "serving"


@dataclass(eq=False)  # an incarnation is itself: compared by identity, never by id
class TcIncarnation:
    """One incarnation of TC ``tc_id`` on this worker: from a replay until it is dropped.

    A restart makes a new object; whatever the old one planned (replies, waiters, retry
    times) dies with it.
    """

    tc_id: int
    store: TransactionMetadataStore
    replay_end: int
    phase: TcPhase = TcPhase.REPLAYING
    position: int = -1
    epoch_write: int | None = None
    end_waiters: dict[int, list[TcRequest]] = field(default_factory=lambda: defaultdict(list))
    group_waiters: list[tuple[TcRequest, set[int], TcReply]] = field(default_factory=list)
    retry_at: dict[int, tuple[float, int]] = field(default_factory=dict)
    next_checkpoint: float = 0.0
    truncate_pending: bool = False
    truncating: tuple[int, Future[Any]] | None = None
    """The truncation point asked of the log, and its answer to come (at most one)."""
    truncated_below: int = 0
    """The last truncation point the log confirmed to this incarnation."""
    last_error: Any = None
    """Why its last failed append failed (KafkaError, exception or "timeout")."""
    watchers: dict[int, dict[Any, None]] = field(default_factory=dict)
    """Txn sequence -> the connections that sent requests for it (NEW, ACTIVATE, ADD), in
    the order they last did, at most :data:`MAX_TXN_WATCHERS`: told at once when the txn
    ends, so its writers stop sending (:meth:`watch`). A connection whose END was
    answered is not (a txn with one writer sends no notice). Bounded by the live txns
    (dropped when a txn ends)."""
    late_aborts: list[tuple[Any, tuple[Any, ...]]] = field(default_factory=list)
    """(TxnID, partitions) an owner tried to register after its txn had ended: they get
    an ABORT marker, so records sent there never wait for one
    (:data:`~txnstream.coordinator.finalizer.MAX_LATE_ABORTS` at most)."""

    def watch(self, seq: int, conn: Any) -> None:
        """``conn`` wrote into txn ``seq``: tell it when the txn ends (its newest writers)."""
        conns = self.watchers.setdefault(seq, {})
        conns.pop(conn, None)
        conns[conn] = None
        if len(conns) > MAX_TXN_WATCHERS:  # the longest quiet one learns at its commit
            del conns[next(iter(conns))]


class TcOwnership:
    """The TCs this worker owns: their incarnations, replays, appends and restarts."""

    def __init__(self, txn_log: TransactionLog, log_topic: str, worker_id: str, *,
                 readback_timeout_s: float, checkpoint_interval_s: float,
                 on_serving: Callable[[TcIncarnation], None],
                 on_dropped: Callable[[int], None]) -> None:
        self.txn_log = txn_log
        self.log_topic = log_topic
        """Named in the log lines about a record."""
        self.worker_id = worker_id
        self.readback_timeout_s = readback_timeout_s
        """Longer than any healthy append; past it the TC is replayed again."""
        self.checkpoint_interval_s = checkpoint_interval_s
        self._on_serving = on_serving
        """Called when an incarnation starts serving (its EPOCH read back)."""
        self._on_dropped = on_dropped
        """Called with the TC id when an incarnation stops serving."""
        self.tcs: dict[int, TcIncarnation] = {}
        self._pending_assign: list[int] | None = None
        self._reseek: set[int] = set()
        self._retake_at: dict[int, float] = {}
        """TC id -> when to replay it again after a failed append (see :meth:`restart`)."""
        self._failures: dict[int, int] = defaultdict(int)
        """Failed appends in a row per TC id, for the restart backoff."""
        self.restarts: dict[int, int] = defaultdict(int)
        """Replays after a failure per TC id since this worker started (in STATS)."""

    # ------------------------------------------------------------ assignment

    def subscribe(self) -> None:
        """Join the owners of the log's partitions."""
        self.txn_log.subscribe(self._on_assign, self._on_revoke)

    def _on_assign(self, tc_ids: list[int]) -> None:
        self._pending_assign = (self._pending_assign or []) + tc_ids

    def _on_revoke(self, tc_ids: list[int]) -> None:
        gone = set(tc_ids)
        for tc_id in gone:
            tc = self.tcs.get(tc_id)
            if tc is not None:
                self.drop(tc, "partition revoked")
            self._retake_at.pop(tc_id, None)
            self._failures.pop(tc_id, None)
            self._reseek.discard(tc_id)
        if self._pending_assign:
            self._pending_assign = [t for t in self._pending_assign if t not in gone] or None

    def _take(self, tc_id: int) -> None:
        """Start replaying TC ``tc_id`` (a new incarnation) from its log start."""
        try:
            low, high = self.txn_log.watermarks(tc_id)
        except KafkaException as exc:
            # Still failing after retries (leader moving, broker busy): try again soon.
            log.warning("tc %d: cannot read log watermarks yet (%s); retrying", tc_id, exc)
            self._reseek.add(tc_id)  # records read meanwhile are skipped: replay again
            self._retake_at[tc_id] = time.monotonic() + RESTART_BACKOFF_FIRST_S
            return
        if tc_id in self._reseek:
            try:
                self.txn_log.seek(tc_id, low)
            except KafkaException as exc:
                log.warning("tc %d: cannot seek its log yet (%s); retrying", tc_id, exc)
                self._retake_at[tc_id] = time.monotonic() + RESTART_BACKOFF_FIRST_S
                return
            self._reseek.discard(tc_id)
        tc = TcIncarnation(tc_id, TransactionMetadataStore(tc_id, self.worker_id),
                           replay_end=high, position=low)
        self.tcs[tc_id] = tc
        log.info("tc %d: assigned to %s, replaying offsets %d..%d", tc_id, self.worker_id,
                 low, high)
        if low >= high:
            self._write_epoch(tc)

    def drop(self, tc: TcIncarnation, why: str) -> None:
        """Stop serving with this incarnation at once; the replies it held die with it."""
        if self.tcs.get(tc.tc_id) is not tc:
            return  # already dropped (a newer incarnation may serve the id)
        del self.tcs[tc.tc_id]
        metrics.TC_OWNERSHIP_CHANGES.labels("dropped").inc()
        self._on_dropped(tc.tc_id)
        level = logging.INFO if why == "worker stopping" else logging.WARNING
        log.log(level, "tc %d: %s stops serving (%s)", tc.tc_id, self.worker_id, why)

    def drop_all(self, why: str) -> None:
        """Drop every incarnation (the worker stops)."""
        for tc in list(self.tcs.values()):
            self.drop(tc, why)

    def restart(self, tc: TcIncarnation, why: str) -> None:
        """Drop this incarnation (its memory may be ahead of the log); replay it later.

        The replay starts after a backoff that doubles per failure in a row.
        Never re-enters an append (no recursion from a failing EPOCH write); safe to call
        from a delivery callback; a no-op for an incarnation already dropped.
        """
        if self.tcs.get(tc.tc_id) is not tc:
            return
        self.drop(tc, f"restarting from the log: {why}")
        self._failures[tc.tc_id] += 1
        self.restarts[tc.tc_id] += 1
        n = self._failures[tc.tc_id]
        delay = min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_FIRST_S * 2 ** (n - 1))
        self._reseek.add(tc.tc_id)
        self._retake_at[tc.tc_id] = time.monotonic() + delay
        log.warning("tc %d: replaying its log in %.1fs (failure %d in a row)", tc.tc_id,
                    delay, n)

    def appended(self, tc_ids: set[int]) -> None:
        """These TCs' appends read back: their failures in a row are over."""
        for tc_id in tc_ids:
            self._failures.pop(tc_id, None)

    def serving(self, tc: TcIncarnation) -> bool:
        """Whether this very incarnation still serves (not dropped, restarted, fenced)."""
        return self.tcs.get(tc.tc_id) is tc and tc.phase is TcPhase.SERVING

    def serving_ids(self) -> list[int]:
        """TC ids served right now.

        Asked from other threads: a copy of the TCs first (the loop adds and drops them).
        """
        return sorted(tc.tc_id for tc in list(self.tcs.values())
                      if tc.phase is TcPhase.SERVING)

    # ------------------------------------------------------------ replay and epoch

    def _write_epoch(self, tc: TcIncarnation) -> None:
        offsets = self.append(tc, [tc.store.epoch_entry()])
        if offsets is None:
            return
        tc.epoch_write = offsets[0]
        tc.phase = TcPhase.EPOCH_PENDING

    def _start_serving(self, tc: TcIncarnation) -> None:
        tc.store.own_epoch = tc.epoch_write
        tc.phase = TcPhase.SERVING
        tc.next_checkpoint = time.monotonic() + self.checkpoint_interval_s
        metrics.TC_OWNERSHIP_CHANGES.labels("serving").inc()
        self._on_serving(tc)

    def poll(self, timeout: float) -> None:
        """Tail the log: take what was assigned, fold what was read into its TC."""
        # Replays after a failed append first: their seek must precede the fetch.
        mono = time.monotonic()
        for tc_id, at in list(self._retake_at.items()):
            if at <= mono:
                del self._retake_at[tc_id]
                if tc_id not in self.tcs:  # else a new assignment replays it already
                    self._take(tc_id)
        records = self.txn_log.poll(timeout)
        if self._pending_assign:  # assigned during this poll, from the log start
            taken, self._pending_assign = self._pending_assign, None
            for tc_id in taken:
                self._retake_at.pop(tc_id, None)
                self._take(tc_id)
        for rec in records:
            tc = self.tcs.get(rec.tc_id)
            if tc is None:
                continue
            self._fold(tc, rec)

    def _fold(self, tc: TcIncarnation, rec: LogRecord) -> None:
        offset = rec.offset
        if offset < tc.position:
            return  # fetched before a seek back to the log start; it comes again in order
        tc.position = offset + 1
        try:
            entry = TransactionLogEntry.decode(rec.value)
        except CorruptRecordError as exc:
            metrics.INVALID_RECORDS.labels(str(tc.tc_id)).inc()
            log.error("tc %d: skipping corrupt record at %s[%d]@%d: %s", tc.tc_id,
                      self.log_topic, rec.tc_id, offset, exc)
        else:
            tc.store.replay(offset, entry, rec.timestamp_ms)
            if tc.store.fenced:
                self.drop(tc, f"fenced by a newer EPOCH at offset {offset} "
                              f"(owner {tc.store.epoch_owner})")
                return
            if tc.store.diverged:
                self.restart(tc, f"its own record at offset {offset} read back invalid")
                return
        if tc.phase is TcPhase.REPLAYING and tc.position >= tc.replay_end:
            self._write_epoch(tc)
        elif tc.phase is TcPhase.EPOCH_PENDING and offset == tc.epoch_write:
            self._start_serving(tc)

    # ------------------------------------------------------------ appends

    def append(self, tc: TcIncarnation, entries: Sequence[TransactionLogEntry],
               restart: bool = True) -> list[int] | None:
        """Append ``entries`` to TC's log and wait; their offsets, or None.

        On failure (``restart``, the default) the TC is restarted: its memory may hold
        what the log does not. Without ``restart`` only the failure is returned (for a
        record that changes no state, the checkpoint); its error is in ``tc.last_error``.
        """
        result = self.txn_log.append(tc.tc_id, entries)
        if not result.ok:
            tc.last_error = result.error
            if restart:
                log.error("tc %d: log append failed (%s); replaying it again", tc.tc_id,
                          result.error)
                self.restart(tc, "its log append failed")
            return None
        return list(result.offsets)

    def append_async(self, tc: TcIncarnation, entries: Sequence[TransactionLogEntry]) -> None:
        """Append records nobody waits on (COMMITTED/ABORTED) without waiting.

        If one is lost, the log still says COMMITTING/ABORTING while the memory of this
        incarnation says final: this incarnation (the very object, not whichever serves
        the id by the time the report comes) is restarted, and its replay finalizes the
        txn again (idempotently).
        """
        if not entries:
            return

        def lost(err: Any) -> None:
            log.error("tc %d: final record not appended (%s); replaying it again",
                      tc.tc_id, err)
            self.restart(tc, "a final record was not appended")

        self.txn_log.append_async(tc.tc_id, entries, lost)

    def truncate(self, tcs: Sequence[TcIncarnation], now_ms: int, retention_ms: int) -> None:
        """Drop the log prefix below each checkpointed TC's truncation point.

        Without waiting: Kafka answers a ``delete_records`` once every replica moved its
        log start (about 0.5 s with 3 replicas), and every TC of the worker waited for it
        when the loop did. A TC has at most one truncation asked; the ended txns below
        its point are forgotten when the log says it is done, if the incarnation that
        asked still serves. A point already reached is not asked again.
        """
        for tc in tcs:
            if tc.truncating is not None:
                point, fut = tc.truncating
                if not fut.done():
                    continue
                tc.truncating = None
                exc = fut.exception()
                if exc is not None:
                    log.warning("tc %d: truncation below %d failed: %s", tc.tc_id, point, exc)
                elif self.serving(tc):
                    tc.truncated_below = point
                    log.info("tc %d: log truncated below offset %d (%d ended txns forgotten)",
                             tc.tc_id, point, tc.store.forget_before(point))
            if not tc.truncate_pending or tc.truncating is not None or not self.serving(tc):
                continue
            tc.truncate_pending = False
            point = tc.store.truncation_point(now_ms, retention_ms)
            if point <= tc.truncated_below:
                continue
            try:
                tc.truncating = (point, self.txn_log.truncate(tc.tc_id, point))
            except Exception as exc:  # noqa: BLE001 - the log closed, or the client refused
                log.warning("tc %d: truncation below %d failed: %s", tc.tc_id, point, exc)

    def read_back(self, want: dict[int, tuple[TcIncarnation, int]]) -> set[int]:
        """Tail until each TC incarnation has read its offset back.

        Returns the ids of those that did and still serve. One that did not in time is
        restarted.
        """
        deadline = time.monotonic() + self.readback_timeout_s
        while True:
            waiting = [tc for tc, off in want.values()
                       if self.serving(tc) and tc.position <= off]
            if not waiting or time.monotonic() > deadline:
                break
            self.poll(0.01)
        ok = set()
        for tc, off in want.values():
            if not self.serving(tc):
                continue  # fenced or restarted meanwhile: its entries vouch for nothing
            if tc.position <= off:
                self.restart(tc, f"offset {off} not read back in time")
                continue
            ok.add(tc.tc_id)
        return ok
