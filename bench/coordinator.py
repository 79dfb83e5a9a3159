"""Issue 3 benchmark: begin + add-partition + commit, txnstream vs Kafka's own transactions.

Both sides do the same work per transaction: open it, write one 100-byte record (which
adds the partition to the transaction), commit. txnstream runs ``c`` client threads over
one client against one ``txnstream worker`` process; Kafka runs ``c`` transactional
producers (one per concurrent transaction, Kafka allows one open txn per producer), each
in its own thread. Same broker, same run.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Producer as KafkaProducer

from bench.common import make_topic, pct, workers
from txnstream import Client, Config

PAYLOAD = b"x" * 100


@dataclass
class Result:
    system: str
    concurrency: int
    txns: int
    seconds: float
    latencies_ms: list[float]

    @property
    def tps(self) -> float:
        return self.txns / self.seconds

    def row(self) -> dict:
        return {"system": self.system, "concurrency": self.concurrency, "txns": self.txns,
                "tps": round(self.tps, 1), "p50_ms": round(pct(self.latencies_ms, 50), 1),
                "p99_ms": round(pct(self.latencies_ms, 99), 1)}


def _drive(concurrency: int, per_thread: int, one_txn) -> tuple[float, list[float]]:
    lats: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(concurrency + 1)

    def loop(i: int) -> None:
        mine = []
        barrier.wait()
        for _ in range(per_thread):
            t0 = time.perf_counter()
            one_txn(i)
            mine.append((time.perf_counter() - t0) * 1000)
        with lock:
            lats.extend(mine)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, lats


def txnstream_run(cfg: Config, topic: str, concurrency: int, total: int) -> Result:
    client = Client(config=cfg)
    producer = client.create_producer(topic)
    try:
        def one(i: int) -> None:
            txn = client.new_transaction(timeout_s=60)
            producer.send(PAYLOAD, key=str(i).encode(), txn=txn)
            txn.commit()

        one(0)  # warm up: client, reply consumer, metadata
        per = max(1, total // concurrency)
        secs, lats = _drive(concurrency, per, one)
        return Result("txnstream", concurrency, per * concurrency, secs, lats)
    finally:
        client.close()


def kafka_run(cfg: Config, topic: str, concurrency: int, total: int) -> Result:
    run_id = uuid.uuid4().hex[:6]
    producers = []
    for i in range(concurrency):
        p = KafkaProducer(cfg.common() | {"transactional.id": f"bench-{run_id}-{i}",
                                          "linger.ms": 5})
        p.init_transactions(30)
        producers.append(p)

    def one(i: int) -> None:
        p = producers[i]
        p.begin_transaction()
        p.produce(topic, PAYLOAD, str(i).encode())
        p.commit_transaction(30)

    one(0)
    per = max(1, total // concurrency)
    secs, lats = _drive(concurrency, per, one)
    for p in producers:
        p.flush(5)
    return Result("kafka-txn", concurrency, per * concurrency, secs, lats)


def run(cfg: Config, concurrencies=(1, 16, 64), total: int = 1000,
        progress=None) -> list[dict]:
    """Both systems at each concurrency; rows for the report."""
    topic = make_topic(cfg, 8)
    rows = []
    with workers(cfg, 1):
        for c in concurrencies:
            n = total if c > 1 else max(200, total // 4)
            for fn in (txnstream_run, kafka_run):
                r = fn(cfg, topic, c, n)
                rows.append(r.row())
                if progress:
                    progress(r.row())
    return rows
