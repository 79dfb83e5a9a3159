"""Data topics cannot lie (issue 20 item 1, DESIGN.md section 10), on a real broker.

Forged records are written with a plain confluent-kafka producer, as any producer with
write access to a data topic could (or MirrorMaker copying another cluster's headers).
The worker holds the workers' secret, so its markers are signed and its buffer owner
checks every marker it folds and asks the coordinator about every txn that stays
ongoing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer as KafkaProducer

from tests.integration.buffer.conftest import make_topic, wait_until
from tests.integration.coordinator.conftest import FAST_FAILOVER_MS
from txnstream import Client, TopicPartition, TxnID
from txnstream.config import Config
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.markers import MarkerKind, TxnMarker

pytestmark = pytest.mark.integration

SECRET = "the-workers-secret-4be1"
FORGED_TXN_BOUND_S = 30.0
"""A txn.id no coordinator issued or registered here unblocks its partition within this
(the buffer owner's check interval, 5 s, plus the age it waits for, plus a fold)."""


@pytest.fixture
def signed(own_config: Config) -> Iterator[tuple[Config, Client]]:
    """A worker and a client sharing the workers' secret (principal ``txnstream``), on
    internal topics of their own."""
    cfg = own_config.with_(tc_secret=SECRET)
    w = CoordinatorWorker(cfg, settings=WorkerSettings(session_timeout_ms=FAST_FAILOVER_MS))
    w.start()
    client = None
    try:
        wait_until(lambda: len(w.serving()) == cfg.num_coordinators, 60, "worker serving")
        assert w.buffers is not None
        buffers = w.buffers
        wait_until(lambda: len(buffers.owned_slots()) == cfg.num_buffer_slots, 60,
                   "buffer slots served")
        client = Client(config=cfg)
        yield cfg, client
    finally:
        if client is not None:
            client.close()
        w.stop()


def receive_all(consumer, want: set[bytes], limit_s: float) -> list[bytes]:
    """Receive (and ack) until every value of ``want`` came or ``limit_s`` passed."""
    got: list[bytes] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not want <= set(got):
        m = consumer.receive(timeout_s=1.0)
        if m is not None:
            got.append(m.value)
            consumer.acknowledge(m)
    return got


def registered_topic(cfg: Config, client: Client) -> str:
    """A one-partition topic the buffer role serves (a committed txn registered it)."""
    topic = make_topic(cfg, 1)
    producer = client.create_producer(topic)
    with client.new_transaction() as txn:
        producer.send(b"first", txn=txn, partition=0)
    return topic


def test_a_forged_abort_marker_with_a_huge_lwm_hides_no_later_txn(signed):
    """Old: the forged ABORT's LWM ended every later txn of that coordinator on the
    partition: they committed at the coordinator and no reader ever saw them."""
    cfg, client = signed
    topic = registered_topic(cfg, client)
    producer = client.create_producer(topic)
    raw = KafkaProducer(cfg.producer())
    for tc in range(cfg.num_coordinators):
        forged = TxnMarker(TxnID(tc, 0), MarkerKind.ABORT, 1 << 40)
        raw.produce(topic, forged.encode(), partition=0, headers=forged.headers())
    raw.flush(10)
    want = set()
    for i in range(cfg.num_coordinators * 2):  # round-robin: every coordinator's txns
        with client.new_transaction() as txn:
            v = f"after-forgery-{i}".encode()
            producer.send(v, txn=txn, partition=0)
            want.add(v)
    consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    try:
        got = receive_all(consumer, want | {b"first"}, 30)
    finally:
        consumer.close()
    assert want | {b"first"} <= set(got), f"committed records hidden: {want - set(got)}"


def test_a_forged_commit_marker_does_not_release_an_open_txn(signed):
    """Old: a forged COMMIT made an open txn's records visible; it then aborted."""
    cfg, client = signed
    topic = registered_topic(cfg, client)
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout_s=60)
    producer.send(b"never", txn=txn, partition=0)
    producer.flush()
    raw = KafkaProducer(cfg.producer())
    forged = TxnMarker(txn.id, MarkerKind.COMMIT, 0)
    raw.produce(topic, forged.encode(), partition=0, headers=forged.headers())
    raw.produce(topic, b"plain-after", partition=0)
    raw.flush(10)
    consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    try:
        early = receive_all(consumer, {b"first", b"never"}, 8)
        assert b"never" not in early, "an open txn's record was released by a forged COMMIT"
        txn.abort()
        late = receive_all(consumer, {b"plain-after"}, 30)
    finally:
        consumer.close()
    assert b"never" not in late and b"plain-after" in late


def test_a_txn_id_no_coordinator_issued_does_not_block_the_partition(signed):
    """Old: one record with a txn.id no coordinator issued blocked the partition for
    every committed-only reader, for good; `txn abort` answered "not found"."""
    cfg, client = signed
    topic = registered_topic(cfg, client)
    raw = KafkaProducer(cfg.producer())
    raw.produce(topic, b"forged-txn-record", partition=0,
                headers=[("txn.id", TxnID(0, 10**12).to_bytes())])
    raw.produce(topic, b"plain-after", partition=0)
    raw.flush(10)
    producer = client.create_producer(topic)
    with client.new_transaction() as txn:
        producer.send(b"committed-after", txn=txn, partition=0)
    consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    t0 = time.monotonic()
    try:
        got = receive_all(consumer, {b"first", b"plain-after", b"committed-after"},
                          FORGED_TXN_BOUND_S)
    finally:
        consumer.close()
    assert {b"plain-after", b"committed-after"} <= set(got), (
        f"partition blocked by a forged txn.id for {time.monotonic() - t0:.0f} s: got {got}")
    assert b"forged-txn-record" not in got
    st = client.admin.buffer_stats(TopicPartition(topic, 0))
    assert st.blocking_txn is None


def test_a_txn_id_of_a_txn_registered_elsewhere_does_not_block_the_partition(signed):
    """A real TxnID copied onto a partition its txn never registered (MirrorMaker, or a
    forger who read the header elsewhere): hidden once the txn ends, never blocking."""
    cfg, client = signed
    topic = registered_topic(cfg, client)
    other = make_topic(cfg, 1)
    producer = client.create_producer(other)
    with client.new_transaction() as txn:
        producer.send(b"elsewhere", txn=txn, partition=0)
        raw = KafkaProducer(cfg.producer())
        raw.produce(topic, b"copied", partition=0, headers=[("txn.id", txn.id.to_bytes())])
        raw.produce(topic, b"plain-after", partition=0)
        raw.flush(10)
    consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    try:
        got = receive_all(consumer, {b"first", b"plain-after"}, FORGED_TXN_BOUND_S)
    finally:
        consumer.close()
    assert b"plain-after" in got, f"partition blocked by a copied txn.id: {got}"
    assert b"copied" not in got


@pytest.mark.parametrize("forged", [TxnID(0, 10**12), TxnID(4_000, 7)],
                         ids=["unissued", "no-such-coordinator"])
def test_a_forged_txn_id_on_a_topic_no_txn_registered_does_not_block_it(signed, forged):
    """A topic no txn ever wrote to, where a raw producer writes one record with a forged
    txn.id (of an unissued txn, or naming a coordinator that does not exist) between plain
    records: committed-only readers get every plain record, never the forged one."""
    cfg, client = signed
    topic = make_topic(cfg, 1)
    raw = KafkaProducer(cfg.producer())
    raw.produce(topic, b"plain-before", partition=0)
    raw.produce(topic, b"forged-txn-record", partition=0,
                headers=[("txn.id", forged.to_bytes())])
    raw.produce(topic, b"plain-after", partition=0)
    raw.flush(10)
    consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    t0 = time.monotonic()
    try:
        got = receive_all(consumer, {b"plain-before", b"plain-after"}, FORGED_TXN_BOUND_S)
    finally:
        consumer.close()
    assert {b"plain-before", b"plain-after"} <= set(got), (
        f"partition blocked by a forged txn.id for {time.monotonic() - t0:.0f} s: got {got}")
    assert b"forged-txn-record" not in got
