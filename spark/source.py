"""The ``txnstream`` source (``spark.read`` / ``spark.readStream``): committed records only.

The readers plan on the driver (:class:`~txnstream_spark.planner.Planner`); each task
reads its range ``[start, end)`` and delivers what is not skipped, never reading past its
end (:mod:`txnstream_spark.task`). A batch range ending at ``latest`` is planned again by
its task if the partition grew since (:func:`~txnstream_spark.task.replan_latest`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from txnstream.types import TopicPartition

from . import deferred
from .log_epochs import join, split
from .options import Offsets, SourceOptions
from .partition import TxnStreamPartition
from .planner import FRESH_WAIT_S, Planner
from .task import BATCH_ROWS, _read_partition, replan_latest

__all__ = ["BATCH_ROWS", "TxnStreamBatchReader", "TxnStreamStreamReader", "replan_latest"]

log = logging.getLogger(__name__)


class TxnStreamBatchReader(DataSourceReader):
    """``spark.read.format("txnstream")``: committed records from start to end offsets.

    Planned on the driver in :meth:`partitions` from the served state, as a micro-batch
    is: the latest end is what was committed when the read is planned (its owners are
    waited for up to ``FRESH_WAIT_S`` to have served that far). Spark plans a
    DataFrame's read once, at its first action; later actions on it reuse the plan, and
    each task of a ``latest`` range takes what was committed since (:func:`replan_latest`).
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.opts = SourceOptions.parse(options)
        self.opts.check_batch()

    def partitions(self) -> Sequence[InputPartition]:
        planner = Planner(self.opts)
        try:
            return planner.plan_batch(FRESH_WAIT_S)  # looked up now: tests shorten it
        finally:
            planner.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Spark hands a plan without partitions one InputPartition(None): no rows.
        if isinstance(partition, TxnStreamPartition):
            yield from _read_partition(partition)


class TxnStreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("txnstream")``: committed-only micro-batches.

    Under ``Trigger.AvailableNow`` the query reads up to the committed ends it found at
    start, in batches of at most ``maxRecordsPerTrigger``, then stops.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.opts = SourceOptions.parse(options, stream=True)
        self.opts.check_stream()
        self._target: Offsets | None = None
        self._last_trigger_ms = 0.0
        """When ``minOffsetsPerTrigger`` last let a micro-batch through (0: never)."""
        self._planner_: Planner | None = None
        self._initial: Offsets | None = None
        self._bounded: set[TopicPartition] = set()
        """Partitions said to wait at the deferred-runs bound (warned once)."""
        # No Kafka client yet: Spark also builds a stream reader in its planning worker,
        # only to ship read() to the tasks. The query's source runner meets a bad option
        # (an unknown topic) at its first call, initialOffset or latestOffset.

    @property
    def _planner(self) -> Planner:
        """Driver-side state; never shipped to executors (see ``__getstate__``)."""
        if self._planner_ is None:
            self._planner_ = Planner(self.opts)
        return self._planner_

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_planner_"] = None
        return state

    def initialOffset(self) -> Offsets:
        # Resolved once, as Kafka's source does: Spark asks for it more than once at a
        # query's start, and the answer must not move between the asks.
        if self._initial is None:
            planner = self._planner
            self._initial = join(planner.starts(self.opts.starting), planner.log_epochs())
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_trigger:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._planner.ends(FRESH_WAIT_S)

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        planner = self._planner
        given, (start, carried) = start, deferred.split(start)
        start, noted = split(start)
        planner.refresh()
        # a topic recreated since ``start`` (a log that ends below the query: Kafka's
        # words; or its partitions served on a newer log): fails under failOnDataLoss,
        # else read from the new log's start (one below: held until it is served)
        held = planner.moved_back(start)
        planner.new_logs(noted, start)
        ends = planner.committed_ends()
        if self._target is not None:  # AvailableNow: nothing committed after query start
            ends = {t: {p: min(e, self._target.get(t, {}).get(p, e)) for p, e in parts.items()}
                    for t, parts in ends.items()}

        def end(t: str, p: str, e: int) -> int:
            at = int(start.get(t, {}).get(p, e))
            if planner.restarted(TopicPartition(t, int(p))):
                return e  # on the new log: below the start
            if TopicPartition(t, int(p)) in held:
                return at
            return max(at, e)  # never behind the start (startingOffsets past the end)

        ends = {t: {p: end(t, p, e) for p, e in parts.items()} for t, parts in ends.items()}
        # where each range starts: a partition on a new log, at that log's start
        begin = {t: {p: planner.range_start(TopicPartition(t, int(p)), int(o))
                     for p, o in parts.items()} for t, parts in start.items()}
        if self._delays(begin, ends):
            return given
        if isinstance(limit, ReadMaxRows):
            ends = _rate_limit(begin, ends, limit.max_rows)
        ends, later = self._defer(begin, ends, carried)
        # the log each end is of (a view dropped for a new log's: still its start's,
        # unless it restarts on the new one), and what each defers for its time
        on = {tp: e for tp, e in noted.items() if not planner.restarted(tp)}
        return deferred.join(join(ends, on | planner.log_epochs()), later)

    def _defer(self, begin: Offsets, ends: Offsets,
               carried: dict[TopicPartition, list[tuple[int, int, int]]]
               ) -> tuple[Offsets, dict[TopicPartition, list[tuple[int, int, int]]]]:
        """The ends, cut where a partition defers too much, and what each defers.

        Deferred runs of a partition on a new log since are of the old one: dropped.
        """
        planner, now = self._planner, int(time.time() * 1000)
        later: dict[TopicPartition, list[tuple[int, int, int]]] = {}
        out: Offsets = {}
        for t, parts in ends.items():
            for p, e in parts.items():
                tp = TopicPartition(t, int(p))
                s = int(begin.get(t, {}).get(p, e))
                view = planner.follower.views.get(tp)
                found = view.delays_in(s, e, now) if view is not None and e > s else []
                keep = [] if planner.restarted(tp) else carried.get(tp, [])
                later[tp], out.setdefault(t, {})[p] = deferred.defer(keep, found, e, now)
                if out[t][p] < e and tp not in self._bounded:
                    self._bounded.add(tp)
                    log.warning("%s defers %d runs of delayed records: the partition waits at "
                                "offset %d until some fall due", tp, len(later[tp]), out[t][p])
        return out, later

    def _delays(self, start: Offsets, ends: Offsets) -> bool:
        """Whether ``minOffsetsPerTrigger`` holds this micro-batch back, as in Kafka's source.

        It does while fewer offsets than that lie ahead (a new partition counts from
        offset 0) and ``maxTriggerDelay`` has not passed since the last micro-batch it
        let through; the first is let through at once. Not under ``Trigger.AvailableNow``,
        which reads what it found at its start and stops.
        """
        least = self.opts.min_offsets_per_trigger
        if least is None or self._target is not None:
            return False
        now = time.time() * 1000
        if now - self._last_trigger_ms >= self.opts.max_trigger_delay_ms:
            self._last_trigger_ms = now
            return False
        ahead = sum(e - int(start.get(t, {}).get(p, 0))
                    for t, parts in ends.items() for p, e in parts.items())
        if ahead < least:
            log.debug("micro-batch delayed: %d offsets ahead, minOffsetsPerTrigger %d",
                      ahead, least)
            return True
        self._last_trigger_ms = now
        return False

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        (start, was), (end, now) = deferred.split(start), deferred.split(end)
        released = {tp: deferred.subtract([(f, la) for f, la, _ in runs],
                                          [(f, la) for f, la, _ in now.get(tp, ())])
                    for tp, runs in was.items()}
        return self._planner.partitions(start, end, clamp=False, defer=now,
                                        released={tp: r for tp, r in released.items() if r})

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, TxnStreamPartition):
            yield from _read_partition(partition)

    def commit(self, end: Offsets) -> None:
        # Offsets live in Spark's checkpoint; nothing to release in Kafka. Later batches
        # start at or after ``end``, so the planner's views forget what lies below.
        if self._planner_ is not None:  # not below what is deferred: read once due
            end, later = deferred.split(end)
            self._planner_.trim(deferred.offsets_floor(split(end)[0], later))

    def stop(self) -> None:
        if self._planner_ is not None:
            self._planner_.close()




def _rate_limit(start: Offsets, ends: Offsets, limit: int) -> Offsets:
    """``maxOffsetsPerTrigger`` as Kafka's source applies it.

    The limit is shared among the partitions in proportion to what each has ahead (a
    share under one offset rounds up, so no partition with records ahead starves; the
    others round down).
    """
    ahead = {(t, p): max(0, e - int(start.get(t, {}).get(p, e)))
             for t, parts in ends.items() for p, e in parts.items()}
    total = sum(ahead.values())
    out: Offsets = {}
    for (t, p), n in ahead.items():
        e = ends[t][p]
        s = int(start.get(t, {}).get(p, e))
        if total > limit:
            share = limit * n / total
            n = min(n, math.ceil(share) if share < 1 else math.floor(share))
        out.setdefault(t, {})[p] = s + n
    return out
