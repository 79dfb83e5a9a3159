"""A snapshot that fails to publish is tried again after a pause, not at every loop turn.

The owner's loop turns every few ms and asks for the snapshots that are due. A snapshot
of a partition whose log cannot be read (a recreated topic with fewer partitions, a
broker answering errors) used to stay due and be tried again at every turn, ~135 times
a second per partition, each with a broker request and a producer flush.
"""

from __future__ import annotations

from typing import Any

from txnstream.buffer.publisher import (
    SNAPSHOT_RETRY_S,
    BufferPublisher,
    OwnedSlot,
    ServedPartition,
)
from txnstream.buffer.transaction_buffer import Journal, TransactionBuffer
from txnstream.types import TopicPartition

TP = TopicPartition("orders", 0)


class _Written:
    def error(self) -> None:
        return None

    def offset(self) -> int:
        return 7


class _Producer:
    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def produce(self, *args: Any, on_delivery: Any, **kwargs: Any) -> None:
        self.callbacks.append(on_delivery)

    def poll(self, timeout: float) -> int:
        return self.flush(timeout)

    def flush(self, timeout: float) -> int:
        for cb in self.callbacks:
            cb(None, _Written())
        self.callbacks.clear()
        return 0


class _Store:
    def __init__(self) -> None:
        self.tries = 0

    def take_failed(self) -> list[TopicPartition]:
        return []

    def publish(self, snapshot: Any, tp: TopicPartition) -> None:
        self.tries += 1
        raise RuntimeError(f"{tp}: unknown partition")


class _Data:
    def get_watermark_offsets(self, ktp: Any, **kwargs: Any) -> tuple[int, int]:
        return 0, 10


def test_a_failing_snapshot_is_retried_after_a_pause_not_at_every_turn(monkeypatch):
    store = _Store()
    pub = BufferPublisher(_Producer(), "state", store, _Data(),  # type: ignore[arg-type]
                          "owner-1", 1.0)
    served = {TP: ServedPartition(TransactionBuffer(TP, journal=Journal()), slot=0,
                                  next_from=0)}
    pub.snapshot_due(TP, served[TP])  # a new partition's first snapshot (as the owner does)
    slots = {0: OwnedSlot(generation=3, served={TP})}
    clock = [1000.0]
    monkeypatch.setattr("txnstream.buffer.publisher.time.monotonic", lambda: clock[0])
    for _ in range(50):  # one loop's turns within a moment
        pub.snapshots(served, slots, force=False)
    assert store.tries == 1, f"tried {store.tries} times at once"
    assert served[TP].snapshot_due
    clock[0] += SNAPSHOT_RETRY_S
    pub.snapshots(served, slots, force=False)
    assert store.tries == 2, "not tried again after the pause"
    pub.snapshots(served, slots, force=True, only={0})  # a handover: tried whatever the pause
    assert store.tries == 3


def test_a_turn_looks_only_at_the_partitions_that_folded_or_need_a_snapshot():
    """Issue 37: every turn of the owner (200 a second) went over every partition it
    serves for the deltas and the snapshots due; at 1,024 partitions that was most of its
    CPU at rest. Only those marked are looked at now."""
    store = _Store()
    pub = BufferPublisher(_Producer(), "state", store, _Data(),  # type: ignore[arg-type]
                          "owner-1", 1.0)

    class Counted(dict):
        looks = 0

        def items(self):  # type: ignore[override]
            Counted.looks += len(self)
            return super().items()

    served = Counted({TopicPartition("wide", p): ServedPartition(
        TransactionBuffer(TopicPartition("wide", p), journal=Journal()), slot=0, next_from=0,
        snapshot_due=False) for p in range(1024)})
    slots = {0: OwnedSlot(generation=3, served=set(served))}
    one = TopicPartition("wide", 7)
    pub.folded(one, served[one])
    pub.deltas(served, slots)
    pub.snapshots(served, slots, force=False)
    assert Counted.looks == 0
    assert not served[one].dirty and pub.deltas_published == 1  # its delta only
    assert not pub.dirty and not pub.due


def test_a_delta_not_published_stays_due_for_the_next_turn():
    """A partition whose slot is not owned at a turn (a claim on its way) keeps its delta
    due, as it did when every turn looked at every partition."""
    pub = BufferPublisher(_Producer(), "state", _Store(), _Data(),  # type: ignore[arg-type]
                          "owner-1", 1.0)
    served = {TP: ServedPartition(TransactionBuffer(TP, journal=Journal()), slot=0,
                                  next_from=0, snapshot_due=False)}
    pub.folded(TP, served[TP])
    pub.deltas(served, {})  # slot 0 not owned now
    assert served[TP].dirty and TP in pub.dirty and pub.deltas_published == 0
    pub.deltas(served, {0: OwnedSlot(generation=3, served={TP})})
    assert not served[TP].dirty and pub.deltas_published == 1
