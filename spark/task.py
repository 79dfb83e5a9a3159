"""The executor side of the ``txnstream`` source: one task reads its range, committed only.

A task reads ``[start, end)`` of one partition with one consumer of its own and
delivers what the plan does not skip (:class:`_Rows`), never reading past its end. The
records come through the native take (``txnstream._native.Scan.take``: librdkafka's
messages filtered in C, with no confluent-kafka Message made for the common shapes)
where it loads, else through confluent-kafka and :func:`~txnstream_spark.take.take_rows`;
both apply the same rule (:mod:`txnstream_spark.take`), and
tests/spark/test_native_take.py checks that they deliver the same rows.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txnstream.buffer.unregistered import log_junk
from txnstream.errors import message_error
from txnstream.kafka.fetch import KafkaRecord, read_to
from txnstream.types import TopicPartition

from .avro import ValueSchema
from .deferred import RunGate
from .options import SourceOptions
from .partition import TxnStreamPartition, _unpack_offsets
from .planner import FRESH_WAIT_S, LOST_HINT, Planner
from .schema import RowColumns, UserHeaders, cached_value_schema, layout
from .take import ScannedRecord, scan_to, take_rows, task_scan, task_scan_loads

if TYPE_CHECKING:
    from confluent_kafka import Consumer

__all__ = ["BATCH_ROWS", "replan_latest"]

log = logging.getLogger(__name__)

BATCH_ROWS = 10_000
"""Rows of one Arrow batch a task hands Spark."""
TAKE_MAX = 5000
"""Records one read of the task's consumer takes at most."""
PROGRESS_S = 5.0
"""A task whose reading makes no progress for this long fails (records deleted?)."""
NATIVE_TAKE = {"enable.partition.eof": True, "fetch.wait.max.ms": 10}
"""The task consumer's settings for the native take. Its range ends where its consumer's
position does, and librdkafka moves the position past a control record (a Kafka txn's
marker) only for confluent-kafka's own reads: the take learns that a range ending in
one was read from the end-of-partition event instead, which comes once a fetch at the
log's end is answered. A task's range is written already, so its fetches never wait for
new records; at the default 500 ms wait the event came half a second late."""


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


def _read_partition(p: TxnStreamPartition, native: bool | None = None
                    ) -> Iterator[pa.RecordBatch]:
    """Deliver the range's records that are not skipped; never reads past its end.

    ``native``: through the native take if it loads (None: where it loads and the range
    has no deferred records; False: through confluent-kafka's Messages).
    """
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTP

    native = native is not False and task_scan_loads()
    c = Consumer(p.config.consumer(f"spark-{uuid.uuid4().hex[:8]}",
                                   **(NATIVE_TAKE if native else {})))
    scan: Any = None
    try:
        p = replan_latest(p, c)  # the task's one consumer: its watermarks, then its read
        if p.end <= p.start:
            return
        rows = _Rows(p, cached_value_schema(p.value_schema))
        pos = _first_readable(c, p)
        if pos >= p.end:
            return
        if native and rows.gate is None:
            scan = task_scan(c)
        if scan is not None:
            scan.attach(p.topic, p.partition)  # before the assign: every fetch comes to it
        c.assign([KafkaTP(p.topic, p.partition, pos)])
        try:
            if scan is not None:
                for _ in scan_to(p.end, pos, PROGRESS_S, lambda at: rows.take(scan, at),
                                 f"{p.topic}[{p.partition}]"):
                    if len(rows) >= BATCH_ROWS:
                        yield rows.flush()
            else:
                for batch in read_to(c, p.topic, p.partition, p.end, PROGRESS_S, TAKE_MAX):
                    pos = rows.add(batch, pos)
                    if len(rows) >= BATCH_ROWS:
                        yield rows.flush()
        except TimeoutError as exc:
            raise RuntimeError(f"{p.topic}-{p.partition}: {exc} (deleted by retention?)"
                               ) from exc
        if len(rows):
            yield rows.flush()
    finally:
        if scan is not None:
            scan.close()  # its queue, before the consumer's handle goes
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

    def take(self, scan: Any, pos: int) -> tuple[int, int, bool]:
        """One read of the native take (``scan``): ``(records seen, position, ended)``.

        The common shapes are taken in C by the rule of ``take_rows``; each other record
        comes to :meth:`_one`, the full rule, in its turn.
        """
        cols = (self.keys, self.values, self.offsets, self.timestamps,
                self.timestamp_types, self.headers, self.txn_ids)
        p = self.p
        seen, at, ended = scan.take(TAKE_MAX, 100, p.end, pos, self.skip, self.spans or None,
                                    self.txn_names, p.plain, cols,
                                    lambda t: self._one(ScannedRecord(t, p.topic, p.partition)))
        return int(seen), int(at), bool(ended)

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
