"""The owner's scan forwards its partitions' fetch queues again, and stops for those it left.

librdkafka clears a fetch queue's forward when it stops the partition's old fetch, on its
own thread and after ``incremental_unassign`` returned, and never forwards an
application-forwarded queue to the consumer's queue again
(``tests/integration/buffer/test_native_scan_broker.py`` runs the restart on a broker).
Here a recording stand-in for the C scan shows what :class:`DataScan` asks of it.
"""

from __future__ import annotations

from typing import Any

import pytest

from txnstream.buffer import scan as scan_mod
from txnstream.buffer.scan import DataScan
from txnstream.types import TopicPartition

A, B = TopicPartition("orders", 0), TopicPartition("orders", 1)


class IdleConsumer:
    """Nothing on the consumer's own queue."""

    def poll(self, timeout: float) -> None:
        return None


class RecordingScan:
    """What the C scan was asked: (call, topic, partition)."""

    def __init__(self, fail_scan: bool = False) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.fail_scan = fail_scan
        self.closed = False

    def attach(self, topic: str, partition: int) -> None:
        self.calls.append(("attach", topic, partition))

    def detach(self, topic: str, partition: int) -> None:
        self.calls.append(("detach", topic, partition))

    def scan(self, max_records: int, timeout_ms: int) -> tuple[list[Any], list[Any]]:
        if self.fail_scan:
            raise RuntimeError("a defect of the scan")
        return [], []

    def close(self) -> None:
        self.closed = True


def _scan(fake: RecordingScan) -> DataScan:
    ds = DataScan(IdleConsumer(), "tb-data-test", native=False)  # type: ignore[arg-type]
    ds._native = fake  # as if the C scan had loaded
    return ds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(scan_mod.time, "monotonic", lambda: now[0])
    return now


def test_a_partition_attached_lately_is_forwarded_again_each_interval_and_no_more(clock):
    fake = RecordingScan()
    ds = _scan(fake)
    ds.attach(A)
    ds.attach(B)
    assert fake.calls == [("attach", "orders", 0), ("attach", "orders", 1)]
    fake.calls.clear()
    ds.read(10, 0.0)  # the first read forwards both again (the attach may have been undone)
    assert sorted(fake.calls) == [("attach", "orders", 0), ("attach", "orders", 1)]
    fake.calls.clear()
    clock[0] += scan_mod.REFORWARD_S / 2
    ds.read(10, 0.0)
    assert fake.calls == []  # not within the interval
    clock[0] += scan_mod.REFORWARD_S
    ds.forget(B)  # unassigned: no longer forwarded
    ds.read(10, 0.0)
    assert fake.calls == [("attach", "orders", 0)]


def test_past_its_first_moments_a_partition_is_forwarded_again_only_with_all(clock):
    """Issue 37: every partition every 0.2 s was 5,000 forwards a second at 1,024."""
    fake = RecordingScan()
    ds = _scan(fake)
    ds.attach(A)
    clock[0] += scan_mod.REFORWARD_FOR_S - scan_mod.REFORWARD_S
    ds.attach(B)
    ds.read(10, 0.0)  # the first read forwards all
    clock[0] += 2 * scan_mod.REFORWARD_S  # A attached long ago, B lately
    fake.calls.clear()
    ds.read(10, 0.0)
    assert fake.calls == [("attach", "orders", 1)]
    clock[0] += scan_mod.REFORWARD_ALL_S  # and all of them at the slow pace
    fake.calls.clear()
    ds.read(10, 0.0)
    assert sorted(fake.calls) == [("attach", "orders", 0), ("attach", "orders", 1)]


def test_after_a_fall_back_the_partitions_are_forwarded_to_the_consumer_again(clock):
    fake = RecordingScan(fail_scan=True)
    ds = _scan(fake)
    ds.attach(A)
    fake.calls.clear()
    ds.read(10, 0.0)  # forwards, then the scan fails: back to the consumer's queue
    assert ds.native is False and fake.calls[-1] == ("detach", "orders", 0)
    fake.calls.clear()
    clock[0] += scan_mod.REFORWARD_S
    ds.attach(B)  # a partition assigned after the fall-back is read through Python too
    ds.read(10, 0.0)
    assert ("detach", "orders", 1) in fake.calls and ("detach", "orders", 0) in fake.calls
    assert not any(c[0] == "attach" for c in fake.calls)
    ds.close()
    assert fake.closed


class BusyScan(RecordingScan):
    """Records at every scan while ``busy``: one entry of partition A."""

    def __init__(self) -> None:
        super().__init__()
        self.busy = True
        self.scans = 0

    def scan(self, max_records: int, timeout_ms: int) -> tuple[list[Any], list[Any]]:
        self.scans += 1
        return ([("orders", 0, "entry")] if self.busy else []), []


def test_a_paced_scan_reads_again_only_a_turn_after_a_read_that_found_records(monkeypatch):
    """One read per ``pace_s`` while records come (one fetch per turn, not per few
    records: the owner's consumer fetches again only once the last fetch was read); a
    read after one that found nothing is not held back (a marker's latency)."""
    now = [1000.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    monkeypatch.setattr(scan_mod.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(scan_mod.time, "sleep", sleep)
    fake = BusyScan()
    ds = DataScan(IdleConsumer(), "tb-data-test", native=False,  # type: ignore[arg-type]
                  pace_s=0.005)
    ds._native = fake
    assert ds.read(10, 0.005) == {("orders", 0): [("orders", 0, "entry")]}
    now[0] += 0.001  # the caller folds for a ms
    ds.read(10, 0.005)
    assert slept == [pytest.approx(0.004)]  # the rest of the turn
    fake.busy = False
    now[0] += 0.010
    assert ds.read(10, 0.005) == {}  # a turn had passed: not held back
    assert slept == [pytest.approx(0.004)]
    ds.read(10, 0.005)  # after a read that found nothing: at once
    assert slept == [pytest.approx(0.004)] and fake.scans == 4


def test_an_unpaced_scan_never_waits_between_reads(monkeypatch):
    monkeypatch.setattr(scan_mod.time, "sleep", lambda s: pytest.fail(f"slept {s}"))
    fake = BusyScan()
    ds = DataScan(IdleConsumer(), "tb-data-test", native=False)  # type: ignore[arg-type]
    ds._native = fake
    for _ in range(3):
        assert ds.read(10, 0.0)
