"""``BufferGauges``: the per-partition gauges a buffer owner exports (prometheus-client).

Once a second, not per turn: the lag of each served partition (folded, readable, and
both against the log end) and which txn blocks it since when; a partition where nothing
moved since its last export is skipped (issue 37: at rest, exporting 1,024 partitions'
unchanged gauges was a fifth of an idle owner's samples). Series of partitions no
longer served, or no longer blocked, are removed: one ``blocked_seconds`` series per
blocked partition at most.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sized

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from txnstream import metrics
from txnstream.buffer.publisher import ServedPartition
from txnstream.types import TopicPartition

__all__ = ["METRICS_EXPORT_S", "BufferGauges"]

METRICS_EXPORT_S = 1.0
"""How often the per-partition gauges are recomputed."""


class BufferGauges:
    """The gauges of the partitions one buffer owner serves."""

    def __init__(self, data: Consumer) -> None:
        """``data``: the owner's data consumer (its cached log ends)."""
        self._data = data
        self._due_at = 0.0
        self._blocked_series: set[tuple[str, str, str]] = set()
        self._lag_series: set[tuple[str, str]] = set()
        self._exported: dict[tuple[str, str], tuple[int, int, int | None]] = {}
        """Partition labels -> (last offset, max read position, log end) its lag gauges
        say: an export skips a partition where none moved (at rest, every one)."""

    def turn(self, slots: Sized, served: Mapping[TopicPartition, ServedPartition]) -> None:
        """Export if :data:`METRICS_EXPORT_S` has passed since the last export."""
        if time.monotonic() >= self._due_at:
            self._due_at = time.monotonic() + METRICS_EXPORT_S
            self.export(slots, served)

    def export(self, slots: Sized, served: Mapping[TopicPartition, ServedPartition]) -> None:
        """Set the gauges of every partition in ``served``; remove the others' series."""
        metrics.BUFFER_SLOTS.set(len(slots))
        metrics.BUFFER_PARTITIONS.set(len(served))
        now_ms = int(time.time() * 1000)
        lag_series: set[tuple[str, str]] = set()
        blocked_series: set[tuple[str, str, str]] = set()
        exported = self._exported
        for tp, s in served.items():
            labels = (tp.topic, str(tp.partition))
            lag_series.add(labels)
            try:
                _, high = self._data.get_watermark_offsets(KafkaTP(tp.topic, tp.partition),
                                                           cached=True)
            except KafkaException:
                high = -1
            buf = s.buf
            moved = (buf.last_offset, buf.max_read_position, high)
            if not buf.ongoing and exported.get(labels) == moved:
                continue  # its gauges say this already; nothing blocks it
            exported[labels] = moved
            st = buf.stats(now_ms)
            metrics.BUFFER_READ_LAG.labels(*labels).set(st.last_offset - st.max_read_position)
            if high is not None and high >= 0:  # high: the log end offset (exclusive)
                metrics.BUFFER_FOLD_LAG.labels(*labels).set(max(0, high - 1 - st.last_offset))
                metrics.BUFFER_LAG.labels(*labels).set(
                    max(0, high - 1 - st.max_read_position))
            if st.blocking_txn is not None:
                key = (*labels, str(st.blocking_txn))
                blocked_series.add(key)
                metrics.BUFFER_BLOCKED_SECONDS.labels(*key).set(st.blocked_for_s or 0.0)
        metrics.BUFFER_BLOCKED.set(len(blocked_series))
        metrics.remove_series(metrics.BUFFER_BLOCKED_SECONDS, self._blocked_series - blocked_series)
        for gauge in (metrics.BUFFER_LAG, metrics.BUFFER_READ_LAG, metrics.BUFFER_FOLD_LAG):
            metrics.remove_series(gauge, self._lag_series - lag_series)
        for gone in self._lag_series - lag_series:
            exported.pop(gone, None)
        self._blocked_series = blocked_series
        self._lag_series = lag_series
