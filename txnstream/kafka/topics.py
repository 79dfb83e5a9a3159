"""``PartitionCatalog``: which data partitions exist, as a cached view of the metadata.

One component for one question (STYLE.md 10), asked in three places: a coordinator
refuses to register a partition that does not exist (ADD_PARTITIONS), and a coordinator
or a buffer owner drops a marker for a partition that no longer exists, as Kafka drops
markers for a deleted topic (DESIGN.md section 5).

* :meth:`PartitionCatalog.missing` answers from the cache when it knows the partition:
  no metadata call on the request path for a topic seen before. A topic it does not
  know, or a partition index past the count it knows, is looked up again (a miss), at
  most once per :data:`REFRESH_INTERVAL_S` per topic and :data:`LOOKUPS_PER_S` in all,
  so a client naming partitions that do not exist cannot make the worker wait on the
  cluster more than that.
* :meth:`PartitionCatalog.gone` confirms a produce error that says a partition does not
  exist (:func:`says_gone`): only a fresh answer from the cluster, topic absent or with
  fewer partitions, counts. A lookup that fails confirms nothing.

The client behind the lookup must not create topics: a metadata request for one topic
with ``allow.auto.create.topics`` on (librdkafka's producer default) makes a broker with
``auto.create.topics.enable`` (Kafka's default) create it. :data:`NO_AUTO_CREATE` is what
every client that writes markers or looks up partitions is given.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from txnstream.errors import (
    KafkaClientError,
    KafkaErrorKind,
    TooManyRequestsError,
    classify_kafka_error,
)
from txnstream.ratelog import RateLimitedLog
from txnstream.types import TopicPartition

__all__ = [
    "cluster_metadata",
    "GONE_CODES",
    "LOOKUP_TIMEOUT_S",
    "NO_AUTO_CREATE",
    "Lookup",
    "PartitionCatalog",
    "metadata_lookup",
    "says_gone",
]

log = logging.getLogger(__name__)
_rate_limited = RateLimitedLog(log)

NO_AUTO_CREATE: dict[str, Any] = {
    # A marker (or a metadata lookup) for a deleted topic must never recreate it.
    "allow.auto.create.topics": False,
    # How long librdkafka holds records for a topic its metadata does not show before
    # failing them with UNKNOWN_TOPIC (default 30 s, meant for topics just created). Markers
    # go only to topics that existed when a txn registered them, so a second is plenty; at
    # the default a marker for a deleted topic sat in the queue for 30 s and every flush
    # of the shared producer waited on it.
    "topic.metadata.propagation.max.ms": 1_000,
}
"""librdkafka settings of every client that writes markers or looks up partitions."""

GONE_CODES = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
                        KafkaError._UNKNOWN_TOPIC})
"""Produce errors that say the topic or partition does not exist (to be confirmed)."""

REFRESH_INTERVAL_S = 1.0
"""A topic is looked up again on a miss at most this often: a partition added to it is
seen within a second, and a client naming one that does not exist costs one lookup a
second at most."""
LOOKUPS_PER_S = 10
"""Metadata lookups per second over all topics: a request naming thousands of unknown
topics is refused past it instead of holding the worker's loop on the cluster."""
LOOKUP_TIMEOUT_S = 5.0
"""How long a coordinator waits for one lookup: it holds the worker's loop meanwhile, and
a cluster that does not answer in this long fails the worker's own appends too."""
MAX_TOPICS = 10_000
"""Topics remembered; the least recently asked is forgotten past it."""

Lookup = Callable[[str | None], dict[str, int | None]]
"""The cluster's topics now: ``lookup(topic)`` for one, ``lookup(None)`` for all. A topic
left out does not exist; one mapped to None is listed with an error (its state is not
known). Raises if the cluster did not answer."""


def cluster_metadata(client: Any, timeout_s: float, what: str, topic: str | None = None) -> Any:
    """``client.list_topics`` (every topic, or ``topic``): the cluster's metadata.

    librdkafka raises a bare ``KafkaException`` when the cluster does not answer within
    ``timeout_s`` (``_TIMED_OUT``, ``_TRANSPORT``: a broker down, a cluster starting);
    it is raised as a ``KafkaClientError`` naming ``what`` asked and classified (a
    cluster down is retriable), so a caller that handles ``TxnStreamError`` handles it.
    """
    try:
        return (client.list_topics(timeout=timeout_s) if topic is None
                else client.list_topics(topic, timeout=timeout_s))
    except KafkaException as exc:
        err = exc.args[0] if exc.args else exc
        unanswered = getattr(err, "code", lambda: None)() in NO_ANSWER_CODES
        raise KafkaClientError(
            f"{what}: no metadata from the cluster within {timeout_s:g} s ({err})"
            + ("; try again once it answers" if unanswered else ""),
            KafkaErrorKind.RETRIABLE if unanswered else classify_kafka_error(exc)) from exc


NO_ANSWER_CODES = frozenset({KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                             KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE})
"""librdkafka's local errors for a metadata request the cluster did not answer: a broker
down or restarting, a cluster starting. Retriable: the same call succeeds once it answers."""


def says_gone(err: Any) -> bool:
    """Whether a produce error claims the topic or partition does not exist.

    ``err``: a ``KafkaError``, or the ``KafkaException`` ``produce()`` raised.
    """
    if isinstance(err, KafkaException) and err.args:
        err = err.args[0]
    return isinstance(err, KafkaError) and err.code() in GONE_CODES


def metadata_lookup(client: Any, timeout_s: float) -> Lookup:
    """A :data:`Lookup` over ``client.list_topics``.

    ``client``: a Producer, Consumer or AdminClient configured with :data:`NO_AUTO_CREATE`.
    """
    def lookup(topic: str | None) -> dict[str, int | None]:
        md = (client.list_topics(timeout=timeout_s) if topic is None
              else client.list_topics(topic, timeout=timeout_s))
        out: dict[str, int | None] = {}
        for name, t in md.topics.items():
            if t.error is None:
                out[name] = len(t.partitions)
            elif t.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                if name == topic:
                    raise KafkaException(t.error)
                out[name] = None
        return out
    return lookup


class PartitionCatalog:
    """Partition counts of the topics asked about, refreshed on a miss (rate-limited)."""

    def __init__(self, lookup: Lookup, *, refresh_interval_s: float = REFRESH_INTERVAL_S,
                 lookups_per_s: int = LOOKUPS_PER_S, max_topics: int = MAX_TOPICS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._lookup = lookup
        self.refresh_interval_s = refresh_interval_s
        self.lookups_per_s = lookups_per_s
        self.max_topics = max_topics
        self._clock = clock
        self._topics: OrderedDict[str, tuple[Any, float]] = OrderedDict()
        """topic -> (partition count, None if it did not exist or ``_FAILED`` if its state
        was not learnt; when looked up)."""
        self._window = (-1.0, 0)
        """(start of the current second, lookups in it)."""
        self.lookups = 0
        """Metadata lookups made (for tests and metrics)."""

    def count(self, topic: str) -> int | None:
        """The cached partition count (None: unknown or absent), no lookup."""
        hit = self._topics.get(topic)
        return None if hit is None or hit[0] is _FAILED or hit[0] is None else int(hit[0])

    def missing(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Those of ``tps`` that do not exist, sorted; the cache answers for known ones.

        Topics it must look up are looked up in one call (every topic's metadata when
        there are several). A topic whose lookup fails is taken to exist (the marker
        rule covers a partition that turns out gone). ``TooManyRequestsError`` if a
        lookup is needed past the per-second budget and none was found missing.
        """
        by_topic: dict[str, list[TopicPartition]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp)
        now = self._clock()
        stale = [t for t, asked in by_topic.items()
                 if not self._covers(t, max(tp.partition for tp in asked))
                 and not self._fresh(t, now)]
        if stale and not self._look_up(stale, now):
            raise TooManyRequestsError(
                f"{len(stale)} topics (e.g. {stale[0][:100]}) are not known to this worker "
                f"and its metadata lookups are over {self.lookups_per_s} a second: retry "
                "in a second")
        out: list[TopicPartition] = []
        for topic, asked in by_topic.items():
            n = self._topics[topic][0] if topic in self._topics else _FAILED
            if n is not _FAILED:
                out.extend(tp for tp in asked if n is None or tp.partition >= n)
        return sorted(out)

    def gone(self, tp: TopicPartition) -> bool:
        """Whether the cluster says, now, that ``tp`` does not exist.

        Uses an answer younger than the refresh interval, else looks up again; False if
        the lookup fails or is over budget (not confirmed: the caller retries).
        """
        now = self._clock()
        if not self._fresh(tp.topic, now) and not self._look_up([tp.topic], now):
            return False
        n = self._topics[tp.topic][0]
        return n is not _FAILED and (n is None or tp.partition >= n)

    def _covers(self, topic: str, partition: int) -> bool:
        n = self.count(topic)
        return n is not None and partition < n

    def _fresh(self, topic: str, now: float) -> bool:
        hit = self._topics.get(topic)
        return hit is not None and now - hit[1] < self.refresh_interval_s

    def _look_up(self, topics: list[str], now: float) -> bool:
        """Look ``topics`` up in one call and cache what was learnt; False if over budget.

        A failed lookup is cached too (as not learnt), so it is asked again only after
        the refresh interval.
        """
        start, used = self._window
        if now - start >= 1.0:
            start, used = now, 0
        if used >= self.lookups_per_s:
            return False
        self._window = (start, used + 1)
        self.lookups += 1
        try:
            found = self._lookup(topics[0] if len(topics) == 1 else None)
        except Exception as exc:
            _rate_limited.warning(f"lookup {topics[0]}", "partitions of %s unknown: %s",
                                  ", ".join(topics[:5]), exc)
            found = {t: None for t in topics}  # None: not learnt
            learnt = False
        else:
            learnt = True
        for t in topics:
            if t not in found:
                value: Any = None  # absent: it does not exist
            elif found[t] is None or not learnt:
                value = _FAILED
            else:
                value = found[t]
            self._topics[t] = (value, now)
            self._topics.move_to_end(t)
        while len(self._topics) > self.max_topics:
            self._topics.popitem(last=False)
        return True


_FAILED: Any = object()
"""A topic whose state a lookup did not learn (distinct from None, one that does not
exist)."""
