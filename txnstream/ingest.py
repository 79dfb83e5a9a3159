"""The consumer's fetch loop: what each fetched record becomes (its hot path).

:class:`Ingest` takes a fetch batch under the consumer's lock and, per record, asks the
served view (:func:`txnstream.delivery.verdict`) and the partition's delivery state
whether to deliver it, skip it or wait there; a record whose time has not come
(:mod:`txnstream.delayed`) is held instead, and handed out when it falls due
(:meth:`Ingest.release`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from txnstream import metrics
from txnstream.buffer.served import BufferView, ServeStatus
from txnstream.buffer.unregistered import Judgement, UnregisteredRecords
from txnstream.delayed import MAX_HELD, MAX_HELD_BYTES, after_ms, commit_ms, due_ms
from txnstream.delivery import PartitionDelivery, ReadyQueue, Verdict, verdict
from txnstream.errors import message_error
from txnstream.message import Delay, Message, make_message, split_headers
from txnstream.ratelog import RateLimitedLog
from txnstream.types import TopicPartition, TxnID

if TYPE_CHECKING:
    from txnstream.buffer.follower import BufferStateFollower
    from txnstream.consumer_group import GroupMember
    from txnstream.kafka.fetch import KafkaRecord

__all__ = ["Ingest"]

log = logging.getLogger("txnstream.consumer")

WAIT, SKIP = Verdict.WAIT, Verdict.SKIP

TXN_ID_CACHE = 10_000
"""Parsed ``txn.id`` headers kept per consumer (one per txn in flight, cleared past it)."""
HOLD_PARTITION_BYTES = 1 << 20
"""What one partition's hold keeps at most (records fetched past where it waits); past
it the fetcher pauses there, and fetches them again once the partition is served."""
HOLD_BYTES = 16 << 20
"""What one consumer's holds keep at most, all partitions together."""
HOLD_RECORD_OVERHEAD = 128
"""Bytes counted per held record beside its key, value and headers (the object)."""


class Ingest:
    """Turns fetched records into messages to hand out, for one consumer."""

    def __init__(self, member_id: str, subscription: str,
                 readers: dict[TopicPartition, PartitionDelivery],
                 queue: ReadyQueue, follower: BufferStateFollower,
                 unreg: UnregisteredRecords, group: GroupMember) -> None:
        self.member_id = member_id
        self._delayed_metric = metrics.DELAYED.labels(subscription)
        self._readers, self._queue, self._follower = readers, queue, follower
        self._unreg, self._group = unreg, group
        self._txn_ids: dict[bytes, TxnID] = {}
        self._bad_delays = RateLimitedLog(log)
        self._paused: set[TopicPartition] = set()
        """Partitions paused because this consumer holds all the delayed records it may."""
        self._holding: dict[TopicPartition, PartitionDelivery] = {}
        """Partitions whose records are held where they wait (:meth:`_hold`)."""
        self.held_bytes = 0
        """What the holds keep (at most :data:`HOLD_BYTES`)."""
        self.delayed_total = 0
        """Records held for their time since the start (each holding counts)."""

    def __call__(self, batch: list[KafkaRecord]) -> None:
        """Deliver what the served state says is committed; wait at the first that is not.

        Per run of one partition's records, the reader, its view and its pending-ack
        state are looked up once; per record, a few comparisons and the
        :class:`Message` (the same object a hand-written ``read_committed`` loop
        builds). Records of a partition from the one it waits at on are held, in
        order, and taken first once it is served (the fetcher goes on meanwhile: a
        commit makes them visible without another fetch); past the hold's bound the
        fetcher pauses there and fetches the rest again.
        """
        if self._holding:
            batch = self._released() + batch
        queue, views, ids = self._queue, self._follower.views, self._txn_ids
        ready, unacked_of = queue.ready, None
        key: tuple[str, int] | None = None
        r: PartitionDelivery | None = None
        view = None
        quiet = False
        for m in batch:
            if m.error() is not None:
                message_error(m, f"consumer {self.member_id}", log)
                continue
            topic, part = m.topic(), m.partition()
            if (topic, part) != key:
                key = (topic, part)
                r = self._readers.get(TopicPartition(topic, part))
                view = views.get(r.tp) if r is not None else None
                quiet = r is not None and r.quiet()
                unacked_of = r.unacked if r is not None else None
            if r is None:
                continue
            if r.wait_at is not None:
                if r.paused_at is None:
                    self._hold(r, m)
                continue
            off = m.offset()
            if off < r.deliver_pos:
                continue
            txn_raw, marker, user, delay = split_headers(m.headers())
            if r.status is ServeStatus.PLAIN:
                if txn_raw is None and not marker:
                    r.deliver_pos = off + 1
                    msg = make_message(topic, part, off, m.key(), m.value(), tuple(user),
                                       m.timestamp()[1], None, 0)
                    if delay is not None and self._delayed(r, msg, delay, None):
                        continue
                    if (given := r.offer(msg)) is not None:
                        ready.append(given)
                    continue
                judged = self._unreg.judge(r.tp, off)  # junk, unless its topic is registered
                if judged is not Judgement.REGISTERED:
                    if judged is Judgement.JUNK:
                        r.deliver_pos = off + 1
                    else:
                        self._wait(r, m, off)  # asked again when due
                    continue
                log.info("%s: %s has txn records from offset %d on: reading served state",
                         self.member_id, r.tp, off)
                self._follower.unfollow(r.tp)
                r.status = self._follower.follow(r.tp, plain_ok=False)
                view = views.get(r.tp)
            said = verdict(view, off, txn_raw, marker)
            if said is WAIT:
                self._wait(r, m, off)
                continue
            r.deliver_pos = off + 1
            if said is SKIP:
                if marker and r.awaiting and txn_raw in r.awaiting:  # its commit: their time
                    assert txn_raw is not None
                    rec_ms = max(h.timestamp_ms for h, _ in r.awaiting[txn_raw])
                    queue.held.committed(r, txn_raw, commit_ms(
                        m.timestamp()[1], rec_ms, int(time.time() * 1000)))
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
            msg = make_message(topic, part, off, m.key(), m.value(), tuple(user),
                               m.timestamp()[1], txn_id, 0)
            if delay is not None and self._delayed(r, msg, delay, txn_raw, view):
                continue
            if quiet and (r.handle is None or off >= r.handle.cursor):
                ready.append(msg)
                assert unacked_of is not None
                unacked_of[off] = msg  # queued counts as unacked: the cursor stays below it
            elif (given := r.offer(msg)) is not None:
                ready.append(given)

    def _wait(self, r: PartitionDelivery, m: KafkaRecord, off: int) -> None:
        """``r`` waits at ``m`` (at ``off``) until it is served: hold it and what follows."""
        self._group.hold_at(r, off)
        r.held_next = off
        self._holding[r.tp] = r
        self._hold(r, m)

    def _hold(self, r: PartitionDelivery, m: KafkaRecord) -> None:
        """Keep ``m``, fetched past where ``r`` waits; a full hold pauses the fetcher at it."""
        off = m.offset()
        if off < r.held_next:  # fetched again (after a seek): held already
            return
        size = HOLD_RECORD_OVERHEAD + len(m.value() or b"") + len(m.key() or b"")
        if (hs := m.headers()) is not None:
            size += sum(len(k) + len(v or b"") for k, v in hs)
        if r.held_bytes + size > HOLD_PARTITION_BYTES or self.held_bytes + size > HOLD_BYTES:
            self._group.wait_at(r, off)
            return
        r.held.append(m)
        r.held_bytes += size
        self.held_bytes += size
        r.held_next = off + 1

    def released_any(self) -> bool:
        """Whether a partition's held records are to be taken (it was served since)."""
        return any(r.wait_at is None for r in self._holding.values())

    def _released(self) -> list[KafkaRecord]:
        """The held records of partitions served since (taken first); drop dropped ones."""
        out: list[KafkaRecord] = []
        for tp, r in list(self._holding.items()):
            if self._readers.get(tp) is not r:  # dropped (revoked, fenced): its hold too
                pass
            elif r.wait_at is not None:
                continue
            else:
                out += r.held
            del self._holding[tp]
            self.held_bytes -= r.held_bytes
            r.held, r.held_bytes = [], 0
        return out

    def _delayed(self, r: PartitionDelivery, msg: Message, delay: Delay,
                 txn_raw: bytes | None, view: BufferView | None = None) -> bool:
        """Whether ``msg`` (``r.deliver_pos`` past it) is held or waited at, not delivered now.

        Held if its time has not come; waited at (the partition paused there, fetched
        again once a held record falls due) if ``r`` or the consumer holds all it may.
        One already acked, or held back by an earlier owner's txn, is the handle's as
        any record is (:meth:`PartitionDelivery.offer`). A record delayed from its
        txn's commit takes its time from the served ``view`` (the owner resolved it at
        the commit marker: :mod:`txnstream.buffer.delays`); only where the view does
        not say (an owner of an older release) does it wait for the marker.
        """
        assert delay is not None
        h, off = r.handle, msg.offset
        if h is not None and (not h.is_deliverable(off) or h.pending_txn(off) is not None):
            return False
        now = int(time.time() * 1000)
        try:
            due = due_ms(delay, msg.timestamp_ms, now, txn_raw is not None)
        except ValueError as exc:
            self._bad_delays.warning("delay", "%s: %s@%d delivered now: %s", self.member_id,
                                     r.tp, off, exc)
            return False
        if due is None and view is not None:
            due = view.delayed.due_of(off)
        if due is not None and due <= now:
            return False
        if (len(r.delayed) >= MAX_HELD or self._queue.held.bytes >= MAX_HELD_BYTES) \
                and not r.awaiting:  # (what gives those their time lies ahead: read on)
            r.deliver_pos, r.delay_paused = off, True
            self._group.wait_at(r, off)
            self._paused.add(r.tp)
            return True
        self.delayed_total += 1
        self._delayed_metric.inc()
        self._queue.held.hold(r, msg, due, after_ms(delay) if due is None else 0, txn_raw)
        return True

    def release(self, msg: Message) -> Message | None:
        """A held ``msg`` whose time came: the message to hand out, if still held here.

        A partition paused because it held all it may resumes below the bound.
        """
        r = self._readers.get(msg.tp)
        if r is None or r.delayed.get(msg.offset) is not msg:
            return None
        del r.delayed[msg.offset]
        if self._paused and self._queue.held.bytes < MAX_HELD_BYTES:
            for tp in list(self._paused):
                p = self._readers.get(tp)
                if p is None or not p.delay_paused:
                    self._paused.discard(tp)
                elif len(p.delayed) < MAX_HELD:
                    self._group.resume(p)
                    self._paused.discard(tp)
        return r.offer(msg)
