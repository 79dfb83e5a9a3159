"""Moved to :mod:`txnstream.kafka.fetch` (kept while the Spark adapter is split)."""

from txnstream.kafka.fetch import (
    KafkaRecord,
    consume,
    delivered_at,
    delivered_offset,
    drain,
    read_to,
)

__all__ = ["KafkaRecord", "consume", "delivered_at", "delivered_offset", "drain", "read_to"]
