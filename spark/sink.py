"""The ``txnstream`` sink (``df.write`` / ``df.writeStream``): exactly once per batch.

Each task attempt writes its rows in its own transaction on the coordinator chosen by the
query id (stable across restarts from the same checkpoint) and returns the TxnID in its
commit message; the driver ends them all with one group commit keyed by ``(query id,
batch id)``. A replayed batch finds its key committed; the coordinator aborts the
replay's transactions: exactly once.
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from txnstream.config import Config
from txnstream.errors import (
    ConfigError,
    RequestTimeoutError,
    TransactionOutcomeUnknownError,
    TransactionTimeoutError,
)

from .options import SinkOptions

if TYPE_CHECKING:
    from txnstream.client import Client
    from txnstream.producer import Producer
    from txnstream.transaction import Transaction

__all__ = ["GROUP_END_ATTEMPTS", "NO_TXN", "TxnCommitMessage", "TxnStreamBatchWriter",
           "TxnStreamStreamWriter", "check_sink_schema", "pause_point"]

log = logging.getLogger(__name__)

NO_TXN = -1
"""``tc_id``/``txn_seq`` of the commit message of a task that wrote no rows."""


@dataclass
class TxnCommitMessage(WriterCommitMessage):
    """What one task attempt wrote: its transaction, and the query/batch it belongs to."""

    tc_id: int
    txn_seq: int
    rows: int
    query_id: str


_CLIENTS: dict[str, tuple[Client, dict[str, Producer]]] = {}
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


def _client_for(config: Config) -> tuple[Client, dict[str, Producer]]:
    from txnstream.client import Client

    key = _client_key(config)
    if key not in _CLIENTS:
        _CLIENTS[key] = (Client(config=config), {})
    return _CLIENTS[key]


DROP_FLUSH_S = 5.0
"""How long a failed task's producers get to flush when its client is dropped: its txn
was aborted, so what is still queued need not land."""


def _drop_client(config: Config) -> None:
    client, producers = _CLIENTS.pop(_client_key(config), (None, None))
    if client is not None:
        try:
            try:
                for producer in (producers or {}).values():
                    producer.close(DROP_FLUSH_S)
            finally:
                client.close()  # closes any producer left open
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


def _by_topic(rb: pa.RecordBatch, option: str | None, done: int
              ) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The batch's rows per destination: option ``topic``, else the ``topic`` column.

    The option overrides the column, as in Kafka's sink.
    """
    import pyarrow.compute as pc

    i = rb.schema.get_field_index("topic")
    col = None if i < 0 or option is not None else rb.column(i)
    if col is None or col.null_count == 0 and len(pc.unique(col)) == 1:
        topic = option if col is None else col[0].as_py()
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


def _send_all(opts: SinkOptions, client: Client, txn: Transaction,
              batches: Iterator[pa.RecordBatch], producers: dict[str, Producer]) -> int:
    """Send every row in ``txn``; keyed rows go where Kafka's default partitioner puts them."""
    from .partitioner import partitions_for

    n = 0
    rr: dict[str, int] = {}
    for rb in batches:
        if rb.schema.get_field_index("value") < 0:  # checked at plan time; guard anyway
            raise ConfigError("the sink needs a 'value' column")
        for topic, rows in _by_topic(rb, opts.topic, n):
            if topic not in producers:
                producers[topic] = client.create_producer(topic)
            producer = producers[topic]
            keys, values = _binary(rows, "key"), _binary(rows, "value")
            assert values is not None  # the guard above
            parts, rr[topic] = partitions_for(keys, rows.num_rows, producer.num_partitions,
                                              rr.get(topic, 0))
            parts = _chosen_partitions(rows, parts)
            key_list = None if keys is None else keys.to_pylist()
            headers = _headers(rows)
            if headers is None:
                producer.send_batch(values.to_pylist(), parts, txn, keys=key_list)
            else:  # one by one, in row order, so each record keeps its own headers
                for i, value in enumerate(values.to_pylist()):
                    producer.send(value, None if key_list is None else key_list[i], txn=txn,
                                  partition=parts[i], headers=headers[i])
        n += rb.num_rows
    return n


def _chosen_partitions(rows: pa.RecordBatch, parts: list[int]) -> list[int]:
    """``parts``, with the ``partition`` column's value wherever it is not null.

    As in Kafka's sink: the column, where set, chooses the partition; else the default
    partitioner does.
    """
    i = rows.schema.get_field_index("partition")
    if i < 0 or rows.column(i).null_count == len(rows.column(i)):
        return parts
    chosen = rows.column(i).to_pylist()
    return [p if c is None else c for p, c in zip(parts, chosen, strict=True)]


def _headers(rows: pa.RecordBatch) -> list[list[tuple[str, bytes | None]]] | None:
    """Each row's ``headers`` column as Kafka headers; None if no row has any."""
    i = rows.schema.get_field_index("headers")
    if i < 0:
        return None
    col = rows.column(i)
    if col.null_count == len(col):
        return None
    out = [[(h["key"], h["value"]) for h in row or ()] for row in col.to_pylist()]
    return out if any(out) else None


HEADERS_TYPE = T.ArrayType(T.StructType([T.StructField("key", T.StringType()),
                                          T.StructField("value", T.BinaryType())]))
"""The ``headers`` column's type, as in Kafka's sink (null values allowed)."""


def _is_headers_type(t: T.DataType) -> bool:
    """``array<struct<key: string, value: binary>>``, whatever the nullability."""
    if not isinstance(t, T.ArrayType) or not isinstance(t.elementType, T.StructType):
        return False
    fields = [(f.name, type(f.dataType)) for f in t.elementType.fields]
    return fields == [("key", T.StringType), ("value", T.BinaryType)]


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
    if "partition" in types and not isinstance(types["partition"], T.IntegerType):
        raise ConfigError(f"column 'partition' must be an int, not "
                          f"{types['partition'].simpleString()}")
    if "headers" in types and not _is_headers_type(types["headers"]):
        raise ConfigError(f"column 'headers' must be {HEADERS_TYPE.simpleString()}, not "
                          f"{types['headers'].simpleString()}")
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


def _end_group(opts: SinkOptions, messages: Sequence[WriterCommitMessage | None], key: str,
               commit: bool) -> None:
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

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        qids = {m.query_id for m in messages if isinstance(m, TxnCommitMessage)}
        key = _group_key(next(iter(qids)) if qids else "query", batchId)
        pause_point("sink-commit-before-end", batchId)
        _end_group(self.opts, messages, key, commit=True)
        pause_point("sink-commit-after-end", batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
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

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _end_group(self.opts, messages, self.job_key, commit=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _end_group(self.opts, messages, self.job_key, commit=False)

