"""Committed-only consumption on a real broker: exactly the committed and plain records."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import Producer as KafkaProducer

from tests.integration.buffer.conftest import make_topic
from txnstream import Client, TopicPartition, TxnID
from txnstream.errors import ConfigError, InvalidTxnStatusError, KafkaClientError, TxnStreamError
from txnstream.markers import MarkerKind, TxnMarker

pytestmark = pytest.mark.integration


def drain(consumer, want: int | None = None, idle_s: float = 4.0, limit_s: float = 120):
    """Receive until ``want`` records or ``idle_s`` of silence; returns (tp, offset, value)."""
    got = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and (want is None or len(got) < want):
        m = consumer.receive(timeout_s=idle_s)
        if m is None:
            break
        got.append((m.partition, m.offset, m.value))
        consumer.acknowledge(m)
    return got


def produce_mix(client: Client, topic: str, partitions: int, txns: int, seed: int):
    """Several producers: random commit/abort/timeout txns with plain records between.

    Returns the values that must be delivered (committed + plain) and those that must not.
    """
    rng = random.Random(seed)
    must, never = set(), set()
    lock = threading.Lock()

    def one_producer(pid: int) -> None:
        producer = client.create_producer(topic)
        for t in range(txns):
            fate = rng.choice(["commit", "commit", "abort", "timeout"])
            txn = client.new_transaction(timeout_s=3 if fate == "timeout" else 60)
            vals = [f"p{pid}-t{t}-r{i}".encode() for i in range(rng.randint(1, 8))]
            for v in vals:
                producer.send(v, txn=txn, partition=rng.randrange(partitions))
            plain = f"p{pid}-t{t}-plain".encode()
            producer.send(plain, partition=rng.randrange(partitions))
            with lock:
                must.add(plain)
            if fate == "commit":
                txn.commit()
                with lock:
                    must.update(vals)
            else:
                if fate == "abort":
                    txn.abort()
                producer.flush()
                with lock:
                    never.update(vals)
        producer.flush()

    threads = [threading.Thread(target=one_producer, args=(i,)) for i in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return must, never


def test_consumer_gets_exactly_committed_and_plain_in_offset_order(config, worker, client):
    topic = make_topic(config, 3)
    must, never = produce_mix(client, topic, 3, txns=25, seed=1)
    consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    try:
        # timed-out txns end ~3 s after their last write: allow for that
        got = drain(consumer, want=len(must), idle_s=10)
    finally:
        consumer.close()
    values = [v for _, _, v in got]
    assert len(values) == len(set(values)), "a record was delivered twice"
    assert set(values) == must, (f"missing {len(must - set(values))}, "
                                 f"unexpected {len(set(values) - must)}")
    assert not (set(values) & never)
    by_part = defaultdict(list)
    for p, off, _ in got:
        by_part[p].append(off)
    for p, offs in by_part.items():
        assert offs == sorted(offs), f"partition {p} out of offset order"


def test_restarted_consumer_resumes_without_loss_or_repeat(config, worker, client):
    topic = make_topic(config, 2)
    producer = client.create_producer(topic)
    expected = []
    for t in range(40):
        txn = client.new_transaction()
        vals = [f"t{t}-{i}".encode() for i in range(5)]
        for v in vals:
            producer.send(v, txn=txn)
        txn.commit()
        expected += vals
    sub = f"s-{uuid.uuid4().hex[:6]}"
    c1 = client.subscribe(topic, subscription=sub)
    first = drain(c1, want=90)
    c1.close()
    c2 = client.subscribe(topic, subscription=sub)
    second = drain(c2, want=len(expected) - len(first), idle_s=6)
    c2.close()
    values = [v for _, _, v in first + second]
    assert len(first) == 90
    assert sorted(values) == sorted(expected)
    assert len(values) == len(set(values))


def test_open_transaction_blocks_its_partition_until_it_ends(config, worker, client):
    topic = make_topic(config, 1)
    producer = client.create_producer(topic)
    producer.send(b"before", partition=0)
    txn = client.new_transaction(timeout_s=60)
    producer.send(b"in-txn", txn=txn, partition=0)
    producer.send(b"after", partition=0)
    producer.flush()
    consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    try:
        assert [v for _, _, v in drain(consumer, idle_s=3)] == [b"before"]
        stats = client.admin.buffer_stats(TopicPartition(topic, 0))
        assert stats.blocking_txn == txn.id
        assert stats.blocked_for_s >= 0
        txn.commit()
        assert [v for _, _, v in drain(consumer, want=2, idle_s=5)] == [b"in-txn", b"after"]
    finally:
        consumer.close()


def test_bad_records_are_skipped_and_change_nothing_delivered(config, worker, client, caplog):
    topic = make_topic(config, 1)
    raw = KafkaProducer(config.producer())
    raw.produce(topic, b"plain-1", partition=0)
    raw.produce(topic, b"bad-header", partition=0, headers=[("txn.id", b"short")])
    unknown = TxnMarker(TxnID(0, 987_654), MarkerKind.COMMIT, 0)
    raw.produce(topic, unknown.encode(), partition=0, headers=unknown.headers())
    raw.produce(topic, b"not a marker value", partition=0,
                headers=[("txn.marker", b"COMMIT"), ("txn.id", TxnID(0, 5).to_bytes())])
    raw.produce(topic, b"plain-2", partition=0)
    raw.produce(config.topics.buffer_snapshots, b"\x01garbage", key=f"{topic}-0".encode())
    raw.flush(10)
    consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    try:
        got = [v for _, _, v in drain(consumer, idle_s=4)]
    finally:
        consumer.close()
    assert got == [b"plain-1", b"plain-2"]
    assert f"{topic}" in caplog.text and "offset 1" in caplog.text.replace("@", "offset ")


def test_send_with_ended_transaction_writes_nothing(config, worker, client):
    topic = make_topic(config, 1)
    producer = client.create_producer(topic)
    txn = client.new_transaction()
    txn.commit()
    with pytest.raises(InvalidTxnStatusError) as exc:
        producer.send(b"late", txn=txn, partition=0)
    assert str(txn.id) in str(exc.value)
    producer.flush()
    from tests.integration.buffer.conftest import read_all

    assert read_all(config, topic) == []


def test_send_batch_commits_and_aborts_as_one_and_puts_keys_where_send_does(
        config, worker, client):
    from txnstream.kafka.partitioning import murmur2_partition

    topic = make_topic(config, 3)
    producer = client.create_producer(topic)
    keys = [f"k{i}".encode() for i in range(300)]
    parts = [murmur2_partition(k, 3) for k in keys]
    kept = client.new_transaction()
    producer.send_batch([b"c" + k for k in keys], parts, kept, keys=keys)
    dropped = client.new_transaction()
    producer.send_batch([b"a" + k for k in keys], parts, dropped, keys=keys)
    dropped.abort()
    kept.commit()
    c = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    got = drain(c, want=300)
    c.close()
    assert sorted(v for _, _, v in got) == sorted(b"c" + k for k in keys)
    where = {v[1:]: p for p, _, v in got}
    assert all(where[k] == parts[i] for i, k in enumerate(keys))
    for p in range(3):  # order kept within each partition
        offs = [o for q, o, _ in got if q == p]
        vals = [v for q, _, v in got if q == p]
        assert vals == [b"c" + k for k, q in zip(keys, parts, strict=True) if q == p]
        assert offs == sorted(offs)


def test_send_batch_that_fails_midway_names_the_partition_and_the_txn_still_aborts(
        config, worker, client):
    topic = make_topic(config, 2)
    producer = client.create_producer(topic)
    txn = client.new_transaction()
    with pytest.raises(ConfigError, match="partition 7 does not exist"):
        producer.send_batch([b"x", b"y"], [0, 7], txn)
    big = b"z" * (2 * 1024 * 1024)  # over librdkafka's message.max.bytes: refused at produce
    with pytest.raises(KafkaClientError, match=f"{topic}-0 refused.*MSG_SIZE_TOO_LARGE"):
        producer.send_batch([b"ok"] * 10 + [big] + [b"never"] * 10, [0] * 21, txn)
    t0 = time.monotonic()
    producer.flush_transaction(txn, timeout_s=10)  # waits for what was sent, not the rest
    assert time.monotonic() - t0 < 10
    txn.abort()
    from tests.integration.buffer.conftest import read_all

    assert [m for m in read_all(config, topic) if m.value() == b"never"] == []


def test_a_send_the_broker_refuses_makes_flush_raise_naming_the_partition(
        config, worker, client):
    topic = make_topic(config, 1)
    # the client lets 2 MB through; the broker (1 MB per record by default) refuses it
    producer = client.create_producer(topic, **{"message.max.bytes": 5_000_000})
    txn = client.new_transaction()
    producer.send_batch([b"ok", b"z" * 2_000_000, b"ok"], [0, 0, 0], txn)
    with pytest.raises(TxnStreamError, match=f"send to {topic}-0 failed"):
        txn.flush()
    with pytest.raises(TxnStreamError, match="aborted instead of committed"):
        txn.commit()
