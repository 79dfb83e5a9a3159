"""The transaction coordinator on a real broker: outcomes, timeouts, admin, bad input."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from confluent_kafka import Producer

from tests.integration.coordinator.conftest import (
    FAST_FAILOVER_MS,
    make_topic,
    read_all,
    wait_until,
)
from txnstream import Client, Config, TopicPartition, TxnID, TxnStatus
from txnstream.coordinator.client_connection import ClientConnection
from txnstream.coordinator.log_entry import LogEntryKind, TransactionLogEntry
from txnstream.coordinator.protocol import TcOp
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.transport import IoLoop
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.errors import (
    CoordinatorNotFoundError,
    InvalidTxnStatusError,
    TransactionNotFoundError,
    TransactionTimeoutError,
)
from txnstream.markers import MarkerKind, RecordKind, TxnMarker, classify_headers

pytestmark = pytest.mark.integration


def markers_by_txn(config: Config, topic: str) -> dict[TxnID, set[MarkerKind]]:
    out: dict[TxnID, set[MarkerKind]] = {}
    for m in read_all(config, topic):
        kind, txn_id = classify_headers(m.headers())
        if kind is RecordKind.MARKER:
            out.setdefault(txn_id, set()).add(TxnMarker.decode(m.value()).kind)
    return out


def test_1000_random_transactions_end_as_told(config, worker, client):
    topic = make_topic(config, 4)
    rng = random.Random(7)
    plan = [rng.random() < 0.5 for _ in range(1000)]
    told: dict[TxnID, TxnStatus] = {}
    lock = threading.Lock()

    def run(commit: bool) -> None:
        txn = client.new_transaction(timeout_s=60)
        txn.register_partitions([TopicPartition(topic, rng.randrange(4))])
        (txn.commit if commit else txn.abort)()
        with lock:
            assert txn.id not in told, f"TxnID {txn.id} handed out twice"
            told[txn.id] = TxnStatus.COMMITTED if commit else TxnStatus.ABORTED

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(run, plan))
    assert len(told) == 1000
    known = {t.txn_id: t.status for t in client.admin.list_transactions()}
    wait_until(lambda: all(known.get(k) is v for k, v in told.items()) or
               known.update({t.txn_id: t.status for t in client.admin.list_transactions()}),
               30, "every txn final")
    assert {k: known[k] for k in told} == told
    markers = markers_by_txn(config, topic)
    for txn_id, status in told.items():
        want = MarkerKind.COMMIT if status is TxnStatus.COMMITTED else MarkerKind.ABORT
        assert markers.get(txn_id) == {want}, \
            f"{txn_id} told {status}, markers {markers.get(txn_id)}"


def test_context_manager_commits_and_aborts(config, worker, client):
    with client.transaction() as txn:
        pass
    assert client.admin.get_transaction(txn.id).status is TxnStatus.COMMITTED
    with pytest.raises(RuntimeError):
        with client.transaction() as txn2:
            raise RuntimeError("boom")
    wait_until(lambda: client.admin.get_transaction(txn2.id).status is TxnStatus.ABORTED, 10,
               "abort")


def test_open_transaction_is_aborted_at_its_timeout(config, worker, client):
    topic = make_topic(config, 1)
    txn = client.new_transaction(timeout_s=2)
    txn.register_partitions([TopicPartition(topic, 0)])
    wait_until(lambda: client.admin.get_transaction(txn.id).status is TxnStatus.ABORTED, 15,
               "timeout abort")
    info = client.admin.get_transaction(txn.id)
    assert info.abort_reason == "timeout"
    with pytest.raises(TransactionTimeoutError) as exc:
        txn.commit()
    assert str(txn.id) in str(exc.value)
    assert markers_by_txn(config, topic)[txn.id] == {MarkerKind.ABORT}


def test_slow_transactions_and_admin_abort(config, worker, client):
    txn = client.new_transaction(timeout_s=120)
    time.sleep(1.2)
    slow = client.admin.slow_transactions(1.0)
    assert txn.id in {t.txn_id for t in slow}
    info = client.admin.abort_transaction(txn.id)
    assert info.status in (TxnStatus.ABORTING, TxnStatus.ABORTED)
    with pytest.raises(InvalidTxnStatusError):
        txn.commit()


def test_low_watermark_waits_for_the_oldest_open_transaction(own_config):
    # A log of its own: on the session's shared one, an earlier test's txn still open on
    # the same TC (a long timeout) is older than ``first`` and holds the watermark
    worker = CoordinatorWorker(own_config,
                               settings=WorkerSettings(session_timeout_ms=FAST_FAILOVER_MS))
    worker.start()
    client = Client(config=own_config)
    try:
        wait_until(lambda: len(worker.serving()) == own_config.num_coordinators, 60,
                   "worker serving")
        first = client.new_transaction()
        tc = first.id.tc_id
        later = [client.new_transaction() for _ in range(2 * own_config.num_coordinators)]
        for t in later:
            t.commit()
        stats = {s.tc_id: s.stats for s in client.admin.coordinator_stats()}
        assert stats[tc]["low_watermark"] == first.id.least_bits
        first.commit()
        wait_until(lambda: {s.tc_id: s.stats for s in client.admin.coordinator_stats()}[tc]
                   ["low_watermark"] > first.id.least_bits, 10, "lwm advance")
    finally:
        client.close()
        worker.stop()


def test_group_end_is_all_or_none_and_idempotent(config, worker, client):
    tc = client.tc
    tc_id = 0
    seqs = [tc.request(TcOp.NEW, tc_id, timeout_ms=60_000).txn_seq for _ in range(3)]
    r1 = tc.request(TcOp.END_GROUP, tc_id, group_key="q1/7", group_seqs=tuple(seqs), commit=True)
    assert not r1.already
    replay = [tc.request(TcOp.NEW, tc_id, timeout_ms=60_000).txn_seq for _ in range(2)]
    r2 = tc.request(TcOp.END_GROUP, tc_id, group_key="q1/7", group_seqs=tuple(replay), commit=True)
    assert r2.already and sorted(r2.group_seqs) == sorted(seqs)

    def status(s: int) -> TxnStatus:
        return client.admin.get_transaction(TxnID(tc_id, s)).status

    wait_until(lambda: all(status(s) is TxnStatus.COMMITTED for s in seqs) and
               all(status(s) is TxnStatus.ABORTED for s in replay), 15, "group outcome")
    # one txn not open -> the whole group aborts
    a = tc.request(TcOp.NEW, tc_id, timeout_ms=60_000).txn_seq
    b = tc.request(TcOp.NEW, tc_id, timeout_ms=60_000).txn_seq
    tc.request(TcOp.END, tc_id, txn_seq=b, commit=False)
    with pytest.raises(InvalidTxnStatusError):
        tc.request(TcOp.END_GROUP, tc_id, group_key="q1/8", group_seqs=(a, b), commit=True)
    wait_until(lambda: status(a) is TxnStatus.ABORTED, 10, "group member aborted")


def test_group_end_aborts_the_orphans_of_its_key_so_readers_are_not_blocked(
        config, worker, client):
    import uuid

    topic = make_topic(config, 1)
    p = client.create_producer(topic)
    # an attempt whose driver died: open, written, never reported; timeout far away
    orphan = client.new_transaction(timeout_s=600, tc_id=0, group_key="q9/3")
    p.send(b"orphan", txn=orphan, partition=0)
    member = client.new_transaction(timeout_s=600, tc_id=0, group_key="q9/3")
    p.send(b"member", txn=member, partition=0)
    other = client.new_transaction(timeout_s=600, tc_id=0, group_key="q9/4")
    p.flush_transaction(orphan)
    p.flush_transaction(member)
    member.flush()
    client.tc.request(TcOp.END_GROUP, 0, group_key="q9/3",
                      group_seqs=(member.id.least_bits,), commit=True)
    wait_until(lambda: client.admin.get_transaction(orphan.id).status is TxnStatus.ABORTED,
               15, "orphan aborted at the group end")
    assert client.admin.get_transaction(orphan.id).abort_reason == "group"
    assert client.admin.get_transaction(other.id).status is TxnStatus.OPEN
    # the orphan no longer blocks the partition: the member's record is delivered
    c = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    m = c.receive(timeout_s=15)
    c.close()
    assert m is not None and m.value == b"member"
    other.abort()


def test_clear_errors_for_unknown_txn_wrong_status_and_missing_coordinator(config, worker, client):
    with pytest.raises(TransactionNotFoundError) as e1:
        client.admin.get_transaction(TxnID(0, 999_999))
    assert "(0,999999)" in str(e1.value)
    txn = client.new_transaction()
    txn.commit()
    with pytest.raises(InvalidTxnStatusError) as e2:
        client.tc.request(TcOp.END, txn.id.tc_id, txn_seq=txn.id.least_bits, commit=False)
    assert str(txn.id) in str(e2.value) and "COMMITTED" in str(e2.value)
    with pytest.raises(InvalidTxnStatusError):
        txn.register_partitions([TopicPartition("x", 0)])
    with pytest.raises(CoordinatorNotFoundError) as e3:
        client.admin.get_transaction(TxnID(config.num_coordinators + 3, 1))
    assert "does not exist" in str(e3.value)


def test_garbage_in_log_and_requests_is_skipped_and_worker_keeps_serving(
        config, worker, client, caplog):
    before = client.new_transaction()
    before.commit()
    tc_id = before.id.tc_id
    stats0 = {s.tc_id: s.stats for s in client.admin.coordinator_stats()}[tc_id]
    p = Producer(config.producer())
    stale = TransactionLogEntry(kind=LogEntryKind.TXN, epoch_offset=stats0["epoch_offset"] - 1
                                if stats0["epoch_offset"] > 0 else 10**9, owner_id="zombie",
                                txn_seq=before.id.least_bits, status=TxnStatus.ABORTING)
    garbage = (b"\x00garbage", b"\x7f" + b"x" * 20, b"", stale.encode())
    for value in garbage:
        p.produce(config.topics.log, value, partition=tc_id)
    p.flush(10)
    # the same garbage as requests over the direct line, on a connection of its own
    io = IoLoop("garbage-client")
    try:
        conn = ClientConnection.open(io, worker.address, None, None, lambda _r: None,
                                     lambda _c: None, 5, cluster=client.tc.cluster)
        for value in garbage:
            conn.send(value)
        time.sleep(1.0)  # the worker must skip all of them and keep serving
        conn.close()
    finally:
        io.close()
    after = client.new_transaction()
    after.commit()
    assert client.admin.get_transaction(before.id).status is TxnStatus.COMMITTED
    stats1 = {s.tc_id: s.stats for s in client.admin.coordinator_stats()}[tc_id]
    assert stats1["invalid_records"] == stats0["invalid_records"] + 1
    logged = caplog.text
    assert f"{config.topics.log}[{tc_id}]@" in logged and "corrupt" in logged
    assert "closing the connection from 127.0.0.1:" in logged and "a corrupt request" in logged
    assert "unknown record format version 127" in logged
