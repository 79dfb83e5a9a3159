"""Issue 4 benchmarks: transactional produce, committed-only consume, produce-to-visible.

(1) produce: 1 KB records, 1,000 per transaction; txnstream vs plain confluent-kafka
    produce vs Kafka's own transactional producer.
(2) consume: committed-only consumer vs a confluent-kafka ``read_committed`` consumer,
    each reading the same volume written with its own system's transactions.
(3) produce-to-visible latency of transactions of 10 records: from the first send to the
    moment a committed-only consumer has received all 10.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer

from bench.common import make_topic, pct, workers
from txnstream import Client, Config

VALUE = b"v" * 1024


def _produce(p: KafkaProducer, topic: str, key: bytes) -> None:
    """Produce one record, waiting for queue space when the local queue is full."""
    while True:
        try:
            p.produce(topic, VALUE, key)
            return
        except BufferError:
            p.poll(0.01)


def _produce_txnstream(cfg: Config, topic: str, records: int, per_txn: int) -> float:
    with Client(config=cfg) as client:
        producer = client.create_producer(topic)
        t0 = time.perf_counter()
        for start in range(0, records, per_txn):
            with client.transaction() as txn:
                for i in range(start, min(records, start + per_txn)):
                    producer.send(VALUE, key=str(i).encode(), txn=txn)
        secs = time.perf_counter() - t0
        producer.flush()
    return records / secs


def _produce_plain(cfg: Config, topic: str, records: int) -> float:
    p = KafkaProducer(cfg.producer())
    t0 = time.perf_counter()
    for i in range(records):
        _produce(p, topic, str(i).encode())
        p.poll(0)
    p.flush(60)
    return records / (time.perf_counter() - t0)


def _produce_kafka_txn(cfg: Config, topic: str, records: int, per_txn: int) -> float:
    p = KafkaProducer(cfg.common() | {"transactional.id": f"bench-{uuid.uuid4().hex[:6]}",
                                      "linger.ms": 5})
    p.init_transactions(30)
    t0 = time.perf_counter()
    for start in range(0, records, per_txn):
        p.begin_transaction()
        for i in range(start, min(records, start + per_txn)):
            _produce(p, topic, str(i).encode())
            p.poll(0)
        p.commit_transaction(60)
    return records / (time.perf_counter() - t0)


def _consume_txnstream(cfg: Config, topic: str, records: int) -> float:
    with Client(config=cfg) as client:
        c = client.subscribe(topic, subscription=f"bench-{uuid.uuid4().hex[:6]}")
        n = 0
        t0 = time.perf_counter()
        while n < records:
            m = c.receive(timeout_s=10)
            if m is None:
                break
            n += 1
        secs = time.perf_counter() - t0
        c.close()
    return n / secs


def _consume_read_committed(cfg: Config, topic: str, records: int) -> float:
    c = KafkaConsumer(cfg.consumer(f"bench-{uuid.uuid4().hex[:6]}",
                                   **{"isolation.level": "read_committed"}))
    c.subscribe([topic])
    n = 0
    t0 = None
    deadline = time.monotonic() + 120
    while n < records and time.monotonic() < deadline:
        for m in c.consume(1000, 1.0):
            if m.error():
                continue
            if t0 is None:
                t0 = time.perf_counter()
            n += 1
    secs = time.perf_counter() - (t0 or time.perf_counter())
    c.close()
    return n / secs if secs else 0.0


def _visible_latency(cfg: Config, topic: str, txns: int) -> list[float]:
    lats = []
    with Client(config=cfg) as client:
        producer = client.create_producer(topic)
        consumer = client.subscribe(topic, subscription=f"bench-{uuid.uuid4().hex[:6]}",
                                    initial_position="latest")
        consumer.receive(timeout_s=3)  # join the group before measuring
        for _ in range(txns):
            t0 = time.perf_counter()
            with client.transaction() as txn:
                for i in range(10):
                    producer.send(VALUE[:100], key=str(i).encode(), txn=txn, partition=0)
            got = 0
            while got < 10:
                if consumer.receive(timeout_s=10) is None:
                    break
                got += 1
            lats.append((time.perf_counter() - t0) * 1000)
        consumer.close()
    return lats


def run(cfg: Config, records: int = 50_000, progress=None) -> list[dict]:
    """All three measurements; rows for the report."""
    rows = []
    with workers(cfg, 1):
        t_tx, t_plain, t_ktx = (make_topic(cfg, 4) for _ in range(3))
        r_tx = _produce_txnstream(cfg, t_tx, records, 1000)
        r_plain = _produce_plain(cfg, t_plain, records)
        r_ktx = _produce_kafka_txn(cfg, t_ktx, records, 1000)
        rows.append({"bench": "produce 1KB, 1000/txn", "txnstream rec/s": round(r_tx),
                     "anchor": "plain produce", "anchor rec/s": round(r_plain),
                     "ratio": round(r_tx / r_plain, 2), "goal": ">= 0.9"})
        rows.append({"bench": "produce 1KB, 1000/txn", "txnstream rec/s": round(r_tx),
                     "anchor": "Kafka txn producer", "anchor rec/s": round(r_ktx),
                     "ratio": round(r_tx / r_ktx, 2), "goal": "-"})
        if progress:
            progress(rows[-2]), progress(rows[-1])
        c_tx = _consume_txnstream(cfg, t_tx, records)
        c_rc = _consume_read_committed(cfg, t_ktx, records)
        rows.append({"bench": "committed-only consume", "txnstream rec/s": round(c_tx),
                     "anchor": "read_committed consumer", "anchor rec/s": round(c_rc),
                     "ratio": round(c_tx / c_rc, 2) if c_rc else None, "goal": ">= 0.8"})
        if progress:
            progress(rows[-1])
        lats = _visible_latency(cfg, make_topic(cfg, 1), 100)
        rows.append({"bench": "produce-to-visible, 10-record txns",
                     "txnstream rec/s": f"p50 {pct(lats, 50):.1f} ms / p99 {pct(lats, 99):.1f} ms",
                     "anchor": "-", "anchor rec/s": "-", "ratio": None, "goal": "report"})
        if progress:
            progress(rows[-1])
    return rows
