"""The buffer owner's read of its data partitions, as runs (:mod:`txnstream.buffer.runs`).

:class:`DataScan` reads the owner's data consumer. With the native scan
(``txnstream._native``, built from ``txnstream/_native.c`` when the package installs) the
records of attached partitions never become Python objects one by one: librdkafka's
messages are cut into runs in C. Without it (``TXNSTREAM_NATIVE=0``; no C compiler at
install; a confluent-kafka whose librdkafka or handle it does not recognise) the same
runs are built from confluent-kafka's messages in Python. Both give the same entries;
``tests/unit/buffer/test_native_scan.py`` checks it.

The native scan reads a queue of its own, to which :meth:`DataScan.attach` forwards a
partition's fetch queue before the partition is assigned. Anything that still reaches the
consumer's own queue (records fetched before the forward, after librdkafka made the
partition anew) is read there first, every turn, and cut into runs in Python; that poll
also serves the consumer's logs and errors.

The forward is made again (``REFORWARD_S``, ``REFORWARD_FOR_S``): librdkafka stops a
partition's fetch on its own thread after ``incremental_unassign`` returns, and that stop
clears the forward.
Once an application has forwarded a fetch queue, librdkafka never forwards it to the
consumer's queue again, so a forward made before the stop ran (the owner's restart of a
partition: unassign, attach, assign at once) left the new assignment's records in a queue
nobody read. Forwarding again moves what that queue holds, in order, to the scan's.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.buffer.runs import Entry, runs_of
from txnstream.errors import message_error
from txnstream.kafka.fetch import KafkaRecord, drain
from txnstream.kafka.librdkafka import NATIVE_ENV, native_librdkafka
from txnstream.ratelog import RateLimitedLog
from txnstream.types import TopicPartition

__all__ = ["DataScan", "native_scan"]

native_scan = native_librdkafka
"""``txnstream._native`` over confluent-kafka's librdkafka, or None
(:func:`txnstream.kafka.librdkafka.native_librdkafka`)."""

log = logging.getLogger(__name__)
_rate_limited = RateLimitedLog(log)

# NATIVE_ENV (txnstream.kafka.librdkafka): ``0`` and the buffer owner folds through Python.
# It was opt-in until the forward was made again every ``REFORWARD_S``: with it on, a
# recreation test (``test_recreated_topic.py``) saw no record of the new log within 45 s
# after the owner restarted the partition, in 3 of 6 parallel runs of the buffer's
# integration suite (a forward undone by the old assignment's stop, above).

QUEUED_MIN = 100
"""``queued.min.messages`` of the owner's data consumer. At 1 (a fetch only once the last
one's records were read) a partition whose record was fetched while another was unread
was left out of the fetch parked next, and its commit marker waited out the fetch wait:
produce-to-visible p99 111 ms at 1,024 partitions against 9 at 4 (stop 59). At 100 the
partitions stay in every fetch while records come slowly (where the wait showed), and
under load, with more than that unread between turns, the turns still pace the fetches
(at 1,000 one A/B run of the produce bench gave the worker 20-35% more CPU per record,
its fetches no longer paced below 1,000 a turn; within that bench's noise)."""
PACED_FETCH = {"fetch.min.bytes": 1, "fetch.wait.max.ms": 100,
               "queued.min.messages": QUEUED_MIN, "fetch.queue.backoff.ms": 1}
"""Settings for the consumer a :class:`DataScan` with ``pace_s`` reads (the buffer owner's).

The broker answers a fetch as soon as a record is there, else after 100 ms: an idle
owner sends ten fetches a second over all its partitions (the 5 ms poll it used cost the
broker 0.38 cores at 4 partitions and 0.82 at 1,024, issue 37). Under load the reads,
one per ``pace_s`` turn at most, pace the fetches: librdkafka leaves a partition out of
the next fetch while :data:`QUEUED_MIN` records wait unread (the count is of the queue
the native scan reads, which every partition's fetch queue is forwarded to), so a turn
folds many records at once. A partition added while a fetch waits on the broker is
fetched once it returns: within 100 ms."""

REFORWARD_S = 0.2
"""How often a partition read natively has its fetch queue forwarded again (at most this
long a partition restarted at once goes unread; a forward costs about a µs)."""
REFORWARD_FOR_S = 30.0
"""For how long after its attach a partition is forwarded again every ``REFORWARD_S``: the
stop that undoes a forward is the old assignment's, run within moments of the unassign.
Every partition is forwarded again every ``REFORWARD_ALL_S`` (a stop of another kind
would otherwise leave its records unread for good), not every ``REFORWARD_S``: at 1,024
partitions that was 5,000 forwards a second at rest (issue 37)."""
REFORWARD_ALL_S = 5.0


class DataScan:
    """Runs of records of the partitions a consumer reads, natively where it can.

    ``native``: read natively if the scan loads (None: unless ``TXNSTREAM_NATIVE=0``).

    ``resume_at(tp)``: the next offset the caller has not folded of ``tp`` (None: not
    read any more). If the native scan fails after taking records from librdkafka, those
    records are gone from the queue: the scan falls back to Python for good, and each
    attached partition is read again from there.

    ``pace_s``: a read that follows one which found records starts at least this long
    after it (its consumer made with :data:`PACED_FETCH`: one fetch per read).
    """

    def __init__(self, consumer: Consumer, client_id: str, native: bool | None = None,
                 resume_at: Callable[[TopicPartition], int | None] | None = None,
                 pace_s: float = 0.0) -> None:
        self._consumer = consumer
        self._resume_at = resume_at
        self._pace_s = pace_s
        self._read_at = 0.0
        self._attached: set[TopicPartition] = set()
        self._recent: dict[TopicPartition, float] = {}
        """Partitions attached within ``REFORWARD_FOR_S``, with when."""
        self._forwarded_at = self._all_forwarded_at = 0.0
        self._native: Any = None
        self._detached: Any = None
        """After a fall-back: the scan whose forwards back to the consumer are renewed."""
        if native is None:
            native = os.environ.get(NATIVE_ENV) != "0"
        mod = native_scan() if native else None
        if mod is not None:
            try:
                self._native = mod.Scan(consumer, client_id)
            except (TypeError, ValueError, RuntimeError) as exc:
                log.warning("the buffer's native scan refuses consumer %s (%s): folding "
                            "through Python", client_id, exc)

    @property
    def native(self) -> bool:
        """Whether records of attached partitions are cut into runs in C."""
        return self._native is not None

    def attach(self, tp: TopicPartition) -> None:
        """Read ``tp`` natively: call before the consumer is assigned it (again)."""
        if self._native is not None:
            self._native.attach(tp.topic, tp.partition)
        elif self._detached is not None:  # forwarded once: librdkafka no longer does it
            self._detached.detach(tp.topic, tp.partition)
        else:
            return
        self._attached.add(tp)
        self._recent[tp] = time.monotonic()

    def forget(self, tp: TopicPartition) -> None:
        """``tp`` is not read any more (unassigned): a later :meth:`attach` reads it again."""
        self._attached.discard(tp)
        self._recent.pop(tp, None)

    def read(self, max_records: int, timeout_s: float) -> dict[tuple[str, int], list[Entry]]:
        """Up to about ``max_records`` records as entries, by partition, in offset order.

        Waits up to ``timeout_s`` for the first.
        """
        if (pause := self._read_at + self._pace_s - time.monotonic()) > 0:
            time.sleep(pause)  # records came at the last read: let more come first
        started = time.monotonic()
        entries = self._read(max_records, timeout_s)
        self._read_at = started if entries else 0.0
        return entries

    def _read(self, max_records: int, timeout_s: float) -> dict[tuple[str, int], list[Entry]]:
        if self._attached and time.monotonic() - self._forwarded_at >= REFORWARD_S:
            self._forward_again()
        plain = drain(self._consumer, max_records, 0.0 if self._native else timeout_s)
        entries = _runs(plain, "buffer worker")
        if self._native is not None:
            try:
                got, errors = self._native.scan(max_records, 0 if plain else
                                                max(0, int(timeout_s * 1000)))
            except Exception as exc:  # a defect of the scan: records must not be lost
                self._fall_back(exc)
                return entries
            for topic, partition, code, why in errors:  # a line per partition per 10 s
                _rate_limited.warning(f"scan {topic}-{partition}", "buffer worker: Kafka "
                                      "error on %s-%s (%d): %s", topic, partition, code, why)
            for e in got:
                entries.setdefault((e[0], e[1]), []).append(e)
        return entries

    def _forward_again(self) -> None:
        """Forward fetch queues again: an unassign's stop undoes a forward made before it.

        The partitions attached within ``REFORWARD_FOR_S``, and every ``REFORWARD_ALL_S``
        all of them.
        """
        self._forwarded_at = now = time.monotonic()
        scan = self._native or self._detached
        forward = scan.attach if self._native is not None else scan.detach
        for tp, at in list(self._recent.items()):
            if now - at > REFORWARD_FOR_S:
                del self._recent[tp]
        if now - self._all_forwarded_at >= REFORWARD_ALL_S:
            self._all_forwarded_at = now
            todo: Iterable[TopicPartition] = self._attached
        else:
            todo = self._recent
        for tp in todo:
            try:
                forward(tp.topic, tp.partition)
            except (ValueError, RuntimeError) as exc:  # a partition librdkafka dropped
                _rate_limited.warning(f"forward {tp}", "buffer worker: %s not forwarded "
                                      "again: %s", tp, exc)

    def _fall_back(self, exc: Exception) -> None:
        log.error("buffer worker: the native scan failed (%r): reading through Python from "
                  "now on, each partition again from the first offset not folded", exc)
        native, self._native = self._native, None
        for tp in sorted(self._attached):
            try:
                native.detach(tp.topic, tp.partition)
                at = self._resume_at(tp) if self._resume_at is not None else None
                if at is not None:
                    self._consumer.seek(KafkaTP(tp.topic, tp.partition, at))
            except Exception as err:  # the others are resumed all the same
                log.error("buffer worker: %s not resumed after the native scan failed: %r",
                          tp, err)
        self._detached = native  # its queue stays, unread, until close()

    def close(self) -> None:
        """Stop reading natively: before the consumer's ``close()``."""
        for scan in (self._native, self._detached):
            if scan is not None:
                scan.close()
        self._native = self._detached = None


def _runs(msgs: list[KafkaRecord], where: str) -> dict[tuple[str, int], list[Entry]]:
    """The runs of confluent-kafka messages, by (topic, partition)."""
    by_tp: dict[tuple[str, int], list[KafkaRecord]] = defaultdict(list)
    for m in msgs:
        if not message_error(m, where, log):
            by_tp[(m.topic(), m.partition())].append(m)
    return {(topic, part): runs_of(got, topic, part) for (topic, part), got in by_tp.items()}
