"""The ``txnstream`` Spark data source (PySpark 4.x Python Data Source API).

Read (``spark.read`` / ``spark.readStream``): committed records only. The driver follows
the transaction buffer state that the buffer owners (``txnstream worker``) serve and
never folds: a partition's committed end is its served ``max_read_position + 1`` (a
partition no txn ever registered: its high watermark), so every transactional record in
a range has already ended. Each input partition carries what its range must skip (hidden
offsets, aborted txns' spans): executors compare positions, without reading ahead.
Offsets are JSON dicts ``{topic: {"partition": next}}``.

Write (``df.write`` / ``df.writeStream``): each task attempt writes its rows in its own
transaction on the coordinator chosen by the query id (stable across restarts from the
same checkpoint) and returns the TxnID in its commit message; the driver ends them all
with one group commit keyed by ``(query id, batch id)``. A replayed batch finds its key
committed; the coordinator aborts the replay's transactions: exactly once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import os
import time
import uuid
import zlib
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from txnstream.config import Config
from txnstream.errors import (
    ConfigError,
    RequestTimeoutError,
    TransactionOutcomeUnknownError,
    TransactionTimeoutError,
    message_error,
)
from txnstream.fetch import read_to
from txnstream.types import TopicPartition
from txnstream_spark.avro import ValueSchema, load_value_schema
from txnstream_spark.options import SinkOptions, SourceOptions

__all__ = ["TxnStreamDataSource", "SCHEMA"]

log = logging.getLogger(__name__)

SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
          "timestamp timestamp, headers array<struct<key: string, value: binary>>, "
          "txn_id string")
"""The source's columns without ``valueSchema``; with it, the record's fields replace value."""
BATCH_ROWS = 10_000

_HEADERS = pa.list_(pa.field("element", pa.struct([("key", pa.string()),
                                                   ("value", pa.binary())])))
_META_ARROW = [pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
               pa.field("offset", pa.int64()), pa.field("timestamp", pa.timestamp("us", tz="UTC")),
               pa.field("headers", _HEADERS), pa.field("txn_id", pa.string())]
_META_SPARK = [T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
               T.StructField("offset", T.LongType()), T.StructField("timestamp", T.TimestampType()),
               T.StructField("headers", T.ArrayType(T.StructType([
                   T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]))),
               T.StructField("txn_id", T.StringType())]


@cache
def _value_schema(text: str | None) -> ValueSchema | None:
    return None if text is None else load_value_schema(text)


def _layout(value_schema: str | None) -> tuple[T.StructType, pa.Schema]:
    """Spark and Arrow schemas of the source's rows: key, value (or its fields), metadata."""
    vs = _value_schema(value_schema)
    value_spark = vs.spark if vs else [T.StructField("value", T.BinaryType())]
    value_arrow = vs.arrow if vs else [pa.field("value", pa.binary())]
    return (T.StructType([T.StructField("key", T.BinaryType()), *value_spark, *_META_SPARK]),
            pa.schema([pa.field("key", pa.binary()), *value_arrow, *_META_ARROW]))


class TxnStreamPartition(InputPartition):
    """One topic partition's range ``[start, end)`` and what in it not to deliver.

    Planned on the driver from the served buffer state (``BufferView.skip_in``), so a
    task only compares positions: ``hidden`` offsets (markers, stragglers, undecodable
    records; packed, see :func:`_pack_offsets`) and ``aborted`` spans, raw ``txn.id``
    header -> ``(first, last)`` offset of an aborted txn: its records in the span are
    not delivered (Kafka's aborted-transaction index).
    """

    def __init__(self, config: Config, topic: str, partition: int, start: int, end: int,
                 hidden: Sequence[int] = (), aborted: Iterable[tuple[bytes, int, int]] = (),
                 value_schema: str | None = None, plain: bool = False) -> None:
        super().__init__((topic, partition, start, end))
        self.plain = plain
        """No txn ever registered the partition (planned without served state)."""
        self.config = config
        self.value_schema = value_schema
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.hidden = _pack_offsets(hidden)
        self.aborted = {raw: (first, last) for raw, first, last in aborted}


def _pack_offsets(offsets: Sequence[int]) -> tuple[int, str, bytes]:
    """Sorted offsets as ``(first, typecode, gaps)``, compact to ship to a task.

    The gaps go in the narrowest array type that holds them: a marker after each
    one-record txn costs one byte.
    """
    if not offsets:
        return -1, "B", b""
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    top = max(gaps, default=0)
    code = next(c for c in "BHIQ" if top < 1 << (8 * array(c).itemsize))
    return offsets[0], code, array(code, gaps).tobytes()


def _unpack_offsets(packed: tuple[int, str, bytes]) -> set[int]:
    """The offsets :func:`_pack_offsets` packed, as a set."""
    first, code, data = packed
    if first < 0:
        return set()
    gaps = array(code)
    gaps.frombytes(data)
    return set(itertools.accumulate(gaps, initial=first))


def _read_partition(p: TxnStreamPartition) -> Iterator[pa.RecordBatch]:
    """Deliver the range's records that are not skipped; never reads past its end."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTP

    if p.end <= p.start:
        return
    vs = _value_schema(p.value_schema)
    rows = _Rows(p, vs)
    c = Consumer(p.config.consumer(f"spark-{uuid.uuid4().hex[:8]}"))
    try:
        c.assign([KafkaTP(p.topic, p.partition, p.start)])
        pos = p.start
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


class _Rows:
    """Columns of the deliverable records of one input partition, built batch by batch."""

    def __init__(self, p: TxnStreamPartition, vs: ValueSchema | None) -> None:
        self.p = p
        self.vs = vs
        self.skip = _unpack_offsets(p.hidden)
        self.spans = p.aborted
        self.schema = _layout(p.value_schema)[1]
        self.txn_names: dict[bytes, str | None] = {}
        self._reset()

    def _reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[Any] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.headers: list[list[dict[str, Any]]] = []
        self.txn_ids: list[str | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def _txn_name(self, raw: bytes) -> str | None:
        """The text form of a ``txn.id`` header; None if it does not parse (not delivered)."""
        from txnstream.types import TxnID

        try:
            name = self.txn_names[raw] = str(TxnID.from_bytes(raw))
        except (ValueError, TypeError):
            name = self.txn_names[raw] = None
        return name

    def _unregistered(self, offset: int) -> None:
        """A txn record in a range planned plain: no coordinator registered the partition.

        Only a writer around the txnstream client does that. Nothing of it is delivered
        unfiltered: the partition is registered (a buffer owner serves it from now on)
        and the task fails; the query, restarted, plans the range with served state.
        """
        from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore

        p = self.p
        tp = TopicPartition(p.topic, p.partition)
        TransactionBufferSnapshotStore(p.config).register([tp], p.config.admin_timeout_s)
        raise RuntimeError(
            f"{tp}@{offset}: a transactional record in a partition no coordinator "
            "registered (written around the txnstream client?). It is registered now, so a "
            "buffer owner serves it; restart the query to read it committed-only.")

    def add(self, batch: list[Any], pos: int) -> int:
        """Take the deliverable records of ``batch``; returns the next position to read."""
        from txnstream.markers import TXN_ID_HEADER, TXN_MARKER_HEADER

        end, skip, spans, names = self.p.end, self.skip, self.spans, self.txn_names
        plain = self.p.plain
        keys, values, offsets = self.keys.append, self.values.append, self.offsets.append
        stamps, headers, txn_ids = self.timestamps.append, self.headers.append, self.txn_ids.append
        for m in batch:
            if message_error(m, f"txnstream source {self.p.topic}-{self.p.partition}", log):
                continue
            off = m.offset()
            if off >= end:
                return end
            pos = off + 1
            if off in skip:
                continue
            h = m.headers()
            if plain and h and any(k in (TXN_ID_HEADER, TXN_MARKER_HEADER) for k, _ in h):
                self._unregistered(off)
            if h is not None and len(h) == 1 and h[0][0] == TXN_ID_HEADER:  # the common case
                user: list[dict[str, Any]] = []
                raw = h[0][1]
                if spans and raw in spans:
                    first, last = spans[raw]
                    if first <= off <= last:
                        continue  # a record of an aborted txn
                txn = names[raw] if raw in names else self._txn_name(raw)
                if txn is None:
                    continue  # an undecodable txn.id is never delivered
            else:
                user, txn = [], None
                for k, v in h or ():
                    if k == TXN_ID_HEADER:
                        span = spans.get(v) if spans else None
                        if span is not None and span[0] <= off <= span[1]:
                            break  # a record of an aborted txn
                        txn = names[v] if v in names else self._txn_name(v)
                        if txn is None:
                            break
                    elif k == TXN_MARKER_HEADER:
                        break  # a marker is never delivered, even if not in the skip list
                    else:
                        user.append({"key": k, "value": v})
                else:
                    h = None
                if h is not None:
                    continue
            keys(m.key())
            values(m.value())
            offsets(off)
            stamps(m.timestamp()[1])
            headers(user)
            txn_ids(txn)
        return pos

    def flush(self) -> pa.RecordBatch:
        """The columns gathered so far as one Arrow batch; starts afresh."""
        n = len(self.offsets)
        cols: dict[str, Any] = {"key": self.keys}
        if self.vs is None:
            cols["value"] = self.values
        else:
            p = self.p
            recs = [self.vs.decode(v, f"{p.topic}-{p.partition}@{o}")
                    for v, o in zip(self.values, self.offsets, strict=True)]
            for f in self.vs.fields:
                cols[f] = [r.get(f) for r in recs]
        cols.update(topic=[self.p.topic] * n, partition=[self.p.partition] * n,
                    offset=self.offsets, timestamp=[t * 1000 for t in self.timestamps],
                    headers=self.headers, txn_id=self.txn_ids)
        rb = pa.RecordBatch.from_pydict(cols, schema=self.schema)
        self._reset()
        return rb


FRESH_WAIT_S = 10.0
"""How long a plan that must hold everything committed before it (a batch read, the
target of ``Trigger.AvailableNow``, ``startingOffsets=latest``) waits for the buffer
owners to serve each partition up to its end as read when planning began."""
CATCH_UP_S = 0.5
"""Bound on one ``catch_up`` of the served state, so planning a micro-batch stays short
when the state is far behind (a view starting from an old snapshot): an end found short
is safe, a later micro-batch (or the fresh and cover waits, which poll on) goes on."""
COVER_WAIT_S = 30.0
"""How long a micro-batch's plan waits for the served state to cover its range (a
restarted driver plans ranges its predecessor found committed: the state it follows
may still be behind, e.g. reloading from a snapshot)."""


class _Planner:
    """Driver side: partitions, their committed ends, and each range's skip info.

    Reads the served buffer state (:class:`BufferStateFollower`); never folds. Per
    partition, the committed end is:

    * SERVED: the view's ``max_read_position + 1``;
    * PLAIN (no txn ever registered it): its high watermark, read *before* checking
      again that it is still not registered (a registration precedes every txn record,
      so nothing transactional lies below that end);
    * WAITING (registered, no buffer owner serves it yet): it does not move, and nothing
      of it is delivered meanwhile (never unfiltered data).

    The ends never move back (a view reloaded from an older snapshot is waited for).
    """

    def __init__(self, opts: SourceOptions) -> None:
        from txnstream.buffer.state_store import BufferStateFollower

        self.opts = opts
        self.follower = BufferStateFollower(opts.config, name="spark")
        self.tps: list[TopicPartition] = []
        try:
            for t in opts.topics:
                tps = self.follower.partitions_of(t)
                if tps is None:
                    raise ConfigError(f"option 'subscribe': topic {t!r} does not exist on "
                                      f"{opts.config.bootstrap_servers}")
                self.tps += tps
        except BaseException:
            self.follower.close()
            raise
        self.committed: dict[TopicPartition, int] = {}
        """Each partition's committed end as last found: never moves back."""
        self._plain_end: dict[TopicPartition, int] = {}
        """The furthest end up to which a partition was found PLAIN: nothing below is
        transactional (a partition registered later keeps it)."""
        self._warned: set[TopicPartition] = set()

    def close(self) -> None:
        self.follower.close()

    def _covered_end(self, tp: TopicPartition) -> int:
        """Up to where the state at hand says what to skip: the plain prefix, or the view."""
        end = self._plain_end.get(tp, 0)
        view = self.follower.views.get(tp)
        if view is not None:
            end = max(end, view.max_read_position + 1)
        return end

    def refresh(self, fresh_s: float = 0.0) -> dict[TopicPartition, int]:
        """Bring the committed ends up to date (``catch_up`` of the served state).

        ``fresh_s > 0``: the ends hold everything committed before this call: wait up to
        that long for each partition's owner to have served it up to the end read now.
        """
        from txnstream.buffer.state_store import ServeStatus

        f = self.follower
        marks = {tp: f.watermarks(tp) for tp in self.tps}  # first: see PLAIN
        for tp in self.tps:
            st = f.status.get(tp)
            if st is None or (st is ServeStatus.PLAIN
                              and marks[tp][1] > self._plain_end.get(tp, 0)):
                if f.recheck(tp) is ServeStatus.PLAIN:
                    self._plain_end[tp] = max(self._plain_end.get(tp, 0), marks[tp][1])
        txnl = [tp for tp in self.tps if f.status.get(tp) is not ServeStatus.PLAIN]
        if txnl:
            f.catch_up(txnl, timeout_s=CATCH_UP_S)
        def behind() -> list[TopicPartition]:
            return [tp for tp in txnl
                    if (v := f.views.get(tp)) is not None and v.position < marks[tp][1] - 1]

        deadline = time.monotonic() + fresh_s
        while fresh_s > 0 and time.monotonic() < deadline and (
                behind() or any(f.status.get(tp) is ServeStatus.WAITING for tp in txnl)):
            f.poll(0.1)
        if fresh_s > 0 and (late := behind()):
            log.warning("the buffer owners of %s have not served them up to their ends yet "
                        "after %.0f s: the plan ends where they are (records committed just "
                        "before it may be left to a later read)", late, fresh_s)
        for tp in self.tps:
            low = marks[tp][0]
            if f.status.get(tp) is ServeStatus.WAITING:
                if tp not in self._warned:
                    self._warned.add(tp)
                    log.warning("%s is transactional but no buffer owner serves it (is a "
                                "`txnstream worker` with the buffer role running?): nothing "
                                "of it past offset %d is read until one does", tp,
                                max(self.committed.get(tp, low), self._covered_end(tp)))
            else:
                self._warned.discard(tp)
            self.committed[tp] = max(self.committed.get(tp, low), self._covered_end(tp))
        return dict(self.committed)

    @staticmethod
    def _json(ends: dict[TopicPartition, int]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for tp, e in ends.items():
            out.setdefault(tp.topic, {})[str(tp.partition)] = e
        return out

    def ends(self, fresh_s: float = 0.0) -> dict[str, dict[str, int]]:
        """The committed ends now (JSON offsets); see :meth:`refresh`."""
        return self._json(self.refresh(fresh_s))

    def starts(self, spec: Any) -> dict[str, dict[str, int]]:
        if spec == "latest":
            return self.ends(FRESH_WAIT_S)
        out = self._json({tp: self.follower.watermarks(tp)[0] for tp in self.tps})
        if isinstance(spec, dict):
            for t, parts in spec.items():
                if t not in out:
                    raise ConfigError(f"option 'startingOffsets' names topic {t!r}, which is "
                                      f"not subscribed ({', '.join(self.opts.topics)})")
                out[t].update(parts)
        return out

    def trim(self, below: dict) -> None:
        """Forget served state below ``below`` (JSON offsets): no batch starts there again."""
        for tp in self.tps:
            view = self.follower.views.get(tp)
            at = below.get(tp.topic, {}).get(str(tp.partition))
            if view is not None and at is not None:
                view.trim(int(at))

    def partitions(self, start: dict, end: dict, clamp: bool) -> list[TxnStreamPartition]:
        """The input partitions of ``[start, end)``, each with its skip info.

        ``clamp``: a range past the committed end is cut there (``endingOffsets``, or an
        offset from elsewhere, would hold records of txns that have not ended). Else
        (a micro-batch, whose end was found committed) the state is waited for until
        it covers the range; ``RuntimeError`` if it does not in ``COVER_WAIT_S``.
        """
        ranges: dict[TopicPartition, tuple[int, int]] = {}
        for tp in self.tps:
            s = int(start.get(tp.topic, {}).get(str(tp.partition), 0))
            ranges[tp] = s, int(end.get(tp.topic, {}).get(str(tp.partition), s))

        def short() -> list[TopicPartition]:
            return [tp for tp, (s, e) in ranges.items() if e > max(s, self._covered_end(tp))]

        if short():
            self.refresh()
            deadline = time.monotonic() + (0 if clamp else COVER_WAIT_S)
            while short() and time.monotonic() < deadline:
                time.sleep(0.2)
                self.refresh()
        parts = []
        for tp, (s, e) in ranges.items():
            covered = self._covered_end(tp)
            if e > covered:
                if not clamp:
                    raise RuntimeError(
                        f"{tp}: the served buffer state does not reach offset {e} of this "
                        f"micro-batch (it is at {covered}) after {COVER_WAIT_S:g} s: is a "
                        "`txnstream worker` with the buffer role running? Restarting the "
                        "query replays the batch.")
                e = covered
            if e > s:
                view = self.follower.views.get(tp)
                hidden, aborted = view.skip_in(s, e) if view is not None else ([], [])
                parts.append(TxnStreamPartition(self.opts.config, tp.topic, tp.partition, s, e,
                                                hidden, aborted, self.opts.value_schema,
                                                plain=view is None))
        return parts


class TxnStreamBatchReader(DataSourceReader):
    """``spark.read.format("txnstream")``: committed records from start to end offsets.

    Planned on the driver from the served state, as a micro-batch is: the latest end is
    what was committed when the read began (its owners are waited for up to
    ``FRESH_WAIT_S`` to have served that far).
    """

    def __init__(self, options: dict[str, str]) -> None:
        opts = SourceOptions.parse(options)
        planner = _Planner(opts)
        try:
            start = planner.starts(opts.starting)
            latest = planner.ends(FRESH_WAIT_S)
            end = latest if opts.ending == "latest" else opts.ending
            self._parts = planner.partitions(start, end, clamp=True)
        finally:
            planner.close()

    def partitions(self) -> Sequence[InputPartition]:
        return self._parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TxnStreamPartition)
        yield from _read_partition(partition)


class TxnStreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("txnstream")``: committed-only micro-batches.

    Under ``Trigger.AvailableNow`` the query reads up to the committed ends it found at
    start, in batches of at most ``maxRecordsPerTrigger``, then stops.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.opts = SourceOptions.parse(options)
        self._target: dict[str, dict[str, int]] | None = None
        self._planner_: _Planner | None = None
        _ = self._planner  # fail fast on bad options (unknown topics) at query start

    @property
    def _planner(self) -> _Planner:
        """Driver-side state; never shipped to executors (see ``__getstate__``)."""
        if self._planner_ is None:
            self._planner_ = _Planner(self.opts)
        return self._planner_

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_planner_"] = None
        return state

    def initialOffset(self) -> dict:
        return self._planner.starts(self.opts.starting)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_trigger:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._planner.ends(FRESH_WAIT_S)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        ends = self._planner.ends()
        if self._target is not None:  # AvailableNow: nothing committed after query start
            ends = {t: {p: min(e, self._target.get(t, {}).get(p, e)) for p, e in parts.items()}
                    for t, parts in ends.items()}
        # never behind the start (a startingOffsets past the committed end)
        ends = {t: {p: max(int(start.get(t, {}).get(p, e)), e) for p, e in parts.items()}
                for t, parts in ends.items()}
        if not isinstance(limit, ReadMaxRows):
            return ends
        left = limit.max_rows
        out: dict[str, dict[str, int]] = {}
        for t, parts in ends.items():
            for p, e in parts.items():
                s = int(start.get(t, {}).get(p, e))
                take = max(0, min(e - s, left))
                left -= take
                out.setdefault(t, {})[p] = s + take
        return out

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self._planner.partitions(start, end, clamp=False)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TxnStreamPartition)
        yield from _read_partition(partition)

    def commit(self, end: dict) -> None:
        # Offsets live in Spark's checkpoint; nothing to release in Kafka. Later batches
        # start at or after ``end``, so the planner's views forget what lies below.
        if self._planner_ is not None:
            self._planner_.trim(end)

    def stop(self) -> None:
        if self._planner_ is not None:
            self._planner_.close()


# ---------------------------------------------------------------------------- sink


NO_TXN = -1
"""``tc_id``/``txn_seq`` of the commit message of a task that wrote no rows."""


@dataclass
class TxnCommitMessage(WriterCommitMessage):
    """What one task attempt wrote: its transaction, and the query/batch it belongs to."""

    tc_id: int
    txn_seq: int
    rows: int
    query_id: str


_CLIENTS: dict[str, tuple[Any, dict[str, Any]]] = {}
"""This Python worker's clients and their producers, by config. Spark reuses a worker for
later tasks (and batches), so they skip the connection set-up and the producer's id
handshake, as Spark's own Kafka sink caches its producers. Dropped after any failure."""


def _client_key(config: Config) -> str:
    """A digest of every setting of ``config``, secrets included.

    Not ``repr(config)``: it hides the secrets, and two sinks differing only in
    ``tc.secret`` or ``kafka.sasl.password`` must not share a client. A digest, so the
    cache holds no secret in clear.
    """
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    values["kafka"] = sorted((k, repr(v)) for k, v in config.kafka.items())
    return hashlib.sha256(repr(sorted(values.items())).encode()).hexdigest()


def _client_for(config: Config) -> tuple[Any, dict[str, Any]]:
    from txnstream.client import Client

    key = _client_key(config)
    if key not in _CLIENTS:
        _CLIENTS[key] = (Client(config=config), {})
    return _CLIENTS[key]


def _drop_client(config: Config) -> None:
    client, _ = _CLIENTS.pop(_client_key(config), (None, None))
    if client is not None:
        try:
            client.close()
        except Exception:  # already failing: the cause is what the task reports
            log.warning("closing a failed sink client", exc_info=True)


def _write_rows(opts: SinkOptions, batches: Iterator[pa.RecordBatch], query_id: str,
                tc_of: str, group_key: str | None) -> TxnCommitMessage:
    """Write one task's rows in one transaction; a task with no rows opens none.

    The transaction opens at the first row, so upstream work does not eat into its timeout.
    It is opened for ``group_key``, the key its driver will commit it under, so that
    commit also aborts the transactions of attempts whose driver died (kill -9).
    """
    batches = (rb for rb in batches if rb.num_rows)
    first = next(batches, None)
    if first is None:  # Spark wants a message from every task: one that names no txn
        return TxnCommitMessage(NO_TXN, NO_TXN, 0, query_id)
    client, producers = _client_for(opts.config)
    try:
        tc_id = zlib.crc32(tc_of.encode()) % client.tc.num_coordinators
        txn = client.new_transaction(timeout_s=opts.txn_timeout_s, tc_id=tc_id,
                                     group_key=group_key)
        try:
            n = _send_all(opts, client, txn, itertools.chain([first], batches), producers)
            txn.flush()  # every row acknowledged, or the task fails (its retry writes anew)
        except BaseException:
            txn.abort()  # a failed attempt's rows never show; the retry writes its own txn
            raise
    except BaseException:
        _drop_client(opts.config)
        raise
    return TxnCommitMessage(tc_id, txn.id.least_bits, n, query_id)


def _binary(rb: pa.RecordBatch, name: str) -> pa.Array | None:
    """A string or binary column as binary (strings as their UTF-8); None if absent."""
    i = rb.schema.get_field_index(name)
    if i < 0:
        return None
    col = rb.column(i)
    return col if pa.types.is_binary(col.type) else col.cast(pa.binary())


def _by_topic(rb: pa.RecordBatch, default: str | None, done: int
              ) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The batch's rows per destination: the ``topic`` column, else option ``topic``."""
    import pyarrow.compute as pc

    i = rb.schema.get_field_index("topic")
    if i < 0:
        col = None
    else:
        col = rb.column(i)
        if default is not None:
            col = pc.fill_null(col, default)
    if col is None or col.null_count == 0 and len(pc.unique(col)) == 1:
        topic = default if col is None else col[0].as_py()
        if topic is None:
            raise ConfigError(f"row {done}: no topic (the sink needs option 'topic' or a "
                              "non-null 'topic' column)")
        yield topic, rb
        return
    if col.null_count:
        first = pc.index(pc.is_null(col), True).as_py()
        raise ConfigError(f"row {done + first}: no topic (the sink needs option 'topic' or "
                          "a non-null 'topic' column)")
    for topic in pc.unique(col).to_pylist():
        yield topic, rb.filter(pc.equal(col, topic))


def _send_all(opts: SinkOptions, client: Any, txn: Any, batches: Iterator[pa.RecordBatch],
              producers: dict[str, Any]) -> int:
    """Send every row in ``txn``; keyed rows go where Kafka's default partitioner puts them."""
    from txnstream_spark.partitioner import partitions_for

    n = 0
    rr: dict[str, int] = {}
    for rb in batches:
        if rb.schema.get_field_index("value") < 0:  # checked at plan time; guard anyway
            raise ConfigError("the sink needs a 'value' column")
        for topic, rows in _by_topic(rb, opts.topic, n):
            if topic not in producers:
                producers[topic] = client.create_producer(topic)
            producer = producers[topic]
            keys = _binary(rows, "key")
            parts, rr[topic] = partitions_for(keys, rows.num_rows, producer.num_partitions,
                                              rr.get(topic, 0))
            producer.send_batch(_binary(rows, "value").to_pylist(), parts, txn,
                                keys=None if keys is None else keys.to_pylist())
        n += rb.num_rows
    return n


def check_sink_schema(schema: StructType, opts: SinkOptions) -> None:
    """Plan-time check of the DataFrame being written; ``ConfigError`` names the column."""
    types = {f.name: f.dataType for f in schema.fields}
    bytes_like = (T.StringType, T.BinaryType)
    if "value" not in types:
        raise ConfigError(f"the txnstream sink needs a 'value' column (string or binary); "
                          f"the DataFrame has {sorted(types)}")
    for name in ("key", "value"):
        if name in types and not isinstance(types[name], bytes_like):
            raise ConfigError(f"column {name!r} must be string or binary, not "
                              f"{types[name].simpleString()}; cast it first")
    if "topic" in types and not isinstance(types["topic"], T.StringType):
        raise ConfigError("column 'topic' must be a string")
    if "topic" not in types and not opts.topic:
        raise ConfigError("the txnstream sink needs option 'topic' or a 'topic' column")


def pause_point(name: str, batch_id: int) -> None:
    """Fault-test hook: hold the driver at a named point so a test can kill -9 it there.

    Inert unless ``TXNSTREAM_PAUSE_AT=<name>:<batch id>:<flag file>`` is set: then, at
    that point of that batch, it creates the flag file and sleeps until killed.
    """
    spec = os.environ.get("TXNSTREAM_PAUSE_AT")
    if not spec:
        return
    want, bid, flag = spec.split(":", 2)
    if want == name and int(bid) == batch_id:
        Path(flag).write_text(f"{name} {batch_id} {os.getpid()}\n")
        log.warning("paused at %s of batch %d (TXNSTREAM_PAUSE_AT)", name, batch_id)
        time.sleep(3600)


GROUP_END_ATTEMPTS = 3
"""Times the driver asks for a batch's group commit when no reply comes. END_GROUP is
idempotent by its key (a repeat reports the first outcome), so asking again is safe;
three attempts of ``request_timeout_s`` each ride through a coordinator failover."""


def _end_group(opts: SinkOptions, messages: list[Any], key: str, commit: bool) -> None:
    """End a batch's txns: one group commit under ``key``, or an abort of each.

    Errors are told apart by class, as the coordinator raised them: a
    ``TransactionTimeoutError`` fails the batch naming the option to raise; a lost reply
    (``RequestTimeoutError``) is asked again under the same key and, if it stays lost,
    is ``TransactionOutcomeUnknownError``: never read as failed, so nothing is retried
    on a guess (restarting the query replays the batch, and its key settles it).
    """
    from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

    from txnstream.types import TxnID

    msgs = [m for m in messages if isinstance(m, TxnCommitMessage) and m.txn_seq != NO_TXN]
    if not msgs:
        return
    client, _ = _client_for(opts.config)
    try:
        by_tc: dict[int, list[int]] = {}
        for m in msgs:
            by_tc.setdefault(m.tc_id, []).append(m.txn_seq)
        if len(by_tc) > 1:
            raise ConfigError(f"sink transactions of {key} span coordinators {sorted(by_tc)}")
        for tc_id, seqs in by_tc.items():
            if not commit:
                for s in seqs:
                    client.abort_transaction(TxnID(tc_id, s))
                continue
            retrying = Retrying(retry=retry_if_exception_type(RequestTimeoutError),
                                stop=stop_after_attempt(GROUP_END_ATTEMPTS), reraise=True)
            try:
                for attempt in retrying:
                    with attempt:
                        already = client.end_group(tc_id, key, seqs, commit=True)
            except TransactionTimeoutError as exc:
                raise TransactionTimeoutError(
                    f"{exc}; the batch took longer than option "
                    f"'txnstream.txnTimeoutSeconds' ({opts.txn_timeout_s:g} s): raise it. "
                    "Restarting the query replays the batch.", exc.txn_id) from exc
            except RequestTimeoutError as exc:
                raise TransactionOutcomeUnknownError(
                    f"the group commit of batch {key} got no answer from coordinator "
                    f"{tc_id} in {GROUP_END_ATTEMPTS} attempts ({exc}): it may have "
                    "committed or not. Restarting the query replays the batch; its key "
                    "makes the outcome exactly once either way.") from exc
            if already and attempt.retry_state.attempt_number > 1:
                log.info("batch %s: committed by an attempt whose reply was lost", key)
            elif already:
                log.warning("batch %s was committed before: its replay was aborted", key)
    except BaseException:
        _drop_client(opts.config)
        raise


def _group_key(query_id: str, batch_id: int | str) -> str:
    """The group commit key of one micro-batch: the same on the tasks and the driver."""
    return f"{query_id}/{int(batch_id)}"


class TxnStreamStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("txnstream")``: exactly once per micro-batch."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = SinkOptions.parse(options)
        check_sink_schema(schema, self.opts)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxnCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query_id = (ctx.getLocalProperty("sql.streaming.queryId") if ctx else None) or "query"
        batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        return _write_rows(self.opts, iterator, query_id, tc_of=query_id,
                           group_key=_group_key(query_id, batch_id) if batch_id else None)

    def commit(self, messages: list[Any], batchId: int) -> None:
        qids = {m.query_id for m in messages if isinstance(m, TxnCommitMessage)}
        key = _group_key(next(iter(qids)) if qids else "query", batchId)
        pause_point("sink-commit-before-end", batchId)
        _end_group(self.opts, messages, key, commit=True)
        pause_point("sink-commit-after-end", batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        _end_group(self.opts, messages, f"abort/{batchId}", commit=False)


class TxnStreamBatchWriter(DataSourceArrowWriter):
    """``df.write.format("txnstream")``: one group commit per job."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = SinkOptions.parse(options)
        check_sink_schema(schema, self.opts)
        self.job_key = f"batch-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxnCommitMessage:
        return _write_rows(self.opts, iterator, self.job_key, tc_of=self.job_key,
                           group_key=self.job_key)

    def commit(self, messages: list[Any]) -> None:
        _end_group(self.opts, messages, self.job_key, commit=True)

    def abort(self, messages: list[Any]) -> None:
        _end_group(self.opts, messages, self.job_key, commit=False)


class TxnStreamDataSource(DataSource):
    """Register with ``spark.dataSource.register(TxnStreamDataSource)``."""

    @classmethod
    def name(cls) -> str:
        return "txnstream"

    def schema(self) -> str:
        # Resolved at load(): bad read options fail here, naming the option, before any
        # plan or task exists.
        if "subscribe" in self.options:
            return _layout(SourceOptions.parse(dict(self.options)).value_schema)[0]
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return TxnStreamBatchReader(dict(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TxnStreamStreamReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return TxnStreamBatchWriter(dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return TxnStreamStreamWriter(dict(self.options), schema)
