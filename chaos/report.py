"""The run's result: rich tables on the terminal and one JSON summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["print_summary", "write_summary"]


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> Table:
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    return t


def print_summary(console: Console, s: dict[str, Any]) -> None:
    """The summary as tables: run, faults, txns and records, bounds, anomalies."""
    ph = s.get("phases_s", {})
    console.print(_table(f"chaos run: profile {s['profile']}, seed {s['seed']}", ("", ""), [
        ("duration", f"{s.get('duration_s', 0):.0f} s (" + ", ".join(
            f"{k} {v:.0f}" for k, v in ph.items()) + ")"),
        ("workdir", s.get("workdir")),
        ("error", s.get("error")),
    ]))
    faults = s.get("faults", {})
    console.print(_table("faults injected", ("kind", "count", "by target role"), [
        (k, n, ", ".join(f"{r}: {m}" for r, m in faults.get("by_role", {}).get(k, {}).items()))
        for k, n in faults.get("by_kind", {}).items()]))
    tx = s.get("txns", {})
    rec = s.get("records", {})
    console.print(_table("txns and records", ("what", "count"), [
        *((f"txns {k}", v) for k, v in tx.items()),
        *((f"records {k}", v) for k, v in rec.items()),
        *((k.replace("_", " "), v) for k, v in s.get("notes", {}).items()),
        ("process restarts (nemesis)", s.get("processes", {}).get("restarts")),
        ("process exits nobody caused", s.get("processes", {}).get("unexpected_exits")),
    ]))
    console.print(_table("bounds", ("what", "measured", "bound", "ok"), [
        (k, b["value"], b["bound"], "yes" if b["ok"] else "[red]NO[/]")
        for k, b in s.get("bounds", {}).items()]))
    lat = s.get("commit_latency")
    if lat:
        every = lat.get("all_commits") or {}
        console.print(_table(f"honest commit latency ({lat.get('rule')}; judged: "
                             f"{lat.get('judged', 'every commit')})",
                             ("phase", "commits", "p50 ms", "p99 ms"),
                             [(ph, lat[ph]["commits"], lat[ph]["p50_ms"], lat[ph]["p99_ms"])
                              for ph in ("quiet", "flood")]
                             + [("flood/quiet p99", None, None, lat.get("ratio")),
                                ("verdict", None, None, lat.get("verdict"))]
                             + [(f"{ph}, every commit (faults included)", every[ph]["commits"],
                                 every[ph]["p50_ms"], every[ph]["p99_ms"])
                                for ph in ("quiet", "flood") if ph in every]
                             + [("flood/quiet p99, every commit", None, None,
                                 every.get("ratio"))] * bool(every)
                             + _probe_rows(lat.get("kafka_probe"))))
    an = s.get("anomalies")
    if an is None:
        console.print(f"[bold red]no verdict[/]: the run did not finish ({s.get('error')})")
        return
    if not an:
        console.print("[bold green]0 anomalies[/]")
        return
    t = _table(f"{s['anomaly_count']} anomalies", ("kind", "count", "detail", "one example",
                                                    "likely issue 11 item"), [
        (k, a["count"], "; ".join(f"{w}: {n}" for w, n in a["detail"].items()),
         json.dumps(a["examples"][0], default=str)[:300] if a["examples"] else "",
         a["maps_to"]) for k, a in an.items()])
    console.print(t)


def _probe_rows(probe: dict[str, Any] | None) -> list[tuple[Any, ...]]:
    """The cluster's own writes (``chaos.probe``), judged like the commits."""
    if not probe:
        return []
    return [(f"{ph}, Kafka's own acks=all write (probe)", probe[ph]["commits"],
             probe[ph]["p50_ms"], probe[ph]["p99_ms"]) for ph in ("quiet", "flood")
            if ph in probe] + [("flood/quiet p99, Kafka's own write", None, None,
                                probe.get("ratio"))]


def write_summary(path: Path, s: dict[str, Any]) -> None:
    """The JSON summary (written atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(s, indent=2, default=str))
    tmp.replace(path)
