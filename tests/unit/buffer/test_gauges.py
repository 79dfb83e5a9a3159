"""The owner's per-partition gauges: right after every export, and no work for a
partition where nothing moved (issue 37: at rest, re-exporting 1,024 partitions'
unchanged gauges was a fifth of an idle owner's samples)."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from txnstream import metrics
from txnstream.buffer import TransactionBuffer
from txnstream.buffer.gauges import BufferGauges
from txnstream.buffer.publisher import ServedPartition
from txnstream.markers import TXN_ID_HEADER
from txnstream.types import TopicPartition, TxnID

TOPIC = "gauges-test"


class _Data:
    """The owner's data consumer, as far as the gauges ask: its cached log ends."""

    def __init__(self) -> None:
        self.high: dict[int, int] = {}

    def get_watermark_offsets(self, ktp: Any, **kwargs: Any) -> tuple[int, int]:
        return 0, self.high.get(ktp.partition, 0)


def _lag(name: str, partition: int) -> float | None:
    return REGISTRY.get_sample_value(name, {"topic": TOPIC, "partition": str(partition)})


def _served(n: int) -> dict[TopicPartition, ServedPartition]:
    return {(tp := TopicPartition(TOPIC, p)): ServedPartition(TransactionBuffer(tp), slot=0,
                                                             next_from=0) for p in range(n)}


def _count_labels(monkeypatch) -> list[int]:
    calls = [0]
    real = metrics.BUFFER_READ_LAG.labels

    def counted(*labels: str) -> Any:
        calls[0] += 1
        return real(*labels)

    monkeypatch.setattr(metrics.BUFFER_READ_LAG, "labels", counted)
    return calls


def test_an_export_skips_partitions_where_nothing_moved_and_keeps_their_gauges(monkeypatch):
    served, data = _served(50), _Data()
    gauges = BufferGauges(data)  # type: ignore[arg-type]
    calls = _count_labels(monkeypatch)
    for tp, s in served.items():  # 10 plain records each, 12 in the log
        for off in range(10):
            s.buf.fold(off, None, b"v")
        data.high[tp.partition] = 12
    gauges.export({}, served)
    assert calls[0] == 50
    assert _lag("txnstream_buffer_fold_lag_records", 7) == 2
    for _ in range(20):  # at rest: nothing moved, nothing set again
        gauges.export({}, served)
    assert calls[0] == 50
    assert _lag("txnstream_buffer_fold_lag_records", 7) == 2
    served[TopicPartition(TOPIC, 7)].buf.fold(10, None, b"v")  # one moved: it alone
    data.high[3] = 13  # another's log end moved
    gauges.export({}, served)
    assert calls[0] == 52
    assert _lag("txnstream_buffer_fold_lag_records", 7) == 1
    assert _lag("txnstream_buffer_fold_lag_records", 3) == 3


def test_a_blocked_partition_is_exported_every_time_and_a_dropped_one_comes_back(monkeypatch):
    served, data = _served(2), _Data()
    gauges = BufferGauges(data)  # type: ignore[arg-type]
    blocked = served[TopicPartition(TOPIC, 1)].buf
    blocked.fold(0, [(TXN_ID_HEADER, TxnID(1, 5).to_bytes())], b"x", timestamp_ms=1)
    assert blocked.ongoing, "the txn record must hold the partition for this test"
    calls = _count_labels(monkeypatch)
    for _ in range(3):
        gauges.export({}, served)
    assert calls[0] == 2 + 2  # partition 0 once, the blocked one every time
    assert REGISTRY.get_sample_value("txnstream_buffer_partitions_blocked") == 1
    gone = {TopicPartition(TOPIC, 0): served.pop(TopicPartition(TOPIC, 0))}
    gauges.export({}, served)
    assert _lag("txnstream_buffer_max_read_lag_records", 0) is None  # its series removed
    gauges.export({}, {**served, **gone})  # served again: exported again
    assert _lag("txnstream_buffer_max_read_lag_records", 0) == 0
