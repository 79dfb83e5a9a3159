"""PREPARED (issue 39): a txn that can no longer change, outlives its timeout, is bounded
by its own maximum prepared age, and is rebuilt the same by a new owner's replay."""

from __future__ import annotations

import time

import pytest

from tests.unit.coordinator.test_store_rules import Log, owner
from txnstream.coordinator.log_entry import TransactionLogEntry
from txnstream.coordinator.protocol import TcOp, TcRequest
from txnstream.coordinator.request_checks import check_request
from txnstream.coordinator.transport import MAGIC, line_mismatch
from txnstream.coordinator.txn_table import ABORT_PREPARED
from txnstream.errors import (
    InvalidRequestError,
    InvalidTxnStatusError,
    TransactionTimeoutError,
)
from txnstream.types import TopicPartition, TxnStatus

TP = TopicPartition("data", 0)
TIMEOUT_MS, MAX_PREPARED_MS = 10_000, 50_000


def prepared(log: Log, now: int = 1_000):
    store = owner(log)
    meta, e = store.new_txn("r1", TIMEOUT_MS, now)
    log.append(e)
    seq = meta.txn_id.least_bits
    log.append(store.add_partitions(seq, [TP], now))
    log.append(store.prepare(seq, MAX_PREPARED_MS, now + 100, "p1"))
    return store, seq


def test_a_prepared_txn_can_no_longer_change_and_preparing_again_logs_nothing():
    log = Log()
    store, seq = prepared(log)
    assert store.txns[seq].status is TxnStatus.PREPARED
    assert store.prepare(seq, MAX_PREPARED_MS, 2_000, "p2") is None  # idempotent
    with pytest.raises(InvalidTxnStatusError, match="PREPARED"):
        store.add_partitions(seq, [TopicPartition("data", 1)], 2_000)
    assert store.txns[seq].partitions == {TP}


def test_a_prepared_txn_outlives_its_timeout_and_commits_after_it():
    log = Log()
    store, seq = prepared(log)
    later = 1_000 + 3 * TIMEOUT_MS
    assert store.expire(later) == []
    assert store.txns[seq].status is TxnStatus.PREPARED
    res = store.end_txn(seq, True, later, request_id="c1")
    assert res.entry is not None and store.txns[seq].status is TxnStatus.COMMITTING
    assert store.end_txn(seq, True, later + 1).entry is None  # completing again: no-op


def test_past_its_maximum_prepared_age_it_is_aborted_and_a_commit_says_why():
    log = Log()
    store, seq = prepared(log)
    past = 1_100 + MAX_PREPARED_MS
    entries = store.expire(past)
    assert [e.status for e in entries] == [TxnStatus.ABORTING]
    assert store.txns[seq].abort_reason == ABORT_PREPARED
    with pytest.raises(TransactionTimeoutError, match="maximum prepared age"):
        store.end_txn(seq, True, past + 1)


def test_a_commit_at_the_age_limit_before_the_turn_expired_it_is_refused_too():
    log = Log()
    store, seq = prepared(log)
    with pytest.raises(TransactionTimeoutError, match="maximum prepared age"):
        store.end_txn(seq, True, 1_100 + MAX_PREPARED_MS)
    assert store.txns[seq].status is TxnStatus.ABORTING


def test_preparing_an_expired_txn_aborts_it_and_an_ended_one_is_refused():
    log = Log()
    store = owner(log)
    meta, e = store.new_txn("r1", TIMEOUT_MS, 1_000)
    log.append(e)
    seq = meta.txn_id.least_bits
    with pytest.raises(TransactionTimeoutError, match="before it was prepared"):
        store.prepare(seq, MAX_PREPARED_MS, 1_000 + TIMEOUT_MS)
    assert store.txns[seq].status is TxnStatus.ABORTING
    with pytest.raises(TransactionTimeoutError, match="aborted at its timeout"):
        store.prepare(seq, MAX_PREPARED_MS, 1_000 + TIMEOUT_MS + 1)
    meta, e = store.new_txn("r2", TIMEOUT_MS, 1_000)
    store.end_txn(meta.txn_id.least_bits, True, 1_001)
    with pytest.raises(InvalidTxnStatusError, match="COMMITTING"):
        store.prepare(meta.txn_id.least_bits, MAX_PREPARED_MS, 1_002)


def test_a_new_owner_replays_prepared_with_the_same_deadline():
    log = Log()
    store, seq = prepared(log)
    log.append(store.expire(2_000) or None)
    for _, e in log.records:  # the log as it reads back (each record's wire form)
        assert TransactionLogEntry.decode(e.encode()) == e
    again = owner(log, "w2")
    meta = again.txns[seq]
    assert meta.status is TxnStatus.PREPARED
    assert meta.prepared_deadline_ms == 1_100 + MAX_PREPARED_MS
    assert again.low_watermark <= seq  # it still holds its partitions' readers
    assert again.expire(1_000 + 3 * TIMEOUT_MS) == []
    assert [e.status for e in again.expire(1_100 + MAX_PREPARED_MS)] == [TxnStatus.ABORTING]


def test_a_prepared_txn_counts_toward_its_principals_open_limit():
    log = Log()
    store, seq = prepared(log)
    assert store.open_by_owner[store.txns[seq].owner] == 1
    store.end_txn(seq, False, 2_000)
    assert store.open_by_owner.get(store.txns[seq].owner, 0) == 0


def _prepare(max_ms: int) -> TcRequest:
    return TcRequest("r1", "c", 0, TcOp.PREPARE, 0, int(time.time() * 1000) + 60_000,
                     txn_seq=3, max_prepared_ms=max_ms)


@pytest.mark.parametrize("max_ms", [-1, 86_400_001])
def test_a_maximum_prepared_age_out_of_bounds_is_refused_naming_it(max_ms):
    with pytest.raises(InvalidRequestError, match="max_prepared_ms"):
        check_request(_prepare(max_ms), 60_000, 100, 86_400_000)


def test_a_prepare_request_round_trips():
    req = _prepare(5_000)
    check_request(req, 60_000, 100, 86_400_000)
    assert TcRequest.decode(req.encode()) == req


def test_an_older_lines_peer_is_refused_naming_both_versions():
    assert "line version 5, this side 6" in line_mismatch(b"TXNS5", "client")
    assert MAGIC == b"TXNS6"
    assert line_mismatch(b"HTTP/", "worker") == "not a txnstream worker"
