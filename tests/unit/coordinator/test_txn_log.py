"""The ``TransactionLog`` contract, run here over ``InMemoryTransactionLog`` with no broker.

The same checks run over ``KafkaTransactionLog`` on a real broker in
``tests/integration/coordinator/test_txn_log_kafka.py`` (Pulsar's
``TransactionMetadataStoreProviderTest`` runs one suite over both of its stores), so the
fake cannot drift from the real log.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from txnstream.coordinator.log_entry import LogEntryKind, TransactionLogEntry
from txnstream.coordinator.txn_log import InMemoryTransactionLog, LogRecord, TransactionLog
from txnstream.types import TxnStatus

PARTITIONS = 3


def entries(n: int, first_seq: int = 0) -> list[TransactionLogEntry]:
    """``n`` distinct OPEN entries (told apart by their sequence)."""
    return [TransactionLogEntry(LogEntryKind.TXN, 0, "contract", txn_seq=first_seq + i,
                                status=TxnStatus.OPEN, timeout_ms=60_000)
            for i in range(n)]


def own_all(log: TransactionLog, partitions: int, timeout_s: float = 60.0) -> None:
    """Subscribe and poll until every partition is owned."""
    owned: set[int] = set()
    log.subscribe(owned.update, owned.difference_update)
    deadline = time.monotonic() + timeout_s
    while len(owned) < partitions:
        assert time.monotonic() < deadline, f"owns {sorted(owned)} of {partitions} partitions"
        for _ in log.poll(0.1):
            pass  # records of earlier checks: their partitions are not this check's


def read_from(log: TransactionLog, tc_id: int, start: int, count: int,
              timeout_s: float = 30.0) -> list[LogRecord]:
    """The first ``count`` records of ``tc_id`` at or after ``start``, polled in order."""
    log.seek(tc_id, start)
    got: list[LogRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"read {len(got)} of {count} records back"
        got += [r for r in log.poll(0.1) if r.tc_id == tc_id and r.offset >= start]
    return got


# ------------------------------------------------------------------ the contract


def check_append_returns_increasing_offsets(log: TransactionLog) -> None:
    tc = 0
    _, high = log.watermarks(tc)
    first = log.append(tc, entries(3))
    second = log.append(tc, entries(2, first_seq=3))
    assert first.ok and second.ok, (first.error, second.error)
    offsets = first.offsets + second.offsets
    assert len(offsets) == 5 and offsets[0] >= high
    assert list(offsets) == sorted(set(offsets)), "offsets must strictly increase"
    assert log.watermarks(tc)[1] > offsets[-1]


def check_appended_reads_back_in_order(log: TransactionLog) -> None:
    tc = 1
    sent = entries(4, first_seq=10)
    result = log.append(tc, sent[:3])
    lost: list[object] = []
    log.append_async(tc, sent[3:], lost.append)
    assert result.ok, result.error
    got = read_from(log, tc, result.offsets[0], len(sent))
    assert not lost, lost
    assert [r.offset for r in got[:3]] == list(result.offsets)
    assert [TransactionLogEntry.decode(r.value) for r in got] == sent
    assert [r.offset for r in got] == sorted(r.offset for r in got)


def check_truncation_drops_the_prefix(log: TransactionLog) -> None:
    tc = 2
    sent = entries(5, first_seq=20)
    result = log.append(tc, sent)
    assert result.ok, result.error
    cut = result.offsets[2]
    log.truncate(tc, cut).result(30)
    low, high = log.watermarks(tc)
    assert low == cut and high > result.offsets[-1]
    got = read_from(log, tc, low, 3)
    assert [r.offset for r in got] == list(result.offsets[2:])
    assert [TransactionLogEntry.decode(r.value) for r in got] == sent[2:]


def check_truncation_past_the_end_fails(log: TransactionLog) -> None:
    tc = 0
    _, high = log.watermarks(tc)
    with pytest.raises(Exception):  # noqa: B017 - Kafka and the fake raise their own
        log.truncate(tc, high + 10).result(30)
    assert log.watermarks(tc)[1] == high


CONTRACT: list[Callable[[TransactionLog], None]] = [
    check_append_returns_increasing_offsets,
    check_appended_reads_back_in_order,
    check_truncation_drops_the_prefix,
    check_truncation_past_the_end_fails,
]


def assert_keeps_the_contract(check: Callable[[TransactionLog], None], log: TransactionLog,
                              partitions: int) -> None:
    """Run one contract check on ``log``; after it, every partition still has its log
    start at or below its end (what a replay's range is computed from)."""
    check(log)
    for tc in range(partitions):
        low, high = log.watermarks(tc)
        assert 0 <= low <= high, f"partition {tc}: log start {low} past its end {high}"


# ------------------------------------------------------------------ in memory


@pytest.mark.parametrize("check", CONTRACT, ids=lambda c: c.__name__)
def test_in_memory_log_keeps_the_contract(check: Callable[[TransactionLog], None]) -> None:
    log = InMemoryTransactionLog(PARTITIONS)
    own_all(log, PARTITIONS)
    assert_keeps_the_contract(check, log, PARTITIONS)


def test_in_memory_log_runs_every_check_on_one_log() -> None:
    log = InMemoryTransactionLog(PARTITIONS)
    own_all(log, PARTITIONS)
    for check in CONTRACT:
        check(log)


def test_a_refusing_log_appends_nothing_and_says_why() -> None:
    log = InMemoryTransactionLog(PARTITIONS, refuse="MSG_SIZE_TOO_LARGE")
    own_all(log, PARTITIONS)
    result = log.append(0, entries(2))
    lost: list[object] = []
    log.append_async(0, entries(1), lost.append)
    assert not result.ok and result.error == "MSG_SIZE_TOO_LARGE" and not result.offsets
    assert lost == ["MSG_SIZE_TOO_LARGE"]
    assert log.watermarks(0) == (0, 0)
    assert list(log.poll(0)) == []
