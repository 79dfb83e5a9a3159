"""One partition that cannot be written never stops a coordinator (issue 20 item 3).

Against a real broker (``auto.create.topics.enable=true``, Kafka's default) and a real
worker: a txn whose topic is deleted before its commit still ends and the coordinator's
LWM moves on; a registration naming a partition that does not exist is refused; a txn
stuck on a partition that exists but refuses its marker is ended by an admin.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from txnstream import Client, TopicNames
from txnstream.admin_topics import ensure_topics
from txnstream.config import Config
from txnstream.coordinator.protocol import TcOp
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.errors import InvalidRequestError, NotAuthorizedError
from txnstream.markers import MarkerKind, RecordKind, TxnMarker, classify_headers
from txnstream.types import TopicPartition, TxnID, TxnStatus

from .conftest import (
    FAST_FAILOVER_MS,
    make_topic,
    read_all,
    restarts,
    set_topic_config,
    wait_until,
)


@pytest.fixture
def config(config: Config) -> Config:
    """Internal topics of its own. These tests check that no line is logged unlimited, and
    the session's shared endpoint topic holds other tests' endpoint records written
    under other workers' keys (or none): every client warns about each TC's once per
    10 s, four TCs' lines in all (seen in a full run once workers sign by default)."""
    cfg = config.with_(topics=TopicNames(f"__t{uuid.uuid4().hex[:8]}"))
    ensure_topics(cfg)
    return cfg


GONE_BOUND_S = 10.0
"""docs/coordinator.md: a txn whose partition is gone ends (and the LWM passes it)
within this of its commit being decided."""
NO_AUTO_CREATE = {"allow.auto.create.topics": False}
"""The test's own producers must not recreate a deleted topic either."""


def _txn_markers(config: Config, topic: str, txn_id: TxnID) -> Counter[tuple[int, str]]:
    """(partition, kind) -> how many markers of ``txn_id`` ``topic`` holds."""
    out: Counter[tuple[int, str]] = Counter()
    for m in read_all(config, topic):
        kind, tid = classify_headers(m.headers())
        if kind is RecordKind.MARKER and tid == txn_id:
            out[(m.partition(), TxnMarker.decode(m.value()).kind.value)] += 1
    return out


def _lwm(client: Client, tc_id: int) -> int:
    return {s.tc_id: s.stats for s in client.admin.coordinator_stats()}[tc_id]["low_watermark"]


def _topics(config: Config) -> set[str]:
    return set(AdminClient(config.admin()).list_topics(timeout=10).topics)


def _repeated_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int]]:
    """Warning/error lines of txnstream logged more than 3 times each (by template)."""
    kinds = Counter(f"{r.name}: {r.msg}" for r in caplog.records
                    if r.levelno >= logging.WARNING and r.name.startswith("txnstream"))
    return [(k[:160], n) for k, n in kinds.most_common() if n > 3]


def _delete_topic(config: Config, topic: str) -> None:
    admin = AdminClient(config.admin())
    for f in admin.delete_topics([topic], operation_timeout=30).values():
        f.result(30)
    wait_until(lambda: topic not in _topics(config), 30, f"topic {topic} deleted")


def test_a_txn_whose_topic_is_deleted_before_its_commit_commits_and_the_lwm_moves_on(
        worker, client, config, caplog):
    """Old: the txn stayed COMMITTING for good (or the marker recreated the topic)."""
    caplog.set_level(logging.WARNING, logger="txnstream")
    gone = make_topic(config, 1, "gone")  # sorts before "kept": its marker is tried first
    kept = make_topic(config, 2, "kept")
    txn = client.new_transaction(timeout_s=60, tc_id=0)
    to_gone = client.create_producer(gone, **NO_AUTO_CREATE)
    to_kept = client.create_producer(kept, **NO_AUTO_CREATE)
    to_gone.send(b"g0", txn=txn, partition=0)
    to_kept.send(b"k0", txn=txn, partition=0)
    to_kept.send(b"k1", txn=txn, partition=1)
    txn.flush()
    to_gone.close()
    _delete_topic(config, gone)

    t0 = time.monotonic()
    txn.commit()
    wait_until(lambda: client.admin.get_transaction(txn.id).status is TxnStatus.COMMITTED,
               GONE_BOUND_S, f"txn {txn.id} COMMITTED within {GONE_BOUND_S}s of its commit")
    wait_until(lambda: _lwm(client, 0) > txn.id.least_bits,
               max(1.0, GONE_BOUND_S - (time.monotonic() - t0)),
               "the coordinator's LWM past the txn")
    time.sleep(5)  # a retry loop would append duplicates meanwhile
    markers = _txn_markers(config, kept, txn.id)
    assert markers == Counter({(0, "COMMIT"): 1, (1, "COMMIT"): 1}), (
        f"{kept} should hold exactly one COMMIT marker of {txn.id} per partition: {markers}")
    assert gone not in _topics(config), f"writing a marker recreated the deleted topic {gone}"
    assert restarts(client, 0) == 0
    assert _repeated_lines(caplog) == [], "a retry loop logs without a rate limit"


def test_add_partitions_naming_a_partition_that_does_not_exist_is_refused(worker, client,
                                                                          config, caplog):
    """Old: registered; the txn's commit then never ended and the coordinator stalled."""
    caplog.set_level(logging.WARNING, logger="txnstream")
    topic = make_topic(config, 2, "idx")
    missing_topic = f"never-{topic}"
    txn = client.new_transaction(timeout_s=60, tc_id=1)
    seq = txn.id.least_bits
    with pytest.raises(InvalidRequestError, match=f"{topic}-7"):
        client.tc.request(TcOp.ADD_PARTITIONS, 1, txn_seq=seq,
                          partitions=(TopicPartition(topic, 0), TopicPartition(topic, 7)))
    with pytest.raises(InvalidRequestError, match=f"{missing_topic}-0"):
        client.tc.request(TcOp.ADD_PARTITIONS, 1, txn_seq=seq,
                          partitions=(TopicPartition(missing_topic, 0),))
    assert missing_topic not in _topics(config), "the existence check created the topic"
    info = client.admin.get_transaction(txn.id)
    assert info.partitions == () and info.status is TxnStatus.OPEN
    # the worker keeps serving, and the txn is whole: it writes and commits
    client.create_producer(topic).send(b"r0", txn=txn, partition=0)
    txn.commit()
    assert client.admin.get_transaction(txn.id).status is TxnStatus.COMMITTED
    assert restarts(client, 1) == 0
    assert _txn_markers(config, topic, txn.id) == Counter({(0, "COMMIT"): 1})
    time.sleep(3)  # the buffer role would be serving the refused partition by now
    assert _repeated_lines(caplog) == [], "a retry loop logs without a rate limit"


# ------------------------------------------------------------------ force-end

ADMIN_SECRET = "admin-secret-4b1e"
SECRETS = {"alice": "alice-secret-7c20", "bob": "bob-secret-90d3"}


@pytest.fixture
def secured(config: Config, tmp_path: Path) -> Iterator[CoordinatorWorker]:
    users = tmp_path / "tc-users"
    users.write_text("".join(f"{who}={secret}\n" for who, secret in SECRETS.items()))
    users.chmod(0o600)
    w = CoordinatorWorker(config.with_(tc_secret=ADMIN_SECRET, tc_users_file=str(users)),
                          settings=WorkerSettings(session_timeout_ms=FAST_FAILOVER_MS))
    w.start()
    try:
        wait_until(lambda: len(w.serving()) == config.num_coordinators, 60, "worker serving")
        yield w
    finally:
        w.stop()


@contextmanager
def _clients(config: Config, *principals: str) -> Iterator[tuple[Client, ...]]:
    """A client per principal (``txnstream`` is the admin), all closed afterwards."""
    made = [Client(config=config.with_(
        tc_principal=who, tc_secret=ADMIN_SECRET if who == "txnstream" else SECRETS[who]))
        for who in principals]
    try:
        yield tuple(made)
    finally:
        for c in made:
            c.close()


def test_an_admin_force_ends_a_txn_stuck_on_a_partition_that_refuses_its_marker(
        secured, config):
    """Old: ``txn abort`` refused a COMMITTING txn and nothing else could end it."""
    with _clients(config, "alice", "bob", "txnstream") as (alice, bob, admin):
        refusing = make_topic(config, 1, "refusing")  # sorts before "writable"
        writable = make_topic(config, 1, "writable")
        txn = alice.new_transaction(timeout_s=60, tc_id=2)
        alice.create_producer(refusing).send(b"x", txn=txn, partition=0)
        alice.create_producer(writable).send(b"y", txn=txn, partition=0)
        txn.flush()
        # The partition exists but refuses every record from now on (a misconfigured
        # topic): its marker is not dropped, the txn stays COMMITTING.
        set_topic_config(config, refusing, {"max.message.bytes": "16"})
        committed = txn.commit_async()
        wait_until(lambda: admin.admin.get_transaction(txn.id).status is TxnStatus.COMMITTING,
                   15, "the commit decided")
        time.sleep(3)
        assert admin.admin.get_transaction(txn.id).status is TxnStatus.COMMITTING
        assert _txn_markers(config, writable, txn.id) == Counter({(0, "COMMIT"): 1}), (
            "the writable partition's marker should be written despite the refusing one")

        for who in (alice, bob):  # the opener too: ending it half-marked is an admin's call
            with pytest.raises(NotAuthorizedError, match="force-end"):
                who.admin.force_end(txn.id)
        assert admin.admin.get_transaction(txn.id).status is TxnStatus.COMMITTING

        ended = admin.admin.force_end(txn.id)
        assert ended.status is TxnStatus.COMMITTED
        committed.result(timeout=15)  # the waiting commit is answered
        wait_until(lambda: _lwm(admin, 2) > txn.id.least_bits, 10,
                   "the coordinator's LWM past the force-ended txn")
        assert admin.admin.force_end(txn.id).status is TxnStatus.COMMITTED  # idempotent
        assert _txn_markers(config, writable, txn.id) == Counter({(0, "COMMIT"): 1})
        assert MarkerKind.COMMIT.value not in {
            k for (_, k) in _txn_markers(config, refusing, txn.id)}
        assert restarts(admin, 2) == 0


def _thread_cpu_s(thread: threading.Thread) -> float:
    """CPU seconds the (running) ``thread`` of this process has used so far."""
    stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


IDLE_WORKER_CPU_S = 0.5
"""CPU the worker's thread may use over :data:`STUCK_WATCH_S` while nothing but a refused
marker's backoff is due (a spinning turn loop uses about all of it)."""
STUCK_WATCH_S = 4.0


def test_a_worker_waiting_out_a_refused_markers_backoff_stays_idle(secured, config):
    """A txn whose partition refuses its marker stays COMMITTING, its markers tried again
    after a backoff (up to 5 s apart). The worker's turn asked for requests without
    waiting while any txn was COMMITTING or ABORTING, so it turned as fast as it could
    for as long as the partition refused: a core for nothing. It now waits for requests
    until the earliest retry is due."""
    with _clients(config, "alice", "txnstream") as (alice, admin):
        refusing = make_topic(config, 1, "refusing")
        txn = alice.new_transaction(timeout_s=60, tc_id=2)
        alice.create_producer(refusing).send(b"x", txn=txn, partition=0)
        txn.flush()
        set_topic_config(config, refusing, {"max.message.bytes": "16"})
        txn.commit_async()
        wait_until(lambda: admin.admin.get_transaction(txn.id).status is TxnStatus.COMMITTING,
                   15, "the commit decided")
        time.sleep(1.0)  # the first retries pass; the backoff grows
        worker = secured._thread
        cpu0 = _thread_cpu_s(worker)
        time.sleep(STUCK_WATCH_S)
        cpu = _thread_cpu_s(worker) - cpu0
        assert admin.admin.get_transaction(txn.id).status is TxnStatus.COMMITTING
        assert cpu < IDLE_WORKER_CPU_S, (
            f"the worker's thread used {cpu:.2f} s of CPU in {STUCK_WATCH_S:.0f} s with "
            f"nothing due but a refused marker's retry: its turn loop spins")
        assert admin.admin.force_end(txn.id).status is TxnStatus.COMMITTED  # leave it ended
