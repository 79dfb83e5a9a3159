"""Issue 22's goals, one table: every goal of the issue beside its named anchor.

Each figure comes from the rows of the part that measures it (``txn-rate``, ``produce``,
``buffer``, ``processor``, ``spark``), where both sides ran in the same run, on the same
data, record size, batch size and timing window; nothing is measured here. A goal whose
part was not run this time (``--only``) says "not run", one whose part failed says
"failed", one whose part ran without giving it says "not measured".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from bench.common import goal_row, ratio
from bench.produce import PER_TXN, SMALL_TXN

__all__ = ["GOALS", "Goal", "table"]


@dataclass(frozen=True)
class Figures:
    """One goal's figures from a part's rows."""

    ours: str
    theirs: str
    ratio: float | None
    anchor: str | None = None
    """The anchor's name when the rows name it better (a version), else the goal's."""


@dataclass(frozen=True)
class Goal:
    part: str
    """The ``python -m bench`` part that measures it."""
    measure: str
    anchor: str
    op: str
    target: float
    figures: Callable[[list[dict]], Figures | None]


# ------------------------------------------------------------------ txn-rate


def _coordinator(rows: list[dict], concurrency: int) -> tuple[dict, dict] | None:
    by = {(r["system"], r["concurrency"]): r for r in rows}
    ours, kafka = by.get(("txnstream", concurrency)), by.get(("kafka-txn", concurrency))
    return (ours, kafka) if ours and kafka else None


def _p50_1(rows: list[dict]) -> Figures | None:
    if (both := _coordinator(rows, 1)) is None:
        return None
    ours, kafka = both
    return Figures(f"{ours['p50_ms']} ms", f"{kafka['p50_ms']} ms",
                   ratio(ours["p50_ms"], kafka["p50_ms"]))


def _tps_16(rows: list[dict]) -> Figures | None:
    if (both := _coordinator(rows, 16)) is None:
        return None
    ours, kafka = both
    return Figures(f"{ours['tps']} txn/s", f"{kafka['tps']} txn/s",
                   ratio(ours["tps"], kafka["tps"]))


# ------------------------------------------------------------------ produce


def _rate(rows: list[dict], ours: str, theirs: str) -> Figures | None:
    by = {r["variant"]: r for r in rows}
    if ours not in by or theirs not in by:
        return None
    a, b = by[ours]["rec/s (median)"], by[theirs]["rec/s (median)"]
    return Figures(f"{a} rec/s", f"{b} rec/s", ratio(a, b))


PLAIN = "plain produce (same txnstream Producer, no txn)"
FLOOR = "plain + read"
"""The produce part's floor: plain produce and one more plain read of every record."""


def _x(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.2f}x"


def _floor_rate(rows: list[dict], ours: str) -> str:
    """``; floor ...: its rate (ours against it)``, or nothing if the floor did not run."""
    f = _rate(rows, ours, FLOOR)
    return "" if f is None else (f"; floor, plain produce + one more plain read of every "
                                 f"record: {f.theirs} (ratio {_x(f.ratio)})")


def _batch_async_vs_plain(rows: list[dict]) -> Figures | None:
    f = _rate(rows, "txn send_batch async", "plain")
    k = _rate(rows, "txn send_batch async", "kafka txn")
    if f is None or k is None:
        return f
    return Figures(f.ours, f.theirs, f.ratio,
                   f"{PLAIN}; 2nd anchor: Kafka txn producer, {PER_TXN}/txn, same topic "
                   f"layout: {k.theirs} (ratio {_x(k.ratio)})"
                   + _floor_rate(rows, "txn send_batch async"))


def _send_vs_plain(rows: list[dict]) -> Figures | None:
    f = _rate(rows, "txn send", "plain")
    return f if f is None else Figures(f.ours, f.theirs, f.ratio,
                                       PLAIN + _floor_rate(rows, "txn send"))


def _cpu_text(cpu: dict[str, float]) -> str:
    total = sum(v for v in cpu.values() if not math.isnan(v))
    broker = "not measured" if math.isnan(cpu["broker"]) else f"{cpu['broker']:.1f}"
    return (f"{total:.1f} µs/rec (client {cpu['client']:.1f} + worker {cpu['worker']:.1f} "
            f"+ broker {broker})")


def _cpu(rows: list[dict]) -> Figures | None:
    by = {r["variant"]: r for r in rows}
    ours, plain = by.get("txn send_batch async"), by.get("plain")
    if ours is None or plain is None:
        return None
    a, b = ours["_cpu_us"], plain["_cpu_us"]
    ta = sum(v for v in a.values() if not math.isnan(v))
    tb = sum(v for v in b.values() if not math.isnan(v))
    anchor = None
    if math.isnan(b["broker"]):
        anchor = ("plain produce: client + worker (idle) CPU per record; external broker, "
                  "its CPU not measured")
    if (floor := by.get(FLOOR)) is not None:
        tf = sum(v for v in floor["_cpu_us"].values() if not math.isnan(v))
        anchor = (anchor or "plain produce, same processes (client + broker; the idle worker "
                  "counted)") + (f"; floor, plain produce + one more plain read of every "
                                 f"record: {_cpu_text(floor['_cpu_us'])} (ratio "
                                 f"{_x(ratio(ta, tf))})")
    return Figures(_cpu_text(a), _cpu_text(b), ratio(ta, tb), anchor)


# ------------------------------------------------------------------ the other parts


def _goal_row(rows: list[dict], key: str, starts: str, unit: str = "") -> Figures | None:
    """From a part whose rows are goal rows (``bench.common.goal_row``): the first whose
    ``key`` starts with ``starts``; ``unit`` is added to its figures."""
    for r in rows:
        if str(r.get(key, "")).startswith(starts):
            return Figures(r["txnstream"] + unit, r["anchor value"] + unit, r.get("_ratio"),
                           r["anchor"])
    return None


def _visible_p99(rows: list[dict]) -> Figures | None:
    for r in rows:
        if str(r.get("bench", "")).startswith("produce-to-visible p99"):
            return Figures(r["txnstream rec/s"], r["anchor rec/s"], r.get("_ratio"))
    return None


GOALS = (
    Goal("txn-rate", "begin + 1 send (100 B) + commit, 1 concurrent txn, p50 latency",
         "Kafka txn producer p50 (begin, produce, commit_transaction)", "<=", 1.0, _p50_1),
    Goal("txn-rate", "begin + 1 send (100 B) + commit, 16 concurrent txns, txn/s",
         "Kafka txn producers, 16 (one per concurrent txn)", ">=", 1.5, _tps_16),
    Goal("produce", f"produce 1 KB, {PER_TXN}/txn, send_batch + commit_async, rec/s",
         PLAIN, ">=", 0.8,
         _batch_async_vs_plain),
    Goal("produce", f"produce 1 KB, {SMALL_TXN}/txn, send_batch + commit_async, rec/s",
         f"Kafka txn producer, {SMALL_TXN}/txn", ">=", 2.0,
         lambda rows: _rate(rows, f"txn send_batch async {SMALL_TXN}",
                            f"kafka txn {SMALL_TXN}")),
    Goal("produce", f"CPU per record of every process (client, txnstream worker + its buffer "
                    f"child, broker JVM), 1 KB, {PER_TXN}/txn, send_batch + commit_async",
         "plain produce, same processes (client + broker; the idle worker counted)", "<=",
         2.0, _cpu),
    Goal("produce", f"produce 1 KB, {PER_TXN}/txn, per-record send(txn=) + commit, rec/s",
         PLAIN, ">=", 0.5, _send_vs_plain),
    Goal("processor", "consume-transform-produce, exactly-once processor, rec/s",
         "the same loop, at-least-once", ">=", 0.8,
         lambda rows: _goal_row(rows, "anchor", "same loop, at-least-once")),
    Goal("buffer", "produce-to-visible, txns of 10 x 100 B, p99",
         "Kafka txn producer + read_committed consumer", "<=", 1.5, _visible_p99),
    Goal("spark", "Spark sink, df.write, rows/s", "spark-sql-kafka sink (at-least-once)",
         ">=", 0.9, lambda rows: _goal_row(rows, "measure", "sink", " rows/s")),
    Goal("spark", "Spark streaming source, readStream AvailableNow to noop, rows/s",
         "spark-sql-kafka streaming source, read_committed", ">=", 1.0,
         lambda rows: _goal_row(rows, "measure", "streaming source", " rows/s")),
    Goal("spark", "Spark batch source, spark.read, rows/s",
         "spark-sql-kafka batch source, read_committed", ">=", 1.2,
         lambda rows: _goal_row(rows, "measure", "batch source", " rows/s")),
)
"""Issue 22's goals, in the issue's order."""


def table(results: dict[str, list[dict]], failed: set[str] | list[str]) -> list[dict]:
    """Issue 22's goal rows from the parts' rows (``results``: part -> rows, for every part
    that ran and gave rows); ``failed``: the parts that raised."""
    out = []
    for i, g in enumerate(GOALS, 1):
        f = g.figures(results[g.part]) if g.part in results else None
        if f is None:
            why = ("failed" if g.part in failed else
                   "not measured" if g.part in results else "not run")
            row = goal_row(g.measure, why, g.anchor, why, None, g.op, g.target)
            row["met"] = why
        else:
            row = goal_row(g.measure, f.ours, f.anchor or g.anchor, f.theirs, f.ratio, g.op,
                           g.target)
        out.append({"#": i, **row})
    return out
