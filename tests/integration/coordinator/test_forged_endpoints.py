"""Endpoint records cannot steer clients (issue 20 item 2), on a real broker and worker.

A record in ``<prefix>_tc_endpoints`` with a huge epoch used to redirect every client
(and the buffer role's coordinator checks) to any address. Forged records here are
written with a plain confluent-kafka producer.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer as KafkaProducer

from txnstream import Client, TxnStatus
from txnstream.config import Config
from txnstream.coordinator.endpoints import CANDIDATES_PER_TC, TcEndpoint
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.tc_client import TransactionCoordinatorClient
from txnstream.coordinator.transport import Endpoint, Listener
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.markers import MarkerSigner

from .conftest import FAST_FAILOVER_MS, make_topic, wait_until

pytestmark = pytest.mark.integration

SECRET = "workers-secret-endpoints-77"
FORGED_EPOCH = 10**15


@pytest.fixture
def secured(config: Config) -> Iterator[tuple[Config, CoordinatorWorker]]:
    cfg = config.with_(tc_secret=SECRET)
    w = CoordinatorWorker(cfg, settings=WorkerSettings(session_timeout_ms=FAST_FAILOVER_MS))
    w.start()
    try:
        wait_until(lambda: len(w.serving()) == cfg.num_coordinators, 60, "worker serving")
        yield cfg, w
    finally:
        w.stop()


@pytest.fixture
def impostors() -> Iterator[list[Listener]]:
    made: list[Listener] = []
    yield made
    for lst in made:
        lst.close()


def forge_endpoints(cfg: Config, at: Endpoint) -> None:
    raw = KafkaProducer(cfg.producer())
    for tc in range(cfg.num_coordinators):
        rec = TcEndpoint(tc, "impostor", at, FORGED_EPOCH)
        raw.produce(cfg.topics.endpoints, rec.encode(), key=str(tc).encode(), partition=tc)
    assert raw.flush(10) == 0


def commit_one_per_coordinator(cfg: Config, client: Client) -> dict[int, TxnStatus]:
    """One committed txn on each coordinator: each one's status after its commit."""
    topic = make_topic(cfg, 1)
    producer = client.create_producer(topic)
    done = {}
    for tc in range(cfg.num_coordinators):
        with client.new_transaction(tc_id=tc) as txn:
            producer.send(b"x", txn=txn, partition=0)
        done[tc] = txn.status
    return done


def dead_address() -> Endpoint:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return Endpoint("127.0.0.1", s.getsockname()[1])


@pytest.mark.parametrize("impostor_kind", ["unauthenticated", "refuses everyone",
                                           "dead address"])
def test_a_forged_endpoint_record_does_not_take_a_coordinator_from_its_clients(
        secured, impostors, impostor_kind):
    """Old: the client went to the forged address and every request failed there
    ("could not prove it knows the secret" / "refused this client" at once, or a
    RequestTimeoutError against a dead address)."""
    cfg, w = secured
    if impostor_kind == "dead address":
        at = dead_address()
    else:
        users = {"someone-else": "x" * 16} if impostor_kind == "refuses everyone" else None
        impostor = Listener("127.0.0.1", 0, lambda data, conn: None, users=users)
        impostors.append(impostor)
        at = impostor.address
    every_tc_committed = {tc: TxnStatus.COMMITTED for tc in range(cfg.num_coordinators)}
    with Client(config=cfg) as before:  # a client that knew the real owner first
        assert commit_one_per_coordinator(cfg, before) == every_tc_committed
        forge_endpoints(cfg, at)
        wait_until(lambda: all(e.epoch_offset == FORGED_EPOCH
                               for e in before.tc.directory.known().values()), 30,
                   "the forged records read")
        assert commit_one_per_coordinator(cfg, before) == every_tc_committed, \
            "a forged endpoint record took a coordinator from a client that knew its owner"
    with Client(config=cfg) as after:  # a client that reads the forged records first
        assert commit_one_per_coordinator(cfg, after) == every_tc_committed, \
            "a forged endpoint record took a coordinator from a new client"


def test_the_workers_own_clients_ignore_unsigned_endpoint_records(secured, impostors):
    """Old: the buffer role's coordinator client took the forged record like any other."""
    cfg, w = secured
    impostor = Listener("127.0.0.1", 0, lambda data, conn: None)
    impostors.append(impostor)
    forge_endpoints(cfg, impostor.address)
    probe = KafkaProducer(cfg.producer())
    cluster = probe.list_topics(timeout=10).cluster_id
    tc = TransactionCoordinatorClient(cfg, signer=MarkerSigner.from_secret(SECRET, cluster))
    try:
        # The forged records are the newest: taken, they would win every lookup.
        wait_until(lambda: all((ep := tc.directory.lookup(t, 0)) is not None
                               and ep.owner_id == w.worker_id
                               for t in range(cfg.num_coordinators)), 30,
                   f"the live worker's records only (known: {tc.directory.known()})")
        known = tc.directory.known()
        assert {t: (e.owner_id, e.endpoint, e.epoch_offset < FORGED_EPOCH)
                for t, e in known.items()} == {
            t: (w.worker_id, w.address, True) for t in range(cfg.num_coordinators)}, \
            f"an unsigned endpoint record was taken: {known}"
    finally:
        tc.close()


REPUBLISH_S = 2.0


@pytest.mark.slow
def test_a_flood_of_forged_endpoint_records_hides_a_coordinator_only_until_it_republishes(
        own_config):
    """Enough forged records with rising epochs, written after the genuine one, to fill a
    new client's candidates (as compaction keeping only a forged record would): the new
    client reaches every coordinator once its worker writes its record again.

    Old: the client kept the records with the highest epochs, all forged at a dead
    address, and the worker never wrote its record again: every commit timed out."""
    cfg = own_config.with_(tc_secret=SECRET, request_timeout_s=20.0)
    w = CoordinatorWorker(cfg, settings=WorkerSettings(
        session_timeout_ms=FAST_FAILOVER_MS, endpoint_republish_s=REPUBLISH_S,
        buffer_role=False))
    w.start()
    try:
        wait_until(lambda: len(w.serving()) == cfg.num_coordinators, 60, "worker serving")
        at = dead_address()
        raw = KafkaProducer(cfg.producer())
        for i in range(CANDIDATES_PER_TC + 2):
            for tc in range(cfg.num_coordinators):
                rec = TcEndpoint(tc, "impostor", at, FORGED_EPOCH + i)
                raw.produce(cfg.topics.endpoints, rec.encode(), key=str(tc).encode(),
                            partition=tc)
        assert raw.flush(10) == 0
        with Client(config=cfg) as after:
            done = {}
            for tc in range(cfg.num_coordinators):
                txn = after.new_transaction(tc_id=tc)
                txn.commit()
                done[tc] = txn.status
        assert done == {tc: TxnStatus.COMMITTED for tc in range(cfg.num_coordinators)}
    finally:
        w.stop()


@pytest.fixture
def two_workers(own_config: Config) -> Iterator[tuple[Config, list[CoordinatorWorker]]]:
    """Two genuine workers sharing the coordinators (each passes a client's proof)."""
    cfg = own_config.with_(tc_secret=SECRET, request_timeout_s=20.0)
    ws = [CoordinatorWorker(cfg, worker_id=f"w{i}-{cfg.topics.prefix}", settings=WorkerSettings(
        session_timeout_ms=FAST_FAILOVER_MS, buffer_role=False)) for i in range(2)]
    for w in ws:
        w.start()
    try:
        wait_until(lambda: all(w.serving() for w in ws)
                   and sum(len(w.serving()) for w in ws) == cfg.num_coordinators, 90,
                   "both workers serving")
        yield cfg, ws
    finally:
        for w in ws:
            w.stop()


def test_a_forged_record_naming_another_live_worker_does_not_hide_a_coordinator(two_workers):
    """Issue 34 item 4. Old: worker B passed the client's proof and answered
    NotCoordinator; the client then waited for an owner newer than the forged epoch,
    which never came: every request on that coordinator timed out."""
    cfg, (a, b) = two_workers
    tc = sorted(a.serving())[0]
    raw = KafkaProducer(cfg.producer())
    raw.produce(cfg.topics.endpoints, TcEndpoint(tc, "forged", b.address, FORGED_EPOCH).encode(),
                key=str(tc).encode(), partition=tc)
    assert raw.flush(10) == 0
    with Client(config=cfg) as client:
        wait_until(lambda: (e := client.tc.directory.known().get(tc)) is not None
                   and e.epoch_offset == FORGED_EPOCH, 30, "the forged record read")
        for _ in range(3):
            t0 = time.monotonic()
            txn = client.new_transaction(tc_id=tc)
            txn.commit()
            assert txn.status is TxnStatus.COMMITTED
            assert time.monotonic() - t0 < 10, f"a commit took {time.monotonic() - t0:.1f} s"


@pytest.fixture
def tarpit() -> Iterator[Endpoint]:
    """An address that accepts connections and never says a word."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield Endpoint("127.0.0.1", srv.getsockname()[1])
    finally:
        stop.set()
        t.join(2)
        for c in held:
            c.close()
        srv.close()


def test_forged_records_naming_a_tarpit_cost_one_attempt_not_one_per_request(
        secured, tarpit):
    """Issue 34 item 7. Old: seven forged records naming a tarpit made every transaction
    on that coordinator take ~35 s: each request walked them again (records it could not
    reach were remembered per request only)."""
    cfg, w = secured
    tc = 0
    raw = KafkaProducer(cfg.producer())
    for i in range(CANDIDATES_PER_TC - 1):
        raw.produce(cfg.topics.endpoints,
                    TcEndpoint(tc, "tarpit", tarpit, FORGED_EPOCH + i).encode(),
                    key=str(tc).encode(), partition=tc)
    assert raw.flush(10) == 0
    with Client(config=cfg.with_(request_timeout_s=60.0)) as client:
        wait_until(lambda: (e := client.tc.directory.known().get(tc)) is not None
                   and e.epoch_offset >= FORGED_EPOCH, 30, "the forged records read")
        took = []
        for _ in range(5):
            t0 = time.monotonic()
            txn = client.new_transaction(tc_id=tc)
            txn.commit()
            took.append(time.monotonic() - t0)
            assert txn.status is TxnStatus.COMMITTED
    print("commits with 7 tarpit records:", [round(t, 2) for t in took])
    assert all(t < 2.0 for t in took[1:]), f"commits took {[round(t, 1) for t in took]} s"


def test_a_record_naming_a_worker_of_another_cluster_does_not_take_its_answers(
        secured, own_config):
    """Two clusters (prefixes) on one Kafka share the workers' secret, as two worker
    fleets on one host share the default key file. A record of cluster A naming the
    address of B's worker (a stale record whose port B's worker took since, or a forged
    one) must not make A's clients open, commit or ask about txns in B's coordinators.

    Old: B's worker proved the shared secret and answered: A's client got TxnIDs from
    B's logs (CI saw ``(0,12)`` handed out by a worker whose TC 0 was at 376, then the
    real owner called it ABORTED), and its commits ended at B, where A's readers never
    look."""
    cfg, a = secured
    b = CoordinatorWorker(own_config.with_(tc_secret=SECRET), settings=WorkerSettings(
        session_timeout_ms=FAST_FAILOVER_MS, buffer_role=False))
    b.start()
    try:
        wait_until(lambda: len(b.serving()) == cfg.num_coordinators, 60, "B serving")
        opened_at_b = {tc: inc.store.next_sequence for tc, inc in b.tcs.items()}
        forge_endpoints(cfg, b.address)
        topic = make_topic(cfg, 1)
        with Client(config=cfg) as client:
            producer = client.create_producer(topic)
            ids = []
            for tc in [*range(cfg.num_coordinators), None, None]:  # None: a reserved id
                with client.new_transaction(tc_id=tc) as txn:
                    producer.send(str(txn.id).encode(), txn=txn, partition=0)
                ids.append(txn.id)
            assert {tc: inc.store.next_sequence for tc, inc in b.tcs.items()} == \
                opened_at_b, "another cluster's worker opened txns for this client"
            for tid in ids:
                assert client.admin.get_transaction(tid).status is TxnStatus.COMMITTED
            reader = client.subscribe(topic, subscription="check")
            got = set()
            deadline = time.monotonic() + 20
            while len(got) < len(ids) and time.monotonic() < deadline:
                m = reader.receive(timeout_s=0.5)
                if m is not None:
                    got.add(m.value)
            assert got == {str(t).encode() for t in ids}, "committed records not delivered"
    finally:
        b.stop()
