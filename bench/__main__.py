"""``python -m bench`` (``make bench``): every benchmark, side by side, one run, one broker.

Writes the results between the markers in BENCHMARKS.md (the hand-written analysis
around them is kept), with the command, the date and the machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.common import fresh_config, machine

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
console = Console()


def _md_table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)\n"
    cols = list(rows[0])
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
    for c in rows[0]:
        t.add_column(c)
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r.values()))
    console.print(t)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--only", choices=("coordinator", "buffer", "processor", "spark"),
                    action="append")
    ap.add_argument("--txns", type=int, default=2000, help="txns per coordinator measurement")
    ap.add_argument("--records", type=int, default=100_000, help="records for buffer benches")
    ap.add_argument("--latency-txns", type=int, default=300,
                    help="10-record txns per produce-to-visible measurement (buffer)")
    ap.add_argument("--cpu-window", type=float, default=20.0,
                    help="seconds of each worker-CPU window (buffer)")
    args = ap.parse_args(argv)
    which = args.only or ["coordinator", "buffer", "processor", "spark"]
    bootstrap = os.environ.get("TXNSTREAM_BOOTSTRAP")
    cluster = None
    if not bootstrap:
        from tests.conftest import _free_port_pair
        from txnstream.cluster import LocalCluster

        cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="txnstream-bench-")),
                               port=_free_port_pair(), heap="1g")
        cluster.up()
        bootstrap = cluster.bootstrap
    sections: list[tuple[str, list[dict]]] = []
    try:
        if "coordinator" in which:
            from bench import coordinator

            with console.status("coordinator: begin + add-partition + commit ..."):
                rows = coordinator.run(fresh_config(bootstrap), total=args.txns,
                                       progress=lambda r: console.print(r))
            sections.append(("Coordinator (issue 3): begin + add partition + commit", rows))
            _show(sections[-1][0], rows)
        if "buffer" in which:
            from bench import buffer, worker_cpu

            cfg = fresh_config(bootstrap)
            with console.status("buffer: produce / consume / visibility ..."):
                rows = buffer.run(cfg, records=args.records, txns=args.latency_txns,
                                  progress=lambda r: console.print(r))
            with console.status("buffer: worker CPU, 1 and 4 subscriptions ..."):
                rows += worker_cpu.run(cfg, window_s=args.cpu_window,
                                       progress=lambda r: console.print(r))
            sections.append(("Transactional produce and committed-only consume (issue 4)", rows))
            _show(sections[-1][0], rows)
        if "processor" in which:
            from bench import processor

            with console.status("processor: exactly-once vs at-least-once vs Kafka EOS ..."):
                rows = processor.run(fresh_config(bootstrap), progress=lambda r: console.print(r))
            sections.append(("Exactly-once consume-transform-produce (issue 5)", rows))
            _show(sections[-1][0], rows)
        if "spark" in which:
            try:
                from bench import spark_bench
            except ImportError:
                spark_bench = None
            if spark_bench is not None:
                rows = spark_bench.run(fresh_config(bootstrap))
                sections.append(("Spark source and sink (issue 6)", rows))
                _show(sections[-1][0], rows)
    finally:
        if cluster is not None:
            cluster.down()
    path = Path("BENCHMARKS.md")
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
    body = [BEGIN, ""] + [f"### {title}\n\n{text}" for title, text in kept.items()] + [END]
    path.write_text(head + "\n".join(body) + tail)
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
