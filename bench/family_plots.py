"""The plots of ``python -m bench``: one per family of rows, beside its tables.

* ``goals.png``: every row of issue 22's goal table, txnstream's ratio to its anchor
  against the goal (log scale; green met, red missed);
* ``coordinator.png``: txns/s and p50/p99 against concurrency, txnstream beside Kafka's
  transactional producers;
* ``produce.png``: each produce variant's rate, and its CPU per record by process;
* ``buffer.png``: committed-only consume and produce-to-visible against their anchors;
* ``owner-scan.png``: the owner's read and fold per record, plain / Python / native;
* ``processor-cpu.png``: the three consume-transform-produce loops' CPU per record by
  process (the sweep's curves are :func:`bench.processor.plot`'s);
* ``spark.png``: each Spark read and write beside spark-sql-kafka and the floors.

Each takes the rows the parts returned (a part that did not run draws nothing);
without matplotlib (the ``bench`` extra) nothing is drawn.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import save_figure

__all__ = ["draw", "number"]

GROUP_COLORS = {"client": "tab:blue", "worker": "tab:orange", "broker": "tab:green"}


def number(text: object) -> float:
    """The first number in ``text`` ("1,234.5 rec/s" -> 1234.5); NaN if there is none."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.search(r"-?\d[\d,]*(?:\.\d+)?", str(text))
    return float(m.group().replace(",", "")) if m else math.nan


def _short(text: str, width: int = 48) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def goals(plt: Any, rows: Sequence[Mapping[str, Any]]) -> Any:
    """Each goal row's ratio (a bar) and goal (a tick), log scale."""
    rows = [r for r in rows if isinstance(r.get("_ratio"), float)]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.2))
    ys = range(len(rows))
    ax.barh(ys, [r["_ratio"] for r in rows],
            color=["tab:green" if r["met"] == "yes" else "tab:red" for r in rows])
    for y, r in zip(ys, rows, strict=True):
        op, target = r["goal"].split()[0], number(r["goal"])
        ax.plot([target, target], [y - 0.4, y + 0.4], color="black", lw=2)
        ax.annotate(f"{r['ratio']} (goal {op} {target:g}x)", (r["_ratio"], y),
                    xytext=(4, -4), textcoords="offset points", fontsize=8)
    ax.set_yticks(list(ys), [f"{r.get('#', '')} {_short(r['measure'])}" for r in rows],
                  fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("txnstream / anchor (the black tick: the goal)")
    ax.set_title("Goals of this run: green met, red missed")
    return fig


def coordinator(plt: Any, rows: Sequence[Mapping[str, Any]]) -> Any:
    """txns/s and latency against concurrency, each system a line."""
    if not rows:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for system in sorted({r["system"] for r in rows}):
        mine = sorted((r for r in rows if r["system"] == system),
                      key=lambda r: r["concurrency"])
        xs = [r["concurrency"] for r in mine]
        a.plot(xs, [r["tps"] for r in mine], marker="o", label=system)
        for key, style in (("p50_ms", "-"), ("p99_ms", "--")):
            b.plot(xs, [r[key] for r in mine], style, marker="o",
                   label=f"{system} {key[:3]}")
    a.set_ylabel("txns/s")
    b.set_ylabel("ms")
    for ax in (a, b):
        ax.set_xscale("log")
        ax.set_xlabel("concurrent txns")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("begin + 1 send + commit")
    return fig


def _cpu_bars(ax: Any, labels: Sequence[str], per_rec: Sequence[Mapping[str, float]]) -> None:
    """Stacked bars of CPU µs per record, client / worker / broker."""
    bottom = [0.0] * len(labels)
    for group, color in GROUP_COLORS.items():
        vals = [0.0 if math.isnan(v := p.get(group, math.nan)) else max(v, 0.0)
                for p in per_rec]
        ax.barh(labels, vals, left=bottom, color=color, label=group)
        bottom = [x + v for x, v in zip(bottom, vals, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("CPU µs per record")
    ax.legend(fontsize=8)


CPU_COLUMN = "CPU µs/rec client / worker / broker"


def _groups(row: Mapping[str, Any]) -> dict[str, float]:
    """Group -> µs per record from a row's :data:`CPU_COLUMN` text ("5.3 / 1.5 / 3.8")."""
    return dict(zip(GROUP_COLORS, map(number, str(row.get(CPU_COLUMN, "")).split(" / ")),
                    strict=False))


def produce(plt: Any, rows: Sequence[Mapping[str, Any]]) -> Any:
    """Each variant's records/s, and its CPU per record by process."""
    if not rows:
        return None
    labels = [r["variant"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 0.5 * len(rows) + 1.5))
    a.barh(labels, [number(r["rec/s (median)"]) / 1000 for r in rows], color="tab:purple")
    a.invert_yaxis()
    a.set_xlabel("thousand records/s (median of rounds)")
    _cpu_bars(b, labels, [_groups(r) for r in rows])
    fig.suptitle("produce 1 KB records")
    return fig


def _pairs(plt: Any, rows: Sequence[Mapping[str, Any]], ours: str, theirs: str,
           label: Callable[[Mapping[str, Any]], str], title: str) -> Any:
    """txnstream's value beside its anchor's, one pair of bars per row (a panel per unit)."""
    units: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if not math.isnan(number(r.get(ours))) and not math.isnan(number(r.get(theirs))):
            unit = "ms" if "ms" in str(r.get(ours)) else "per s"
            units.setdefault(unit, []).append(r)
    if not units:
        return None
    fig, axs = plt.subplots(1, len(units), figsize=(6 * len(units), 3.8), squeeze=False)
    for ax, (unit, mine) in zip(axs[0], units.items(), strict=True):
        xs = range(len(mine))
        ax.bar([x - 0.2 for x in xs], [number(r[ours]) for r in mine], 0.4, label="txnstream")
        ax.bar([x + 0.2 for x in xs], [number(r[theirs]) for r in mine], 0.4, label="anchor")
        ax.set_xticks(list(xs), [_short(label(r), 28) for r in mine], fontsize=7,
                      rotation=15, ha="right")
        ax.set_ylabel(unit)
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title)
    return fig


def buffer(plt: Any, rows: Sequence[Mapping[str, Any]]) -> Any:
    """Committed-only consume and produce-to-visible beside their anchors."""
    mine = [r for r in rows if str(r.get("bench", "")).startswith(
        ("committed-only", "produce-to-visible")) and r.get("goal") not in (None, "-")]
    return _pairs(plt, mine, "txnstream rec/s", "anchor rec/s",
                  lambda r: f"{r['bench'].split(',')[0]} vs {r['anchor'][:20]}",
                  "committed-only read and visibility (anchor: Kafka read_committed)")


def owner_scan(plt: Any, rows: Sequence[Mapping[str, Any]]) -> Any:
    """The owner's read and fold, CPU µs per record by way."""
    mine = [r for r in rows if "µs CPU/record" in r and r["µs CPU/record"] not in ("", None)]
    if not mine:
        return None
    fig, ax = plt.subplots(figsize=(7, 2.8))
    ax.barh([r["measure"].split(": ")[-1] for r in mine],
            [number(r["µs CPU/record"]) for r in mine], color="tab:cyan")
    ax.invert_yaxis()
    ax.set_xlabel("CPU µs per record (read + fold)")
    ax.set_title("the buffer owner's scan, 1 KB records, 1000 per txn")
    return fig


def processor_cpu(plt: Any, rows: Sequence[Mapping[str, Any]]) -> Any:
    """The consume-transform-produce loops' CPU per record by process."""
    mine = [r for r in rows if CPU_COLUMN in r]
    if not mine:
        return None
    fig, ax = plt.subplots(figsize=(8, 2.8))
    _cpu_bars(ax, [f"{r['loop']} ({number(r['rec/s, median']):,.0f} rec/s)" for r in mine],
              [_groups(r) for r in mine])
    ax.set_title("consume-transform-produce, CPU per record")
    return fig


def spark(plt: Any, rows: Sequence[Mapping[str, Any]]) -> Any:
    """Rows/s of each Spark read and write: txnstream, floors, spark-sql-kafka."""
    mine = [r for r in rows if "rows/s" in r.get("measure", "")]
    if not mine:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.45 * (len(mine) + 3) + 1))
    labels, vals, colors = [], [], []
    anchors: dict[str, float] = {}
    for r in mine:
        floor = r["measure"].startswith("floor")
        labels.append(_short(r["measure"], 60))
        vals.append(number(r["txnstream"]) / 1000)
        colors.append("tab:gray" if floor else "tab:blue")
        anchors.setdefault(r["anchor"], number(r["anchor value"]) / 1000)
    for name, v in anchors.items():
        labels.append(_short(name, 60))
        vals.append(v)
        colors.append("tab:orange")
    ax.barh(labels, vals, color=colors)
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("thousand rows/s (blue txnstream, gray floors, orange spark-sql-kafka)")
    ax.set_title("Spark source and sink")
    return fig


DRAWN: tuple[tuple[str, str, Callable[[Any, Sequence[Mapping[str, Any]]], Any]], ...] = (
    ("goals", "goals.png", goals),
    ("txn-rate", "coordinator.png", coordinator),
    ("produce", "produce.png", produce),
    ("buffer", "buffer.png", buffer),
    ("owner-scan", "owner-scan.png", owner_scan),
    ("processor-cpu", "processor-cpu.png", processor_cpu),
    ("spark", "spark.png", spark),
)
"""(the rows' name in :func:`draw`'s ``rows``, the file, the drawing)."""


def draw(rows: Mapping[str, Sequence[Mapping[str, Any]]], folder: Path) -> list[Path]:
    """Every plot whose rows are in ``rows`` (name -> rows), into ``folder``; the files."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, file, fn in DRAWN:
        if rows.get(name) and (fig := fn(plt, rows[name])) is not None:
            out.append(save_figure(fig, folder / file))
    return out
