"""Issue 37's other axes at one width: readers, workers and coordinators.

``python -m bench.scale_axes --partitions 256 --readers 1 2 4 8 --workers 1 2 3
--coordinators 4 32 [--out FILE]`` (``TXNSTREAM_BOOTSTRAP=host:port`` for an existing
broker; else one local broker, KRaft, 1 GB heap, is started and its JVM measured too).

Each point is ``bench.scale``'s steady load and first-delivery rounds at one width, with
one setting moved from the base (1 reader, 1 worker, 4 coordinators) at a time:

* **readers**: committed-only subscriptions, each reading every txn (fan-out, the
  broker's and the buffer state's cost per reader); Kafka beside it with as many
  ``read_committed`` consumers, each its own group. Latencies are pooled over readers.
* **workers**: ``txnstream worker`` processes sharing the TC partitions and buffer
  slots; their CPU is summed (Kafka's row is the same anchor at each point).
* **coordinators**: TC partitions (``Config.num_coordinators``) on one worker.

The readers live in this process (threads), as the bench's do elsewhere; the client's
CPU is not in the figures. Not part of ``python -m bench`` (minutes per point).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.__main__ import _md_table, _show
from bench.common import machine, plots_line, publish, run_broker, run_line, save_figure
from bench.scale import COST, PLOTS, VISIBILITY, console, one_width

BASE = {"readers": 1, "n_workers": 1, "coordinators": 4}
AXES = (("readers", "readers"), ("workers", "n_workers"), ("coordinators", "coordinators"))


def points(args: argparse.Namespace) -> list[tuple[str, int, dict[str, int]]]:
    """(axis, value, one_width's settings) for every point; the base point once."""
    out: list[tuple[str, int, dict[str, int]]] = []
    seen: set[tuple[int, ...]] = set()
    for axis, key in AXES:
        for v in getattr(args, axis) or []:
            settings = {**BASE, key: v}
            sig = tuple(settings.values())
            if sig in seen:
                continue
            seen.add(sig)
            out.append((axis, v, settings))
    return out


def plot(rows: list[dict], folder: Path, tag: str = "", where: str = "") -> list[Path]:
    """Per axis: p99, broker and worker cores at rest, broker CPU per txn against the
    axis' value, txnstream beside Kafka (``tag`` ends the files' names, ``where`` the
    titles); [] without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    measures = (("p99", "produce-to-visible p99, ms"),
                ("broker_rest", "broker cores at rest"),
                ("worker_rest", "worker cores at rest (all workers)"),
                ("broker_txn_ms", "broker CPU per txn, ms (gross)"))
    out = []
    for axis, _ in AXES:
        mine = [r for r in rows if r["axis"] == axis or r["axis"] == "base"]
        if len({r["value"] for r in mine}) < 2:
            continue
        fig, axs = plt.subplots(1, len(measures), figsize=(4 * len(measures), 3.6))
        for ax, (key, label) in zip(axs, measures, strict=True):
            for system in ("txnstream", "Kafka read_committed"):
                pts = sorted((r["value"], r["_m"][key]) for r in mine if r["system"] == system
                             and key in r["_m"] and r["_m"][key] == r["_m"][key])
                if pts and not (system != "txnstream" and key == "worker_rest"):
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o",
                            label=system)
            ax.set_xlabel(axis)
            ax.set_ylabel(label)
            ax.grid(True, alpha=0.3)
        axs[0].legend()
        fig.suptitle(f"against {axis}, {rows[0]['partitions']} partitions{where}")
        out.append(save_figure(fig, folder / f"scale-{axis}{tag}.png"))
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale_axes")
    ap.add_argument("--partitions", type=int, default=256)
    ap.add_argument("--readers", type=int, nargs="*", default=[1, 2, 4, 8])
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2, 3])
    ap.add_argument("--coordinators", type=int, nargs="*", default=[4, 32])
    ap.add_argument("--rounds", type=int, default=1, help="first-delivery rounds per point")
    ap.add_argument("--window", type=float, default=20.0, help="steady-load window, s")
    ap.add_argument("--rest", type=float, default=15.0, help="at-rest window, s")
    ap.add_argument("--out", type=Path, default=None,
                    help="append the markdown section to this file (default: stdout)")
    ap.add_argument("--plots", type=Path, default=PLOTS)
    ap.add_argument("--brokers", type=int, choices=(1, 3), default=1,
                    help="brokers of the local cluster started for the run (3: every "
                         "topic replicated 3 times)")
    args = ap.parse_args(argv)
    rows: list[dict] = []
    with run_broker("txnstream-scale-", args.brokers) as rb:
        # warm-up: a fresh JVM's first minute
        one_width(rb.bootstrap, rb.pids, 4, 1, 5.0, 3.0, replication=args.brokers)
        for axis, v, settings in points(args):
            t0 = time.monotonic()
            base = settings == BASE
            for r in one_width(rb.bootstrap, rb.pids, args.partitions, args.rounds,
                               args.window, args.rest, replication=args.brokers,
                               **settings):
                r.update(axis="base" if base else axis, value=v, **{
                    k: settings[key] for k, key in AXES})
                rows.append(r)
            console.print(f"{axis} {v}: {time.monotonic() - t0:.0f} s")
    head = ("readers", "workers", "coordinators")
    vis = [{c: r[c] for c in head + VISIBILITY} for r in rows]
    cost = [{c: r[c] for c in head + COST if c != "partitions"} for r in rows]
    _show("Visibility", vis)
    _show("Cost", cost)
    on = "" if args.brokers == 1 else f", {args.brokers} brokers"
    tag = f"-{args.partitions}" + ("" if args.brokers == 1 else f"-{args.brokers}brokers")
    plots = plot(rows, args.plots, tag, on)
    publish(f"\n## Scale at {args.partitions} partitions{on}: readers, workers, coordinators "
            f"(issue 37)\n\n" + run_line("bench.scale_axes", argv, rb.load)
            + f"Machine: {machine()}; {rb.where()}; the steady load and windows of "
            "`bench.scale`, one setting moved from 1 reader, 1 worker, 4 coordinators at a "
            f"time.\n\n### Visibility\n\n{_md_table(vis)}\n### Cost\n\n{_md_table(cost)}\n"
            + plots_line(plots), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
