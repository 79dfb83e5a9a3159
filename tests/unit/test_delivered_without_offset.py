"""A write reported delivered with no offset: no process dies of it, nothing is assumed.

An idempotent producer that retries a batch the broker had already written gets
``DUPLICATE_SEQUENCE_NUMBER``, and librdkafka reports the batch delivered with offset -1
(confluent-kafka: ``offset()`` None). The hostile soak (seed 29, broker kills) had an
exactly-once processor die of it: its pending-ack record's delivery report asserted an
offset (``kafka.fetch.delivered_at``). Each user of a delivery report's offset is driven
here with such a report (no broker: the report is what these parts see of one).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from txnstream.errors import TransactionOutcomeUnknownError
from txnstream.fate import DeliveredOffsets
from txnstream.kafka.fetch import delivered_at, delivered_offset
from txnstream.pendingack.records import PendingAckEntry, PendingAckKind
from txnstream.pendingack.store import PendingAckStore
from txnstream.producer import _TxnSends
from txnstream.types import TxnID

TXN = TxnID(1, 7)


class Report:
    """A confluent-kafka message as a delivery report gives it."""

    def __init__(self, partition: int, offset: int | None) -> None:
        self._p, self._o = partition, offset

    def partition(self) -> int:
        return self._p

    def offset(self) -> int | None:
        return self._o


def test_a_report_without_an_offset_gives_none_not_an_assertion():
    assert delivered_offset(Report(2, None)) is None  # type: ignore[arg-type]
    assert delivered_at(Report(2, None)) == (2, None)  # type: ignore[arg-type]
    assert delivered_at(Report(2, 40)) == (2, 40)  # type: ignore[arg-type]


class CapturingProducer:
    def __init__(self) -> None:
        self.reports: list[Callable[[Any, Any], None]] = []

    def produce(self, *args: Any, on_delivery: Callable[[Any, Any], None], **kw: Any) -> None:
        self.reports.append(on_delivery)


class Tail:
    def __init__(self, end: int) -> None:
        self.end = end
        self.asked = 0

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self.asked += 1
        return 0, self.end


def _store(tail: Tail) -> tuple[PendingAckStore, CapturingProducer]:
    store = PendingAckStore.__new__(PendingAckStore)  # its Kafka clients stood in for
    producer = CapturingProducer()
    store.topic, store.subscription, store.partitions = "__txn_pending_ack", "billing", 8
    store._producer, store._tail = producer, tail  # type: ignore[assignment]
    store._lock = threading.Lock()
    store._outstanding, store._failed = defaultdict(int), {}
    store._written, store._unknown = defaultdict(dict), defaultdict(set)
    store._tail_pos, store._moved_pos, store._log_part = {}, {}, {}
    return store, producer


def test_an_ack_record_without_an_offset_is_read_back_to_the_log_end():
    tail = Tail(end=42)
    store, producer = _store(tail)
    entry = PendingAckEntry(PendingAckKind.ACK_CUMULATIVE, "billing", "orders", 0, TXN, (5,),
                            3, "m1")
    store.append(entry)
    part = store.log_partition(entry.tp)
    producer.reports[0](None, Report(part, None))  # delivered, offset not given
    store.flush_txn(TXN)  # durable: nothing failed
    store._tail_pos[part] = 41
    assert not store.read_back(TXN)  # the record is somewhere below 42: not yet passed
    store._tail_pos[part] = 42
    assert store.read_back(TXN) and tail.asked == 1
    store.confirmed(TXN)
    assert store.tracked_txns() == 0


def test_a_txn_send_without_an_offset_makes_its_fate_unknown_not_a_crash():
    class Txn:
        id, key = TXN, b"k" * 32
        delivered = DeliveredOffsets()

        def mark_abort_only(self, exc: Exception) -> None:
            raise AssertionError(exc)

    txn = Txn()
    sends = _TxnSends("orders", txn)  # type: ignore[arg-type]
    sends.headers_at(0)
    sends.delivered(None, Report(0, 10))  # type: ignore[arg-type]
    sends.delivered(None, Report(0, None))  # type: ignore[arg-type]
    assert sends.outstanding() == -2  # both counted as acknowledged (none were "sent" here)
    with pytest.raises(TransactionOutcomeUnknownError, match=r"1 records of \(1,7\) in "
                       r"orders-0 were acknowledged without an offset"):
        txn.delivered.snapshot(TXN)
