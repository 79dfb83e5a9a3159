"""The source's rows: their columns in Spark and in Arrow, and the Arrow batches of them.

Without ``valueSchema`` a row is ``key, value`` and the record's metadata (:data:`SCHEMA`);
with it, the decoded record's fields take the place of ``value``
(:mod:`txnstream_spark.avro`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import pyarrow as pa
from pyspark.sql import types as T

from txnstream.arrow import metadata_fields

from .avro import ValueSchema, load_value_schema

__all__ = ["SCHEMA", "RowColumns", "UserHeaders", "cached_value_schema", "layout"]

SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
          "timestamp timestamp, timestampType int, "
          "headers array<struct<key: string, value: binary>>, txn_id string")
"""The source's columns without ``valueSchema``; with it, the record's fields replace value.

Kafka's source columns, in its order, then ``headers`` (Kafka's with ``includeHeaders``)
and ``txn_id``. ``timestampType`` is Kafka's: 0 CreateTime, 1 LogAppendTime (-1 none)."""


def _with_timestamp_type(fields: list[pa.Field]) -> list[pa.Field]:
    """:func:`txnstream.arrow.metadata_fields` with Kafka's ``timestampType`` added.

    It goes after ``timestamp``: the Spark source's rows have it, txnstream's columnar
    reads do not.
    """
    at = [f.name for f in fields].index("timestamp") + 1
    return [*fields[:at], pa.field("timestampType", pa.int32()), *fields[at:]]


_META_ARROW = _with_timestamp_type(metadata_fields())
_META_SPARK = [T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
               T.StructField("offset", T.LongType()), T.StructField("timestamp", T.TimestampType()),
               T.StructField("timestampType", T.IntegerType()),
               T.StructField("headers", T.ArrayType(T.StructType([
                   T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]))),
               T.StructField("txn_id", T.StringType())]

UserHeaders = list[dict[str, str | bytes]]
"""A row's ``headers`` column: the record's own headers (txnstream's are not delivered)."""


@cache
def cached_value_schema(text: str | None) -> ValueSchema | None:
    """The ``valueSchema`` option parsed, once per worker process; None: raw bytes."""
    return None if text is None else load_value_schema(text)


def layout(value_schema: str | None) -> tuple[T.StructType, pa.Schema]:
    """Spark and Arrow schemas of the source's rows: key, value (or its fields), metadata."""
    vs = cached_value_schema(value_schema)
    value_spark = vs.spark if vs else [T.StructField("value", T.BinaryType())]
    value_arrow = vs.arrow if vs else [pa.field("value", pa.binary())]
    return (T.StructType([T.StructField("key", T.BinaryType()), *value_spark, *_META_SPARK]),
            pa.schema([pa.field("key", pa.binary()), *value_arrow, *_META_ARROW]))


class RowColumns:
    """The columns of one topic partition's delivered records, gathered record by record.

    Plain lists, which the task's filter appends to in its loop; :meth:`flush` turns
    them into one Arrow batch of :func:`layout`'s schema, decoding values if ``vs``.
    """

    def __init__(self, topic: str, partition: int, vs: ValueSchema | None,
                 schema: pa.Schema) -> None:
        self.topic = topic
        self.partition = partition
        self.vs = vs
        self.schema = schema
        self._reset()

    def _reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.timestamp_types: list[int] = []
        """confluent-kafka's: 0 not available, 1 create time, 2 log append time."""
        self.headers: list[UserHeaders] = []
        self.txn_ids: list[str | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def flush(self) -> pa.RecordBatch:
        """The columns gathered so far as one Arrow batch; starts afresh."""
        n = len(self.offsets)
        cols: dict[str, Sequence[object]] = {"key": self.keys}
        if self.vs is None:
            cols["value"] = self.values
        else:
            recs = [self.vs.decode(v, f"{self.topic}-{self.partition}@{o}")
                    for v, o in zip(self.values, self.offsets, strict=True)]
            for f in self.vs.fields:
                cols[f] = [r.get(f) for r in recs]
        cols.update(topic=[self.topic] * n, partition=[self.partition] * n,
                    offset=self.offsets, timestamp=[t * 1000 for t in self.timestamps],
                    timestampType=[k - 1 for k in self.timestamp_types],  # Kafka's ids
                    headers=self.headers, txn_id=self.txn_ids)
        rb = pa.RecordBatch.from_pydict(cols, schema=self.schema)
        self._reset()
        return rb
