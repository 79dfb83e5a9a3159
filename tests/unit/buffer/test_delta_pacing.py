"""An owner's deltas never go behind five unanswered ones of their state partition.

Deltas of many data partitions share a state partition (a slot), and the owner's turn
comes every 5 ms. librdkafka's idempotent producer spins its broker thread while a
partition it has a record ready for has five in flight
(``txnstream.kafka.clients.IDEMPOTENT_IN_FLIGHT``), so a partition whose slot has five
deltas unanswered stays dirty, and its next delta covers both turns' folds.
"""

from __future__ import annotations

from typing import Any

from txnstream.buffer.publisher import BufferPublisher, OwnedSlot, ServedPartition
from txnstream.buffer.transaction_buffer import Journal, TransactionBuffer
from txnstream.kafka.clients import IDEMPOTENT_IN_FLIGHT
from txnstream.types import TopicPartition


class _Written:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def offset(self) -> int:
        return self._offset


class HeldProducer:
    """Answers nothing until :meth:`answer` is called."""

    def __init__(self) -> None:
        self.held: list[Any] = []
        self.produced: list[tuple[int, bytes]] = []  # (partition, key)

    def produce(self, topic: str, value: bytes, key: bytes, partition: int,
                on_delivery: Any) -> None:
        self.produced.append((partition, key))
        self.held.append(on_delivery)

    def poll(self, timeout: float) -> int:
        return 0

    def answer(self) -> None:
        served, self.held = self.held, []
        for i, cb in enumerate(served):
            cb(None, _Written(i))


def _owner(n: int) -> tuple[BufferPublisher, HeldProducer, dict, dict]:
    producer = HeldProducer()
    pub = BufferPublisher(producer, "state", None, None, "owner-1", 1.0)  # type: ignore[arg-type]
    served = {TopicPartition("t", p): ServedPartition(
        TransactionBuffer(TopicPartition("t", p), journal=Journal()), slot=0, next_from=0,
        snapshot_due=False) for p in range(n)}
    return pub, producer, served, {0: OwnedSlot(generation=3, served=set(served))}


def test_a_slot_with_five_deltas_unanswered_holds_the_next_until_they_are() -> None:
    pub, producer, served, slots = _owner(IDEMPOTENT_IN_FLIGHT + 3)
    for tp, s in served.items():
        pub.folded(tp, s)
    pub.deltas(served, slots)
    assert len(producer.produced) == IDEMPOTENT_IN_FLIGHT
    assert pub.unanswered == {0: IDEMPOTENT_IN_FLIGHT}
    held = {tp for tp, s in served.items() if s.dirty}
    assert len(held) == 3 and held == pub.dirty, "a held partition's fold was forgotten"
    pub.deltas(served, slots)  # a turn later, nothing answered yet
    assert len(producer.produced) == IDEMPOTENT_IN_FLIGHT
    producer.answer()
    assert pub.unanswered == {}, "answered slots are kept: the map grows with use"
    pub.deltas(served, slots)
    assert sorted(k for _, k in producer.produced) == sorted(str(tp).encode() for tp in served)
    assert not any(s.dirty for s in served.values())


def test_a_partition_folded_again_while_held_gets_one_delta_covering_both() -> None:
    pub, producer, served, slots = _owner(IDEMPOTENT_IN_FLIGHT + 1)
    last = TopicPartition("t", IDEMPOTENT_IN_FLIGHT)
    others = [tp for tp in served if tp != last]
    for tp in others:
        pub.folded(tp, served[tp])
    pub.deltas(served, slots)
    pub.folded(last, served[last])
    pub.deltas(served, slots)
    pub.folded(last, served[last])  # folds again before the slot is answered
    pub.deltas(served, slots)
    producer.answer()
    pub.deltas(served, slots)
    keys = [k for _, k in producer.produced]
    assert keys.count(str(last).encode()) == 1, keys
