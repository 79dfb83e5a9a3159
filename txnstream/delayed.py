"""Delayed delivery: a record delivered no earlier than a time (Pulsar's ``deliverAt``).

Kafka has no delayed delivery; Pulsar keeps it in the broker (a delay tracker per
subscription, for Shared subscriptions only, its index in memory or in bucket
snapshots). Here a record carries its time in a header, and every committed-only reader
holds it back until then:

* ``txn.deliver.at``: epoch milliseconds, ASCII decimal. Written for ``deliver_at``, and
  for ``deliver_after`` outside a txn (the send time plus the delay).
* ``txn.deliver.after``: milliseconds after the commit of the txn that wrote the record
  (``deliver_after`` in a txn, as Pulsar's PR #17548 asks). The commit time is the
  timestamp of the txn's marker in the same partition. The buffer owner resolves it
  when it folds that marker (a marker counts only if a worker wrote it) and publishes
  the due time with the served state (:mod:`txnstream.buffer.delays`), where readers
  take it; without it (an owner of an older release) the reader takes the marker's
  timestamp itself when it meets the marker, between the record's own and the reader's
  clock (:func:`commit_ms`).

The reader (:mod:`txnstream.ingest`) holds a record that is not due in memory, not
delivered, and keeps the subscription's cursor below it while what lies behind it goes
on; once due it is delivered (ahead of records fetched later, as a nacked record is). A
consumer that restarts reads it again from the log and holds it again: the log is the
index (the served state repeats the due times, for readers that plan ahead).

Bounds (stated, and what happens past them):

* a delay is at most :data:`MAX_DELAY_S` (a week, Kafka's default retention: a record
  must outlive its delay in the log); a sender asking more is refused, a header claiming
  more is taken as that much;
* a partition holds at most :data:`MAX_HELD` records, a consumer at most
  :data:`MAX_HELD_BYTES` of their keys and values: past either, the partition pauses
  at the next record until a held one falls due, so a flood of delayed records costs
  latency behind it, not memory. A record delayed from its txn's commit takes its time
  from the served state (:mod:`txnstream.buffer.delays`: the owner resolved it at the
  commit marker), so the bound holds for it too; only where the state does not say (an
  owner of an older release) is it held until the reader meets its marker, which lies
  ahead of it, and a partition holding such records reads on past the bound;
* a header that does not parse (a writer outside txnstream) delays nothing: the record
  is delivered at once and the reader logs it (nothing is lost).
"""

from __future__ import annotations

import datetime as dt
import heapq
import math
from collections.abc import Callable
from typing import Protocol

from txnstream.errors import ConfigError
from txnstream.message import DELIVER_AFTER_HEADER, DELIVER_AT_HEADER, Delay, Message
from txnstream.types import TopicPartition

__all__ = ["MAX_DELAY_S", "MAX_HELD", "MAX_HELD_BYTES", "Held", "Holder", "Release",
           "after_ms", "commit_ms", "delay_header", "due_ms", "held_size"]

MAX_DELAY_S = 7 * 86_400
"""The longest delay: a week, Kafka's default ``retention.ms`` (a record delayed past its
topic's retention may be deleted before it is due: keep delays below it)."""
MAX_HELD = 10_000
"""Records one partition holds for their time; past it the partition pauses."""
MAX_HELD_BYTES = 64 << 20
"""Keys and values one consumer holds for their time; past it partitions pause."""
_MAX_DIGITS = 19


def _millis(value: object, name: str, *, allow_datetime: bool) -> int:
    """``value`` as whole milliseconds; ``ConfigError`` naming ``name`` if it is not one."""
    if isinstance(value, dt.timedelta):
        return int(value.total_seconds() * 1000)
    if allow_datetime and isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ConfigError(f"{name} must be a timezone-aware datetime (or epoch ms), "
                              f"got naive {value!r}")
        return int(value.timestamp() * 1000)
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value):
        kinds = "an aware datetime or epoch ms" if allow_datetime else "a timedelta or seconds"
        raise ConfigError(f"{name} must be {kinds}, got {value!r:.80}")
    return int(value) if allow_datetime else int(value * 1000)


def delay_header(deliver_after: object, deliver_at: object, in_txn: bool,
                 now_ms: int) -> tuple[str, bytes] | None:
    """The delay header a send writes (None: not delayed), or ``ConfigError`` naming the option.

    ``deliver_after``: a ``timedelta`` or seconds, from now, or in a txn from its commit;
    ``deliver_at``: epoch milliseconds or an aware ``datetime``. Not both; neither
    negative nor more than :data:`MAX_DELAY_S` ahead.
    """
    if deliver_after is None and deliver_at is None:
        return None
    if deliver_after is not None and deliver_at is not None:
        raise ConfigError("deliver_after and deliver_at: give one of them, not both")
    if deliver_after is not None:
        after = _millis(deliver_after, "deliver_after", allow_datetime=False)
        if not 0 <= after <= MAX_DELAY_S * 1000:
            raise ConfigError(f"deliver_after must be between 0 and {MAX_DELAY_S} s "
                              f"(a week), got {deliver_after!r}")
        if in_txn:
            return DELIVER_AFTER_HEADER, str(after).encode()
        return DELIVER_AT_HEADER, str(now_ms + after).encode()
    at = _millis(deliver_at, "deliver_at", allow_datetime=True)
    if at < 0 or at > now_ms + MAX_DELAY_S * 1000:
        raise ConfigError(f"deliver_at must be an epoch ms time at most {MAX_DELAY_S} s "
                          f"(a week) from now, got {deliver_at!r}")
    return DELIVER_AT_HEADER, str(at).encode()


def _header_ms(delay: tuple[str, bytes | None]) -> int:
    name, raw = delay
    if not isinstance(raw, bytes) or not 0 < len(raw) <= _MAX_DIGITS or not raw.isdigit():
        raise ValueError(f"header {name!r} is not a decimal number of ms: {raw!r:.40}")
    return int(raw)


def due_ms(delay: Delay, record_ms: int, now_ms: int, in_txn: bool) -> int | None:
    """When a record with ``delay`` (see :func:`txnstream.message.split_headers`) is due.

    Epoch ms; None if it counts from its txn's commit, not seen yet (see
    :func:`commit_ms`). ``ValueError`` naming the header if its value does not parse
    (the caller delivers the record now). A time beyond :data:`MAX_DELAY_S` from now is
    taken as that far. ``record_ms`` is the record's timestamp: a ``txn.deliver.after``
    on a record written outside a txn (not txnstream's) counts from it.
    """
    if delay is None:
        return 0
    ms = _header_ms(delay)
    cap = now_ms + MAX_DELAY_S * 1000
    if delay[0] == DELIVER_AT_HEADER:
        return min(ms, cap)
    if in_txn:
        return None
    return min(record_ms + ms, cap)


def after_ms(delay: tuple[str, bytes | None]) -> int:
    """The delay of a ``txn.deliver.after`` header, in ms (at most :data:`MAX_DELAY_S`)."""
    return min(_header_ms(delay), MAX_DELAY_S * 1000)


def commit_ms(marker_ms: int, record_ms: int, now_ms: int) -> int:
    """The commit time a delay counts from: the marker's, within [record's, now]."""
    return max(min(marker_ms, now_ms), min(record_ms, now_ms))


def held_size(msg: Message) -> int:
    """What holding ``msg`` costs, for :data:`MAX_HELD_BYTES`."""
    return 100 + len(msg.key or b"") + len(msg.value or b"")


Release = Callable[[Message], Message | None]
"""Takes a held message that fell due back from the queue: the message to hand out."""


class Holder(Protocol):
    """A partition's delivery state, as :class:`Held` keeps it (``PartitionDelivery``)."""

    tp: TopicPartition
    delayed: dict[int, Message]
    awaiting: dict[bytes, list[tuple[Message, int]]]


class Held:
    """The records a consumer holds for their time, by when they fall due.

    Each is also in its partition's :attr:`~txnstream.delivery.PartitionDelivery.delayed`
    (which keeps the cursor below it); one delayed from its txn's commit waits in the
    partition's ``awaiting`` until the reader meets that commit (:meth:`committed`).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Message]] = []
        self._seq = 0
        self._bytes_of: dict[TopicPartition, int] = {}
        self.bytes = 0
        """What every held record costs (:func:`held_size`), awaiting ones too."""

    def __bool__(self) -> bool:
        return bool(self._heap)

    def hold(self, r: Holder, msg: Message, due: int | None, after: int = 0,
             txn_raw: bytes | None = None) -> None:
        """Hold ``msg`` (of ``r``) until ``due`` (epoch ms).

        ``due`` None: ``after`` ms after ``txn_raw``'s commit, not seen yet.
        """
        r.delayed[msg.offset] = msg
        size = held_size(msg)
        self.bytes += size
        self._bytes_of[r.tp] = self._bytes_of.get(r.tp, 0) + size
        if due is not None:
            self._push(due, msg)
        else:
            assert txn_raw is not None
            r.awaiting.setdefault(txn_raw, []).append((msg, after))

    def committed(self, r: Holder, txn_raw: bytes, at: int) -> None:
        """``txn_raw`` committed at ``at`` (epoch ms): its records held in ``r`` get their time."""
        for msg, after in r.awaiting.pop(txn_raw, ()):
            self._push(at + after, msg)

    def _push(self, due: int, msg: Message) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, msg))

    def next_due(self) -> int | None:
        """When the next held record with a time falls due (epoch ms)."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: int) -> Message | None:
        """The next record due at ``now`` (no longer counted here), or None."""
        if not self._heap or self._heap[0][0] > now:
            return None
        msg = heapq.heappop(self._heap)[2]
        size = held_size(msg)
        self.bytes -= size
        left = self._bytes_of.get(msg.tp, 0) - size
        if left > 0:
            self._bytes_of[msg.tp] = left
        else:
            self._bytes_of.pop(msg.tp, None)
        return msg

    def drop(self, tp: TopicPartition) -> None:
        """Forget what ``tp`` holds (no longer delivered here)."""
        if tp not in self._bytes_of:
            return
        self._heap = [h for h in self._heap if h[2].tp != tp]
        heapq.heapify(self._heap)
        self.bytes -= self._bytes_of.pop(tp)
