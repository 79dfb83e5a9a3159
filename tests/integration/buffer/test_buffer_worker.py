"""The buffer worker: snapshots published; a txn stuck below its TC's LWM gets an ABORT."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Producer as KafkaProducer

from tests.integration.buffer.conftest import make_topic, wait_until
from txnstream import TopicPartition
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.buffer.worker import BufferWorker
from txnstream.membership import txn_headers

pytestmark = pytest.mark.integration


def test_unregistered_txn_record_is_aborted_at_lwm_and_unblocks(config, tc_worker, client):
    topic = make_topic(config, 2)
    producer = client.create_producer(topic)
    txn = client.new_transaction()
    producer.send(b"registered", txn=txn, partition=0)
    raw = KafkaProducer(config.producer())
    # a record of the same txn in a partition it never registered (a buggy client: its
    # own writer, so the record is tagged as the txn's)
    raw.produce(topic, b"unregistered", partition=1,
                headers=txn_headers(txn.id, txn.key, topic, 1))
    raw.flush(10)
    txn.commit()
    producer.send(b"plain-after", partition=1)
    producer.flush()
    later = client.new_transaction()     # moves the TC's LWM past txn
    later.commit()
    tp1 = TopicPartition(topic, 1)
    # served, without the LWM duty yet: the txn blocks partition 1
    idle = BufferWorker(config, [topic], snapshot_interval_s=1, lwm_check_interval_s=3600)
    idle.start()
    try:
        wait_until(lambda: _served(client, tp1), 30, "partition 1 served")
        assert client.admin.buffer_stats(tp1).blocking_txn == txn.id
    finally:
        idle.stop()
    bw = BufferWorker(config, [topic], snapshot_interval_s=1, lwm_check_interval_s=1).start()
    try:
        wait_until(lambda: bw.markers_written >= 1, 30, "an ABORT marker from the buffer worker")
        wait_until(lambda: client.admin.buffer_stats(tp1).blocking_txn is None, 30,
                   "the ABORT marker folded and published")
        consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
        got = []
        while (m := consumer.receive(timeout_s=4)) is not None:
            got.append(m.value)
            consumer.acknowledge(m)
        consumer.close()
        assert sorted(got) == [b"plain-after", b"registered"]
        store = TransactionBufferSnapshotStore(config)
        wait_until(lambda: (s := store.latest(tp1)) is not None and s.position >= 2, 30,
                   "a published snapshot of partition 1")
    finally:
        bw.stop()


def test_a_stuck_txn_behind_more_open_txns_than_a_round_asks_is_still_ended(
        config, tc_worker, client, monkeypatch):
    """A round asks about at most ``MAX_TXNS_ASKED`` ongoing txns; the rest must be asked
    at a later round. Asked in the partition's order each round, txns that stay open
    past the bound kept a copied record behind them from ever being judged: it held
    the partition back for good."""
    from txnstream.buffer import ongoing

    monkeypatch.setattr(ongoing, "MAX_TXNS_ASKED", 5)
    topic = make_topic(config, 1)
    producer = client.create_producer(topic)
    live = []
    for _ in range(12):  # open past the test: more than two rounds' worth
        txn = client.new_transaction(timeout_s=300)
        producer.send(b"live", txn=txn, partition=0)
        live.append(txn)
    producer.flush()
    _copy_a_committed_txns_record(config, client, topic)
    bw = BufferWorker(config, [topic], snapshot_interval_s=1, lwm_check_interval_s=0.5)
    bw.start()
    try:
        wait_until(lambda: bw.markers_written >= 1, 60,
                   "the copied txn's ABORT marker, behind 12 open txns and rounds of 5")
        assert bw.markers_written == 1, "the check ended txns that are open"
    finally:
        bw.stop()
        for txn in live:
            txn.abort()


def test_coordinators_that_refuse_a_page_of_txns_are_asked_one_txn_at_a_time(
        config, tc_worker, client, monkeypatch):
    """A coordinator of an earlier version refuses a GET that names no ``txn_seq``: the
    owner then asks it a txn at a time, and still ends only what must end."""
    from txnstream.coordinator.handlers import TcRequestHandler
    from txnstream.errors import InvalidRequestError

    def earlier(self, tc, req, caller):
        raise InvalidRequestError("GET request refused: txn_seq must be a TxnID sequence")

    monkeypatch.setattr(TcRequestHandler, "_get_many", earlier)
    topic = make_topic(config, 1)
    producer = client.create_producer(topic)
    live = client.new_transaction(timeout_s=300)
    producer.send(b"live", txn=live, partition=0)
    producer.flush()
    _copy_a_committed_txns_record(config, client, topic)
    bw = BufferWorker(config, [topic], snapshot_interval_s=1, lwm_check_interval_s=0.5)
    bw.start()
    try:
        wait_until(lambda: bw.markers_written >= 1, 60, "the copied txn's ABORT marker")
        time.sleep(1.5)  # rounds more: the live txn stays
        assert bw.markers_written == 1, "the check ended the open txn"
    finally:
        bw.stop()
        live.abort()


def test_a_stuck_txn_on_a_partition_that_never_rests_is_still_ended(config, tc_worker, client):
    """The check judges a partition only once its fold has reached the end read after
    the answers (a marker the coordinator wrote before answering is then folded). On a
    partition written to without pause, the fold is a few records short of that end at
    every judging, and a copied record there was never ended: it held the partition
    back for good."""
    topic = make_topic(config, 1)
    with client.transaction() as warm:  # registers the topic: the partition is served
        client.create_producer(topic).send(b"warm", txn=warm, partition=0)
    _copy_a_committed_txns_record(config, client, topic)
    stop = threading.Event()

    def busy() -> None:  # plain records, one every ~millisecond, each its own batch
        p = KafkaProducer(config.producer(**{"linger.ms": 0}))
        while not stop.is_set():
            p.produce(topic, b"busy", partition=0)
            p.poll(0)
            time.sleep(0.001)
        p.flush(10)

    writer = threading.Thread(target=busy, daemon=True)
    writer.start()
    bw = BufferWorker(config, [topic], snapshot_interval_s=1, lwm_check_interval_s=0.5)
    bw.start()
    try:
        wait_until(lambda: bw.markers_written >= 1, 30,
                   "the copied txn's ABORT marker on a partition written to without pause")
    finally:
        stop.set()
        writer.join(30)
        bw.stop()


def _copy_a_committed_txns_record(config, client, topic: str) -> None:
    """Partition 0 of ``topic`` gets a record of a txn that committed elsewhere, without
    registering ``topic``: junk there, which the owner's check must end (ABORT)."""
    elsewhere = make_topic(config, 1)
    copied = client.new_transaction()
    client.create_producer(elsewhere).send(b"there", txn=copied, partition=0)
    copied.commit()
    raw = KafkaProducer(config.producer())
    raw.produce(topic, b"copied", partition=0,
                headers=txn_headers(copied.id, copied.key, topic, 0))
    raw.flush(10)


def _served(client, tp) -> bool:
    return client.admin.buffer_stats(tp).state != "waiting"


def test_a_txn_ended_by_a_later_markers_lwm_gets_its_own_abort_marker(config, worker, client):
    """A txn whose record reached a partition its coordinator never learnt of (a writer
    killed before its pipelined registration landed) is ended there by the LWM a later
    marker of the same TC carries: readers drop it. The raw partition must say so too:
    the buffer's owner writes that txn's ABORT marker, so no txn record is left without
    one (chaos: ``txn_without_marker``)."""
    from tests.integration.coordinator.conftest import read_all
    from txnstream.markers import RecordKind, TxnMarker, classify_headers

    topic = make_topic(config, 1)
    producer = client.create_producer(topic)
    with client.transaction() as warm:  # registers the topic: the partition is served
        producer.send(b"warm", txn=warm, partition=0)
    lost = client.new_transaction(timeout_s=60)
    raw = KafkaProducer(config.producer())
    raw.produce(topic, b"never-registered", partition=0,  # by its writer: tagged
                headers=txn_headers(lost.id, lost.key, topic, 0))
    raw.flush(10)
    lost.abort()  # it ends at its coordinator with no marker in this partition
    with client.new_transaction(tc_id=lost.id.tc_id) as later:  # its marker carries the LWM
        producer.send(b"later", txn=later, partition=0)

    def abort_markers() -> list[TxnMarker]:
        out = []
        for m in read_all(config, topic):
            kind, _ = classify_headers(m.headers())
            if kind is RecordKind.MARKER:
                marker = TxnMarker.decode(m.value())
                if marker.txn_id == lost.id:
                    out.append(marker)
        return out

    wait_until(lambda: abort_markers(), 30, f"an ABORT marker of {lost.id} in {topic}-0")
    assert all(mk.kind.value == "ABORT" for mk in abort_markers())
    consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    got = []
    while (m := consumer.receive(timeout_s=3)) is not None:
        got.append(m.value)
    consumer.close()
    assert sorted(got) == [b"later", b"warm"]
