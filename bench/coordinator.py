"""Issue 3 and 13 benchmark: begin + add-partition + commit, txnstream vs Kafka's own
transactions.

Both sides do the same work per transaction: open it, write one 100-byte record (which
adds the partition to the transaction), commit. txnstream runs ``c`` client threads over
one client against one ``txnstream worker`` process; Kafka runs ``c`` transactional
producers (one per concurrent transaction, Kafka allows one open txn per producer), each
in its own thread. Same broker, same run. Each transaction's latency is timed from just
before it opens to its commit's return; the rate is the transactions over the whole window.
Before the first measurement both sides run :data:`WARMUP_TXNS` untimed transactions on
the fresh broker: its transaction coordinator's code is cold until then (Kafka's first
200 txns on a fresh broker had a p50 of 29 ms, the next 200 7 ms), and txnstream's side
would otherwise be timed on a broker the other side warmed.

:func:`goals` turns the rows into issue 13's goal ratios: p50 at 1 concurrent against
Kafka's p50, p99 at 1 concurrent against twice Kafka's p99, and the rate at 16 and 64
concurrent against Kafka's (1.5x).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Producer as KafkaProducer

from bench.common import goal_row, make_topic, pct, ratio, workers
from txnstream import Client, Config

PAYLOAD = b"x" * 100
P50_GOAL = 1.0
"""Issue 13: p50 at 1 concurrent at most Kafka's p50."""
P99_GOAL = 2.0
"""Issue 13: p99 at 1 concurrent at most twice Kafka's p99."""
RATE_GOAL = 1.5
"""Issue 13: txns/s at 16 and 64 concurrent at least 1.5x Kafka's."""


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


WARMUP_TXNS = 300
"""Untimed transactions per side before the first measurement."""


def run(cfg: Config, concurrencies=(1, 16, 64), total: int = 1000,
        progress=None) -> list[dict]:
    """Both systems at each concurrency; rows for the report."""
    topic = make_topic(cfg, 8)
    rows = []
    with workers(cfg, 1):
        for fn in (txnstream_run, kafka_run):
            fn(cfg, topic, 1, WARMUP_TXNS)
        for c in concurrencies:
            n = total if c > 1 else max(200, total // 4)
            for fn in (txnstream_run, kafka_run):
                r = fn(cfg, topic, c, n)
                rows.append(r.row())
                if progress:
                    progress(r.row())
    return rows


def goals(rows: list[dict]) -> list[dict]:
    """Issue 13's goal ratios from :func:`run`'s rows (those whose both sides ran)."""
    by = {(r["system"], r["concurrency"]): r for r in rows}
    out = []
    ours, kafka = by.get(("txnstream", 1)), by.get(("kafka-txn", 1))
    if ours and kafka:
        out.append(goal_row("p50, 1 concurrent txn", f"{ours['p50_ms']} ms", "Kafka txn p50",
                            f"{kafka['p50_ms']} ms", ratio(ours["p50_ms"], kafka["p50_ms"]),
                            "<=", P50_GOAL))
        out.append(goal_row("p99, 1 concurrent txn", f"{ours['p99_ms']} ms",
                            "2 x Kafka txn p99", f"{2 * kafka['p99_ms']:.1f} ms",
                            ratio(ours["p99_ms"], P99_GOAL * kafka["p99_ms"]), "<=", 1.0))
    for c in sorted({r["concurrency"] for r in rows if r["concurrency"] > 1}):
        ours, kafka = by.get(("txnstream", c)), by.get(("kafka-txn", c))
        if ours and kafka:
            out.append(goal_row(f"txns/s, {c} concurrent", f"{ours['tps']}",
                                "Kafka txns/s", f"{kafka['tps']}",
                                ratio(ours["tps"], kafka["tps"]), ">=", RATE_GOAL))
    return out
