"""Txn records in a partition read plain: junk, or the first of a genuine writer's.

A partition no coordinator ever registered is read plain (it pays nothing). A record
with a ``txn.id`` header or a marker can still show up there: any producer may write a
data topic (DESIGN.md section 10). Whether a coordinator admitted it follows from the
order the coordinators keep: a coordinator writes a topic's registration (every
partition it has, partition 0 always; :mod:`txnstream.coordinator.buffer_registrar`)
to the snapshot topic before it answers the ``ADD_PARTITIONS`` that asked for it, and a
writer sends a txn record to a topic only once its first registration there is answered.
A partition added to the topic later gets its own registration with the first txn that
writes to it, which may land after that txn's first record there (a registration of a
known topic is pipelined), hence the question about partition 0 as well:

    the partition's high watermark is read first, then its and its topic's partition
    0's registrations: if neither is registered, no coordinator admitted a txn there
    before the watermark was read, and every txn record below that watermark is junk.

Junk is skipped: never delivered, never waited on, logged (rate-limited) with its
topic, partition and offset, and counted. If either is registered the partition is
transactional: the reader follows its served state and waits for it, as for any
transactional partition (genuine txn records are never delivered unfiltered). The
reader never writes a registration itself: applications may not write the snapshot
topic (docs/security.md), and a reader's registration is what made a forger's record
hold its readers back, waiting for an owner that ``--buffer-topics`` left out.

The check stays cheap: one answer per partition per :data:`CHECK_INTERVAL_S`, and every
junk record below that answer's watermark is skipped on it. A record above it met
within the interval waits (its partition paused there) for the next answer; a record is
never skipped on an answer taken before it was fetched (a fetched record lies below the
watermark read after it), so a genuine writer's registration is never missed.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter
from collections.abc import Callable

from confluent_kafka import KafkaException

from txnstream.errors import TxnStreamError
from txnstream.ratelog import RateLimitedLog
from txnstream.types import TopicPartition

__all__ = ["CHECK_INTERVAL_S", "Judgement", "UnregisteredRecords", "log_junk", "topic_anchor"]

log = logging.getLogger(__name__)
_rate_limited = RateLimitedLog(log, interval_s=10.0)

CHECK_INTERVAL_S = 2.0
"""Registrations are read again for a partition at most this often."""


class Judgement(enum.Enum):
    """What a reader does with a txn record met in a partition it reads plain."""

    JUNK = "junk"
    """No coordinator admitted it: skip it (it is counted and logged already)."""
    REGISTERED = "registered"
    """The partition's topic is registered: follow its served state (wait for it)."""
    LATER = "later"
    """No answer taken after the record yet (the interval, or an error): wait there and
    ask again when :meth:`UnregisteredRecords.due` names the partition."""


def topic_anchor(tp: TopicPartition) -> list[TopicPartition]:
    """The registrations that say ``tp``'s topic is transactional: its own, partition 0's."""
    return [tp] if tp.partition == 0 else [tp, TopicPartition(tp.topic, 0)]


def log_junk(who: str, tp: TopicPartition, offset: int) -> None:
    """Log a skipped junk record (at most one line per partition per 10 s)."""
    _rate_limited.warning(
        f"junk:{tp}", "%s: skipped the txn record at %s offset %d: no coordinator "
        "registered topic %r, so none admitted a txn there (a record written around the "
        "txnstream client, or copied); it is never delivered", who, tp, offset, tp.topic)


class UnregisteredRecords:
    """A reader's answers about txn records in the partitions it reads plain.

    ``registered(tps)``: whether any of ``tps`` is registered now (a scan of the snapshot
    topic); ``watermarks(tp)``: ``tp``'s log start and end now. Both may raise Kafka
    errors: the record then waits for the next answer. Not thread-safe (the reader's loop).
    """

    def __init__(self, registered: Callable[[list[TopicPartition]], bool],
                 watermarks: Callable[[TopicPartition], tuple[int, int]], who: str = "reader",
                 interval_s: float = CHECK_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._registered = registered
        self._watermarks = watermarks
        self.who = who
        self.interval_s = interval_s
        self._clock = clock
        self._junk_below: dict[TopicPartition, int] = {}
        """Txn records below this offset are junk (the last answer: not registered)."""
        self._asked: dict[TopicPartition, float] = {}
        """When each partition's registrations were last read."""
        self._later: dict[TopicPartition, float] = {}
        """Partitions told LATER -> when they may be asked again."""
        self.skipped: Counter[TopicPartition] = Counter()
        """Junk records skipped, per partition."""

    def judge(self, tp: TopicPartition, offset: int) -> Judgement:
        """The txn record at ``tp``@``offset``, fetched from a partition read plain.

        A JUNK answer has counted and logged the record; the caller skips it.
        """
        if offset < self._junk_below.get(tp, -1):
            return self._junk(tp, offset)
        now = self._clock()
        asked = self._asked.get(tp)
        if asked is not None and now - asked < self.interval_s:
            self._later[tp] = asked + self.interval_s
            return Judgement.LATER
        self._asked[tp] = now
        try:
            high = self._watermarks(tp)[1]  # first: a record below it preceded the scan
            registered = self._registered(topic_anchor(tp))
        except (KafkaException, TimeoutError, TxnStreamError) as exc:
            _rate_limited.warning(f"check:{tp}", "%s: cannot read the registrations of %s "
                                  "yet (%s): its txn record at offset %d waits", self.who,
                                  tp, exc, offset)
            self._later[tp] = now + self.interval_s
            return Judgement.LATER
        if registered:
            self.forget(tp)
            return Judgement.REGISTERED
        self._junk_below[tp] = max(high, self._junk_below.get(tp, -1))
        if offset < self._junk_below[tp]:
            self._later.pop(tp, None)
            return self._junk(tp, offset)
        self._later[tp] = now + self.interval_s
        return Judgement.LATER

    def _junk(self, tp: TopicPartition, offset: int) -> Judgement:
        self.skipped[tp] += 1
        log_junk(self.who, tp, offset)
        return Judgement.JUNK

    def due(self) -> set[TopicPartition]:
        """Partitions told LATER that may be asked again now (each named once)."""
        if not self._later:
            return set()
        now = self._clock()
        ready = {tp for tp, at in self._later.items() if at <= now}
        for tp in ready:
            del self._later[tp]
        return ready

    def forget(self, tp: TopicPartition) -> None:
        """``tp`` is no longer read plain here (followed, or no longer assigned)."""
        self._junk_below.pop(tp, None)
        self._asked.pop(tp, None)
        self._later.pop(tp, None)
