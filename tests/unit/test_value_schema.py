"""The source's ``valueSchema`` option: type mapping, decoding, and errors that name things."""

from __future__ import annotations

import io
import json

import fastavro
import pyarrow as pa
import pytest
from pyspark.sql import types as T

from txnstream.errors import ConfigError
from txnstream_spark.avro import SchemaMismatchError, load_value_schema


def _schema(*fields):
    return json.dumps({"type": "record", "name": "R", "fields": list(fields)})


def _encode(vs, record):
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, vs.parsed, record)
    return buf.getvalue()


def test_types_map_to_spark_and_arrow():
    vs = load_value_schema(_schema(
        {"name": "b", "type": "boolean"}, {"name": "i", "type": "int"},
        {"name": "s", "type": ["null", "string"]},
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9,
                               "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "m", "type": {"type": "map", "values": "long"}},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
        {"name": "r", "type": {"type": "record", "name": "In",
                               "fields": [{"name": "x", "type": "float"}]}}))
    assert [f.dataType for f in vs.spark] == [
        T.BooleanType(), T.IntegerType(), T.StringType(), T.DecimalType(9, 2), T.DateType(),
        T.MapType(T.StringType(), T.LongType()), T.StringType(),
        T.StructType([T.StructField("x", T.FloatType())])]
    assert [f.type for f in vs.arrow] == [
        pa.bool_(), pa.int32(), pa.string(), pa.decimal128(9, 2), pa.date32(),
        pa.map_(pa.string(), pa.int64()), pa.string(), pa.struct([("x", pa.float32())])]


def test_decode_round_trips_and_builds_an_arrow_batch():
    vs = load_value_schema("demo_event")
    import datetime as dt

    rec = {"id": 7, "user": "ann", "amount": 1.5, "ts": dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
           "tags": ["x", "y"], "note": None}
    got = vs.decode(_encode(vs, rec), "t-0@0")
    assert got == rec
    batch = pa.RecordBatch.from_pydict({f: [got[f]] for f in vs.fields}, schema=pa.schema(vs.arrow))
    assert batch.num_rows == 1


def test_tombstone_gives_null_fields():
    vs = load_value_schema("demo_event")
    assert vs.decode(None, "t-0@0") == dict.fromkeys(vs.fields)


@pytest.mark.parametrize("value", [b"\x02garbage that is not an event", b""])
def test_garbage_names_the_record(value):
    vs = load_value_schema("demo_event")
    with pytest.raises(SchemaMismatchError, match=r"orders-3@42: value does not match valueSchema"):
        vs.decode(value, "orders-3@42")


def test_trailing_bytes_name_the_record():
    vs = load_value_schema(_schema({"name": "n", "type": "long"}))
    with pytest.raises(SchemaMismatchError, match=r"t-1@9: .* 2 bytes left over"):
        vs.decode(_encode(vs, {"n": 1}) + b"\x00\x00", "t-1@9")


@pytest.mark.parametrize("text,needle", [
    ("no_such_schema", "no schema 'no_such_schema'"),
    ("{not json", "not a valid Avro schema"),
    (json.dumps({"type": "string"}), "must be an Avro record schema"),
    (_schema({"name": "offset", "type": "long"}), "clash"),
    (_schema({"name": "u", "type": ["int", "string"]}), "unions other than [null, T]"),
])
def test_bad_option_names_it(text, needle):
    with pytest.raises(ConfigError) as exc:
        load_value_schema(text)
    assert "valueSchema" in str(exc.value) and needle in str(exc.value)
