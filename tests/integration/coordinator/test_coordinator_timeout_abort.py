"""A timeout abort found by a commit is logged before anything acts on it (real broker).

Pulsar's rule, and DESIGN.md section 5's: the log is the truth. A commit that arrives
after its txn's deadline, before the timeout tracker's next turn, aborts the txn; that
ABORTING record must be in the log before the client hears "timed out" and before any
ABORT marker, or a new owner replays the txn as OPEN while its partitions hold ABORT
markers, and could commit it: committed on some partitions, aborted on others.
"""

from __future__ import annotations

import time

import pytest

from tests.integration.coordinator.conftest import make_topic, read_all, replay_log, wait_until
from txnstream import TopicPartition, TxnID, TxnStatus
from txnstream.coordinator.protocol import TcOp
from txnstream.coordinator.timeout_tracker import TransactionTimeoutTracker
from txnstream.errors import TransactionTimeoutError
from txnstream.markers import MarkerKind, RecordKind, TxnMarker, classify_headers

pytestmark = pytest.mark.integration


def test_commit_that_finds_its_txn_expired_logs_the_abort_before_replying(
        config, worker, client, monkeypatch):
    # The tracker is held back, so the commit is what finds the txn expired: the race
    # between a late commit and the tracker's next turn, made certain.
    monkeypatch.setattr(TransactionTimeoutTracker, "pop_expired", lambda self, now_ms: [])
    topic = make_topic(config, 1)
    tc = 2
    seq = client.tc.request(TcOp.NEW, tc, timeout_ms=1_000).txn_seq
    txn_id = TxnID(tc, seq)
    client.tc.request(TcOp.ADD_PARTITIONS, tc, txn_seq=seq, partitions=(TopicPartition(topic, 0),))
    time.sleep(1.3)
    with pytest.raises(TransactionTimeoutError) as exc:
        client.tc.request(TcOp.END, tc, txn_seq=seq, commit=True)
    assert str(txn_id) in str(exc.value)
    # The error reply came after the abort was in the log.
    logged = replay_log(config, tc).txns[seq]
    assert logged.status in (TxnStatus.ABORTING, TxnStatus.ABORTED), logged.status
    assert logged.abort_reason == "timeout"

    def markers() -> set:
        return {TxnMarker.decode(m.value()).kind for m in read_all(config, topic)
                if classify_headers(m.headers()) == (RecordKind.MARKER, txn_id)}

    wait_until(lambda: markers() == {MarkerKind.ABORT}, 15, "the ABORT marker")
    wait_until(lambda: replay_log(config, tc).txns[seq].status is TxnStatus.ABORTED, 15,
               "ABORTED in the log")
    # Asking again (a retry, or a new owner) gives the same answer: timed out.
    with pytest.raises(TransactionTimeoutError):
        client.tc.request(TcOp.END, tc, txn_seq=seq, commit=True)
