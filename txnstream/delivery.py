"""What the consumer may deliver, and what comes back: its decisions, with no Kafka.

Per assigned partition a :class:`PartitionDelivery` holds where delivery stands and the
messages in each state a delivered record passes through:

=============  =====================================================================
``unacked``    delivered (or queued to be) and not acked: the cursor stays below it
``inflight``   acked in a txn still open: redelivered if it aborts, gone if it commits
``held_back``  acked by an earlier owner's open txn: delivered only if that txn aborts
=============  =====================================================================

and the partition's :class:`~txnstream.pendingack.handle.PendingAckHandle` (Pulsar's
pending-ack state: the cursor, individual acks above it, acks pending in txns).
:class:`ReadyQueue` is the consumer's queue of messages to hand out: new ones in fetch
order, nacked ones after their delay, and redeliveries after an abort in offset order
ahead of later ones (Pulsar redelivers 0, 1, 2 before 3, 4).

Where a partition's delivery starts (:func:`start_on_log`): the committed cursor and the
pending-ack state each know which log of the partition they are of (its log epoch, as
the served buffer state numbers them); one of a log gone since (the topic was deleted
and created again) is not applied to the new log, which is delivered from its start.

Nothing here locks, fetches or logs: the consumer calls it under its lock, and
``tests/unit/test_delivery.py`` checks the decisions without a broker.
"""

from __future__ import annotations

import enum
import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from operator import is_
from typing import TYPE_CHECKING

from txnstream.delayed import Held, Release
from txnstream.errors import TxnStreamError
from txnstream.message import Message
from txnstream.pendingack.records import CursorMetadata
from txnstream.types import TopicPartition, TxnID

if TYPE_CHECKING:
    from txnstream.buffer.served import BufferView, ServeStatus
    from txnstream.kafka.fetch import KafkaRecord
    from txnstream.pendingack.handle import PendingAckHandle
    from txnstream.pendingack.records import Checkpointed

__all__ = ["PartitionDelivery", "ReadyQueue", "StartPlan", "Verdict", "message_order",
           "newer_log", "start_on_log", "verdict"]


class Verdict(enum.Enum):
    """What a reader does with a fetched record of a transactional partition."""

    WAIT = "wait"
    """Past the served max read position (or no served state yet): pause here."""
    SKIP = "skip"
    """A marker, or a record the fold hides (aborted, straggler, forged): never shown."""
    DELIVER = "deliver"
    """Committed (or plain) and at or below the max read position."""


def verdict(view: BufferView | None, offset: int, txn_raw: bytes | None,
            marker: bool) -> Verdict:
    """The served view's word on the record at ``offset`` (its ``txn.id``, if a marker)."""
    if view is None or offset > view.max_read_position:
        return Verdict.WAIT
    if marker or not view.visible(offset, txn_raw):
        return Verdict.SKIP
    return Verdict.DELIVER


def newer_log(noted: int | None, now: int | None) -> bool:
    """Whether positions noted on log epoch ``noted`` are of a log gone since.

    ``now`` is the served view's epoch; None (no view: a partition read plain, or not
    served yet) decides nothing. A position with no epoch noted (None or -1: metadata
    or pending-ack records of a version that noted none, a claim made before any view)
    counts as of the first log, epoch 0: epochs start there, and a log of a higher one
    was created after the buffer role found the topic recreated, so positions taken
    before are of a log gone (if they were taken after, by an older version, the new
    log comes again from its start: records twice, none lost).
    """
    return now is not None and now > (noted if noted is not None and noted >= 0 else 0)


@dataclass(frozen=True, slots=True)
class StartPlan:
    """Where a new owner of a partition starts (:func:`start_on_log`)."""

    start: int
    """The first offset to deliver (the claim's cursor)."""
    committed: int
    """The committed cursor if it applies to this log, else -1 (commits may go lower)."""
    new_log: bool
    """The pending-ack state is of an older log: the claim starts it over on this one."""
    log_epoch: int
    """The log epoch the claim notes beside its cursor (-1 not known)."""


def start_on_log(committed: int, cursor_epoch: int | None, state_epoch: int,
                 state_cursor: int, view_epoch: int | None, low: int,
                 initial: Callable[[], int]) -> StartPlan:
    """Where to start delivering a partition just taken, and on which log.

    ``committed`` is the group's committed offset (-1 none) and ``cursor_epoch`` the log
    epoch its metadata notes; ``state_epoch`` and ``state_cursor`` are the replayed
    pending-ack state's; ``view_epoch`` the served view's now (None: none yet);
    ``low`` the log start; ``initial()`` the subscription's initial position (asked
    only for a subscription with no cursor and no state of an older log).

    A cursor or a state of a log older than the view's is of a log that is gone: the
    subscription read that topic before it was recreated, so the new log is delivered
    from its start (``low``), whatever the initial position; a state that still applies
    keeps every offset below its cursor acked.
    """
    stale_cursor = committed >= 0 and newer_log(cursor_epoch, view_epoch)
    stale_state = newer_log(state_epoch, view_epoch)
    if committed >= 0 and not stale_cursor:
        start = committed
    elif stale_cursor or stale_state:
        start = low
    else:
        start = initial()
    if not stale_state:
        start = max(start, state_cursor)
    if view_epoch is not None:
        epoch = view_epoch
    else:
        epoch = max(state_epoch, -1 if cursor_epoch is None else cursor_epoch)
    return StartPlan(max(start, low), -1 if stale_cursor else committed, stale_state, epoch)


def message_order(m: Message) -> tuple[str, int, int]:
    """Offset order within a partition (partitions by name)."""
    return (m.topic, m.partition, m.offset)


@dataclass
class PartitionDelivery:
    """Position filter and in-order delivery state of one partition."""

    tp: TopicPartition
    status: ServeStatus
    deliver_pos: int
    """Next offset to deliver (or skip)."""
    wait_at: int | None = None
    """The first record not taken yet: the partition waits here until the served max read
    position reaches it, its records from here on held (:attr:`held`) or, past the
    hold's bound, the fetcher paused (:attr:`paused_at`)."""
    held: list[KafkaRecord] = field(default_factory=list)
    """Records fetched from :attr:`wait_at` on, in offset order, taken once it is served
    (:class:`txnstream.ingest.Ingest`): the fetcher goes on instead of pausing."""
    held_bytes: int = 0
    held_next: int = -1
    """The next offset the hold takes (one the fetcher gives again is skipped)."""
    paused_at: int | None = None
    """The fetcher is paused and sought here (a full hold, or delayed records held)."""
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
    """The offset metadata changed (a checkpoint, the log epoch): commit it."""
    delayed: dict[int, Message] = field(default_factory=dict)
    """Fetched before their delivery time (:mod:`txnstream.delayed`), in offset order: not
    delivered yet, and the cursor stays below them."""
    awaiting: dict[bytes, list[tuple[Message, int]]] = field(default_factory=dict)
    """Of :attr:`delayed`, txn records delayed from their txn's commit: ``txn.id`` ->
    ``(message, ms after the commit)``, until the reader meets the txn's marker."""
    delay_paused: bool = False
    """Paused at :attr:`wait_at` because it holds all it may (:mod:`txnstream.delayed`)."""

    def metadata(self) -> str | None:
        """The committed offset's metadata: the log epoch and the latest checkpoint."""
        epoch = self.handle.log_epoch if self.handle is not None else -1
        return CursorMetadata(epoch if epoch >= 0 else None, self.checkpoint).to_metadata()

    def cursor(self) -> int:
        """The group offset to commit: below every unacked or pending offset."""
        lows = [self.deliver_pos]
        if self.unacked:
            lows.append(min(self.unacked))
        if self.delayed:  # in offset order: the first is the lowest
            lows.append(next(iter(self.delayed)))
        if self.handle is not None and (held := self.handle.lowest_held()) is not None:
            lows.append(held)
        return min(lows)

    def quiet(self) -> bool:
        """No pending or individual acks here (the fetch loop's fast path).

        Then every record at or above the cursor is deliverable, without asking the
        handle per record.
        """
        h = self.handle
        return h is None or (not h.pending and h.cumulative is None and not h.acked
                             and not h.redeliveries)

    def offer(self, msg: Message) -> Message | None:
        """A fetched, visible record: the message to deliver now (it is then unacked).

        One acked in an open txn (an earlier owner's) is held back for its outcome; one
        already acked is dropped (None). One that came back before carries its count.
        """
        off, h = msg.offset, self.handle
        if h is not None and h.pending_txn(off) is not None:
            self.held_back[off] = msg
            return None
        if h is None or h.is_deliverable(off):
            if h is not None and (n := h.redeliveries.get(off)):
                msg = replace(msg, redelivery_count=n)
            self.unacked[off] = msg  # queued counts as unacked: the cursor stays below it
            return msg
        return None

    def came_back(self, msgs: Iterable[Message]) -> list[Message]:
        """``msgs`` (unacked here) are delivered again: each with its count one higher.

        The new messages replace the old in :attr:`unacked` (an ack names the one handed
        out); the caller logs their offsets (``REDELIVERED``) and queues them.
        """
        out = [m for m in msgs if self.unacked.get(m.offset) is m]
        if self.handle is None or not out:
            return out
        self.handle.came_back(m.offset for m in out)
        counts = self.handle.redeliveries
        out = [replace(m, redelivery_count=counts.get(m.offset, m.redelivery_count + 1))
               for m in out]
        for m in out:
            self.unacked[m.offset] = m
        return out

    def holds(self, msgs: Sequence[Message], offsets: Sequence[int]) -> bool:
        """Whether ``msgs`` (ascending, at ``offsets``) are the records delivered here, unacked.

        One dict read each, in C: a batch's ack tests them at once.
        """
        return offsets[-1] < self.deliver_pos and all(map(is_, map(self.unacked.get, offsets),
                                                          msgs))

    def covered_by(self, last: int) -> list[int]:
        """The unacked offsets a cumulative ack of ``last`` takes (redeliveries too)."""
        return sorted(o for o in self.unacked if o <= last)

    def cumulative_is_exact(self, offsets: list[int], txn_id: TxnID | None) -> bool:
        """Whether a cumulative ack of ``offsets[-1]`` acks exactly ``offsets`` now.

        It does if no other delivered record below it is unacked (queued, nacked or
        redelivered after an abort), none is held back or pending in another txn, and
        no other txn's cumulative ack is pending. Records below it that are acked
        already, or invisible (markers, aborted), change nothing.
        """
        h = self.handle
        assert h is not None
        last = offsets[-1]
        if last < h.cursor or (h.cumulative is not None and h.cumulative[0] != txn_id):
            return False
        if self.holds_delayed(last):
            return False
        mine, unacked = set(offsets), self.unacked
        return ((unacked.keys() <= mine or all(o in mine for o in unacked if o <= last))
                and not any(o <= last for o in self.held_back)
                and not any(o <= last and t != txn_id for o, t in h.pending.items()))

    def holds_delayed(self, last: int) -> bool:
        """Whether a record at or below ``last`` is held for its time.

        A cumulative ack must not take it: it was never delivered.
        """
        return bool(self.delayed) and next(iter(self.delayed)) <= last

    def acked(self, offsets: Iterable[int], in_txn: bool) -> None:
        """``offsets`` were acked: in a txn they wait in ``inflight`` for its outcome."""
        for o in offsets:
            m = self.unacked.pop(o, None)
            if m is not None and in_txn:
                self.inflight[o] = m

    def end_txn(self, txn_id: TxnID, committed: bool) -> list[Message]:
        """Apply ``txn_id``'s outcome (idempotent); the messages to deliver again.

        A commit drops what it acked from ``inflight`` and ``held_back``; an abort makes
        every message its acks covered unacked again, to be redelivered.
        """
        h = self.handle
        if h is None:
            return []
        if committed:
            eff = h.commit(txn_id)
            for o in [o for o in self.inflight if o < eff.cursor or o in eff.acked
                      or o in h.acked]:
                del self.inflight[o]
            for o in [o for o in self.held_back if not h.is_deliverable(o)
                      and h.pending_txn(o) is None]:
                del self.held_back[o]
            return []
        back = []
        for o in h.abort(txn_id).redeliver:  # each one's count is one higher now
            m = self.inflight.pop(o, None) or self.held_back.pop(o, None)
            if m is not None:
                m = replace(m, redelivery_count=h.redelivery_count(o))
                back.append(m)
                self.unacked[o] = m
        return back


class ReadyQueue:
    """Messages to hand out: fetched ones in order, nacked ones when their delay is up."""

    def __init__(self) -> None:
        self.ready: deque[Message] = deque()
        """In delivery order (the fetch loop appends here directly)."""
        self._nacked: list[tuple[float, int, Message]] = []
        self._nacked_seq: dict[tuple[TopicPartition, int], int] = {}
        """Per nacked message, its latest entry in ``_nacked`` (older ones are skipped):
        at most one per waiting message."""
        self._seq = 0
        self._given_back: dict[TopicPartition, set[int]] = {}
        """Offsets queued again (nacked, redelivered: an aborted txn's acks) and not
        handed out since: see :meth:`given_back`. Empty on the common path."""
        self.held = Held()
        """Records held for their time (:mod:`txnstream.delayed`)."""

    def take(self, n: int, now: float,
             unacked: Callable[[Message], bool] | None = None,
             release: Release | None = None, wall_ms: int | None = None) -> list[Message]:
        """Up to ``n``: held and nacked ones due first, then the ready ones.

        ``release``: takes a held record whose time came (at ``wall_ms``, epoch ms; now
        if None) back to its partition, returning the message to hand out (None: not any
        more, e.g. acked by an earlier owner).

        ``unacked``: whether a message queued again (nacked, redelivered) is still
        unacked here; one that is not (acked since, plainly or in a txn, or no longer
        this consumer's) is dropped, not handed out. Pulsar's broker redelivers only
        positions still unacked: an ack between the nack and its delay wins.
        """
        out: list[Message] = []
        if self.held and release is not None:
            wall = int(time.time() * 1000) if wall_ms is None else wall_ms
            while len(out) < n and (m := self.held.pop_due(wall)) is not None:
                if (given := release(m)) is not None:
                    out.append(given)
        nacked = self._nacked
        while nacked and nacked[0][0] <= now and len(out) < n:
            _, seq, m = heapq.heappop(nacked)
            key = (m.tp, m.offset)
            if self._nacked_seq.get(key) != seq:
                continue  # nacked again since: its later entry hands it out
            del self._nacked_seq[key]
            if unacked is None or unacked(m):
                out.append(m)
            else:
                self._handed_out((m,))
        ready = self.ready
        if unacked is not None and self._given_back:
            while ready and len(out) < n:
                m = ready.popleft()
                offs = self._given_back.get(m.tp)
                if offs is not None and m.offset in offs and not unacked(m):
                    self._handed_out((m,))
                    continue
                out.append(m)
        elif len(out) + len(ready) <= n:
            out.extend(ready)
            ready.clear()
        else:
            while ready and len(out) < n:
                out.append(ready.popleft())
        if self._given_back:
            self._handed_out(out)
        return out

    def _handed_out(self, msgs: Iterable[Message]) -> None:
        for m in msgs:
            offs = self._given_back.get(m.tp)
            if offs is not None:
                offs.discard(m.offset)
                if not offs:
                    del self._given_back[m.tp]

    def given_back(self, tp: TopicPartition, offsets: Iterable[int]) -> list[int]:
        """Those of ``offsets`` queued again and not handed out since.

        Records an aborted txn's acks gave back (or a nack, a redelivery) below where
        the caller has already received: a cumulative ack in a txn must not take them
        unprocessed (the consumer refuses it as a conflict).
        """
        offs = self._given_back.get(tp)
        return sorted(o for o in offsets if o in offs) if offs else []

    def is_given_back(self, tp: TopicPartition, offset: int) -> bool:
        """Whether the record at ``offset`` is queued again (nacked, redelivered) already."""
        offs = self._given_back.get(tp)
        return offs is not None and offset in offs

    def nack(self, msg: Message, due: float) -> None:
        """Hand ``msg`` out again at ``due`` (monotonic seconds), once.

        Nacked again before that, the later due time replaces the earlier one (Pulsar's
        nack tracker keeps one entry per message); one already queued for redelivery
        (an aborted txn's acks) comes back with that redelivery only.
        """
        key = (msg.tp, msg.offset)
        offs = self._given_back.get(msg.tp)
        if key not in self._nacked_seq and offs is not None and msg.offset in offs:
            return
        self._seq += 1
        self._nacked_seq[key] = self._seq
        heapq.heappush(self._nacked, (due, self._seq, msg))
        self._given_back.setdefault(msg.tp, set()).add(msg.offset)

    def redeliver(self, msgs: Iterable[Message],
                  fresh: Callable[[list[Message]], list[Message]] | None = None) -> int:
        """Queue ``msgs`` again in offset order, ahead of later ones; how many were new.

        One already waiting (ready or nacked) is not queued twice. ``fresh``: maps the
        new ones to what is queued (each counted once more:
        :class:`txnstream.lifecycle.Redeliveries`).
        """
        waiting = {message_order(m) for m in self.ready}
        waiting.update((tp.topic, tp.partition, off) for tp, off in self._nacked_seq)
        back = {message_order(m): m for m in msgs if message_order(m) not in waiting}
        if back and fresh is not None:
            back = {message_order(m): m for m in fresh(list(back.values()))}
        if back:
            self.ready = deque(sorted([*self.ready, *back.values()], key=message_order))
            for m in back.values():
                self._given_back.setdefault(m.tp, set()).add(m.offset)
        return len(back)

    def drop(self, tp: TopicPartition) -> None:
        """Forget every waiting message of ``tp`` (no longer delivered here)."""
        self.ready = deque(m for m in self.ready if m.tp != tp)
        self._nacked = [n for n in self._nacked if n[2].tp != tp]
        heapq.heapify(self._nacked)
        for key in [k for k in self._nacked_seq if k[0] == tp]:
            del self._nacked_seq[key]
        self._given_back.pop(tp, None)
        self.held.drop(tp)


def check_delivered(r: PartitionDelivery, view: BufferView | None, msgs: Sequence[Message],
                    offsets: Sequence[int], subscription: str) -> bool:
    """Refuse an ack of ``msgs`` (one partition, ascending, at ``offsets``) not delivered.

    Not delivered here: beyond what was released, or not a visible record there. True if
    they are the very records delivered here, unacked and visible, which is tested for
    the batch at once; False if each had to be tested.
    """
    if r.holds(msgs, offsets) and (view is None or offsets[-1] < view.trimmed_below
                                   or view.all_visible(offsets)):
        return True
    for m in msgs:
        if m.offset >= r.deliver_pos or not _was_visible(r, view, m):
            raise TxnStreamError(f"cannot ack {m.tp}@{m.offset}: not a message delivered to "
                                 f"this consumer of {subscription!r}")
    return False


def _was_visible(r: PartitionDelivery, view: BufferView | None, msg: Message) -> bool:
    if (there := r.unacked.get(msg.offset, msg)) is not msg and there != msg:
        return False  # another record there: msg is of a log gone since (recreated)
    if view is None or msg.offset < view.trimmed_below:
        return True  # plain, or below the cursor (the handle decides)
    if msg.offset > view.max_read_position and r.unacked.get(msg.offset) is msg \
            and r.handle is not None \
            and not newer_log(r.handle.log_epoch, view.log_epoch):
        # Delivered here, on this log, before the view read it: a view made anew (the
        # topic became served while it was held, or a new owner's first fold not
        # published yet) says nothing against it yet.
        return True
    return view.visible(msg.offset, msg.txn_id.to_bytes() if msg.txn_id else None)
