"""Floors for the Spark source rows (issue 35): what a PySpark Python data source costs.

``txnstream_floor`` is a Python data source (batch and streaming) with the txnstream
source's schema and the same Arrow batches (``RowColumns``), in one of two modes
(option ``mode``):

* ``memory``: each task appends its share of the rows from memory, record by record as
  the source's filter does, with no Kafka at all. What PySpark's Python data source
  costs for these rows: no Python source, however fast its reading, does better.
* ``kafka``: each task reads its partition of ``topic`` with plain confluent-kafka
  (``read_committed``) and appends every record, with no committed-only filter. What
  reading from Kafka in Python costs.

bench.spark_bench times both beside the txnstream source and spark-sql-kafka in the
same run, so a missed goal is argued from them (BENCHMARKS.md).

Its writer (``df.write.format("txnstream_floor")``), an Arrow writer as the txnstream
sink is, has the same two modes for the sink row:

* ``memory``: each task turns its Arrow batches into the Python lists the txnstream sink
  sends (keys, values), and sends nothing. What PySpark's Python writer API costs.
* ``kafka``: each task produces its rows with plain confluent-kafka, one ``produce()``
  per row (the txnstream data producer's settings: idempotent, ``linger.ms`` 5, Java's
  partitioner by key; no txn), then flushes. What writing Kafka from Python costs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from txnstream_spark.schema import SCHEMA, RowColumns, layout

BATCH_ROWS = 10_000
"""Rows per Arrow batch, about the txnstream source's."""


class FloorPartition(InputPartition):
    """One task: a topic partition (``kafka``) or a share of the rows (``memory``)."""

    def __init__(self, index: int, rows: int) -> None:
        super().__init__(index)
        self.index, self.rows = index, rows


def _value(i: int, size: int) -> bytes:
    return f"{i:012d}".encode().ljust(size, b"x")


class _Reader:
    def __init__(self, options: dict[str, str]) -> None:
        self.mode = options.get("mode", "memory")
        if self.mode not in ("memory", "kafka"):
            raise ValueError(f"option mode: 'memory' or 'kafka', not {self.mode!r}")
        self.rows = int(options.get("rows", "0"))
        self.partitions_n = int(options.get("partitions", "2"))
        self.size = int(options.get("valueBytes", "100"))
        self.bootstrap = options.get("bootstrap", "")
        self.topic = options.get("topic", "floor")

    def _parts(self) -> Sequence[FloorPartition]:
        n, k = self.rows, self.partitions_n
        return [FloorPartition(i, n // k + (1 if i < n % k else 0)) for i in range(k)]

    def _read(self, p: FloorPartition) -> Iterator[pa.RecordBatch]:
        rows = RowColumns(self.topic, p.index, None, layout(None)[1])
        if self.mode == "memory":
            yield from self._from_memory(p, rows)
        else:
            yield from self._from_kafka(p, rows)
        if len(rows):
            yield rows.flush()

    def _from_memory(self, p: FloorPartition, rows: RowColumns) -> Iterator[pa.RecordBatch]:
        size = self.size
        for start in range(0, p.rows, BATCH_ROWS):
            # bound per batch: flush() starts new lists
            keys, values, offsets = rows.keys.append, rows.values.append, rows.offsets.append
            stamps, kinds = rows.timestamps.append, rows.timestamp_types.append
            headers, txn_ids = rows.headers.append, rows.txn_ids.append
            for i in range(start, min(p.rows, start + BATCH_ROWS)):
                keys(str(i).encode())
                values(_value(i, size))
                offsets(i)
                stamps(1_700_000_000_000)
                kinds(1)
                headers([])
                txn_ids(None)
            yield rows.flush()

    def _from_kafka(self, p: FloorPartition, rows: RowColumns) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import Consumer, TopicPartition

        from txnstream.kafka.fetch import read_to

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"floor-{uuid.uuid4()}",
                      "enable.auto.commit": False, "isolation.level": "read_committed"})
        try:
            tp = TopicPartition(self.topic, p.index)
            _, end = c.get_watermark_offsets(tp, timeout=30)
            c.assign([TopicPartition(self.topic, p.index, 0)])
            for batch in read_to(c, self.topic, p.index, end, 30.0, 5000):
                # bound per batch: flush() starts new lists
                keys, values, offsets = rows.keys.append, rows.values.append, rows.offsets.append
                stamps, kinds = rows.timestamps.append, rows.timestamp_types.append
                headers, txn_ids = rows.headers.append, rows.txn_ids.append
                for m in batch:
                    if m.error() is not None or m.offset() >= end:
                        continue
                    keys(m.key())
                    values(m.value())
                    offsets(m.offset())
                    kind, stamp = m.timestamp()
                    stamps(stamp)
                    kinds(kind)
                    headers([])
                    txn_ids(None)
                if len(rows) >= BATCH_ROWS:
                    yield rows.flush()
        finally:
            c.close()


class FloorBatchReader(_Reader, DataSourceReader):
    def partitions(self) -> Sequence[InputPartition]:
        return self._parts()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FloorPartition)
        return self._read(partition)


class FloorStreamReader(_Reader, DataSourceStreamReader):
    """One micro-batch of every row, then nothing (``Trigger.AvailableNow`` ends)."""

    def initialOffset(self) -> dict:
        return {"done": 0}

    def latestOffset(self, start: dict, limit: object) -> dict:
        return {"done": 1}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self._parts() if start["done"] < end["done"] else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FloorPartition)
        return self._read(partition)

    def commit(self, end: dict) -> None:
        pass


class FloorWritten(WriterCommitMessage):
    """What one task wrote."""

    def __init__(self, rows: int) -> None:
        self.rows = rows


class FloorBatchWriter(DataSourceArrowWriter):
    """The sink's floors: the rows as Python lists (``memory``), or produced plain."""

    def __init__(self, options: dict[str, str]) -> None:
        self.mode = options.get("mode", "memory")
        if self.mode not in ("memory", "kafka"):
            raise ValueError(f"option mode: 'memory' or 'kafka', not {self.mode!r}")
        self.bootstrap = options.get("bootstrap", "")
        self.topic = options.get("topic", "floor")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FloorWritten:
        producer = None
        if self.mode == "kafka":
            from confluent_kafka import Producer

            producer = Producer({"bootstrap.servers": self.bootstrap,
                                 "enable.idempotence": True, "linger.ms": 5,
                                 "partitioner": "murmur2_random"})
        n = 0
        for rb in iterator:
            keys = rb.column(rb.schema.get_field_index("key")).cast(pa.binary()).to_pylist()
            values = rb.column(rb.schema.get_field_index("value")).cast(
                pa.binary()).to_pylist()
            n += len(values)
            if producer is None:
                continue
            produce, topic = producer.produce, self.topic
            for key, value in zip(keys, values, strict=True):
                while True:
                    try:
                        produce(topic, value, key)
                        break
                    except BufferError:  # librdkafka's queue is full: let it drain
                        producer.poll(0.05)
            producer.poll(0)
        if producer is not None and producer.flush(60):
            raise RuntimeError(f"floor writer: records of {self.topic} not delivered in 60 s")
        return FloorWritten(n)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass


class FloorDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "txnstream_floor"

    def schema(self) -> StructType | str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return FloorBatchReader(dict(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FloorStreamReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> FloorBatchWriter:
        return FloorBatchWriter(dict(self.options))
