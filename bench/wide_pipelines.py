"""Issue 37: the Spark source and the exactly-once processor on a wide topic.

``python -m bench.wide_pipelines --partitions 256 [--spark-rows 100000]
[--processor-records 50000] [--out FILE]`` (``TXNSTREAM_BOOTSTRAP=host:port`` for an
existing broker; else one local broker is started for the run). One worker.

* **Spark streaming source**, ``Trigger.AvailableNow`` to the ``noop`` sink over a
  ``--partitions`` topic of N committed rows (txns of 1,000, keys spread over the
  partitions), against spark-sql-kafka (``read_committed``) over the same rows written
  with Kafka's transactions: the first micro-batch's planning (``latestOffset`` +
  ``queryPlanning`` of its progress report) and its whole trigger
  (``triggerExecution``), and rows/s from building the query to its end; a median of
  ``ROUNDS``, the sides taking turns, each query on a fresh checkpoint.
* **Spark batch source**, ``spark.read`` of the same rows: rows/s.
* **Consume-transform-produce** over a ``--partitions`` input and output (plain input
  records): ``bench.processor``'s three loops with their defaults (exactly-once
  processor, at-least-once, Kafka EOS): records/s from the first input, and the time
  before it (the wall time of the loop less its window: the group join and the
  partitions' takeover).

Not part of ``python -m bench`` (minutes). Results appended to ``--out`` as markdown.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench import processor
from bench.__main__ import _md_table, _show
from bench.common import (
    fresh_config,
    machine,
    make_topic,
    publish,
    ratio,
    run_broker,
    run_line,
    workers,
)
from bench.spark_bench import (
    _fill_kafka_txn,
    _fill_txnstream,
    _jars,
    _opts,
    _read,
    _session,
    stream_progress,
)
from txnstream import Config

ROUNDS = 3


def stream_once(spark, fmt: str, options: dict[str, str]) -> dict[str, float]:
    """One ``AvailableNow`` query to ``noop``: rows, seconds, and its first micro-batch's
    planning and trigger ms (from its first progress report with input)."""
    progress, secs = stream_progress(spark, fmt, options)
    first = next((p for p in progress if p.numInputRows), None)
    d = dict(first.durationMs) if first is not None else {}
    return {"rows": sum(p.numInputRows for p in progress), "secs": secs,
            "plan_ms": d.get("latestOffset", 0) + d.get("queryPlanning", 0),
            "first_ms": d.get("triggerExecution", float("nan"))}


def spark_rows(cfg: Config, width: int, n: int) -> list[dict]:
    jars, version = _jars()
    anchor = f"spark-sql-kafka {version}"
    spark = _session(jars)
    try:
        kafka_src, ours_src = make_topic(cfg, width), make_topic(cfg, width)
        _fill_kafka_txn(cfg, kafka_src, n)
        _fill_txnstream(cfg, ours_src, n)
        kafka = {"kafka.bootstrap.servers": cfg.bootstrap_servers,
                 "kafka.isolation.level": "read_committed", "startingOffsets": "earliest"}
        sides = {"txnstream": ("txnstream", _opts(cfg, subscribe=ours_src,
                                                  startingOffsets="earliest")),
                 anchor: ("kafka", {**kafka, "subscribe": kafka_src})}
        for fmt, o in sides.values():  # warm-up: a session's first query of each kind
            stream_once(spark, fmt, o)
        runs: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
        reads: dict[str, list[float]] = {s: [] for s in sides}
        for _ in range(ROUNDS):
            for side, (fmt, o) in sides.items():
                r = stream_once(spark, fmt, o)
                if r["rows"] != n:
                    raise RuntimeError(f"{side} streamed {r['rows']} of {n} rows")
                runs[side].append(r)
                got, secs = _read(spark, fmt, {k: v for k, v in o.items()
                                               if k != "startingOffsets"})
                if got != n:
                    raise RuntimeError(f"{side} read {got} of {n} rows")
                reads[side].append(secs)
    finally:
        spark.stop()

    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    out = []
    for what, key, fmt in (("first micro-batch planning (latestOffset + queryPlanning), ms",
                            "plan_ms", ".0f"),
                           ("first micro-batch, triggerExecution, ms", "first_ms", ".0f")):
        t, k = med("txnstream", key), med(anchor, key)
        out.append({"measure": f"Spark streaming source, {width} partitions: {what}",
                    "txnstream": format(t, fmt), "anchor": anchor, "anchor value": format(k, fmt),
                    "ratio": f"{ratio(t, k):.2f}x"})
    t, k = n / med("txnstream", "secs"), n / med(anchor, "secs")
    out.append({"measure": f"Spark streaming source, {width} partitions: rows/s ({n:,} rows, "
                           f"AvailableNow to noop, from building the query)",
                "txnstream": f"{t:,.0f}", "anchor": anchor, "anchor value": f"{k:,.0f}",
                "ratio": f"{ratio(t, k):.2f}x"})
    t, k = (n / statistics.median(reads[s]) for s in ("txnstream", anchor))
    out.append({"measure": f"Spark batch source, {width} partitions: rows/s ({n:,} rows)",
                "txnstream": f"{t:,.0f}", "anchor": anchor, "anchor value": f"{k:,.0f}",
                "ratio": f"{ratio(t, k):.2f}x"})
    return out


def processor_rows(cfg: Config, width: int, n: int) -> list[dict]:
    loops = dict(zip(processor.LOOPS, (processor.txnstream_eo, processor.txnstream_alo,
                                       processor.kafka_eos), strict=True))
    got: dict[str, tuple[float, float]] = {}
    for loop in loops.values():  # a warm-up each, then the measured run
        warm = make_topic(cfg, width)
        processor._fill(cfg, warm, n // 10)
        loop(cfg, warm, make_topic(cfg, width), n // 10)
    for name, loop in loops.items():
        src = make_topic(cfg, width)
        processor._fill(cfg, src, n)
        t0 = time.perf_counter()
        rate = loop(cfg, src, make_topic(cfg, width), n)
        wall = time.perf_counter() - t0
        got[name] = (rate, wall - n / rate if rate else float("nan"))
    eo, alo, eos = (got[name] for name in processor.LOOPS)
    return [{"measure": f"consume-transform-produce, {width} partitions, {n:,} records: "
                        f"rec/s (before the first input, s)",
             "txnstream": f"{eo[0]:,.0f} ({eo[1]:.1f})", "anchor": name,
             "anchor value": f"{v[0]:,.0f} ({v[1]:.1f})", "ratio": f"{ratio(eo[0], v[0]):.2f}x"}
            for name, v in (("same loop, at-least-once", alo), ("Kafka EOS", eos))]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.wide_pipelines")
    ap.add_argument("--partitions", type=int, default=256)
    ap.add_argument("--spark-rows", type=int, default=100_000)
    ap.add_argument("--processor-records", type=int, default=50_000)
    ap.add_argument("--out", type=str, default=None)
    args = ap.parse_args(argv)
    with run_broker("txnstream-wide-") as rb:
        cfg = fresh_config(rb.bootstrap)
        with workers(cfg, 1):
            rows = spark_rows(cfg, args.partitions, args.spark_rows)
            rows += processor_rows(cfg, args.partitions, args.processor_records)
    _show(f"Spark and the processor on {args.partitions} partitions", rows)
    publish(f"\n### Issue 37: the Spark source and the processor on {args.partitions} "
            "partitions\n\n" + run_line("bench.wide_pipelines", argv, rb.load)
            + f"Machine: {machine()}; {rb.where()}, one worker; Spark local[2]; medians of "
            f"{ROUNDS} for Spark, one run per loop.\n\n{_md_table(rows)}\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
