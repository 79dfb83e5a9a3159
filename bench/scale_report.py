"""bench.scale's report: issue 37's goals (widest width against narrowest) and its plots."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from bench.common import goal_row, ratio, save_figure


def goals(rows: list[dict]) -> list[dict]:
    """Issue 37's Show items: the widest width against the narrowest, same run."""
    def get(width: int, system: str) -> dict:
        return next(r["_m"] for r in rows if r["partitions"] == width and r["system"] == system)
    widths = sorted({r["partitions"] for r in rows})
    lo, hi = widths[0], widths[-1]
    t_lo, t_hi, k_hi = get(lo, "txnstream"), get(hi, "txnstream"), get(hi, "Kafka read_committed")

    def med(m: dict) -> float:
        return statistics.median(d for _, d in m["rounds"])

    out = [goal_row(f"first delivery after subscribe, {hi} partitions", f"{med(t_hi):.2f} s",
                    f"Kafka at {hi}", f"{med(k_hi):.2f} s", ratio(med(t_hi), med(k_hi)),
                    "<=", 2.0),
           goal_row(f"produce-to-visible p99, {hi} partitions", f"{t_hi['p99']:.0f} ms",
                    f"txnstream at {lo}", f"{t_lo['p99']:.0f} ms",
                    ratio(t_hi["p99"], t_lo["p99"]), "<=", 1.5)]
    for g in ("worker", "broker", "reader"):
        for kind in ("txn", "net"):
            a, b = t_hi[f"{g}_{kind}_ms"], t_lo[f"{g}_{kind}_ms"]
            out.append(goal_row(f"{g} CPU per txn ({'gross' if kind == 'txn' else 'net of rest'})"
                                f", {hi} partitions", f"{a:.2f} ms", f"txnstream at {lo}",
                                f"{b:.2f} ms", ratio(a, b), "<=", 1.5))
    return out


PLOT_SPECS = (
    ("first-delivery", "s from subscribe at latest to first delivery",
     lambda m: statistics.median(d for _, d in m["rounds"])),
    ("p99", "produce-to-visible p99, ms", lambda m: m["p99"]),
    ("p50", "produce-to-visible p50, ms", lambda m: m["p50"]),
    ("worker-cpu-per-txn", "worker CPU per txn, ms (gross)", lambda m: m["worker_txn_ms"]),
    ("broker-cpu-per-txn", "broker CPU per txn, ms (gross)", lambda m: m["broker_txn_ms"]),
    ("reader-cpu-per-txn", "reader threads' CPU per txn, ms (gross)",
     lambda m: m["reader_txn_ms"]),
    ("rest-per-partition", "at rest, worker + broker millicores per partition",
     lambda m: (m["worker_rest"] + m["broker_rest"]) / m["_width"] * 1000),
    ("worker-rss", "worker RSS at rest, MB", lambda m: m["rss_mb"]),
)


def plot(rows: list[dict], folder: Path) -> list[Path]:
    """One plot per measure against width (log scale), txnstream beside Kafka, into
    ``folder/scale-*.png``; [] without matplotlib (the ``bench`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    for r in rows:
        r["_m"]["_width"] = r["partitions"]
    out = []
    for name, label, value in PLOT_SPECS:
        fig, ax = plt.subplots(figsize=(6, 4))
        for system in ("txnstream", "Kafka read_committed"):
            pts = sorted((r["partitions"], value(r["_m"])) for r in rows if r["system"] == system)
            pts = [(x, y) for x, y in pts if y == y and not math.isinf(y)]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=system)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("partitions")
        ax.set_ylabel(label)
        ax.set_title(f"{label} against width")
        ax.legend()
        ax.grid(True, alpha=0.3)
        out.append(save_figure(fig, folder / f"scale-{name}.png"))
    return out
