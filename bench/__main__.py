"""``python -m bench`` (``make bench``): every benchmark, side by side, one run, one broker.

Writes the results between the markers in BENCHMARKS.md (the hand-written analysis
around them is kept), with the command, the date and the machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import family_plots, issue22
from bench.common import discard_cluster, fresh_config, local_cluster, machine

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
console = Console()


def _columns(rows: list[dict]) -> list[str]:
    """The columns shown: the first row's keys, but those starting with ``_`` (figures kept
    for other tables, e.g. an unrounded ratio)."""
    return [c for c in rows[0] if not c.startswith("_")]


def _md_table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)\n"
    cols = _columns(rows)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in cols) + " |"
            for r in rows]
    return "\n".join(out) + "\n"


def _sections(block: str) -> dict[str, str]:
    """``### title`` -> its text, from the generated block of BENCHMARKS.md, in order."""
    out: dict[str, str] = {}
    for part in block.split("\n### ")[1:]:
        title, _, text = part.partition("\n")
        out[title.strip()] = text.strip("\n") + "\n"
    return out


def _show(title: str, rows: list[dict]) -> None:
    if not rows:
        return
    t = Table(title=title)
    cols = _columns(rows)
    for c in cols:
        t.add_column(c)
    for r in rows:
        t.add_row(*("" if r.get(c) is None else str(r.get(c)) for c in cols))
    console.print(t)


GROUPS = {"coordinator": ("txn-rate", "produce", "failover")}
"""``--only coordinator`` runs all of issue 13's coordinator-side measurements."""
PARTS = ("txn-rate", "produce", "failover", "buffer", "owner-scan", "processor", "spark")
PLOTS = Path("bench/plots")
PLOTS_TITLE = "Plots of the parts this run ran (bench/family_plots.py)"
ISSUE22 = "Issue 22 goals"
"""Every goal of issue 22 beside its anchor (bench.issue22); rewritten by every run, its
rows of the parts not run saying so."""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--only", choices=(*GROUPS, *PARTS), action="append",
                    help="run only these (repeatable); coordinator = txn-rate + produce + "
                         "failover")
    ap.add_argument("--bootstrap", default=os.environ.get("TXNSTREAM_BOOTSTRAP"),
                    help="an existing broker (default: $TXNSTREAM_BOOTSTRAP, else a local "
                         "cluster started for the run)")
    ap.add_argument("--txns", type=int, default=2000, help="txns per coordinator measurement")
    ap.add_argument("--produce-records", type=int, default=20_000,
                    help="1 KB records per transactional / plain produce measurement")
    ap.add_argument("--produce-rounds", type=int, default=3,
                    help="rounds of the produce variants (median reported)")
    ap.add_argument("--session-timeout-ms", type=int, default=None,
                    help="workers' session timeout in the failover bench (default: "
                         "bench.failover.SESSION_TIMEOUT_MS, 6000)")
    ap.add_argument("--processor-records", type=int, default=400_000,
                    help="input records per consume-transform-produce loop")
    ap.add_argument("--processor-rounds", type=int, default=3,
                    help="rounds of the three consume-transform-produce loops, in turn")
    ap.add_argument("--records", type=int, default=100_000, help="records for buffer benches")
    ap.add_argument("--latency-txns", type=int, default=300,
                    help="10-record txns per produce-to-visible measurement (buffer)")
    ap.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"),
                    help="the report whose generated section is rewritten")
    ap.add_argument("--cpu-window", type=float, default=20.0,
                    help="seconds of each worker-CPU window (buffer)")
    args = ap.parse_args(argv)
    which: set[str] = set()
    for name in args.only or PARTS:
        which.update(GROUPS.get(name, (name,)))
    bootstrap = args.bootstrap
    cluster = None
    if not bootstrap:
        cluster = local_cluster()
        bootstrap = cluster.bootstrap
    sections: list[tuple[str, list[dict]]] = []
    goals: list[dict] = []
    failed: list[str] = []
    results: dict[str, list[dict]] = {}
    """Part -> its rows, for issue 22's table (bench.issue22)."""

    def section(title: str, rows: list[dict]) -> None:
        sections.append((title, rows))
        _show(title, rows)

    def part(name: str, status: str, fn) -> None:
        """Run one part; a failure is reported and the other parts still run."""
        if name not in which:
            return
        try:
            with console.status(status):
                fn()
        except Exception:
            failed.append(name)
            console.print(f"[red]{name} failed[/red]")
            console.print_exception()

    def txn_rate() -> None:
        from bench import coordinator

        rows = coordinator.run(fresh_config(bootstrap), total=args.txns,
                               progress=lambda r: console.print(r))
        results["txn-rate"] = rows
        section("Coordinator (issue 3): begin + add partition + commit", rows)
        g = coordinator.goals(rows)
        goals.extend(g)
        section("Issue 13 goals: begin + one send + commit, vs Kafka's transactions", g)

    def produce() -> None:
        from bench import produce as prod

        broker = list(cluster.pids().values()) if cluster is not None else None
        rows = prod.run(fresh_config(bootstrap), records=args.produce_records,
                        rounds=args.produce_rounds, progress=lambda r: console.print(r),
                        broker_pids=broker)
        results["produce"] = rows
        section("Transactional vs plain produce, same txnstream Producer (issue 13)", rows)
        g = prod.goals(rows)
        goals.extend(g)
        section("Issue 13 goals: transactional vs plain produce", g)

    def failover() -> None:
        from bench import failover as fo

        ms = args.session_timeout_ms or fo.SESSION_TIMEOUT_MS
        rows = fo.run(fresh_config(bootstrap), session_timeout_ms=ms,
                      progress=lambda r: console.print(r))
        section("Coordinator failover: kill -9 of a TC owner under load (issue 13)",
                fo.table(rows))
        g = fo.goals(rows, ms)
        goals.extend(g)
        section("Issue 13 goals: failover", g)

    def buffer() -> None:
        from bench import buffer as buf
        from bench import worker_cpu

        cfg = fresh_config(bootstrap)
        rows = buf.run(cfg, records=args.records, txns=args.latency_txns,
                       progress=lambda r: console.print(r))
        results["buffer"] = rows
        rows += worker_cpu.run(cfg, window_s=args.cpu_window,
                               progress=lambda r: console.print(r))
        section("Transactional produce and committed-only consume (issue 4)", rows)

    def owner_scan() -> None:
        from bench import owner_scan as scan

        rows = scan.run(fresh_config(bootstrap), records=2 * args.records,
                        progress=lambda r: console.print(r))
        results["owner-scan"] = rows
        section("The buffer owner's read and fold: native scan vs Python (issue 35)", rows)

    def processor() -> None:
        from bench import processor as proc

        broker = list(cluster.pids().values()) if cluster is not None else None
        rows, cpu = proc.run(fresh_config(bootstrap), records=args.processor_records,
                             progress=lambda r: console.print(r), broker_pids=broker,
                             rounds=args.processor_rounds)
        results["processor"] = rows
        results["processor-cpu"] = cpu
        goals.extend(rows)
        section("Exactly-once consume-transform-produce (issue 5)", rows)
        section("Consume-transform-produce: CPU per record by process (issue 36)", cpu)
        curve = proc.sweep(fresh_config(bootstrap), args.processor_records,
                           proc.SWEEP_BATCHES, proc.SWEEP_INTERVALS,
                           progress=lambda r: console.print(r),
                           rounds=args.processor_rounds)
        plotted = proc.plot(curve, PLOTS / "processor.png")
        for r in curve:
            r["plot"] = "bench/plots/processor.png" if plotted else "matplotlib missing"
        section("Exactly-once vs at-least-once against batch size and commit interval "
                "(issue 36)", curve)

    def spark() -> None:
        try:
            from bench import spark_bench
        except ImportError:
            results["spark"] = []  # pyspark not installed: issue 22's rows say not measured
            return
        rows = spark_bench.run(fresh_config(bootstrap))
        results["spark"] = rows
        section("Spark source and sink (issue 6)", rows)

    try:
        part("txn-rate", "coordinator: begin + one send + commit ...", txn_rate)
        part("produce", "produce: transactional vs plain ...", produce)
        part("failover", "failover: kill -9 of a TC owner ...", failover)
        part("buffer", "buffer: produce / consume / visibility / worker CPU ...", buffer)
        part("owner-scan", "owner scan: native vs Python read and fold ...", owner_scan)
        part("processor", "processor: exactly-once vs at-least-once vs Kafka EOS ...",
             processor)
        part("spark", "spark: source and sink ...", spark)
    finally:
        if cluster is not None:
            discard_cluster(cluster)
    _show("Issue 13 goals, this run", goals)
    summary = issue22.table(results, failed)
    section(ISSUE22, summary)
    plots = family_plots.draw({**results, "goals": summary}, PLOTS)
    path = args.out
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    old, _, tail = rest.partition(END)
    run = (f"Run: `{' '.join(['python -m bench', *argv])}` on "
           f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC.  \n"
           f"Machine: {machine()}; one local broker (KRaft, 1 node, 1 GB heap) on "
           "the same machine as the clients and workers.\n")
    kept = _sections(old)  # a partial run (--only) keeps the other sections' last results
    for title, rows in sections:
        kept[title] = run + "\n" + _md_table(rows)
    if plots:  # the files are rewritten each run: the list of the last run's
        kept[PLOTS_TITLE] = run + "\n" + "".join(
            f"![{p.stem}]({p.as_posix()})\n" for p in plots)
    kept = {ISSUE22: kept.pop(ISSUE22), **kept}  # the summary first
    body = [BEGIN, ""] + [f"### {title}\n\n{text}" for title, text in kept.items()] + [END]
    path.write_text(head + "\n".join(body) + tail)
    console.print(f"wrote {path}")
    if failed:
        console.print(f"[red]failed: {', '.join(failed)} (their sections were not rewritten)"
                      "[/red]")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
