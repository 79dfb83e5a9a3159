"""``Consumer``: committed-only reads with Pulsar-style acks (subscription = consumer group).

Reads filter by position (DESIGN.md section 6): the buffer role of ``txnstream worker``
folds each transactional partition once and serves its state; a
:class:`~txnstream.buffer.follower.BufferStateFollower` keeps this consumer's view of
it. Per assigned partition the consumer delivers, in offset order, only records at or
below the served ``max_read_position`` that the view does not skip (markers, aborted
txns' records, stragglers). It never holds or re-reads: at the first record past the
max read position it pauses the partition there and resumes when the position moves.
A partition no txn ever registered is read plain (it pays nothing); a txn record there
is junk, skipped, unless its topic is registered by then: then it waits for served state
(:mod:`txnstream.buffer.unregistered`). No txn record is ever delivered unfiltered, and
memory is bounded by one fetch, whatever an open txn holds back.

Acks: the group's committed Kafka offset is the cursor (mark-delete position), so lag
tools keep working. ``acknowledge`` acks one record; the cursor moves to the lowest
delivered-but-unacked offset. ``acknowledge_cumulative`` acks everything up to a record.
``acknowledge_batch`` acks many records with one pending-ack record per partition.
``negative_acknowledge`` redelivers the record after ``nack_delay_s``;
``redeliver_unacknowledged`` at once (a batch that will not ack what it took).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from txnstream import validate
from txnstream.buffer.follower import BufferStateFollower, ServeStatus
from txnstream.buffer.unregistered import UnregisteredRecords
from txnstream.consumer_group import CHECKPOINT_INTERVAL_S, GroupMember
from txnstream.consumer_txns import TxnAcks
from txnstream.coordinator.log_entry import SubscriptionRef
from txnstream.delivery import PartitionDelivery, ReadyQueue, check_delivered
from txnstream.errors import (
    ConfigError,
    TransactionConflictError,
    TxnStreamError,
)
from txnstream.ingest import Ingest
from txnstream.kafka.fetch import KafkaRecord, drain
from txnstream.kafka.wake import Wakeup
from txnstream.lifecycle import DeadLetters, Redeliveries
from txnstream.message import Message
from txnstream.pendingack.handle import PendingAckStats
from txnstream.pendingack.records import PendingAckEntry, PendingAckKind
from txnstream.pendingack.store import PendingAckStore
from txnstream.types import TopicPartition

if TYPE_CHECKING:
    from txnstream.admin import Admin
    from txnstream.config import Config
    from txnstream.transaction import Transaction

__all__ = ["Consumer", "Message"]

log = logging.getLogger(__name__)

_OFFSET = attrgetter("offset")

FETCH_BATCH = 5000
"""Records taken from the fetcher per call: one Python call per batch, not per record."""
POLL_SLICE_S = 0.1
"""Longest single wait inside receive: rebalances and retakes are served between waits."""


class Consumer:
    """Committed-only consumer; use ``client.subscribe(...)``.

    The facade: receiving and acking. Group membership, takeovers and cursor commits
    are :class:`~txnstream.consumer_group.GroupMember`'s; what may be delivered is
    decided by :mod:`txnstream.delivery`.
    """

    def __init__(self, config: Config, admin: Admin, topics: str | Sequence[str],
                 subscription: str, initial_position: str = "earliest",
                 nack_delay_s: float = 1.0,
                 checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
                 abort_predecessor_txns: bool = False,
                 dead_letters: DeadLetters | None = None, **kafka: object) -> None:
        validate.consumer_options(initial_position, subscription, kafka)
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.subscription, self._nack_delay = subscription, nack_delay_s
        self._lock = threading.RLock()
        self._queue = ReadyQueue()
        self.member_id = f"{subscription}-{uuid.uuid4().hex[:8]}"
        self._acks = PendingAckStore(config, subscription, self.member_id)
        self._follower = BufferStateFollower(config, name=self.member_id)
        self._unreg = UnregisteredRecords(self._follower.any_registered,
                                          self._follower.watermarks, who=self.member_id)
        self._group = GroupMember(
            config, admin, self.topics, subscription, self.member_id, owner=self,
            lock=self._lock, acks=self._acks, follower=self._follower,
            initial_position=initial_position, checkpoint_interval_s=checkpoint_interval_s,
            abort_predecessor_txns=bool(abort_predecessor_txns), kafka=kafka)
        self._readers = self._group.readers
        self._ingest = Ingest(self.member_id, subscription, self._readers, self._queue,
                              self._follower, self._unreg, self._group)
        self._txn_acks = TxnAcks(self._acks, self._group, self._queue, self._lock)
        self._redeliveries = Redeliveries(self._readers, self._acks, subscription,
                                          self.member_id)
        self.dead_letters = dead_letters  # its policy and count (None: none)
        if dead_letters is not None:
            dead_letters.bind(lambda msgs, txn: self._ack(msgs, txn, cumulative=False))
        self._wake = Wakeup()
        self._wake.watch((self._group.kafka, ""), self._follower.wake_source())
        self._closed = False

    def partition_dropped(self, tp: TopicPartition, why: str, fence_txns: bool) -> None:
        """``tp`` is no longer delivered here (lock held): its waiting messages go.

        With ``fence_txns`` (lost, not revoked) the txns holding acks on it can only abort.
        """
        self._queue.drop(tp)
        self._unreg.forget(tp)
        self._txn_acks.dropped(tp)
        if fence_txns:
            self._txn_acks.fence(tp, f"consumer {self.member_id} of {self.subscription!r} "
                                     f"lost {tp} ({why})")

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
                out = self._queue.take(max_records, time.monotonic(), self._still_unacked,
                                       self._ingest.release)
            if out and self.dead_letters is not None:  # past the count: dead-lettered, not out
                out = self.dead_letters.divert(out, lambda dead: [*map(self.negative_acknowledge,
                                                                dead)])
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

    def _pump(self, timeout_s: float, max_records: int) -> None:
        """One round: served state first, then records; acks' marks; the cursor."""
        self._group.retake_due()
        if self._wake.active:  # wait on both consumers at once (txnstream.kafka.wake)
            self._wake.clear()
            batch, found = self._take(False, 0.0, max_records)
            if not found and self._wake.wait(timeout_s):
                batch, _ = self._take(False, 0.0, max_records)
        else:  # one at a time: on served state only if every partition waits for it
            with self._lock:
                readers = list(self._readers.values())
            blocked = bool(readers) and all(
                r.wait_at is not None or r.status is ServeStatus.WAITING for r in readers)
            batch, _ = self._take(blocked, timeout_s, max_records)
        with self._lock:
            self._ingest(batch)
            self._txn_acks.apply_marks()
            self._group.commit()  # (and, at its pace, the sweep that trims the views)

    def _take(self, blocked: bool, timeout_s: float, max_records: int
              ) -> tuple[list[KafkaRecord], bool]:
        """Served state, then records; the records, and whether anything at all came.

        Waits up to ``timeout_s`` on served state if ``blocked``, else on records.
        """
        moved = self._follower.poll(timeout_s if blocked else 0.0)
        polled = self._follower.polled
        with self._lock:  # and partitions read plain whose junk check may run again
            self._group.unblock(moved | self._unreg.due())
            released = self._ingest.released_any()  # held records to take: no wait
        batch = drain(self._group.kafka, max_records,
                      0.0 if blocked or released else timeout_s)
        return batch, bool(batch or polled or released)

    def unregistered_skipped(self) -> dict[TopicPartition, int]:
        """Per partition: the junk txn records skipped (no coordinator registered its topic)."""
        with self._lock:
            return dict(self._unreg.skipped)

    def buffer_status(self) -> dict[TopicPartition, tuple[str, float | None]]:
        """Per assigned partition: plain, waiting (and for how long, s) or served."""
        with self._lock:
            return {tp: (r.status.value, self._follower.waiting_for(tp))
                    for tp, r in self._readers.items()}

    # ------------------------------------------------------------ acks

    def acknowledge(self, msg: Message, txn: Transaction | None = None) -> None:
        """Ack one record; with ``txn`` the ack takes effect only if ``txn`` commits.

        A transactional ack is logged to the pending-ack log before ``txn`` can commit;
        a conflict (another txn, or a plain ack, touching the same message) raises
        ``TransactionConflictError`` and makes ``txn`` abort-only.
        """
        self._ack([msg], txn, cumulative=False)

    def acknowledge_cumulative(self, msg: Message, txn: Transaction | None = None) -> None:
        """Ack every delivered record of the partition up to and including ``msg``.

        In a txn, one that would also take records given back for redelivery (an aborted
        txn's acks, a nack) and not received again raises ``TransactionConflictError``
        naming them, and the txn can only abort: they were never processed, and an
        abort confirmed in the background can give them back at any moment. Outside a
        txn it takes them, as Pulsar's does. A record below ``msg`` held for its delivery
        time (:mod:`txnstream.delayed`) is not taken: the delivered ones are acked
        individually.
        """
        self._ack([msg], txn, cumulative=True)

    def cumulative_coverage(self, msg: Message) -> list[int]:
        """The offsets ``acknowledge_cumulative(msg)`` would ack now.

        Every unacked one of ``msg``'s partition up to it, including messages queued for
        redelivery (after an abort) and not received again yet (in a txn such an ack is
        refused: :meth:`acknowledge_cumulative`).
        """
        with self._lock:
            return self._reader_for(msg).covered_by(msg.offset)

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
        by_tp: dict[tuple[str, int], list[Message]] = {}
        for m in msgs:
            by_tp.setdefault((m.topic, m.partition), []).append(m)
        if txn is not None:  # one registration for every partition, not one each
            txn.register_subscriptions(self._subscription_refs(
                TopicPartition(*tp) for tp in by_tp))
        for tp_msgs in by_tp.values():
            tp_msgs.sort(key=_OFFSET)
            self._ack(tp_msgs, txn, cumulative=None)

    def prepare_acks(self, msgs: Iterable[Message], txn: Transaction) -> None:
        """Register ``msgs``' partitions of this subscription with ``txn``, in the background.

        For a caller that will ack them in ``txn`` later (the exactly-once processor,
        as each input arrives): that ack then finds the registration sent, and waits
        only for what is still on its way instead of a round trip of its own. Nothing
        is acked here; a failed registration makes ``txn`` abort-only.
        """
        txn.register_subscriptions(self._subscription_refs(m.tp for m in msgs), wait=False)

    def _subscription_refs(self, tps: Iterable[TopicPartition]) -> list[SubscriptionRef]:
        return [SubscriptionRef(tp.topic, tp.partition, self.subscription) for tp in set(tps)]

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
            if msgs is None:
                found = [m for r in self._readers.values() for m in r.unacked.values()]
            else:
                found = []
                for m in msgs:
                    r = self._readers.get(m.tp)
                    if r is not None and (mine := r.unacked.get(m.offset)) is not None:
                        found.append(mine)
            return self._queue.redeliver(found, fresh=self._redeliveries.bump)

    def _ack(self, msgs: list[Message], txn: Transaction | None,
             cumulative: bool | None) -> None:
        """Ack ``msgs`` (one partition, in offset order) with one pending-ack record.

        ``cumulative``: everything up to the last one; False: exactly these; None:
        cumulative where that acks exactly these (:meth:`acknowledge_batch`).
        """
        msg, offsets = msgs[-1], [m.offset for m in msgs]
        with self._lock:
            r = self._reader_for(msg)
            # (An already acked one is the handle's call: a conflict in a txn, else a no-op.)
            ours = check_delivered(r, self._follower.views.get(r.tp), msgs, offsets,
                                   self.subscription)
        if txn is not None:
            txn.register_subscriptions([SubscriptionRef(msg.topic, msg.partition,
                                                        self.subscription)])
        while txn is not None:  # an end applied here ahead of its mark: the mark first
            try:
                self._txn_acks.await_marks(msg.tp, txn.id)
            except TxnStreamError as exc:
                txn.mark_abort_only(exc)
                raise
            with self._lock:
                if not self._txn_acks.marks_pending(msg.tp):
                    self._log_ack(msgs, offsets, txn, cumulative, r, ours)
                    return
        with self._lock:
            self._log_ack(msgs, offsets, txn, cumulative, r, ours)

    def _log_ack(self, msgs: list[Message], offsets: list[int], txn: Transaction | None,
                 cumulative: bool | None, r: PartitionDelivery, ours: bool) -> None:
        """:meth:`_ack`'s second half, under the lock: the handle's check, then the log."""
        msg = msgs[-1]
        ours = ours and self._reader_for(msg) is r  # not revoked while registering
        r = self._reader_for(msg)
        assert r.handle is not None
        txn_id = txn.id if txn else None
        offsets = sorted(set(offsets))
        exact = cumulative is None and r.cumulative_is_exact(offsets, txn_id)
        cumulative = exact or bool(cumulative)
        # exact, of records all unacked here: it covers exactly them
        covered = r.covered_by(msg.offset) if cumulative and not (exact and ours) \
            else offsets
        try:
            if cumulative and txn_id is not None and (
                    back := self._queue.given_back(msg.tp, covered)):
                raise TransactionConflictError(
                    f"transaction {txn_id} conflicts on {self.subscription}@{msg.tp}: "
                    f"its cumulative ack of offset {msg.offset} would also ack offsets "
                    f"{back[:10]}{' and more' if len(back) > 10 else ''}, given back "
                    "for redelivery (an aborted transaction's acks, or a negative ack) "
                    "and not received again; receive them first, or ack individually",
                    txn_id)
            if cumulative and r.holds_delayed(msg.offset):  # never delivered: not taken
                cumulative, offsets = False, covered or [msg.offset]
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
            self._txn_acks.joined(txn, msg.tp)
            r.acked(covered, in_txn=True)
        else:
            above = [] if cumulative else [o for o in offsets if o >= r.handle.cursor]
            if above:
                # Above the cursor: the group offset cannot say it; the log keeps it.
                self._acks.append_plain(PendingAckEntry(
                    PendingAckKind.ACK_INDIVIDUAL, self.subscription, msg.topic,
                    msg.partition, None, tuple(above), r.handle.generation,
                    self.member_id))
            r.acked(covered, in_txn=False)
        self._group.commit()

    def negative_acknowledge(self, msg: Message) -> None:
        """Redeliver ``msg`` after the nack delay, once, if it is still unacked then.

        Acked in the meantime (plainly, or in a txn: that txn's outcome decides) it is
        not delivered again; nacked twice it comes back once. A record of a partition
        no longer assigned here is left alone, as Pulsar's nack never fails: its next
        owner delivers it (it is unacked).
        """
        with self._lock:
            if (r := self._readers.get(msg.tp)) is None:
                return
            if (latest := r.unacked.get(msg.offset)) == msg:
                msg = latest  # the same record as last handed out: its count
            if not self._queue.is_given_back(msg.tp, msg.offset):  # else it comes once
                msg = self._redeliveries.bump([msg])[0]
            self._queue.nack(msg, time.monotonic() + self._nack_delay)

    def reconsume_later(self, msg: Message, delay: object,
                        txn: Transaction | None = None) -> None:
        """Deliver ``msg`` again after ``delay`` (a ``timedelta`` or seconds), via the retry topic.

        Pulsar's ``reconsumeLater``: written to the retry topic (its delay counted from
        the commit) and acked, in ``txn`` or in a txn of its own; past the policy's
        ``max_redeliver_count`` retries, dead-lettered instead. Needs a dead-letter policy
        with a retry topic (``ConfigError`` otherwise).
        """
        if self.dead_letters is None:
            raise ConfigError("reconsume_later needs subscribe(..., dead_letter_policy="
                              "DeadLetterPolicy(..., retry_letter_topic=... or "
                              "enable_retry=True))")
        self.dead_letters.reconsume_later(msg, delay, txn)

    def _still_unacked(self, msg: Message) -> bool:
        """Whether a record queued again is delivered and unacked here (under the lock)."""
        r = self._readers.get(msg.tp)
        return r is not None and msg.offset in r.unacked

    def _reader_for(self, msg: Message) -> PartitionDelivery:
        r = self._readers.get(msg.tp)
        if r is None:
            raise TxnStreamError(
                f"cannot ack {msg.tp}@{msg.offset}: partition {msg.tp} is not assigned to this "
                f"consumer of subscription {self.subscription!r} (rebalanced away?)")
        return r

    def close(self) -> None:
        """Commit the cursor and leave the group; a second call does nothing.

        The group is left and the Kafka clients closed even if the last cursor commit
        fails (its error is raised after).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            with self._lock:
                self._group.commit(force=True)
        finally:
            with self._lock:
                self._txn_acks.closed = True
            self._wake.close()  # its queue references go before the consumers close
            self._group.close()
            self._acks.close()
            self._follower.close()

    @property
    def delayed_total(self) -> int:
        """Records this consumer held for their delivery time (:mod:`txnstream.delayed`)."""
        return self._ingest.delayed_total

    def tracked_txns(self) -> int:
        """Txns whose acks this consumer still tracks (a bound test reads it)."""
        return max(self._txn_acks.tracked())

    def pending_ack_stats(self, tp: TopicPartition) -> PendingAckStats:
        """The pending-ack state of one owned partition."""
        r = self._readers.get(tp)
        if r is None or r.handle is None:
            raise TxnStreamError(f"{tp} is not assigned to this consumer")
        return r.handle.stats()

