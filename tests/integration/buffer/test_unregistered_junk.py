"""Forged txn records on a topic no txn ever registered (issue 33 item 3), on a real broker.

A plain confluent-kafka producer writes records with a junk ``txn.id`` header (and a
forged marker) between plain records, into a topic no coordinator ever registered. A
coordinator registers a partition's topic before it answers ``ADD_PARTITIONS`` and a
writer sends a txn record only after that, so such a record was admitted by no
coordinator: the committed-only consumer skips it and delivers every plain record, in
order, at once. It must not register the topic itself: applications may not write the
snapshot topic (docs/security.md), and a reader's registration is what made the junk
block its readers (old: 91 s with workers whose ``--buffer-topics`` do not cover the
topic, 60 s with the registration refused, both still waiting).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka import TopicPartition as KafkaTP

from tests.integration.buffer.conftest import make_topic, wait_until
from tests.integration.coordinator.conftest import FAST_FAILOVER_MS, set_topic_config
from txnstream import Client, TopicPartition, TxnID
from txnstream.buffer import follower as follower_module
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.config import Config
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.errors import ConfigError
from txnstream.markers import TXN_ID_HEADER, MarkerKind, TxnMarker

pytestmark = pytest.mark.integration

QUICK_S = 8.0
"""Every plain record is delivered within this (a group join, a registration check or
two): never held back by the junk."""
JUNK_IDS = [TxnID(0, 10**12), TxnID(1, 3), TxnID(4_000, 7)]
"""Unissued, low (a sequence a coordinator may have issued elsewhere), and naming a
coordinator the cluster does not have."""


def write_mixed(cfg: Config, topic: str, tag: str, plain: int = 6) -> tuple[list[bytes], int]:
    """Plain records with junk txn records (and a forged ABORT marker) between them.

    Returns the plain values in offset order and how many junk records were written.
    """
    raw = KafkaProducer(cfg.producer())
    want: list[bytes] = []
    junk = 0
    for i in range(plain):
        if i % 2 == 0:
            raw.produce(topic, f"{tag}-junk-{i}".encode(), partition=0,
                        headers=[(TXN_ID_HEADER, JUNK_IDS[i % len(JUNK_IDS)].to_bytes())])
            junk += 1
        v = f"{tag}-plain-{i}".encode()
        raw.produce(topic, v, partition=0, headers=[("user", b"kept")])
        want.append(v)
    forged = TxnMarker(JUNK_IDS[0], MarkerKind.ABORT, 0)
    raw.produce(topic, forged.encode(), partition=0, headers=forged.headers())
    junk += 1
    v = f"{tag}-plain-last".encode()
    raw.produce(topic, v, partition=0)
    want.append(v)
    assert raw.flush(10) == 0
    return want, junk


def receive_in_order(consumer, want: list[bytes], limit_s: float) -> list[bytes]:
    """Receive (and ack) until as many records as ``want`` came or ``limit_s`` passed."""
    got: list[bytes] = []
    deadline = time.monotonic() + limit_s
    while len(got) < len(want) and time.monotonic() < deadline:
        m = consumer.receive(timeout_s=0.5)
        if m is not None:
            got.append(m.value)
            consumer.acknowledge(m)
    return got


def snapshot_topic_end(cfg: Config) -> int:
    """How many records the snapshot topic holds (its partitions' ends, summed)."""
    c = KafkaConsumer(cfg.consumer(f"count-{uuid.uuid4().hex[:8]}"))
    try:
        topic = cfg.topics.buffer_snapshots
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(c.get_watermark_offsets(KafkaTP(topic, p), timeout=10)[1] for p in parts)
    finally:
        c.close()


def assert_all_plain_quickly(cfg: Config, client: Client, topic: str) -> None:
    """Two waves of plain records and junk: the first there before the consumer starts,
    the second written while it tails the partition (a later registration check)."""
    tp = TopicPartition(topic, 0)
    first, junk1 = write_mixed(cfg, topic, "a")
    consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    try:
        t0 = time.monotonic()
        got = receive_in_order(consumer, first, QUICK_S)
        assert got == first, (
            f"plain records held back by junk txn records for {time.monotonic() - t0:.0f} s: "
            f"got {got}; buffer status {consumer.buffer_status()}")
        second, junk2 = write_mixed(cfg, topic, "b")
        t0 = time.monotonic()
        got = receive_in_order(consumer, second, QUICK_S)
        assert got == second, (
            f"plain records held back by junk txn records for {time.monotonic() - t0:.0f} s: "
            f"got {got}; buffer status {consumer.buffer_status()}")
        assert consumer.receive(timeout_s=1.0) is None, "a junk record was delivered"
        assert consumer.buffer_status()[tp][0] == "plain"
        assert consumer.unregistered_skipped() == {tp: junk1 + junk2}
    finally:
        consumer.close()


@pytest.fixture
def other_topics_worker(config: Config) -> Iterator[tuple[CoordinatorWorker, str]]:
    """A worker whose ``--buffer-topics`` name one other topic only."""
    other = make_topic(config, 1, prefix="other")
    w = CoordinatorWorker(config, settings=WorkerSettings(
        session_timeout_ms=FAST_FAILOVER_MS, buffer_topics=(other,)))
    w.start()
    try:
        wait_until(lambda: len(w.serving()) == config.num_coordinators, 60, "worker serving")
        assert w.buffers is not None
        buffers = w.buffers
        wait_until(lambda: len(buffers.owned_slots()) == config.num_buffer_slots, 60,
                   "buffer slots owned")
        yield w, other
    finally:
        w.stop()


def test_junk_txn_records_on_an_unregistered_topic_are_skipped_under_buffer_topics_of_another(
        config, other_topics_worker, client):
    """Old: the reader registered the topic at the first junk record and waited for served
    state that no worker (``--buffer-topics`` of another topic) would ever publish."""
    topic = make_topic(config, 1)
    tp = TopicPartition(topic, 0)
    before = snapshot_topic_end(config)
    assert_all_plain_quickly(config, client, topic)
    assert not TransactionBufferSnapshotStore(config).find(tp).registered, \
        "the reader registered the topic"
    assert snapshot_topic_end(config) == before, "the reader wrote to the snapshot topic"


def test_junk_txn_records_are_skipped_where_the_reader_may_not_write_registrations(
        own_config):
    """The ACLs of docs/security.md: applications may not write the snapshot topic. Here
    the broker refuses every write to it (``max.message.bytes`` 1). Old: the reader's
    registration was refused and never retried, and it waited for good."""
    cfg = own_config
    set_topic_config(cfg, cfg.topics.buffer_snapshots, {"max.message.bytes": "1"})
    probe = TransactionBufferSnapshotStore(cfg)

    def refused() -> bool:
        try:
            return not probe.register([TopicPartition("probe-topic", 0)], 10)
        except ConfigError:  # the new topic not in the metadata yet
            return False

    try:  # refused indeed, as an ACL refuses it (once the broker applied the setting)
        wait_until(refused, 30, "writes to the snapshot topic refused")
    finally:
        probe.close()
    topic = make_topic(cfg, 1)
    before = snapshot_topic_end(cfg)
    with Client(config=cfg) as client:
        assert_all_plain_quickly(cfg, client, topic)
    assert snapshot_topic_end(cfg) == before


def test_a_registered_topic_no_buffer_owner_serves_waits_and_says_so(
        config, other_topics_worker, client, monkeypatch, caplog):
    """A genuine txn's records are never delivered unfiltered: on a registered topic that
    no worker's ``--buffer-topics`` cover the reader waits, and a WARNING names the topic
    and says no buffer owner serves it."""
    monkeypatch.setattr(follower_module, "WAIT_WARN_AFTER_S", 1.0)
    topic = make_topic(config, 1)
    producer = client.create_producer(topic)
    producer.send(b"plain-before", partition=0)
    producer.flush()
    consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    try:
        assert receive_in_order(consumer, [b"plain-before"], QUICK_S) == [b"plain-before"]
        with client.transaction() as txn:  # registers the topic: transactional now
            producer.send(b"committed", txn=txn, partition=0)
        producer.send(b"plain-after", partition=0)
        producer.flush()
        with caplog.at_level(logging.WARNING, logger=follower_module.__name__):
            got = receive_in_order(consumer, [b"committed", b"plain-after"], 5.0)
        assert got == [], f"delivered without served state: {got}"
        assert consumer.buffer_status()[TopicPartition(topic, 0)][0] == "waiting"
    finally:
        consumer.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and "no buffer owner serves" in r.getMessage()]
    assert any(f"topic {topic!r}" in w and "--buffer-topics" in w for w in warned), warned
    assert consumer.unregistered_skipped() == {}, "a genuine txn record taken for junk"
