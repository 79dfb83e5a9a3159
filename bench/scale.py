"""Issue 37: what a topic's width costs, txnstream beside plain Kafka, 4 to 1,024 partitions.

``python -m bench.scale --partitions 4 64 256 1024 [--rounds 2] [--out FILE]``
(``TXNSTREAM_BOOTSTRAP=host:port`` for an existing broker; else one local broker, KRaft,
1 GB heap, is started for the run, and its JVM's CPU is measured too).

Per width, on a fresh config (its own state topics) and, for txnstream, a fresh
``txnstream worker`` (``bench.common.workers``), so what one width left behind is not
counted at the next:

1. **Kafka first**, with no worker running, so its broker CPU has nothing of ours in it:
   the steady load (below) on a plain topic, an idempotent producer and a
   ``read_committed`` group consumer; then ``bench.wide_start``'s rounds (subscribe at
   latest, a record every ~50 ms, time to first delivery).
2. **txnstream** on a topic whose every partition a txn registered first: the steady
   load, then ``bench.wide_start``'s rounds on a topic of its own.

The steady load: one writer sends a ``RECORDS_PER_TXN`` x 1 KB txn (Kafka: one record,
flushed) to a random partition at ``TXNS_PER_S``, a consumer subscribed at earliest
notes when each arrives. After the first delivery and ``WARMUP_S``, a ``window_s``
window counts the txns sent, their produce-to-delivery latency (from just before the
send) and the CPU of the worker with its children, of the broker JVM
(:class:`bench.cpu.CpuMeter`'s samples) and of the reader threads of this process
(:data:`GROUPS`). Then the writer stops, the consumer stays
subscribed, and after ``SETTLE_S`` an at-rest window of ``rest_s`` measures the same
processes' cores; the worker's RSS (its tree) is read at its end. CPU per txn is shown
gross (the window's CPU / txns) and net (less the at-rest rate over the window: what
the txns added).

Not part of ``python -m bench``: run it on its own (several minutes per width).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient
from rich.console import Console

from bench import wide_start
from bench.__main__ import _md_table, _show
from bench.buffer import CONSUME_BATCH, VALUE, kafka_batch, receive_batch
from bench.common import (
    fresh_config,
    machine,
    make_topic,
    pct,
    plots_line,
    publish,
    run_broker,
    run_line,
    workers,
)
from bench.cpu import CLK_TCK, CpuMeter, with_children
from bench.scale_report import goals, plot
from txnstream import Client, Config

console = Console()

TXNS_PER_S = 20
"""The steady writer's rate: the issue's "a txn every ~50 ms"; a rate, not as fast as it
can, so every width asks the same work of the worker and the broker."""
RECORDS_PER_TXN = 1
WARMUP_S = 3.0
"""After the first delivery: the consumer's start-up is not in the window."""
DRAIN_S = 15.0
"""After the window: how long a txn sent in it may take to be delivered and counted."""
SETTLE_S = 3.0
"""After the writer stops: markers and folding done before the at-rest window."""
POLL_S = 0.1
WARMUP_WIDTH = 4
PROFILE_S = 20.0
PLOTS = Path("bench/plots")


# ------------------------------------------------------------------ pure helpers

def window_latencies(sent: dict[int, float], seen: dict[int, float], lo: int,
                     hi: int) -> tuple[list[float], int]:
    """ms from send to delivery of txns ``lo``..``hi - 1``, and how many never came."""
    lats = [(seen[s] - sent[s]) * 1000 for s in range(lo, hi) if s in seen and s in sent]
    return lats, (hi - lo) - len(lats)


def net_per_txn(cpu_s: float, rest_cores: float, window_s: float, txns: int) -> float:
    """CPU seconds per txn beyond the at-rest rate: ``(cpu_s - rest_cores * window_s) /
    txns`` (NaN with no txns)."""
    return (cpu_s - rest_cores * window_s) / txns if txns else float("nan")


# ------------------------------------------------------------------ steady load

Send = Callable[[int, int], float]
"""(txn seq, partition) -> when its first send began (perf_counter)."""
Receive = Callable[[], list[bytes | None]]
"""The keys (``seq``) of what has arrived."""


GROUPS = ("worker", "broker", "reader")
"""What a window measures: the worker tree, the broker JVM, and the reader threads of
this process (each one's own CPU, librdkafka's threads not included: the per-record and
per-partition work a committed-only reader does on the caller's thread)."""


def thread_cpu_seconds(tid: int) -> float:
    """utime + stime of thread ``tid`` of this process (0 once it ended)."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _cpu(meter: CpuMeter, reader_tids: Sequence[int]) -> dict[str, float]:
    """Worker tree, broker and reader threads' CPU seconds so far (NaN: not measured)."""
    s = meter.sample()
    out = {g: float("nan") if meter.roots[g] is None else sum(s[g].values())
           for g in ("worker", "broker")}
    out["reader"] = sum(thread_cpu_seconds(t) for t in reader_tids)
    return out


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in with_children(pids):
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def steady(send: Send, receives: Sequence[Receive], width: int, meter: CpuMeter,
           window_s: float, rest_s: float,
           after_rest: Callable[[], object] | None = None) -> dict:
    """The steady load, then rest with the consumers still polling; one result row's
    figures (see the module docstring). Each of ``receives`` is a reader of every txn,
    polled on its own thread; latencies are pooled over them. ``after_rest`` runs after
    the at-rest window, the consumers still polling (a profile of rest that does not
    load the window)."""
    sent: dict[int, float] = {}
    seens: list[dict[int, float]] = [{} for _ in receives]
    stop_w, stop_r = threading.Event(), threading.Event()
    behind = [0.0]
    errors: list[BaseException] = []
    tids: list[int] = []

    def write() -> None:
        rng, seq, next_at = random.Random(11), 0, time.monotonic()
        try:
            while not stop_w.is_set():
                sent[seq] = send(seq, rng.randrange(width))
                seq += 1
                next_at += 1.0 / TXNS_PER_S
                lag = next_at - time.monotonic()
                if lag > 0:
                    stop_w.wait(lag)
                else:
                    behind[0] = max(behind[0], -lag)
        except BaseException as e:  # reported in the row
            errors.append(e)

    def read(receive: Receive, seen: dict[int, float]) -> None:
        tids.append(threading.get_native_id())
        try:
            while not stop_r.is_set():
                keys = receive()
                now = time.perf_counter()
                for k in keys:
                    seen.setdefault(int(k or b"-1"), now)
        except BaseException as e:
            errors.append(e)

    writer = threading.Thread(target=write, daemon=True, name="scale-writer")
    threads = [threading.Thread(target=read, args=(rc, seen), daemon=True,
                                name=f"scale-reader-{i}")
               for i, (rc, seen) in enumerate(zip(receives, seens, strict=True))] + [writer]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + wide_start.FIRST_TIMEOUT_S
        while not all(seens) and time.monotonic() < deadline and not errors:
            time.sleep(0.1)
        if not all(seens):
            raise RuntimeError(f"nothing delivered to {sum(not s for s in seens)} reader(s) "
                               f"in {wide_start.FIRST_TIMEOUT_S:.0f}s ({errors!r})")
        time.sleep(WARMUP_S)
        lo, c0, t0 = len(sent), _cpu(meter, tids), time.monotonic()
        time.sleep(window_s)
        hi, c1, t1 = len(sent), _cpu(meter, tids), time.monotonic()
        stop_w.set()
        writer.join(30)
        deadline = time.monotonic() + DRAIN_S
        while any(s not in seen for seen in seens for s in range(lo, hi)) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        lats, missing = [], 0
        for seen in seens:
            got, lost = window_latencies(sent, seen, lo, hi)
            lats += got
            missing += lost
        time.sleep(SETTLE_S)
        r0, tr0 = _cpu(meter, tids), time.monotonic()
        time.sleep(rest_s)
        r1, tr1 = _cpu(meter, tids), time.monotonic()
        rss = _rss_mb(meter.roots["worker"] or [])
        if after_rest is not None:
            after_rest()
    finally:
        stop_w.set()
        stop_r.set()
        for t in threads:
            t.join(30)
    txns, win = hi - lo, t1 - t0
    out = {"txns": txns, "missing": missing, "behind_s": behind[0], "p50": pct(lats, 50),
           "p99": pct(lats, 99), "rss_mb": rss, "errors": [repr(e) for e in errors]}
    for g in GROUPS:
        rest = (r1[g] - r0[g]) / (tr1 - tr0)
        out[f"{g}_rest"] = rest
        out[f"{g}_txn_ms"] = (c1[g] - c0[g]) / txns * 1000 if txns else float("nan")
        out[f"{g}_net_ms"] = net_per_txn(c1[g] - c0[g], rest, win, txns) * 1000
    return out


def kafka_steady(cfg: Config, width: int, meter: CpuMeter, window_s: float,
                 rest_s: float, readers: int = 1) -> dict:
    """The anchor: an idempotent producer (one record, flushed) and ``readers``
    ``read_committed`` consumers, each its own group, on a plain topic."""
    topic = make_topic(cfg, width, f"scale-plain{width}-{uuid.uuid4().hex[:6]}")
    p = KafkaProducer(cfg.producer(**{"linger.ms": 0}))
    cs = [KafkaConsumer(cfg.consumer(f"scale-{uuid.uuid4().hex[:6]}", **{
        "isolation.level": "read_committed", "auto.offset.reset": "earliest"}))
        for _ in range(readers)]
    for c in cs:
        c.subscribe([topic])

    def send(seq: int, partition: int) -> float:
        t0 = time.perf_counter()
        p.produce(topic, VALUE, key=str(seq).encode(), partition=partition)
        p.flush(10)
        return t0

    def receive_of(c: KafkaConsumer) -> Receive:
        return lambda: [m.key() for m in kafka_batch(c, CONSUME_BATCH, POLL_S)
                        if m.error() is None]

    try:
        return steady(send, [receive_of(c) for c in cs], width, meter, window_s, rest_s)
    finally:
        for c in cs:
            c.close()


def profile_rest(pid: int, seconds: float, path: Path) -> None:
    """``py-spy record`` of ``pid`` and its children for ``seconds`` (collapsed stacks,
    CPU only) into ``path``; skipped, saying so, without py-spy on the PATH."""
    spy = shutil.which("py-spy")
    if spy is None:
        console.print("no profile: py-spy is not on the PATH")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([spy, "record", "--pid", str(pid), "--subprocesses", "--duration",
                    str(int(seconds)), "--rate", "50", "--format", "raw", "--output",
                    str(path), "--nonblocking"], check=False, capture_output=True,
                   timeout=seconds + 60)


def txnstream_steady(cfg: Config, width: int, meter: CpuMeter, window_s: float,
                     rest_s: float, profile: Path | None = None, readers: int = 1) -> dict:
    """txnstream: ``RECORDS_PER_TXN``-record txns, ``readers`` subscriptions at
    earliest; with ``profile``, the worker at rest is profiled into ``profile`` after
    the window."""
    with Client(config=cfg) as client:
        topic = wide_start.registered_topic(client, cfg, width, f"scale{width}")
        producer = client.create_producer(topic)
        cs = [client.subscribe(topic, subscription=f"scale-{uuid.uuid4().hex[:6]}",
                               initial_position="earliest") for _ in range(readers)]

        def send(seq: int, partition: int) -> float:
            with client.transaction() as txn:
                t0 = time.perf_counter()
                for _ in range(RECORDS_PER_TXN):
                    producer.send(VALUE, key=str(seq).encode(), partition=partition, txn=txn)
            return t0

        def receive_of(c: Any) -> Receive:
            return lambda: [m.key for m in receive_batch(c, CONSUME_BATCH, POLL_S)]

        try:
            return steady(send, [receive_of(c) for c in cs], width, meter, window_s, rest_s,
                          None if profile is None else lambda: profile_rest(
                              (meter.roots["worker"] or [0])[0], PROFILE_S, profile))
        finally:
            for c in cs:
                c.close()


# ------------------------------------------------------------------ one width

def _delete_new_topics(cfg: Config, before: set[str]) -> None:
    """Delete the topics made since ``before`` (data and state alike), best effort."""
    admin = AdminClient(cfg.admin())
    new = [t for t in admin.list_topics(timeout=10).topics if t not in before]
    for f in (admin.delete_topics(new, operation_timeout=60) if new else {}).values():
        try:
            f.result(60)
        except Exception:  # noqa: BLE001 - best effort: the next width has new names
            pass


def one_width(bootstrap: str, broker: list[int] | None, width: int, rounds: int,
              window_s: float, rest_s: float, profile: Path | None = None, *,
              readers: int = 1, n_workers: int = 1, coordinators: int = 4,
              replication: int = 1) -> list[dict]:
    """The two rows of one width: Kafka's, then txnstream's (``readers`` subscriptions
    each, ``n_workers`` workers, ``coordinators`` TC partitions; every topic, Kafka's
    too, replicated ``replication`` times)."""
    cfg = fresh_config(bootstrap, coordinators, replication)
    before = set(AdminClient(cfg.admin()).list_topics(timeout=10).topics)
    rows = []
    try:
        with console.status(f"{width} partitions: Kafka ..."):
            k = kafka_steady(cfg, width, CpuMeter([], broker), window_s, rest_s, readers)
            k["rounds"] = wide_start.kafka_rounds(cfg, width, rounds)
        k["rss_mb"] = float("nan")
        rows.append(_row(width, "Kafka read_committed", k))
        with workers(cfg, n_workers) as pids, \
                console.status(f"{width} partitions: txnstream ..."):
            meter = CpuMeter(pids, broker)
            t = txnstream_steady(cfg, width, meter, window_s, rest_s, profile, readers)
            t["rounds"] = wide_start.txnstream_rounds(cfg, width, rounds)
            t["rss_end_mb"] = _rss_mb(pids)
        rows.append(_row(width, "txnstream", t))
    finally:
        _delete_new_topics(cfg, before)
        time.sleep(SETTLE_S)  # the broker's deletions are not the next width's at-rest
    for r in rows:
        console.print({k: v for k, v in r.items() if k != "_m"})
    return rows


def _row(width: int, system: str, m: dict) -> dict:
    rs, notes = m["rounds"], []
    if m["missing"]:
        notes.append(f"{m['missing']} of {m['txns']} never delivered")
    if m["behind_s"] > 1:
        notes.append(f"writer fell {m['behind_s']:.1f} s behind")
    if m["errors"]:
        notes.append("errors: " + "; ".join(m["errors"])[:200])
    if "rss_end_mb" in m:
        notes.append(f"RSS after the rounds {m['rss_end_mb']:.0f} MB")

    def f(v: float, fmt: str) -> str:
        return "n/m" if v != v else format(v, fmt)

    return {
        "partitions": width, "system": system,
        "first written s": f"{statistics.median(w for w, _ in rs):.2f}",
        "first delivered s": f"{statistics.median(d for _, d in rs):.2f}",
        "rounds (written/delivered)": ", ".join(f"{w:.2f}/{d:.2f}" for w, d in rs),
        "p50 ms": f(m["p50"], ".0f"), "p99 ms": f(m["p99"], ".0f"), "txns": m["txns"],
        "worker ms/txn (net)": f"{f(m['worker_txn_ms'], '.2f')} ({f(m['worker_net_ms'], '.2f')})"
        if system == "txnstream" else "",
        "broker ms/txn (net)": f"{f(m['broker_txn_ms'], '.2f')} ({f(m['broker_net_ms'], '.2f')})",
        "reader ms/txn (net)": f"{f(m['reader_txn_ms'], '.2f')} ({f(m['reader_net_ms'], '.2f')})",
        "rest reader cores": f(m["reader_rest"], ".3f"),
        "rest worker cores": f(m["worker_rest"], ".3f") if system == "txnstream" else "",
        "rest broker cores": f(m["broker_rest"], ".3f"),
        "rest worker mcores/partition": f(m["worker_rest"] / width * 1000, ".3f")
        if system == "txnstream" else "",
        "rest broker mcores/partition": f(m["broker_rest"] / width * 1000, ".3f"),
        "worker RSS MB": f(m["rss_mb"], ".0f"), "notes": "; ".join(notes),
        "_m": m,
    }


# ------------------------------------------------------------------ main

VISIBILITY = ("partitions", "system", "first written s", "first delivered s",
              "rounds (written/delivered)", "p50 ms", "p99 ms", "txns", "notes")
COST = ("partitions", "system", "worker ms/txn (net)", "broker ms/txn (net)",
        "reader ms/txn (net)", "rest reader cores", "rest worker cores", "rest broker cores",
        "rest worker mcores/partition",        "rest broker mcores/partition", "worker RSS MB")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale")
    ap.add_argument("--partitions", type=int, nargs="+", default=[4, 64, 256, 1024])
    ap.add_argument("--rounds", type=int, default=2, help="first-delivery rounds per width")
    ap.add_argument("--window", type=float, default=20.0, help="steady-load window, s")
    ap.add_argument("--rest", type=float, default=15.0, help="at-rest window, s")
    ap.add_argument("--out", type=Path, default=None,
                    help="append the markdown section to this file (default: stdout)")
    ap.add_argument("--plots", type=Path, default=PLOTS)
    ap.add_argument("--profile", type=Path, default=None,
                    help="py-spy the worker at rest at the widest width, collapsed stacks "
                         "into this folder")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="skip the unreported short run at 4 partitions first")
    ap.add_argument("--brokers", type=int, choices=(1, 3), default=1,
                    help="brokers of the local cluster started for the run (3: every "
                         "topic replicated 3 times)")
    args = ap.parse_args(argv)
    rows: list[dict] = []
    with run_broker("txnstream-scale-", args.brokers) as rb:
        if args.warmup:  # a fresh JVM's first minute (JIT, first topics) is not width 4's
            one_width(rb.bootstrap, rb.pids, WARMUP_WIDTH, 1, 5.0, 3.0,
                      replication=args.brokers)
        for width in args.partitions:
            t0 = time.monotonic()
            prof = args.profile / f"scale-rest-{width}.txt" if args.profile and \
                width == max(args.partitions) else None
            rows += one_width(rb.bootstrap, rb.pids, width, args.rounds, args.window,
                              args.rest, prof, replication=args.brokers)
            console.print(f"{width} partitions: {time.monotonic() - t0:.0f} s")
    vis = [{c: r[c] for c in VISIBILITY} for r in rows]
    cost = [{c: r[c] for c in COST} for r in rows]
    _show("Visibility: first delivery after subscribe at latest, then produce-to-delivery",
          vis)
    _show("Cost: CPU per txn under the steady load, at rest, worker memory", cost)
    g = goals(rows) if len(args.partitions) > 1 else []
    _show("Issue 37 goals, widest against narrowest", g)
    plots = plot(rows, args.plots)
    publish("\n## Scale: 4 to 1,024 partitions (issue 37)\n\n"
            + run_line("bench.scale", argv, rb.load)
            + f"Machine: {machine()}; {rb.where()}, one worker; steady load {TXNS_PER_S} "
            f"txn/s of {RECORDS_PER_TXN} x 1 KB for {args.window:g} s, at rest "
            f"{args.rest:g} s.\n\n### Visibility\n\n{_md_table(vis)}\n"
            f"### Cost\n\n{_md_table(cost)}\n"
            + (f"### Goals\n\n{_md_table(g)}\n" if g else "") + plots_line(plots), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
