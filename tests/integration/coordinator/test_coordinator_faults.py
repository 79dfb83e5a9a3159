"""Coordinator failover with real processes: kill -9, SIGSTOP zombies, replay finalization."""

from __future__ import annotations

import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from confluent_kafka import Producer

from tests.integration.coordinator.conftest import (
    make_topic,
    owners,
    read_all,
    wait_until,
)
from txnstream import Client, TopicPartition, TxnID, TxnStatus
from txnstream.coordinator.log_entry import LogEntryKind, TransactionLogEntry
from txnstream.coordinator.protocol import TcOp
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.errors import TxnStreamError
from txnstream.markers import MarkerKind, RecordKind, TxnMarker, classify_headers

pytestmark = [pytest.mark.integration, pytest.mark.fault]

FINAL = (TxnStatus.COMMITTED, TxnStatus.ABORTED)


def all_served_by(client: Client, names: set[str], n: int) -> bool:
    try:
        o = owners(client)
    except TxnStreamError:
        return False
    return len(o) == n and set(o.values()) <= names


def run_traffic(client: Client, topic: str, count: int, told: dict, unknown: set,
                started: threading.Event | None = None, timeout_s: float = 20) -> None:
    rng = random.Random()
    lock = threading.Lock()

    def one(i: int) -> None:
        if started is not None and i == count // 4:
            started.set()
        try:
            txn = client.new_transaction(timeout_s=timeout_s)
        except TxnStreamError:
            return  # never opened as far as the client knows
        commit = rng.random() < 0.5
        try:
            txn.register_partitions([TopicPartition(topic, rng.randrange(3))])
            (txn.commit if commit else txn.abort)()
        except TxnStreamError:
            with lock:
                assert txn.id not in told and txn.id not in unknown, f"{txn.id} repeated"
                unknown.add(txn.id)
            return
        with lock:
            assert txn.id not in told and txn.id not in unknown, f"{txn.id} repeated"
            told[txn.id] = TxnStatus.COMMITTED if commit else TxnStatus.ABORTED

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))


def check_outcomes(client: Client, told: dict, unknown: set, wait_s: float = 60) -> None:
    def final_view() -> dict:
        return {t.txn_id: t.status for t in client.admin.list_transactions()}

    deadline = time.monotonic() + wait_s
    while True:
        view = final_view()
        pending = [t for t in list(told) + list(unknown) if view.get(t) not in FINAL]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not pending, f"{len(pending)} txns not final, e.g. {pending[:3]}"
    wrong = {t: (s, view[t]) for t, s in told.items() if view[t] is not s}
    assert not wrong, f"txns ended other than the client was told: {wrong}"
    ids = [t.txn_id for t in client.admin.list_transactions()]
    assert len(ids) == len(set(ids)), "a TxnID appears twice"


def test_kill9_owner_midrun_survivors_take_over(config, worker_procs, client):
    topic = make_topic(config, 3)
    for name in ("w1", "w2", "w3"):
        worker_procs.start(name)
    n = config.num_coordinators
    wait_until(lambda: all_served_by(client, {"w1", "w2", "w3"}, n), 90, "3 workers serving")
    victim = owners(client)[0]
    told: dict = {}
    unknown: set = set()
    started = threading.Event()
    t = threading.Thread(target=run_traffic, args=(client, topic, 600, told, unknown, started))
    t.start()
    assert started.wait(120)
    worker_procs.signal(victim, signal.SIGKILL)
    t.join(600)
    survivors = {"w1", "w2", "w3"} - {victim}
    wait_until(lambda: all_served_by(client, survivors, n), 60, "survivors own every TC")
    assert len(told) + len(unknown) >= 500, (len(told), len(unknown))
    check_outcomes(client, told, unknown)
    markers: dict[TxnID, set] = {}
    for m in read_all(config, topic):
        kind, txn_id = classify_headers(m.headers())
        if kind is RecordKind.MARKER:
            markers.setdefault(txn_id, set()).add(TxnMarker.decode(m.value()).kind)
    # A marker is owed where the coordinator registered the partition, and only there.
    # A registration is pipelined after a topic's first (docs/coordinator.md): one sent
    # to the killed owner may never land, and the abort that follows it (which waits for
    # it a bounded time) ends a txn that registered nothing and sent nothing here: no
    # marker is due (seen once in six full runs: (1,456) told ABORTED, no marker). A
    # commit carries its unconfirmed registrations, so every committed txn has it.
    known = {t.txn_id: t for t in client.admin.list_transactions()}
    for txn_id, status in told.items():
        want = MarkerKind.COMMIT if status is TxnStatus.COMMITTED else MarkerKind.ABORT
        registered = any(p.startswith(f"{topic}-") for p in known[txn_id].partitions)
        assert registered or status is TxnStatus.ABORTED, (txn_id, status, known[txn_id])
        assert markers.get(txn_id) == ({want} if registered else None), (
            txn_id, status, markers.get(txn_id), known[txn_id])


def test_sigstopped_owner_is_fenced_and_stops_serving(config, worker_procs, client):
    topic = make_topic(config, 3)
    worker_procs.start("a")
    worker_procs.start("b")
    n = config.num_coordinators
    wait_until(lambda: all_served_by(client, {"a", "b"}, n)
               and len(set(owners(client).values())) == 2, 90, "two workers serving")
    zombie = owners(client)[0]
    other = ({"a", "b"} - {zombie}).pop()
    stopped_at = len(worker_procs.log(zombie))
    worker_procs.signal(zombie, signal.SIGSTOP)
    told: dict = {}
    unknown: set = set()
    try:
        run_traffic(client, topic, 120, told, unknown)
        wait_until(lambda: all_served_by(client, {other}, n), 60, "takeover by the live worker")
    finally:
        worker_procs.signal(zombie, signal.SIGCONT)
    wait_until(lambda: "stops serving" in worker_procs.log(zombie)[stopped_at:], 60,
               "the zombie to stop serving")
    after = worker_procs.log(zombie)[stopped_at:]
    assert ("fenced" in after) or ("revoked" in after), after[-2000:]
    run_traffic(client, topic, 60, told, unknown)
    check_outcomes(client, told, unknown)


def test_committing_found_on_replay_is_finalized_by_new_owner(config, client):
    topic = make_topic(config, 1)
    tc_id = config.num_coordinators - 1
    p = Producer(config.producer())
    offsets: list[int] = []

    def append(entry: TransactionLogEntry) -> int:
        p.produce(config.topics.log, entry.encode(), partition=tc_id,
                  on_delivery=lambda err, m: offsets.append(m.offset()))
        p.flush(10)
        return offsets[-1]

    seq = 5_000_000
    epoch = append(TransactionLogEntry(kind=LogEntryKind.EPOCH, epoch_offset=-1,
                                       owner_id="crashed-owner", next_sequence=seq))
    now = int(time.time() * 1000)
    append(TransactionLogEntry(kind=LogEntryKind.TXN, epoch_offset=epoch, owner_id="crashed-owner",
                               txn_seq=seq, status=TxnStatus.OPEN, open_time_ms=now,
                               timeout_ms=600_000, partitions=(TopicPartition(topic, 0),)))
    append(TransactionLogEntry(kind=LogEntryKind.TXN, epoch_offset=epoch, owner_id="crashed-owner",
                               txn_seq=seq, status=TxnStatus.COMMITTING))
    w = CoordinatorWorker(config).start()
    try:
        txn_id = TxnID(tc_id, seq)
        wait_until(lambda: tc_id in w.serving(), 60, "new owner serving")
        wait_until(lambda: client.admin.get_transaction(txn_id).status is TxnStatus.COMMITTED,
                   30, "finalization by the new owner")
        kinds = [TxnMarker.decode(m.value()).kind for m in read_all(config, topic)
                 if classify_headers(m.headers()) == (RecordKind.MARKER, txn_id)]
        assert kinds and set(kinds) == {MarkerKind.COMMIT}
        # the new owner continues the sequence above the replayed txn
        fresh = client.tc.request(TcOp.NEW, tc_id, timeout_ms=10_000)
        assert fresh.txn_seq > seq
    finally:
        w.stop()
