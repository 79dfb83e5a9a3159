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
"""The first format version of every record type."""

SCHEMA_DIR = resources.files("txnstream") / "schemas"
"""Package data (``txnstream/schemas``; the repo's top-level ``schemas`` links to it)."""


class AvroCodec:
    """Encode/decode one record type (a dict matching its schema).

    A record type whose schema changed keeps each older schema as
    ``<name>.v<N>.avsc``: records are written in the newest version and records of an
    older one are read through Avro schema resolution (fields added since take their
    defaults), so a log written before an upgrade replays after it.
    """

    def __init__(self, name: str, schema: dict[str, Any],
                 older: dict[int, dict[str, Any]] | None = None) -> None:
        self.name = name
        self._schema = fastavro.parse_schema(schema)
        self._older = {v: fastavro.parse_schema(s) for v, s in (older or {}).items()}
        self.version = max(self._older, default=FORMAT_VERSION - 1) + 1

    def encode(self, record: dict[str, Any], version: int | None = None) -> bytes:
        """Version byte + schemaless Avro, in the newest version or an older one.

        An older ``version`` (fields added since are left out) lets a record whose new
        fields hold nothing yet stay readable by the previous release (a rolling upgrade).
        """
        writer = self._schema if version in (None, self.version) else self._older[version]
        buf = io.BytesIO()
        buf.write(bytes([self.version if version is None else version]))
        fastavro.schemaless_writer(buf, writer, record)
        return buf.getvalue()

    def decode(self, data: bytes | None) -> dict[str, Any]:
        """Inverse of :meth:`encode`; ``CorruptRecordError`` names what is wrong."""
        if not data:
            raise CorruptRecordError(f"{self.name}: empty record")
        version = data[0]
        writer = self._schema if version == self.version else self._older.get(version)
        if writer is None:
            raise CorruptRecordError(
                f"{self.name}: unknown record format version {version} "
                f"(this reader knows {FORMAT_VERSION}..{self.version}); upgrade txnstream "
                "to read it"
            )
        buf = io.BytesIO(data)
        buf.seek(1)
        try:
            rec = fastavro.schemaless_reader(
                buf, writer, None if writer is self._schema else self._schema)
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
    """The codec for ``schemas/<name>.avsc`` (loaded once), with its older versions."""
    path = SCHEMA_DIR / f"{name}.avsc"
    if not path.is_file():  # the same test on a directory and inside a zipped wheel
        raise CorruptRecordError(f"no schema file {path}")
    older = {}
    version = FORMAT_VERSION
    while (old := SCHEMA_DIR / f"{name}.v{version}.avsc").is_file():
        older[version] = json.loads(old.read_text())
        version += 1
    return AvroCodec(name, json.loads(path.read_text()), older)
