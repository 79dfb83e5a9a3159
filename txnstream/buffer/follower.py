"""Readers of the served transaction buffer: :class:`BufferStateFollower`.

Where a partition's state lives (DESIGN.md section 6): its slot ``s`` is the partition
the snapshot topic puts the key ``topic-partition`` in (Java's murmur2); the buffer
state topic has as many partitions, and the owner of slot ``s`` writes the partition's
deltas to state partition ``s``. A reader of ``tp``:

1. scans snapshot partition ``s`` (compacted, short) for ``tp``'s registration and its
   newest snapshot (highest owner generation, then furthest position);
2. never registered: ``tp`` has never had a txn; it is read plain (no filtering). A
   record with txn headers met there is junk unless ``tp``'s topic is registered by
   then (a coordinator writes the registration before it confirms it, and a writer
   sends txn records only after that): :mod:`txnstream.buffer.unregistered` tells them
   apart, and a reader follows ``tp`` (``plain_ok=False``) before delivering anything
   more of a registered one. A reader never registers a partition itself;
3. registered, no snapshot yet: the reader waits (its owner publishes one as soon as it
   serves the partition), and says so in :meth:`status`;
4. else the view starts from the snapshot, and the reader tails state partition ``s``
   from the snapshot's ``state_offset`` on, applying ``tp``'s deltas (a gap: the view
   is reloaded from a newer snapshot);
5. a delta of a newer log epoch (the owner restarted ``tp`` on a recreated topic's new
   log, :mod:`txnstream.buffer.recreation`): the view is dropped at once (WAITING: no
   record of the new log is judged by the old log's state) and reloaded from a snapshot
   of that epoch, never an older one. The new view's positions are the new log's, so
   they move *back*; :attr:`BufferView.restarts` counts it and
   :attr:`BufferView.log_epoch` names the log (a reader holding positions of the old
   log compares it with the epoch it noted beside them).

Start-up cost is the snapshot partition's scan plus the deltas since the snapshot
(seconds of them): independent of how long the data partition is.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTP
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from txnstream.buffer.served import BufferStateKind, BufferStateRecord, BufferView, ServeStatus
from txnstream.buffer.snapshot_store import LatestSnapshotFinder, TransactionBufferSnapshotStore
from txnstream.config import Config
from txnstream.errors import CorruptRecordError, message_error
from txnstream.fencing import supersedes
from txnstream.kafka.fetch import drain, learn_topic
from txnstream.kafka.offsets import Bounds, LogBounds
from txnstream.ratelog import RateLimitedLog
from txnstream.types import TopicPartition

__all__ = ["BufferStateFollower", "ServeStatus"]

log = logging.getLogger(__name__)

RESCAN_INTERVAL_S = 0.25
"""How often a partition waiting for its first snapshot (or after a gap) looks again."""
SCAN_RETRY_S = 15.0
"""How long a snapshot scan that meets a Kafka error (a broker restarting, a leader
moving) is retried before the error is raised (``follow``) or the partition waits for
the next rescan (``poll``, and ``follow`` of a partition known transactional)."""
FOLLOW_FETCH_WAIT_MS = 100
"""The follower's fetch wait: a delta is fetched as soon as it is written (the broker
answers at the first byte), so this only bounds an idle follower's polls (ten a second;
at 5 ms one follower cost the broker about as much as an idle owner, issue 37) and how
long a newly followed or re-read state partition waits for the fetch already parked."""
WAIT_WARN_AFTER_S = 10.0
"""A partition registered but not served for this long is logged as a warning."""
WAIT_WARN_EVERY_S = 60.0
"""And again at most this often per topic while it waits (:class:`RateLimitedLog`)."""


class BufferStateFollower:
    """Keeps a :class:`BufferView` per followed partition current. Not thread-safe.

    Single-threaded by design: the owner of the follower (a consumer's receive loop, the
    Spark planner) calls :meth:`poll` or :meth:`catch_up` itself.
    """

    def __init__(self, config: Config, name: str = "reader") -> None:
        self.config = config
        self.name = name
        self.topic = config.topics.buffer_state
        self._store = TransactionBufferSnapshotStore(config)
        self._consumer = Consumer(config.consumer(
            f"{config.topics.prefix}-state-{uuid.uuid4().hex[:8]}",
            **{"fetch.wait.max.ms": FOLLOW_FETCH_WAIT_MS, "client.id": f"tb-follow-{name}"}))
        self._bounds: LogBounds | None = None
        self.views: dict[TopicPartition, BufferView] = {}
        self.status: dict[TopicPartition, ServeStatus] = {}
        self._slot: dict[TopicPartition, int] = {}
        self._waiting_since: dict[TopicPartition, float] = {}
        self._next_rescan = 0.0
        self._warn = RateLimitedLog(log, interval_s=WAIT_WARN_EVERY_S)
        """Partitions waiting for an owner, logged per topic (:meth:`_rescan`)."""
        self._assigned: dict[int, int] = {}
        """Slot -> the offset it was (re)assigned at."""
        self.polled = 0  # records the last poll() read
        self._changed: set[TopicPartition] = set()
        """Partitions whose status or view changed since :meth:`take_changed`."""
        self._moved: dict[TopicPartition, int] = {}
        """In a poll: each partition a record touched, with its max read position before."""
        self._reseek: dict[int, int] = {}
        """Slots to seek back (a newly followed partition's snapshot is older)."""
        self._next: dict[int, int] = {}
        """Slot -> the next state offset this follower reads there."""
        self.gaps = 0
        self._epoch: dict[TopicPartition, int] = {}
        """The newest log epoch seen of each partition: no view of an older one again."""
        self._restarts: dict[TopicPartition, int] = {}
        """Views restarted on a newer log epoch, per partition (:attr:`BufferView.restarts`)."""
        self.restarts = 0
        """Views restarted on a newer log epoch, all partitions."""

    # ------------------------------------------------------------ following

    def follow(self, tp: TopicPartition, plain_ok: bool = True) -> ServeStatus:
        """Start following ``tp``: its status now (see :class:`ServeStatus`).

        ``plain_ok=False``: the caller saw a txn record in ``tp`` and found its topic
        registered (:mod:`txnstream.buffer.unregistered`), so it is transactional
        whatever the scan says (it stays WAITING until served).
        """
        if tp in self.views:
            return self.status[tp]
        self._slot[tp] = self._store.partition_of(tp)
        try:
            found = self._find_many([tp])[tp]
        except (KafkaException, TimeoutError) as exc:
            if plain_ok:
                raise
            # Transactional whatever a scan would say: it waits for the next rescan
            # (a reader's receive() must not die of brokers down past the retries).
            log.warning("%s: cannot read the buffer state of %s yet: %s", self.name, tp, exc)
            self._wait(tp)
            return self.status[tp]
        return self._follow_found(tp, found, plain_ok)

    def follow_many(self, tps: list[TopicPartition]) -> dict[TopicPartition, ServeStatus]:
        """:meth:`follow` each of ``tps``, scanning each snapshot partition once.

        A reader's whole assignment at once (a topic of hundreds of partitions shares a
        few snapshot partitions); Kafka errors are raised, as :meth:`follow`'s.
        """
        new = [tp for tp in tps if tp not in self.views]
        if new:
            found = self._find_many(new)
            for tp in new:
                self._slot[tp] = self._store.partition_of(tp)
                self._follow_found(tp, found[tp], plain_ok=True)
        return {tp: self.status[tp] for tp in tps}

    def prefetch(self, tps: list[TopicPartition]) -> set[TopicPartition]:
        """:meth:`follow_many`, for a reader's new assignment: the partitions it read.

        Empty if the scan failed (logged): each partition is followed on its own then.
        """
        try:
            return set(self.follow_many(tps))
        except (KafkaException, TimeoutError) as exc:
            log.info("%s: served state of %d partitions not read at once (%s); one by one",
                     self.name, len(tps), exc)
            return set()

    def committed_end(self, tp: TopicPartition, high: int, low: int, timeout_s: float,
                      lock: threading.RLock) -> int:
        """Where ``latest`` starts on a served partition: the committed end as of now.

        That is its max read position + 1 once the owner has folded up to ``high``
        (records before it may belong to a txn still open, which ``high`` itself would
        skip). An owner that does not get there in ``timeout_s`` leaves the served
        position so far (a warning says so). ``lock``: the reader's, held around each
        read of the state (not while waiting).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            with lock:
                view = self.views.get(tp)
                if view is None or view.position < high - 1:
                    self.catch_up([tp], timeout_s=max(0.1, deadline - time.monotonic()))
                    view = self.views.get(tp)
            if view is not None and view.position >= high - 1:
                return min(high, view.max_read_position + 1)
            if time.monotonic() >= deadline:
                at = view.max_read_position + 1 if view is not None else low
                log.warning("%s: the buffer owner of %s has not folded to its end (%d) in "
                            "%.0fs; 'latest' starts at the served position %d", self.name,
                            tp, high, timeout_s, at)
                return max(low, at)
            time.sleep(0.05)

    def _follow_found(self, tp: TopicPartition, found: LatestSnapshotFinder,
                      plain_ok: bool) -> ServeStatus:
        """Start following ``tp`` from what a scan ``found`` (see :meth:`follow`)."""
        if found.best is not None and found.best.log_epoch < self._epoch.get(tp, 0):
            self._wait(tp)  # of a log older than one seen: wait for the newer log's
        elif found.best is not None:
            self._start_view(tp, found.best)
        elif found.registered:
            self._wait(tp)
        elif not plain_ok:
            # Its topic is registered, it is not (yet): a partition added to the topic
            # later, whose first txn's registration is on its way. Never registered here.
            log.info("%s: %s holds txn records and its topic is registered, but it is not "
                     "yet: waiting for its registration and served state", self.name, tp)
            self._wait(tp)
        else:
            self.status[tp] = ServeStatus.PLAIN
            self._changed.add(tp)
        return self.status[tp]

    def any_registered(self, tps: list[TopicPartition]) -> bool:
        """Whether any of ``tps`` is registered now (a scan; Kafka errors are raised)."""
        return self._store.any_registered(tps)

    def recheck(self, tp: TopicPartition) -> ServeStatus:
        """A PLAIN partition's status again (a txn may have registered it since).

        Read the partition's end first, then recheck: if it is still not registered, no
        txn record precedes that end (a registration precedes every txn record).
        """
        if self.status.get(tp) is ServeStatus.PLAIN:
            self.unfollow(tp)
            return self.follow(tp)
        return self.status.get(tp) or self.follow(tp)

    def unfollow(self, tp: TopicPartition) -> None:
        """Stop following ``tp``."""
        self._changed.add(tp)
        self.views.pop(tp, None)
        self.status.pop(tp, None)
        self._waiting_since.pop(tp, None)
        self._epoch.pop(tp, None)
        self._restarts.pop(tp, None)
        slot = self._slot.pop(tp, None)
        if slot is not None and slot not in self._slot.values() and slot in self._assigned:
            del self._assigned[slot]
            self._reseek.pop(slot, None)
            self._next.pop(slot, None)
            self._consumer.incremental_unassign([KafkaTP(self.topic, slot)])

    def take_changed(self) -> set[TopicPartition]:
        """The partitions whose status or view (its log epoch) changed since the last call.

        A reader looks at these, not at every partition it reads, on each round.
        """
        out, self._changed = self._changed, set()
        return out

    def _wait(self, tp: TopicPartition) -> None:
        self._changed.add(tp)
        self.status[tp] = ServeStatus.WAITING
        self._waiting_since.setdefault(tp, time.monotonic())
        self.views.pop(tp, None)

    def _start_view(self, tp: TopicPartition, snap) -> None:  # type: ignore[no-untyped-def]
        view = BufferView.from_snapshot(snap)
        seen = self._epoch.get(tp)
        if seen is not None and snap.log_epoch > seen:  # reloaded on a newer log directly
            self._count_restart(tp)
        self._epoch[tp] = max(seen or 0, snap.log_epoch)
        view.restarts = self._restarts.get(tp, 0)
        self.views[tp] = view
        self.status[tp] = ServeStatus.SERVED
        self._changed.add(tp)
        self._moved.setdefault(tp, -2)
        self._waiting_since.pop(tp, None)
        slot = self._slot[tp]
        start = snap.state_offset + 1 if snap.state_offset >= 0 else OFFSET_BEGINNING
        if slot not in self._assigned:
            if not self._assigned:
                learn_topic(self._consumer, self.topic, self.config.admin_timeout_s)
            self._assigned[slot] = start
            self._next[slot] = start
            self._consumer.incremental_assign([KafkaTP(self.topic, slot, start)])
            return
        # Tailing the slot already: go back if this view needs older deltas (the other
        # views skip what they have); never forward, which would skip theirs.
        nxt = self._next.get(slot, OFFSET_BEGINNING)
        if start == OFFSET_BEGINNING or (nxt != OFFSET_BEGINNING and start < nxt):
            self._reseek[slot] = start if start != OFFSET_BEGINNING else 0
            self._next[slot] = self._reseek[slot]

    # ------------------------------------------------------------ reading

    def poll(self, timeout_s: float) -> set[TopicPartition]:
        """Read what the owners published (waiting up to ``timeout_s`` for it).

        Returns the partitions whose max read position moved.
        """
        self._do_reseeks()
        moved: set[TopicPartition] = set()
        self.polled = 0
        if self._assigned:
            msgs = drain(self._consumer, 1000, timeout_s)
            self.polled = len(msgs)
            self._moved = {}  # only what the records touch: not a loop over every view
            for m in msgs:
                self._apply(m)
            moved = {tp for tp, before in self._moved.items()
                     if (v := self.views.get(tp)) is not None and v.max_read_position != before}
        elif timeout_s > 0 and not self._waiting_since:
            time.sleep(timeout_s)
        if self._waiting_since and time.monotonic() >= self._next_rescan:
            self._next_rescan = time.monotonic() + RESCAN_INTERVAL_S
            moved |= self._rescan_many(list(self._waiting_since))
        elif self._waiting_since and not self._assigned and timeout_s > 0:
            time.sleep(min(timeout_s, RESCAN_INTERVAL_S))
        return moved

    def catch_up(self, tps: Iterable[TopicPartition], timeout_s: float = 30.0) -> None:
        """Follow ``tps`` and read their slots to their current ends (planners, admin)."""
        tps = list(tps)
        self.follow_many(tps)
        self._do_reseeks()
        ends = {}
        for stp, b in self.bounds({TopicPartition(self.topic, self._slot[tp])
                                   for tp in tps if tp in self.views}).items():
            if isinstance(b, KafkaException):
                raise b
            ends[stp.partition] = b[1]
        deadline = time.monotonic() + timeout_s
        for slot in list(ends):
            if self._position(slot) >= ends[slot]:
                del ends[slot]
        while ends and time.monotonic() < deadline:
            for m in drain(self._consumer, 1000, 0.05):
                self._apply(m)
            for slot in list(ends):
                if self._position(slot) >= ends[slot]:
                    del ends[slot]
        self._rescan_many([tp for tp in tps if self.status.get(tp) is ServeStatus.WAITING])

    def _position(self, slot: int) -> int:
        """The next offset this follower reads in ``slot``.

        Before any fetch, where it was assigned or sought to: a slot assigned at its end
        has nothing to read, and catching up must not wait for a record there.
        """
        pos = self._consumer.position([KafkaTP(self.topic, slot)])[0].offset
        if pos >= 0 and slot not in self._reseek:
            return pos
        nxt = self._next.get(slot, -1)
        return nxt if nxt >= 0 else -1

    def _do_reseeks(self) -> None:
        for slot, offset in list(self._reseek.items()):
            try:
                self._consumer.seek(KafkaTP(self.topic, slot, offset))
                del self._reseek[slot]
            except Exception as exc:  # not yet fetching (just assigned): next poll
                log.debug("seek state slot %d: %s", slot, exc)

    def _apply(self, m) -> None:  # type: ignore[no-untyped-def]
        if message_error(m, f"buffer state follower {self.name}", log):
            return
        part = m.partition()
        if part in self._reseek:
            return  # fetched before a seek back: it comes again
        self._next[part] = m.offset() + 1
        try:
            rec = BufferStateRecord.decode(m.value())
        except CorruptRecordError as exc:
            log.error("skipping unreadable buffer state record at %s[%d]@%d: %s",
                      m.topic(), m.partition(), m.offset(), exc)
            return
        if rec.kind is BufferStateKind.OWNER:
            # A new owner claimed the slot: older owners' deltas are fenced from now on.
            for tp, view in self.views.items():
                if self._slot.get(tp) == m.partition() and supersedes(m.offset(),
                                                                      view.generation):
                    view.generation = m.offset()
            return
        tp = rec.tp
        current = self.views.get(tp)
        if current is None:
            return
        self._moved.setdefault(tp, current.max_read_position)
        if rec.log_epoch > current.log_epoch and rec.generation >= current.generation:
            self._restart(tp, current, rec)
            return
        if not current.apply(rec) and rec.generation >= current.generation:
            self.gaps += 1
            log.warning("%s: buffer state of %s has a gap (delta from %d, have %d): "
                        "reloading from a snapshot", self.name, tp, rec.from_position,
                        current.position)
            self._wait(tp)
            self._rescan_many([tp])

    def _restart(self, tp: TopicPartition, current: BufferView, rec: BufferStateRecord) -> None:
        """The owner restarted ``tp`` on a new log: drop the view, reload that epoch's."""
        log.warning("%s: the buffer owner restarted %s on a new log (the topic was "
                    "recreated or truncated): log epoch %d -> %d, its served position "
                    "%d -> %d; reloading from a snapshot of the new log", self.name, tp,
                    current.log_epoch, rec.log_epoch, current.max_read_position,
                    rec.max_read_position)
        self._epoch[tp] = rec.log_epoch
        self._count_restart(tp)
        self._wait(tp)
        self._rescan_many([tp])

    def _count_restart(self, tp: TopicPartition) -> None:
        self._restarts[tp] = self._restarts.get(tp, 0) + 1
        self.restarts += 1

    def _find_many(self, tps: list[TopicPartition]) -> dict[TopicPartition, LatestSnapshotFinder]:
        """Scan their snapshot partitions, once each, riding through transient Kafka errors."""
        for attempt in _scan_retries():
            with attempt:
                return self._store.find_many(tps)
        raise AssertionError("unreachable")

    def _rescan_many(self, tps: list[TopicPartition]) -> set[TopicPartition]:
        """Look again for waiting partitions' snapshots (one scan per slot); those served."""
        if not tps:
            return set()
        try:
            found = self._find_many(tps)
        except (KafkaException, TimeoutError) as exc:  # still waiting: the next rescan
            log.warning("%s: cannot read the buffer state of %s yet: %s", self.name,
                        tps[0] if len(tps) == 1 else f"{len(tps)} partitions", exc)
            return set()
        for tp in tps:
            self._rescan_found(tp, found[tp])
        return {tp for tp in tps if tp in self.views}

    def _rescan_found(self, tp: TopicPartition, found: LatestSnapshotFinder) -> None:
        old = self.views.get(tp)
        best = found.best
        if best is not None and best.log_epoch >= self._epoch.get(tp, 0) and (
                old is None or (best.log_epoch, best.position) > (old.log_epoch, old.position)):
            self._start_view(tp, best)
            return
        since = self._waiting_since.get(tp)
        if since is not None and time.monotonic() - since > WAIT_WARN_AFTER_S:
            self._warn.warning(
                f"unserved:{tp.topic}", "%s: topic %r is transactional (a coordinator "
                "registered it) but no buffer owner serves %s (waiting %.0f s): nothing of "
                "it is delivered until one does. Is a `txnstream worker` with the buffer "
                "role running, and do its --buffer-topics include %r?", self.name, tp.topic,
                tp, time.monotonic() - since, tp.topic)

    def log_queries(self) -> LogBounds:
        """Log bounds, times and partitions, asked of a consumer that never fetches.

        Not of this follower's own consumer: a query waits behind its parked fetch
        (:mod:`txnstream.kafka.offsets`). Made at first use.
        """
        if self._bounds is None:
            self._bounds = LogBounds(self.config, f"follow-{self.name}")
        return self._bounds

    def bounds(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, Bounds]:
        """Each partition's log start and end (high watermark) now, in one round.

        An error Kafka calls retriable (a leader not elected yet) is asked again, as a
        consumer's own watermark query waits for the leader; the others are given as
        Kafka gave them.
        """
        return self.log_queries().get(tps)

    def watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        """``tp``'s log start and end (high watermark) now; raises Kafka's error."""
        return self.log_queries().one(tp)

    def log_epoch(self, tp: TopicPartition) -> int | None:
        """The newest log epoch seen of ``tp`` (None: not known), its view dropped or not.

        Ahead of the view's while the view is dropped for a newer log's (WAITING).
        """
        return self._epoch.get(tp)

    def waiting_for(self, tp: TopicPartition) -> float | None:
        """Seconds ``tp`` has waited for served state, or None if it does not wait."""
        since = self._waiting_since.get(tp)
        return None if since is None else time.monotonic() - since

    def wake_source(self) -> tuple[Consumer, str]:
        """Its consumer and ``client.id``, for a reader's :class:`~txnstream.kafka.wake.Wakeup`."""
        return self._consumer, f"tb-follow-{self.name}"

    def close(self) -> None:
        """Release the consumers."""
        try:
            self._consumer.close()
        finally:
            if self._bounds is not None:
                self._bounds.close()


def _scan_retries() -> Retrying:
    """Retries of a snapshot scan through transient Kafka errors (up to ``SCAN_RETRY_S``)."""
    return Retrying(retry=retry_if_exception_type((KafkaException, TimeoutError)),
                    stop=stop_after_delay(SCAN_RETRY_S), wait=wait_exponential(0.1, max=2),
                    reraise=True)
