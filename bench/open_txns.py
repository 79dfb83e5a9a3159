"""Issue 37: many transactions open at once, 10 to 10,000, txnstream beside Kafka's own.

``python -m bench.open_txns --open 10 100 1000 10000 [--kafka-max 1000] [--partitions 64]
[--hold 10] [--out FILE]`` (``TXNSTREAM_BOOTSTRAP=host:port`` for an existing broker;
else one local broker, KRaft, 1 GB heap, is started and its JVM measured too).

Per point ``n``, on a fresh config (its own state topics) and a fresh ``txnstream worker``:

1. **open**: ``n`` txns are opened and each sends one 1 KB record (its key: its number) to
   a random partition of a ``--partitions`` topic; the sends are waited for. txnstream:
   one ``Client`` and one producer hold all ``n`` (the point of the design). Kafka: one
   transactional producer per txn (its one open txn), ``init_transactions`` included.
2. **settle**, then **hold**: the worker first finishes what the open sent it (a
   txnstream client pipelines each txn's registrations: its sends are delivered before
   the coordinator has logged them all, and at 10,000 the worker was still busy with
   them 15 s later) until its cores stay under :data:`SETTLE_CORES` for a second
   (:data:`SETTLE_MAX_S` at most; counted in the open's CPU, not in "settle s").
   Then nothing happens for ``--hold`` seconds with the ``n`` txns open: the worker's
   and the broker's cores then are what an open txn costs at rest, and the worker
   tree's RSS at the end (Kafka: this process's RSS growth, its producers').
3. **commit**: all ``n`` commit at once (txnstream: ``commit_async``; Kafka: each
   producer's ``commit_transaction`` on 16 threads); a committed-only reader subscribed
   at earliest before the open (Kafka: a ``read_committed`` consumer) must deliver each
   record once: commit-to-delivery p50 / p99 (from the commit's start), and the time
   from the first commit to the last delivery.

CPU per txn is the worker's and the broker's (and this process's: the client's, the
reader's) over the open and commit phases. Kafka's side stops at ``--kafka-max`` (each
producer is a librdkafka handle with its own threads and connections: 10,000 of them is
not a Kafka deployment). Not part of ``python -m bench`` (minutes at 10,000).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient
from rich.console import Console

from bench.__main__ import _md_table, _show
from bench.buffer import VALUE, kafka_batch, receive_batch
from bench.common import (
    fresh_config,
    machine,
    make_topic,
    pct,
    publish,
    run_broker,
    run_line,
    workers,
)
from bench.cpu import CpuMeter
from bench.scale import _delete_new_topics, _rss_mb
from txnstream import Client, Config

console = Console()

TXN_TIMEOUT_S = 600.0
"""Each txn's timeout: longer than opening 10,000, holding and committing them."""
DELIVERY_TIMEOUT_S = 120.0
COMMIT_THREADS = 16
SETTLE_CORES = 0.1
"""The worker is done with the open once its cores stay under this for a second (at rest
with 10 to 10,000 txns open it used 0.03-0.05 of a core)."""
SETTLE_MAX_S = 60.0


class Reader:
    """Delivery times by key, read on a thread of its own until :meth:`stop`."""

    def __init__(self, receive: Callable[[], list[bytes | None]]) -> None:
        self.seen: dict[int, float] = {}
        self.doubled = 0
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(receive,), daemon=True)
        self._thread.start()

    def _run(self, receive: Callable[[], list[bytes | None]]) -> None:
        try:
            while not self._stop.is_set():
                keys = receive()
                now = time.perf_counter()
                for k in keys:
                    seq = int(k or b"-1")
                    self.doubled += seq in self.seen
                    self.seen.setdefault(seq, now)
        except BaseException as exc:  # noqa: BLE001 - reported by wait()
            self._errors.append(exc)

    def wait(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.seen) < n and time.monotonic() < deadline and not self._errors:
            time.sleep(0.01)
        if self._errors:
            raise RuntimeError(f"the reader failed: {self._errors[0]!r}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _measure(n: int, meter: CpuMeter, hold_s: float, open_: Callable[[], None],
             commit: Callable[[], dict[int, float]], reader: Reader,
             rss: Callable[[], float]) -> dict:
    """The three phases' figures (see the module docstring)."""
    c0, t0 = meter.sample(), time.monotonic()
    open_()
    t_open = time.monotonic() - t0
    t_settle = _settle(meter)
    h0, th0 = meter.sample(), time.monotonic()
    time.sleep(hold_s)
    h1, th1 = meter.sample(), time.monotonic()
    rss_mb = rss()
    t1, first = time.monotonic(), time.perf_counter()
    started = commit()
    t_commit = time.monotonic() - t1
    reader.wait(n, DELIVERY_TIMEOUT_S)
    c1 = meter.sample()
    lats = [(reader.seen[s] - started[s]) * 1000 for s in started if s in reader.seen]
    out = {"open_s": t_open, "settle_s": t_settle, "commit_s": t_commit,
           "p50": pct(lats, 50), "p99": pct(lats, 99),
           "visible_s": (max(reader.seen.values()) - first) if len(reader.seen) >= n
           else float("nan"), "missing": n - len(reader.seen), "doubled": reader.doubled,
           "rss_mb": rss_mb}
    for g in ("worker", "broker", "client"):
        if meter.roots[g] is None:
            out[f"hold_{g}"] = out[f"{g}_ms"] = float("nan")
            continue
        held = sum(h1[g].values()) - sum(h0[g].values())
        out[f"hold_{g}"] = held / (th1 - th0)
        out[f"{g}_ms"] = (sum(c1[g].values()) - sum(c0[g].values()) - held) / n * 1000
    return out


def _settle(meter: CpuMeter) -> float:
    """Wait until the worker's cores stay under :data:`SETTLE_CORES` for a second; the
    seconds waited (none for Kafka's side: it has no worker)."""
    if not meter.roots["worker"]:
        return 0.0
    t0 = time.monotonic()
    last = sum(meter.sample()["worker"].values())
    while time.monotonic() - t0 < SETTLE_MAX_S:
        time.sleep(1.0)
        now = sum(meter.sample()["worker"].values())
        if now - last < SETTLE_CORES:
            break
        last = now
    return time.monotonic() - t0


def txnstream_point(cfg: Config, n: int, partitions: int, meter: CpuMeter,
                    hold_s: float) -> dict:
    with Client(config=cfg) as client:
        topic = make_topic(cfg, partitions, f"open{n}-{uuid.uuid4().hex[:6]}")
        producer = client.create_producer(topic)
        sub = client.subscribe(topic, subscription=f"open-{uuid.uuid4().hex[:6]}",
                               initial_position="earliest")
        reader = Reader(lambda: [m.key for m in receive_batch(sub, 1000, 0.05)])
        txns = []
        rng = random.Random(n)

        def open_() -> None:
            for seq in range(n):
                txn = client.new_transaction(timeout_s=TXN_TIMEOUT_S)
                producer.send(VALUE, key=str(seq).encode(), partition=rng.randrange(
                    partitions), txn=txn)
                txns.append(txn)
            producer.flush()

        def commit() -> dict[int, float]:
            started, futures = {}, []
            for seq, txn in enumerate(txns):
                started[seq] = time.perf_counter()
                futures.append(txn.commit_async())
            for f in futures:
                f.result(DELIVERY_TIMEOUT_S)
            return started

        try:
            return _measure(n, meter, hold_s, open_, commit, reader,
                            lambda: _rss_mb(meter.roots["worker"] or []))
        finally:
            reader.stop()
            sub.close()


def kafka_point(cfg: Config, n: int, partitions: int, meter: CpuMeter,
                hold_s: float) -> dict:
    topic = make_topic(cfg, partitions, f"open-kafka{n}-{uuid.uuid4().hex[:6]}")
    consumer = KafkaConsumer(cfg.consumer(f"open-{uuid.uuid4().hex[:6]}", **{
        "isolation.level": "read_committed", "auto.offset.reset": "earliest"}))
    consumer.subscribe([topic])
    reader = Reader(lambda: [m.key() for m in kafka_batch(consumer, 1000, 0.05)
                             if m.error() is None])
    producers: list[KafkaProducer] = []
    rng, stem = random.Random(n), uuid.uuid4().hex[:6]
    rss0 = psutil.Process(os.getpid()).memory_info().rss

    def open_() -> None:
        def one(seq: int) -> KafkaProducer:
            p = KafkaProducer(cfg.producer(**{"transactional.id": f"open-{stem}-{seq}",
                                              "linger.ms": 0}))
            p.init_transactions(60)
            p.begin_transaction()
            return p

        with ThreadPoolExecutor(COMMIT_THREADS) as pool:
            producers.extend(pool.map(one, range(n)))
        for seq, p in enumerate(producers):
            p.produce(topic, VALUE, key=str(seq).encode(), partition=rng.randrange(partitions))
        for p in producers:
            p.flush(60)

    def commit() -> dict[int, float]:
        started: dict[int, float] = {}

        def one(seq: int) -> None:
            started[seq] = time.perf_counter()
            producers[seq].commit_transaction(60)

        with ThreadPoolExecutor(COMMIT_THREADS) as pool:
            list(pool.map(one, range(n)))
        return started

    try:
        return _measure(n, meter, hold_s, open_, commit, reader, lambda: (
            psutil.Process(os.getpid()).memory_info().rss - rss0) / 2**20)
    finally:
        reader.stop()
        consumer.close()
        producers.clear()


def _row(n: int, system: str, m: dict) -> dict:
    def f(v: float, fmt: str) -> str:
        return "n/m" if v != v else format(v, fmt)

    notes = [f"{m['missing']} never delivered"] if m["missing"] else []
    notes += [f"{m['doubled']} delivered twice"] if m["doubled"] else []
    return {"open": n, "system": system, "open s": f(m["open_s"], ".2f"),
            "settle s": f(m["settle_s"], ".1f"),
            "commit s": f(m["commit_s"], ".2f"), "all visible s": f(m["visible_s"], ".2f"),
            "p50 ms": f(m["p50"], ".0f"), "p99 ms": f(m["p99"], ".0f"),
            "hold worker cores": f(m["hold_worker"], ".3f"),
            "hold broker cores": f(m["hold_broker"], ".3f"), "RSS MB": f(m["rss_mb"], ".0f"),
            "worker ms/txn": f(m["worker_ms"], ".2f"), "broker ms/txn": f(m["broker_ms"], ".2f"),
            "client ms/txn": f(m["client_ms"], ".2f"), "notes": "; ".join(notes)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.open_txns")
    ap.add_argument("--open", type=int, nargs="+", default=[10, 100, 1000, 10000])
    ap.add_argument("--kafka-max", type=int, default=1000,
                    help="the largest point Kafka's side runs (a producer per txn)")
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--hold", type=float, default=10.0, help="seconds held open")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows: list[dict] = []
    with run_broker("txnstream-open-") as rb:
        for n in args.open:
            cfg = fresh_config(rb.bootstrap)
            before = set(AdminClient(cfg.admin()).list_topics(timeout=10).topics)
            try:
                if n <= args.kafka_max:
                    with console.status(f"{n} open: Kafka ..."):
                        rows.append(_row(n, "Kafka, a producer per txn", kafka_point(
                            cfg, n, args.partitions, CpuMeter([], rb.pids), args.hold)))
                with workers(cfg) as pids, console.status(f"{n} open: txnstream ..."):
                    rows.append(_row(n, "txnstream", txnstream_point(
                        cfg, n, args.partitions, CpuMeter(pids, rb.pids), args.hold)))
            finally:
                _delete_new_topics(cfg, before)
            console.print(rows[-1])
    _show("Open txns: open, hold, commit at once", rows)
    publish("\n## Open txns at once, 10 to 10,000 (issue 37)\n\n"
            + run_line("bench.open_txns", argv, rb.load)
            + f"Machine: {machine()}; one worker, 4 coordinators, a {args.partitions}-"
            f"partition topic, 1 KB records, held open {args.hold:g} s.\n\n"
            + _md_table(rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
