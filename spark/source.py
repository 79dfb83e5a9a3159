"""The ``txnstream`` source (``spark.read`` / ``spark.readStream``): committed records only.

The readers plan on the driver (:class:`~txnstream_spark.planner.Planner`); each task
reads its range ``[start, end)`` and delivers what is not skipped (:class:`_Rows`),
never reading past its end. A batch range ending at ``latest`` is planned again by its
task if the partition grew since (:func:`replan_latest`).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from txnstream.buffer.unregistered import log_junk
from txnstream.errors import message_error
from txnstream.kafka.fetch import KafkaRecord, read_to
from txnstream.types import TopicPartition

from . import deferred
from .avro import ValueSchema
from .deferred import RunGate
from .log_epochs import join, split
from .options import Offsets, SourceOptions
from .partition import TxnStreamPartition, _unpack_offsets
from .partition import _pack_offsets as _pack_offsets  # beside _unpack_offsets, for tests
from .planner import FRESH_WAIT_S, LOST_HINT, Planner
from .schema import RowColumns, UserHeaders, cached_value_schema, layout
from .take import take_rows

if TYPE_CHECKING:
    from confluent_kafka import Consumer

__all__ = ["BATCH_ROWS", "TxnStreamBatchReader", "TxnStreamStreamReader", "replan_latest"]

log = logging.getLogger(__name__)

BATCH_ROWS = 10_000
"""Rows of one Arrow batch a task hands Spark."""


def replan_latest(p: TxnStreamPartition, c: Consumer) -> TxnStreamPartition:
    """``p``, or its range to the committed end now if its partition grew since planning.

    Kafka resolves a batch read's ``latest`` each time the read is planned, i.e. for
    every action. Spark plans a Python data source's read once per DataFrame and reuses
    that plan, so the task does it: if the partition's high watermark moved since ``p``
    was planned, it plans ``[start, committed end)`` again from the served state, as
    the driver does (:meth:`Planner.refresh` with ``FRESH_WAIT_S``). The end never
    moves back: a state found behind ``p.end`` keeps ``p``.
    """
    from confluent_kafka import TopicPartition as KafkaTP

    if p.latest_high is None:
        return p
    high = c.get_watermark_offsets(KafkaTP(p.topic, p.partition),
                                   timeout=p.config.admin_timeout_s)[1]
    if high == p.latest_high:
        return p
    tp = TopicPartition(p.topic, p.partition)
    opts = SourceOptions(p.config, (p.topic,), "earliest", "latest", None, p.value_schema,
                         fail_on_data_loss=p.fail_on_data_loss)
    planner = Planner(opts, tps=[tp])
    try:
        end = planner.refresh(FRESH_WAIT_S)[tp]
        if end <= p.end:
            return p
        at = {p.topic: {str(p.partition): p.start}}
        view = planner.follower.views.get(tp)
        defer = {tp: view.delays_in(p.start, end, int(time.time() * 1000))} if view else {}
        again = planner.partitions(at, {p.topic: {str(p.partition): end}}, clamp=True,
                                   latest={tp: high}, defer=defer)
    finally:
        planner.close()
    return again[0] if again and again[0].end > p.end else p


def _read_partition(p: TxnStreamPartition) -> Iterator[pa.RecordBatch]:
    """Deliver the range's records that are not skipped; never reads past its end."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTP

    c = Consumer(p.config.consumer(f"spark-{uuid.uuid4().hex[:8]}"))
    try:
        p = replan_latest(p, c)  # the task's one consumer: its watermarks, then its read
        if p.end <= p.start:
            return
        rows = _Rows(p, cached_value_schema(p.value_schema))
        pos = _first_readable(c, p)
        if pos >= p.end:
            return
        c.assign([KafkaTP(p.topic, p.partition, pos)])
        try:
            for batch in read_to(c, p.topic, p.partition, p.end, 5.0, 5000):
                pos = rows.add(batch, pos)
                if len(rows) >= BATCH_ROWS:
                    yield rows.flush()
        except TimeoutError as exc:
            raise RuntimeError(f"{p.topic}-{p.partition}: {exc} (deleted by retention?)"
                               ) from exc
        if len(rows):
            yield rows.flush()
    finally:
        c.close()


def _first_readable(c: Consumer, p: TxnStreamPartition) -> int:
    """Where the range's reading starts: its start, or else the log start.

    Records of the range deleted meanwhile (retention, ``delete_records``) fail the task
    unless ``failOnDataLoss`` is false, as in Kafka's source.
    """
    from confluent_kafka import TopicPartition as KafkaTP

    low, _ = c.get_watermark_offsets(KafkaTP(p.topic, p.partition),
                                     timeout=p.config.admin_timeout_s)
    if low <= p.start:
        return p.start
    lost = f"offsets {p.start}..{min(low, p.end) - 1} of {p.topic}-{p.partition}"
    if p.fail_on_data_loss:
        raise RuntimeError(f"{lost} were deleted before this query read them (the log "
                           f"starts at {low}). {LOST_HINT}")
    log.warning("%s were deleted before this query read them (the log starts at %d); "
                "skipped, as failOnDataLoss=false asks", lost, low)
    return low


class _Rows(RowColumns):
    """The committed-only filter of one input partition: takes the records to deliver.

    Skips the planned ``hidden`` offsets and the records of ``aborted`` spans, and never
    delivers a marker or a record whose ``txn.id`` does not parse, skip info or not.
    """

    def __init__(self, p: TxnStreamPartition, vs: ValueSchema | None) -> None:
        super().__init__(p.topic, p.partition, vs, layout(p.value_schema)[1])
        self.p = p
        self.skip = _unpack_offsets(p.hidden)
        self.spans = p.aborted
        self.txn_names: dict[bytes, str | None] = {}
        self.junk_ok: bool | None = None
        """Whether txn records in this range (planned plain) are junk; None: not asked."""
        self.junk = 0
        """Junk txn records skipped (see :meth:`_unregistered`)."""
        self.gate = RunGate(p.only, True) if p.only is not None else \
            RunGate(p.exclude, False) if p.exclude else None
        """Deferred records (not delivered here), or released ones (only those)."""

    def _txn_name(self, raw: bytes) -> str | None:
        """The text form of a ``txn.id`` header; None if it does not parse (not delivered)."""
        from txnstream.types import TxnID

        name: str | None
        try:
            name = self.txn_names[raw] = str(TxnID.from_bytes(raw))
        except (ValueError, TypeError):
            name = self.txn_names[raw] = None
        return name

    def _unregistered(self, offset: int) -> None:
        """A txn record in a range planned plain: junk, skipped, unless its topic is registered.

        The planner found the partition not registered after it read the high watermark
        the range ends below, and a coordinator registers a topic before any txn record
        is written there (:mod:`txnstream.buffer.unregistered`). So if neither the
        partition nor its topic's partition 0 is registered now, no coordinator ever
        admitted this range's txn records: each is skipped (logged, counted in
        ``junk``), and one answer, taken at the first of them, covers the whole range.
        If the topic is registered by now, nothing of the range is delivered unfiltered:
        the task fails and the query, restarted, plans the range with the served state.
        Never registers anything itself (an application may not write registrations).
        """
        from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
        from txnstream.buffer.unregistered import topic_anchor

        p = self.p
        tp = TopicPartition(p.topic, p.partition)
        if self.junk_ok is None:
            store = TransactionBufferSnapshotStore(p.config)
            try:
                self.junk_ok = not store.any_registered(topic_anchor(tp))
            finally:
                store.close()
        if not self.junk_ok:
            raise RuntimeError(
                f"{tp}@{offset}: a transactional record in a range planned without served "
                f"state, and topic {p.topic!r} is registered now (a txn wrote to it since the "
                "range was planned?): restart the query to read it committed-only.")
        self.junk += 1
        log_junk(f"txnstream source task {tp}", tp, offset)

    def add(self, batch: Sequence[KafkaRecord], pos: int) -> int:
        """Take the deliverable records of ``batch``; returns the next position to read.

        Runs of the common shapes go through :func:`~txnstream_spark.take.take_rows` (in
        C where built); each other record through :meth:`_one`, the full rule.
        """
        end, n, i = self.p.end, len(batch), 0
        fast = self.gate is None  # deferred records: every record by the full rule
        batch = batch if isinstance(batch, list) else list(batch)
        while i < n:
            if fast:
                cols = (self.keys, self.values, self.offsets, self.timestamps,
                        self.timestamp_types, self.headers, self.txn_ids)
                i, pos, ended = take_rows(batch, i, pos, end, self.skip, self.spans or None,
                                          self.txn_names, self.p.plain, cols)
                if ended:
                    return end
                if i >= n:
                    break
            at = self._one(batch[i])
            if at is None:
                return end
            pos = max(pos, at)
            i += 1
        return pos

    def _one(self, m: KafkaRecord) -> int | None:
        """The full rule for one record: taken if deliverable.

        Returns the position past it; None at or past the range's end; -1 for an error
        (the position unchanged).
        """
        from txnstream.markers import TXN_ID_HEADER, TXN_MARKER_HEADER, TXN_TAG_HEADER
        from txnstream.message import DELIVER_AFTER_HEADER, DELIVER_AT_HEADER

        if message_error(m, f"txnstream source {self.p.topic}-{self.p.partition}", log):
            return -1
        off = m.offset()
        if off >= self.p.end:
            return None
        skip, spans, gate = self.skip, self.spans, self.gate
        if off in skip or (gate is not None and gate.blocks(off)):
            return off + 1
        h = m.headers()
        if self.p.plain and h and any(k in (TXN_ID_HEADER, TXN_MARKER_HEADER) for k, _ in h):
            self._unregistered(off)  # raises unless it is junk
            return off + 1
        names = self.txn_names
        txn: str | None
        user: UserHeaders = []
        if h is not None and 0 < len(h) <= 2 and h[0][0] == TXN_ID_HEADER \
                and (len(h) == 1 or h[1][0] == TXN_TAG_HEADER):  # the common case
            raw = h[0][1]
            if spans and raw in spans:
                first, last = spans[raw]
                if first <= off <= last:
                    return off + 1  # a record of an aborted txn
            txn = names[raw] if raw in names else self._txn_name(raw)
            if txn is None:
                return off + 1  # an undecodable txn.id is never delivered
        else:
            txn = None
            for k, v in h or ():
                if k == TXN_ID_HEADER:
                    span = spans.get(v) if spans else None
                    if span is not None and span[0] <= off <= span[1]:
                        return off + 1  # a record of an aborted txn
                    txn = names[v] if v in names else self._txn_name(v)
                    if txn is None:
                        return off + 1
                elif k == TXN_MARKER_HEADER:
                    return off + 1  # a marker is never delivered, even if not skipped
                elif k in (TXN_TAG_HEADER, DELIVER_AT_HEADER, DELIVER_AFTER_HEADER):
                    continue  # membership (the fold checked it), a delay
                else:
                    user.append({"key": k, "value": v})
        self.keys.append(m.key())
        self.values.append(m.value())
        self.offsets.append(off)
        kind, stamp = m.timestamp()
        self.timestamps.append(stamp)
        self.timestamp_types.append(kind)
        self.headers.append(user)
        self.txn_ids.append(txn)
        return off + 1


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
