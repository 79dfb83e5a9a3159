"""Versioned Avro encoding of internal records (DESIGN.md section 4).

Wire form: one format-version byte, then the fastavro *schemaless* encoding of the
record against its ``schemas/<name>.avsc``. A reader rejects an unknown version or
bytes that do not parse with :class:`~txnstream.errors.CorruptRecordError`, never with
a bare exception, so a worker can log the position and skip the record.
"""

from __future__ import annotations

import io
import json
from functools import cache
from importlib import resources
from typing import Any

import fastavro

from txnstream.errors import CorruptRecordError

__all__ = ["FORMAT_VERSION", "SCHEMA_DIR", "AvroCodec", "codec"]

FORMAT_VERSION = 1
"""Bump when a schema changes incompatibly; readers refuse versions they do not know."""

SCHEMA_DIR = resources.files("txnstream") / "schemas"
"""Package data (``txnstream/schemas``; the repo's top-level ``schemas`` links to it)."""


class AvroCodec:
    """Encode/decode one record type (a dict matching its schema)."""

    def __init__(self, name: str, schema: dict[str, Any]) -> None:
        self.name = name
        self._schema = fastavro.parse_schema(schema)

    def encode(self, record: dict[str, Any]) -> bytes:
        """Version byte + schemaless Avro."""
        buf = io.BytesIO()
        buf.write(bytes([FORMAT_VERSION]))
        fastavro.schemaless_writer(buf, self._schema, record)
        return buf.getvalue()

    def decode(self, data: bytes | None) -> dict[str, Any]:
        """Inverse of :meth:`encode`; ``CorruptRecordError`` names what is wrong."""
        if not data:
            raise CorruptRecordError(f"{self.name}: empty record")
        if data[0] != FORMAT_VERSION:
            raise CorruptRecordError(
                f"{self.name}: unknown record format version {data[0]} "
                f"(this reader knows {FORMAT_VERSION}); upgrade txnstream to read it"
            )
        buf = io.BytesIO(data)
        buf.seek(1)
        try:
            rec = fastavro.schemaless_reader(buf, self._schema, None)
        except Exception as exc:  # fastavro raises many types on garbage
            raise CorruptRecordError(f"{self.name}: record does not parse: {exc!r}") from exc
        if buf.tell() != len(data):
            raise CorruptRecordError(
                f"{self.name}: {len(data) - buf.tell()} trailing bytes after the record"
            )
        assert isinstance(rec, dict)
        return rec


@cache
def codec(name: str) -> AvroCodec:
    """The codec for ``schemas/<name>.avsc`` (loaded once)."""
    path = SCHEMA_DIR / f"{name}.avsc"
    if not path.is_file():  # the same test on a directory and inside a zipped wheel
        raise CorruptRecordError(f"no schema file {path}")
    schema = json.loads(path.read_text())
    return AvroCodec(name, schema)
