"""The source's ``valueSchema`` option: Avro-encoded values decoded into columns.

A value is the Avro *binary* (schemaless) encoding of one record of the schema; its fields
become top-level columns in place of ``value``. The schema is an ``.avsc`` file, named by
path or by its name in ``schemas/`` (``valueSchema=demo_event``), or inline JSON.

A value that does not decode, or decodes with bytes left over, fails the task with a
:class:`SchemaMismatchError` naming ``topic-partition@offset``: Spark fails the batch,
so nothing of it is committed downstream. (Avro binary carries no field names: data of
a different schema that happens to decode byte for byte cannot be told apart.)
"""

from __future__ import annotations

import io
import json
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, cast

import fastavro
import pyarrow as pa
from pyspark.sql import types as T

from txnstream.codec import SCHEMA_DIR
from txnstream.errors import ConfigError, TxnStreamError

__all__ = ["ValueSchema", "SchemaMismatchError", "load_value_schema"]

OPTION = "valueSchema"
RESERVED = frozenset({"key", "value", "topic", "partition", "offset", "timestamp", "headers",
                      "txn_id"})
"""The source's own columns: no field of a value schema may take one of these names."""


class SchemaMismatchError(TxnStreamError):
    """A record's value does not match the ``valueSchema`` the source was given."""


def load_value_schema(text: str) -> ValueSchema:
    """Parse the option; ``ConfigError`` names it."""
    text = text.strip()
    if text.startswith("{"):
        source, raw = "inline JSON", text
    else:
        path: Traversable = Path(text)
        if not path.is_file():
            path = SCHEMA_DIR / (text if text.endswith(".avsc") else f"{text}.avsc")
        if not path.is_file():
            raise ConfigError(f"option '{OPTION}': no schema {text!r} (neither a file nor "
                              f"a name in {SCHEMA_DIR})")
        source, raw = str(path), path.read_text()
    try:
        schema = json.loads(raw)
        parsed = fastavro.parse_schema(schema)
    except Exception as exc:
        raise ConfigError(f"option '{OPTION}': {source} is not a valid Avro schema: {exc}") \
            from exc
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigError(f"option '{OPTION}': {source} must be an Avro record schema")
    clash = sorted({f["name"] for f in schema["fields"]} & RESERVED)
    if clash:
        raise ConfigError(f"option '{OPTION}': fields {clash} clash with the source's own "
                          "columns")
    return ValueSchema(schema.get("name", "record"), schema, parsed)


class ValueSchema:
    """One Avro record schema: its Spark and Arrow fields, and the decoder."""

    def __init__(self, name: str, schema: dict[str, Any], parsed: Any) -> None:
        self.name = name
        self.parsed = parsed
        self.fields = [f["name"] for f in schema["fields"]]
        self.spark = [T.StructField(f["name"], _spark(f["type"], f["name"]), True)
                      for f in schema["fields"]]
        self.arrow = [pa.field(f["name"], _arrow(f["type"], f["name"]), True)
                      for f in schema["fields"]]

    def decode(self, value: bytes | None, where: str) -> dict[str, Any]:
        """The record's fields; a tombstone (null value) gives all-null fields."""
        if value is None:
            return dict.fromkeys(self.fields)
        buf = io.BytesIO(value)
        try:
            rec = fastavro.schemaless_reader(buf, self.parsed, None)
        except Exception as exc:  # fastavro raises many types on bytes of another schema
            raise SchemaMismatchError(f"{where}: value does not match valueSchema "
                                      f"{self.name!r}: {exc!r}") from exc
        if buf.tell() != len(value):
            raise SchemaMismatchError(f"{where}: value does not match valueSchema "
                                      f"{self.name!r}: {len(value) - buf.tell()} bytes left "
                                      "over after the record")
        return cast(dict[str, Any], rec)  # a record schema's datum is a dict


def _nonnull(t: Any, field: str) -> Any:
    if isinstance(t, list):
        rest = [x for x in t if x != "null"]
        if len(rest) != 1:
            raise ConfigError(f"option '{OPTION}': field {field!r}: unions other than "
                              f"[null, T] are not supported ({t})")
        return rest[0]
    return t


_PRIMITIVE_SPARK = {"boolean": T.BooleanType(), "int": T.IntegerType(), "long": T.LongType(),
                    "float": T.FloatType(), "double": T.DoubleType(), "bytes": T.BinaryType(),
                    "string": T.StringType(), "null": T.NullType()}
_PRIMITIVE_ARROW = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(),
                    "float": pa.float32(), "double": pa.float64(), "bytes": pa.binary(),
                    "string": pa.string(), "null": pa.null()}


def _logical(t: dict[str, Any]) -> tuple[T.DataType, pa.DataType] | None:
    lt = t.get("logicalType")
    if lt in ("timestamp-millis", "timestamp-micros"):
        return T.TimestampType(), pa.timestamp("us", tz="UTC")
    if lt == "date":
        return T.DateType(), pa.date32()
    if lt == "decimal":
        p, s = int(t["precision"]), int(t.get("scale", 0))
        return T.DecimalType(p, s), pa.decimal128(p, s)
    return None


def _spark(t: Any, field: str) -> T.DataType:
    t = _nonnull(t, field)
    if isinstance(t, str):
        if t in _PRIMITIVE_SPARK:
            return _PRIMITIVE_SPARK[t]
        raise ConfigError(f"option '{OPTION}': field {field!r}: named type {t!r} is not "
                          "supported; inline its definition")
    if (lg := _logical(t)) is not None:
        return lg[0]
    kind = t["type"]
    if kind == "record":
        return T.StructType([T.StructField(f["name"], _spark(f["type"], f["name"]), True)
                             for f in t["fields"]])
    if kind == "array":
        return T.ArrayType(_spark(t["items"], field), True)
    if kind == "map":
        return T.MapType(T.StringType(), _spark(t["values"], field), True)
    if kind == "enum":
        return T.StringType()
    if kind == "fixed":
        return T.BinaryType()
    return _spark(kind, field)


def _arrow(t: Any, field: str) -> pa.DataType:
    t = _nonnull(t, field)
    if isinstance(t, str):
        return _PRIMITIVE_ARROW[t]
    if (lg := _logical(t)) is not None:
        return lg[1]
    kind = t["type"]
    if kind == "record":
        return pa.struct([pa.field(f["name"], _arrow(f["type"], f["name"]), True)
                          for f in t["fields"]])
    if kind == "array":
        return pa.list_(pa.field("element", _arrow(t["items"], field)))
    if kind == "map":
        return pa.map_(pa.string(), _arrow(t["values"], field))
    if kind in ("enum",):
        return pa.string()
    if kind == "fixed":
        return pa.binary()
    return _arrow(kind, field)
