"""Committed records as Arrow record batches (columnar reads for data users).

The columns are the Spark source's (``spark/schema.py`` ``SCHEMA``) but its
``timestampType``: key, value, topic, partition, offset, timestamp (UTC, microseconds),
headers (user headers only) and txn_id (Pulsar's text form, null for plain records).
``pyarrow`` is an optional dependency (``pip install txnstream[arrow]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from txnstream.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

    from txnstream.message import Message

__all__ = ["arrow_schema", "metadata_fields", "to_record_batch"]


def _pa() -> Any:
    try:
        import pyarrow
    except ImportError as exc:  # the one message a person needs
        raise ConfigError("columnar reads need pyarrow: pip install 'txnstream[arrow]'") from exc
    return pyarrow


def metadata_fields() -> list[pa.Field]:
    """The columns after key and value: origin, time, user headers, txn.

    The Spark source's rows end with the same, plus Kafka's ``timestampType`` after
    ``timestamp`` (``spark/schema.py``).
    """
    pa = _pa()
    headers = pa.list_(pa.field("element", pa.struct([("key", pa.string()),
                                                      ("value", pa.binary())])))
    return [pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
            pa.field("offset", pa.int64()), pa.field("timestamp", pa.timestamp("us", tz="UTC")),
            pa.field("headers", headers), pa.field("txn_id", pa.string())]


def arrow_schema() -> pa.Schema:
    """The columns of :func:`to_record_batch`: key, value, then :func:`metadata_fields`."""
    pa = _pa()
    return pa.schema([pa.field("key", pa.binary()), pa.field("value", pa.binary()),
                      *metadata_fields()])


def to_record_batch(msgs: Sequence[Message]) -> pa.RecordBatch:
    """``msgs`` as one record batch, column by column."""
    pa = _pa()
    names: dict[Any, str | None] = {None: None}
    txn_ids = []
    for m in msgs:
        t = m.txn_id
        name = names.get(t)
        if name is None and t is not None:
            name = names[t] = str(t)
        txn_ids.append(name)
    cols = {
        "key": [m.key for m in msgs], "value": [m.value for m in msgs],
        "topic": [m.topic for m in msgs], "partition": [m.partition for m in msgs],
        "offset": [m.offset for m in msgs],
        "timestamp": [m.timestamp_ms * 1000 for m in msgs],
        "headers": [[{"key": k, "value": v} for k, v in m.headers] for m in msgs],
        "txn_id": txn_ids,
    }
    return pa.RecordBatch.from_pydict(cols, schema=arrow_schema())
