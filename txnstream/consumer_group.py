"""A consumer's membership in its subscription: Kafka's group, pending-ack ownership.

The subscription is a Kafka consumer group (``cooperative-sticky``): the group assigns
partitions, and the member that is assigned one becomes its owner in the pending-ack
log before delivering anything (DESIGN.md section 7):

1. **take**: read the committed cursor and its checkpoint pointer (offset metadata),
   replay the partition's pending acks from that checkpoint, write an ``OWNER`` record
   of a new generation and fold the log up to it (a zombie's late ack included), end
   at once the txns of fenced or dead owners that hold acks there, and start fetching
   at the cursor;
2. **retake**: a take that failed (the log not readable yet) or a claim a newer owner
   fenced while the group still assigns the partition here is tried again later;
3. **release**: a clean revoke flushes the acks and commits the cursor first; a lost
   partition commits nothing (another member may own it already);
4. **cursor commits** (batched, twice a second) carry the latest pending-ack checkpoint
   as offset metadata, so lag tools keep working and a new owner replays seconds of the
   log, never all of it;
5. **wait and resume**: a partition waits at the first record past the served max read
   position (what is fetched beyond held: :class:`~txnstream.ingest.Ingest`; past the
   hold's bound the fetcher paused there), and resumes when the position reaches it;
6. **a new log**: the cursor and the pending-ack state note the partition's log epoch
   (the served buffer state's). When the view moves to a newer epoch (the topic was
   deleted and created again) the partition is taken again at once: the claim starts the
   pending-ack state over on the new log, from its start (docs/pendingack.md).

:class:`GroupMember` does all of this for the :class:`~txnstream.consumer.Consumer`,
under the consumer's lock, and tells it through :class:`DeliveryOwner` when a partition
stops being delivered here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.buffer.follower import BufferStateFollower, ServeStatus
from txnstream.delivery import PartitionDelivery, newer_log
from txnstream.errors import KafkaErrorKind, TxnStreamError, classify_kafka_error
from txnstream.kafka.clients import COOPERATIVE, leave_group
from txnstream.pendingack.store import PendingAckStore
from txnstream.predecessors import end_predecessors
from txnstream.ratelog import RateLimitedLog
from txnstream.take_plan import TakePlan
from txnstream.types import TopicPartition

if TYPE_CHECKING:
    from txnstream.admin import Admin
    from txnstream.config import Config

__all__ = ["DeliveryOwner", "GroupMember"]

log = logging.getLogger("txnstream.consumer")
_rate_limited = RateLimitedLog(log)

DATA_FETCH_WAIT_MS = 100
"""The broker's long-poll wait for data fetches: how late a paused partition's records
can be after its resume (:meth:`GroupMember.wait_at`); shorter costs the broker at rest."""
COMMIT_INTERVAL_S = 0.5
"""Cursor commits are batched: at most two offset commits a second per consumer."""
SWEEP_INTERVAL_S = 5.0
"""How often every partition is looked at (:meth:`GroupMember.sweep`), not only those
that changed or wait: what a round's bookkeeping missed waits no longer than this."""
RETAKE_AFTER_S = 10.0
"""After a newer owner fenced this member on a partition the group still assigns to it,
wait this long (about a session timeout, in which the group settles who owns it; a
revoke cancels the retake) before replaying and claiming it again."""
CHECKPOINT_INTERVAL_S = 10.0
"""How often an owner checkpoints a partition's pending acks (when they changed): a new
owner replays the log from the latest one, about this many seconds of it, never all."""
CLAIM_RETRY_S = 1.0
"""A takeover that failed (log not readable yet) is tried again after this long."""


class DeliveryOwner(Protocol):
    """What the member tells the consumer it serves."""

    def partition_dropped(self, tp: TopicPartition, why: str, fence_txns: bool) -> None:
        """``tp`` is no longer delivered here: forget its waiting messages.

        With ``fence_txns``, make the txns holding acks on it abort-only.
        """


class GroupMember:
    """One member of a subscription's group: takes, keeps and releases its partitions.

    Every method but the Kafka callbacks runs under ``lock`` (the consumer's), and so
    do the callbacks where they touch shared state.
    """

    def __init__(self, config: Config, admin: Admin, topics: Sequence[str],
                 subscription: str, member_id: str, *, owner: DeliveryOwner,
                 lock: threading.RLock, acks: PendingAckStore,
                 follower: BufferStateFollower, initial_position: str,
                 checkpoint_interval_s: float, abort_predecessor_txns: bool,
                 kafka: dict[str, object]) -> None:
        self._config = config
        self._admin = admin
        self.subscription = subscription
        self.member_id = member_id
        self._owner = owner
        self._lock = lock
        self._acks = acks
        self._follower = follower
        self._initial = initial_position
        self._checkpoint_interval = checkpoint_interval_s
        self._abort_predecessors = abort_predecessor_txns
        self.readers: dict[TopicPartition, PartitionDelivery] = {}
        """The partitions taken (claimed) here."""
        self._owned: set[TopicPartition] = set()
        """Partitions the group assigns to this member (whether or not claimed yet)."""
        self._retake: dict[TopicPartition, float] = {}
        """Owned partitions to (re)claim, with when: failed takeovers and fenced ones."""
        self.waiting: dict[TopicPartition, PartitionDelivery] = {}
        """Readers that wait somewhere (``wait_at`` set): those a round looks at."""
        self._taken: set[TopicPartition] = set()
        """Partitions taken since the last round: their log epoch is looked at once."""
        self._last_commit = self._last_sweep = 0.0
        self.kafka = KafkaConsumer(config.consumer(
            subscription, **{"auto.offset.reset": initial_position,
                             "partition.assignment.strategy": COOPERATIVE,
                             "fetch.wait.max.ms": DATA_FETCH_WAIT_MS,
                             "on_commit": self._on_commit}, **kafka))
        self.kafka.subscribe(list(topics), on_assign=self._on_assign,
                             on_revoke=self._on_revoke, on_lost=self._on_lost)

    def drop(self, tp: TopicPartition, why: str, fence_txns: bool) -> None:
        """Stop delivering ``tp`` (lock held)."""
        self.readers.pop(tp, None)
        self.waiting.pop(tp, None)
        self._follower.unfollow(tp)
        self._owner.partition_dropped(tp, why, fence_txns)

    def fenced(self, tp: TopicPartition, why: str = "fenced",
               retake_after_s: float = RETAKE_AFTER_S) -> None:
        """A newer owner claimed ``tp`` (or it has a new log; lock held): stop here.

        It stays paused in the assignment and is claimed again later if the group still
        assigns it here (the other claim was a zombie's); a revoke cancels that.
        """
        self.drop(tp, why, fence_txns=False)
        try:  # stays in librdkafka's assignment (it is the group's), paused
            self.kafka.pause([KafkaTP(tp.topic, tp.partition)])
        except KafkaException as exc:
            log.debug("pause %s: %s", tp, exc)
        if tp in self._owned:
            self._retake[tp] = time.monotonic() + retake_after_s

    def close(self) -> None:
        """Leave the group (the cursor is committed by the caller first)."""
        leave_group(self.kafka)  # the revoke runs here, not inside close()
        try:
            self.kafka.close()
        except KafkaException as exc:  # the group is gone already: nothing left to leave
            log.info("%s: close: %s", self.member_id, exc)

    def _on_assign(self, consumer: KafkaConsumer, parts: list[KafkaTP]) -> None:
        # A rebalance callback must never raise (it would surface from poll() and end the
        # caller): a takeover that fails is retried from receive(). librdkafka's
        # assignment always equals the group's (a partition not taken yet, or fenced,
        # stays assigned but paused), else its automatic unassign on the next revoke
        # fails inside poll().
        tps = [TopicPartition(p.topic, p.partition) for p in parts]
        with self._lock:  # the whole assignment's served state at once, not one by one
            scanned = self._follower.prefetch(tps)
            self._owned.update(tps)
        ready, failed = self._take_many(tps, scanned)
        waiting = [KafkaTP(tp.topic, tp.partition) for tp in failed]
        for tp, exc in failed.items():
            log.warning("%s: cannot take %s yet (%s); retrying in %.0fs", self.member_id,
                        tp, exc, CLAIM_RETRY_S)
            with self._lock:
                self._retake[tp] = time.monotonic() + CLAIM_RETRY_S
        consumer.incremental_assign([*ready, *waiting])
        if ready:  # a partition paused (not taken, fenced) before a revoke stays paused
            consumer.resume(ready)
        if waiting:
            consumer.pause(waiting)

    def _take(self, tp: TopicPartition) -> KafkaTP:
        """:meth:`_take_many` of one partition; raises what its take met."""
        ready, failed = self._take_many([tp], set())
        if failed:
            raise failed[tp]
        return ready[0]

    def _take_many(self, tps: list[TopicPartition], scanned: set[TopicPartition]
                   ) -> tuple[list[KafkaTP], dict[TopicPartition, Exception]]:
        """Become the owner of ``tps``: replay their pending acks, claim them.

        Returns where to start fetching each one taken (the caller assigns them), and
        the error of each one not taken. Nothing is delivered before the claim's OWNER
        record is in the log and every record before it is folded (a zombie's late ack
        included). The whole assignment at once (issue 37): one committed-offsets
        request, one replay reading each log partition once, every OWNER written before
        one fold to them. ``scanned``: partitions whose served state was just read.
        """
        timeout = self._config.admin_timeout_s
        failed: dict[TopicPartition, Exception] = {}
        try:
            found_all = self.kafka.committed([KafkaTP(tp.topic, tp.partition) for tp in tps],
                                             timeout=timeout)
            bounds = self._follower.bounds(tps)  # one round for all, not a query each
        except KafkaException as exc:
            return [], dict.fromkeys(tps, exc)
        found = {TopicPartition(f.topic, f.partition): f for f in found_all}
        plans = {}
        for tp in tps:
            try:
                plans[tp] = TakePlan.of(tp, found[tp], bounds[tp], self._follower,
                                        tp in scanned, self._lock, self._initial)
            except (TxnStreamError, KafkaException) as exc:
                failed[tp] = exc
        try:
            handles = self._acks.replay_many({tp: p.meta.checkpoint
                                              for tp, p in plans.items()})
        except (TxnStreamError, KafkaException) as exc:
            return [], {**failed, **dict.fromkeys(plans, exc)}
        starts = {}
        for tp, p in plans.items():
            try:
                starts[tp] = p.start_on(handles[tp], self._follower, self._lock, timeout)
            except (TxnStreamError, KafkaException) as exc:
                failed[tp] = exc
        for tp, plan in starts.items():
            if plan.new_log or plan.committed != plans[tp].found.offset:
                log.warning("%s: %s is a new log (log epoch %d; the topic was recreated): "
                            "the cursor %d and pending acks of the old log (epoch %s) are "
                            "not applied to it; delivering it from %d", self.member_id, tp,
                            plan.log_epoch, plans[tp].found.offset, handles[tp].log_epoch,
                            plan.start)
        try:
            claimed = self._acks.claim_many([(handles[tp], plan.start, plan.log_epoch)
                                             for tp, plan in starts.items()])
        except (TxnStreamError, KafkaException) as exc:
            return [], {**failed, **dict.fromkeys(starts, exc)}
        ready = []
        for tp, plan in starts.items():
            owner_at = claimed[tp]
            if isinstance(owner_at, Exception):
                failed[tp] = owner_at
                continue
            handle, found_at = handles[tp], plans[tp].found
            try:
                end_predecessors(self._admin, self.member_id, self._abort_predecessors, tp,
                                 handle)
            except (TxnStreamError, KafkaException) as exc:
                failed[tp] = exc
                continue
            reader = PartitionDelivery(tp, self._follower.status.get(tp, plans[tp].status),
                                      deliver_pos=plan.start, committed=plan.committed,
                                      handle=handle, checkpoint=plans[tp].meta.checkpoint)
            reader.pointer_dirty = reader.metadata() != found_at.metadata  # a new epoch
            with self._lock:
                self.readers[tp] = reader
                self._taken.add(tp)
                self._retake.pop(tp, None)
                # The tail passes what follows the OWNER to this reader from now on:
                # under the consumer lock, as every reader of the tail runs.
                self._acks.resume_tail(tp, owner_at + 1)
            ready.append(KafkaTP(tp.topic, tp.partition, plan.start))
        return ready, failed

    def _on_revoke(self, consumer: KafkaConsumer, parts: list[KafkaTP]) -> None:
        """A clean revoke: our acks are made durable and the cursor committed first."""
        self._acks.flush()  # acks land before the next owner's OWNER: they stay valid
        with self._lock:
            self.commit(force=True)
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
                self.drop(tp, f"partition {'lost' if lost else 'revoked'}", fence_txns=lost)
        try:
            # librdkafka's assignment is the group's (see _on_assign), so these are all
            # assigned. Always called: a callback that calls no unassign makes the client
            # unassign by itself, and that error escapes poll() (or close()). Nothing
            # else is asked of the handle here: during close() it is being destroyed.
            consumer.incremental_unassign(parts)
        except KafkaException as exc:  # librdkafka already dropped them (lost)
            log.info("%s: unassign %s: %s", self.member_id, parts, exc)

    def unblock(self, moved: set[TopicPartition]) -> None:
        """Resume partitions whose served max read position reached where they wait.

        A partition read plain waits only at a txn record whose junk check is not due
        yet; ``moved`` names it once it is (:mod:`txnstream.buffer.unregistered`). Only
        the partitions that changed (the follower's, those taken since: :meth:`_look_at`
        first) and those waiting are looked at: a round costs what happened, not width.
        """
        self._look_at(self._follower.take_changed() | self._taken)
        self._taken = set()
        for r in list(self.waiting.values()):
            if r.wait_at is None or self.readers.get(r.tp) is not r:  # (or taken anew)
                del self.waiting[r.tp]
                continue
            if r.delay_paused or (r.tp not in moved and r.status is not ServeStatus.SERVED):
                continue  # (one paused for held delayed records resumes as they fall due)
            view = self._follower.views.get(r.tp)
            if r.status is ServeStatus.PLAIN or (
                    view is not None and view.max_read_position >= r.wait_at):
                self.resume(r)

    def hold_at(self, r: PartitionDelivery, offset: int) -> None:
        """``r`` waits at ``offset`` (its fetch goes on, held: :mod:`txnstream.ingest`)."""
        r.wait_at = offset
        self.waiting[r.tp] = r

    def sweep(self) -> None:
        """Look at every partition as a round looks at the changed ones; trim the views.

        Every ``SWEEP_INTERVAL_S``, with a cursor commit: a view keeps nothing for long
        below where its reader's cursor is.
        """
        self._look_at(set(self.readers))
        for r in self.readers.values():
            if r.wait_at is not None:
                self.waiting[r.tp] = r
            view = self._follower.views.get(r.tp)
            if view is not None:  # below the cursor nothing is asked again
                view.trim(min(r.cursor(), r.deliver_pos))

    def resume(self, r: PartitionDelivery) -> None:
        """Take ``r`` again from where it waits: its hold, and a paused fetch resumed."""
        assert r.wait_at is not None
        if r.paused_at is not None:
            # Seek again after the resume: a resumed partition alone is fetched again
            # only at librdkafka's next periodic fetch decision (~1 s later).
            ktp = KafkaTP(r.tp.topic, r.tp.partition, r.paused_at)
            try:
                self.kafka.resume([ktp])
                self.kafka.seek(ktp)
            except KafkaException as exc:
                log.warning("%s: resume %s: %s", self.member_id, r.tp, exc)
                return
        r.wait_at, r.paused_at, r.delay_paused = None, None, False
        self.waiting.pop(r.tp, None)

    def _look_at(self, tps: set[TopicPartition]) -> None:
        """Their served status; their views' log epochs beside the cursors (newer: retake).

        A view of a newer epoch serves a new log (the topic was deleted and created
        again): every position held here is of the old one. The partition is dropped
        (its waiting messages go; txns holding acks on it go on: their marks end nothing
        on the new log) and taken again at the next receive, where the claim starts the
        pending-ack state over on the new log's start. An epoch not known yet (state
        written before epochs were noted, a partition read plain so far) is 0.
        """
        for tp in tps:
            if (r := self.readers.get(tp)) is None:
                continue
            if r.status is ServeStatus.WAITING:
                r.status = self._follower.status.get(tp, ServeStatus.WAITING)
            view, h = self._follower.views.get(r.tp), r.handle
            if view is None or h is None or view.log_epoch == h.log_epoch:
                continue
            if h.log_epoch < 0 and view.log_epoch == 0:
                h.log_epoch, r.pointer_dirty = 0, True
            elif newer_log(h.log_epoch, view.log_epoch):
                log.warning("%s: %s has a new log (log epoch %d -> %d: the topic was "
                            "recreated): taking it again, from the new log's start",
                            self.member_id, r.tp, h.log_epoch, view.log_epoch)
                self.fenced(r.tp, f"new log (epoch {view.log_epoch})", retake_after_s=0.0)

    def wait_at(self, r: PartitionDelivery, offset: int) -> None:
        """Pause ``r``'s fetch at ``offset``: where it waits, or where its full hold ends."""
        if r.wait_at is None:
            self.hold_at(r, offset)
        r.paused_at = offset
        ktp = KafkaTP(r.tp.topic, r.tp.partition, offset)
        try:
            self.kafka.pause([ktp])
            self.kafka.seek(ktp)
        except KafkaException as exc:
            log.warning("%s: pause %s at %d: %s", self.member_id, r.tp, offset, exc)

    def retake_due(self) -> None:
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
                    self.readers.pop(tp, None)
                    continue
                try:
                    self.kafka.incremental_unassign([KafkaTP(tp.topic, tp.partition)])
                    self.kafka.incremental_assign([start])
                    self.kafka.resume([start])  # a partition's pause outlives unassign
                    log.warning("%s: took %s again", self.member_id, tp)
                except KafkaException as exc:
                    log.warning("%s: cannot assign %s again (%s)", self.member_id, tp, exc)
                    self.readers.pop(tp, None)
                    self._retake[tp] = time.monotonic() + CLAIM_RETRY_S
                    self._keep_assigned_paused(tp)

    def _keep_assigned_paused(self, tp: TopicPartition) -> None:
        """Put ``tp`` back in librdkafka's assignment, paused (it is the group's)."""
        ktp = KafkaTP(tp.topic, tp.partition)
        try:
            if (tp.topic, tp.partition) not in {(p.topic, p.partition)
                                                for p in self.kafka.assignment()}:
                self.kafka.incremental_assign([ktp])
            self.kafka.pause([ktp])
        except KafkaException as exc:
            log.warning("%s: cannot keep %s assigned (%s)", self.member_id, tp, exc)

    def commit(self, force: bool = False) -> None:
        """Commit the cursors: at most every ``COMMIT_INTERVAL_S`` unless ``force``.

        Each carries its partition's latest pending-ack checkpoint as offset metadata.
        """
        now = time.monotonic()
        if not force and now - self._last_commit < COMMIT_INTERVAL_S:
            return
        if not force and now - self._last_sweep >= SWEEP_INTERVAL_S:
            self._last_sweep = now  # (not in a forced one: a revoke's, a close's)
            self.sweep()
        self._acks.checkpoint_readers(self.readers.values(), now, self._checkpoint_interval)
        offsets = []
        for r in self.readers.values():
            c = r.cursor()
            if c > r.committed or r.pointer_dirty:
                offsets.append((r, c))
        self._last_commit = now
        if not offsets:
            return
        try:
            tps = [KafkaTP(r.tp.topic, r.tp.partition, max(c, r.committed),
                           metadata=r.metadata() or "")
                   for r, c in offsets]
            if force:
                answer = self.kafka.commit(offsets=tps, asynchronous=False)
            else:  # librdkafka answers later, in _on_commit
                answer = None
                self.kafka.commit(offsets=tps, asynchronous=True)
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
        if answer is not None:  # a partition's error is in the answer, not raised
            self._on_commit(None, answer)

    def _on_commit(self, err: KafkaError | None, parts: list[KafkaTP] | None) -> None:
        """The answer to a cursor commit: librdkafka's ``on_commit``, or a forced one's.

        Each cursor was noted as committed when it was sent: one the answer says failed
        (the broker down, the member unknown for a moment) is sent again by the next
        commit, even if it has not moved since (the last records of a partition an
        aborted txn's, say: nothing else would ever move it).
        """
        failed = [p for p in parts or () if err is not None or p.error is not None]
        for p in failed:  # no lock: librdkafka may call this on any thread that polls
            if (r := self.readers.get(TopicPartition(p.topic, p.partition))) is not None:
                r.pointer_dirty = True
        if failed:
            _rate_limited.warning("commit", "%s: cursor commit of %d partitions failed (%s); "
                                  "the next commit sends them again", self.member_id,
                                  len(failed), err or failed[0].error)
