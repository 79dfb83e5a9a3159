"""Honest commit latency in the run's quiet phase and in its flood phase (issue 34 Show).

The hostile profile's flood actors (:mod:`chaos.roles.flooder`) idle for the first part
of the workload, then flood. The harness logs a ``phase`` truth event ``quiet`` when the
workload starts and ``end`` when it ends; the flooder logs ``flood`` when it starts
flooding. An honest producer's ``end`` event of a plain commit carries ``t0`` (just
before ``commit()``) and ``t`` (once it returned or raised): its latency is ``t - t0``,
whatever the outcome (a timed-out commit is the slowest of all). A commit belongs to the
phase its ``t0`` falls in.

The rule: with at least :data:`MIN_COMMITS` commits in each phase, a flood p99 above
:data:`MAX_RATIO` times the quiet p99 is a ``flood_latency`` anomaly; with fewer, the
figures are reported and nothing is judged.

The commits judged are those clear of the nemesis's faults (a fault's window and the
:data:`FAULT_SETTLE_S` after it); with no faults, that is every commit. A commit that
waits out a broker kill takes as long as the kill (23-76 s in the hostile soak), so the
p99 of every commit measures which phase drew the longer kills, not the flood: in the
hostile soaks of seeds 57 and 58 it gave 8.2 and 3.3 by every commit against 0.20 and
0.65 clear of faults. Every commit's figures are still reported (``all_commits``), and
what faults cost is judged elsewhere (``txn_open_past_timeout``, the drain, the bounds).
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["MIN_COMMITS", "MAX_RATIO", "COMMIT_WANTS", "CLOCK_STEP_S", "ClockWatch",
           "commit_samples", "phase_bounds", "split", "percentile", "judge", "summarize",
           "slowest"]

MIN_COMMITS = 50
"""Commits a phase needs for its p99 to be judged: with fewer, p99 is one outlier."""
MAX_RATIO = 2.0
"""Flood p99 over quiet p99 allowed (issue 34's Show)."""
FAULT_SETTLE_S = 10.0
"""After a fault heals, commits still wait on it: a new owner takes a TC after the 6 s
session timeout, a broker back in the cluster takes its leaderships back."""
SLOWEST = 5
"""Slowest commits of each phase kept in the summary (to read against the fault log)."""
CLOCK_STEP_S = 1.0
"""A change this large of the wall clock against the monotonic one is a step of it."""
PROBE_LOOKBACK_S = 60.0
"""How far before a commit a probe write may have started and still overlap it (a write
waits at most 30 s, :data:`chaos.probe.PROBE_TIMEOUT_S`)."""
COMMIT_WANTS = ("commit", "late")
"""Producer txns whose opener calls ``commit()`` on an open txn right away (``slow``
commits after its timeout on purpose; ``foreign`` after its peer committed)."""


class ClockWatch:
    """Steps of the wall clock against the monotonic one, as faults of the machine.

    The roles time commits on the wall clock (one clock for every process), the nemesis
    its faults on the monotonic one. A VM paused and resumed has every process stand
    still while the wall clock goes on: seed 72's stepped 22 s in its 14th minute, and
    every later fault was judged 22 s before it happened. Such a step is a fault of its
    own: timeouts measured on the wall clock (group sessions on the brokers, txn
    deadlines) expire at once. :meth:`check` (every second or so) notes one as a
    ``clock_step`` fault whose window covers the step and the interval it fell in.
    """

    def __init__(self, wall: Callable[[], float] = time.time,
                 mono: Callable[[], float] = time.monotonic) -> None:
        self._wall, self._mono = wall, mono
        self.steps: list[dict[str, Any]] = []
        self._last = (wall(), mono())

    def check(self) -> bool:
        """Note a step since the last check; whether there was one."""
        wall, mono = self._wall(), self._mono()
        step = (wall - mono) - (self._last[0] - self._last[1])
        if abs(step) >= CLOCK_STEP_S:
            since = max(wall - self._last[0], mono - self._last[1])
            self.steps.append({"kind": "clock_step", "role": "machine", "target": "clock",
                               "pid": None, "at": None, "wall_at": wall - since,
                               "duration_s": since, "step_s": round(step, 3),
                               "error": None})
        self._last = (wall, mono)
        return abs(step) >= CLOCK_STEP_S


def commit_samples(ends: Iterable[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """``(start, seconds)`` of every honest ``commit()`` the ``end`` events time.

    The seconds are its monotonic duration (``dt``) where the event has one, else
    ``t - t0``.
    """
    out = []
    for e in ends:
        if e.get("want") in COMMIT_WANTS and not e.get("co") and "t0" in e and "t" in e:
            secs = float(e["dt"]) if "dt" in e else float(e["t"]) - float(e["t0"])
            out.append((float(e["t0"]), max(0.0, secs)))
    return out


def phase_bounds(phases: Iterable[Mapping[str, Any]]) -> dict[str, tuple[float, float]]:
    """``{"quiet": (from, to), "flood": (from, to)}`` from the ``phase`` events.

    Quiet runs from the workload's start to the flood's (or the end); the flood from its
    first ``flood`` event to the end. A phase with no events is left out.
    """
    first: dict[str, float] = {}
    for ev in phases:
        name, t = ev.get("phase"), ev.get("t")
        if isinstance(name, str) and isinstance(t, (int, float)):
            first[name] = min(first.get(name, math.inf), float(t))
    end = first.get("end", math.inf)
    out: dict[str, tuple[float, float]] = {}
    if "quiet" in first:
        out["quiet"] = (first["quiet"], min(first.get("flood", end), end))
    if "flood" in first:
        out["flood"] = (first["flood"], end)
    return out


def split(samples: Iterable[tuple[float, float]],
          bounds: Mapping[str, tuple[float, float]]) -> dict[str, list[float]]:
    """Latencies by phase (by start time); samples outside every phase are left out."""
    out: dict[str, list[float]] = {name: [] for name in bounds}
    for t0, secs in samples:
        for name, (lo, hi) in bounds.items():
            if lo <= t0 < hi:
                out[name].append(secs)
                break
    return out


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q`` percentile (0-100) by the nearest-rank method; None if empty."""
    xs = sorted(values)
    if not xs:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(xs)))
    return xs[rank - 1]


def judge(by_phase: Mapping[str, list[float]], min_commits: int = MIN_COMMITS,
          max_ratio: float = MAX_RATIO) -> dict[str, Any]:
    """Per phase commits, p50 and p99 (ms); the flood/quiet p99 ratio and the verdict.

    ``verdict``: ``ok``, ``flood_latency`` (an anomaly) or ``not judged: ...`` (why).
    """
    out: dict[str, Any] = {}
    for name in ("quiet", "flood"):
        xs = by_phase.get(name, [])
        out[name] = {"commits": len(xs)}
        for q in (50, 90, 99):
            v = percentile(xs, q)
            out[name][f"p{q}_ms"] = None if v is None else round(v * 1000, 1)
    q, f = out["quiet"]["p99_ms"], out["flood"]["p99_ms"]
    out["ratio"] = None if not q or f is None else round(f / q, 2)
    short = [n for n in ("quiet", "flood") if out[n]["commits"] < min_commits]
    if short:
        out["verdict"] = (f"not judged: {' and '.join(short)} phase had fewer than "
                          f"{min_commits} commits")
    elif out["ratio"] is None:
        out["verdict"] = "not judged: no quiet p99"
    else:
        out["verdict"] = "flood_latency" if out["ratio"] > max_ratio else "ok"
    out["rule"] = f"flood p99 <= {max_ratio:g} x quiet p99, each phase >= {min_commits} commits"
    return out


def summarize(ends: Iterable[Mapping[str, Any]], phases: Iterable[Mapping[str, Any]],
              faults: Iterable[Mapping[str, Any]] = (),
              probe: Iterable[tuple[float, float]] | None = None,
              cpu: Iterable[tuple[float, float, float, float]] = ()) -> dict[str, Any]:
    """:func:`judge` of the honest commits clear of ``faults``, by phase.

    ``faults`` (the nemesis's, from ``wall_at`` on the wall clock, else ``at`` seconds
    after the quiet phase's start, for ``duration_s``; and :class:`ClockWatch`'s steps):
    a commit that overlaps one of them, or the :data:`FAULT_SETTLE_S` after it, is left
    out of the verdict. ``all_commits`` has the same figures for every
    commit, faults included (for reading: the verdict does not use them).

    ``probe``: ``(start, seconds)`` of the cluster's own writes (:mod:`chaos.probe`),
    judged by the same rule clear of the same faults and reported as ``kafka_probe``
    beside the verdict, which does not use them; each of ``slowest_judged`` gets the
    slowest probe write that overlapped it (``probe_max_ms``). ``cpu``: ``(start,
    seconds, busy, steal)`` of the machine's cores (:attr:`chaos.probe.KafkaProbe.cpu`):
    each phase's mean over the intervals clear of faults (``kafka_probe.cpu``), and the
    busiest interval around each slowest judged commit (``cpu_busy``).
    """
    ends = list(ends)
    bounds = phase_bounds(phases)
    samples = commit_samples(ends)
    start = bounds["quiet"][0] if "quiet" in bounds else 0.0
    froms = [float(f["wall_at"]) if f.get("wall_at") is not None else start + float(f["at"])
             for f in faults]
    windows = [(lo, lo + float(f["duration_s"]) + FAULT_SETTLE_S)
               for lo, f in zip(froms, faults, strict=True)]
    def is_clear(t0: float, secs: float) -> bool:
        return not any(lo < t0 + secs and t0 < hi for lo, hi in windows)

    clear = [(t0, secs) for t0, secs in samples if is_clear(t0, secs)]
    out = judge(split(clear, bounds))
    out["judged"] = (f"the {len(clear)} of {len(samples)} commits clear of the "
                     f"{len(windows)} faults (each fault's window + {FAULT_SETTLE_S:g} s)")
    out["all_commits"] = {k: v for k, v in judge(split(samples, bounds)).items()
                          if k in ("quiet", "flood", "ratio")}
    out["phases"] = {k: [round(lo, 3), None if hi == math.inf else round(hi, 3)]
                     for k, (lo, hi) in bounds.items()}
    out["slowest"] = slowest(ends, bounds)
    # the ones the verdict counts: to read against the workers' slow-request lines
    out["slowest_judged"] = slowest([e for e in ends if any(
        is_clear(t0, secs) for t0, secs in commit_samples([e]))], bounds)
    if probe is not None:
        writes = sorted(probe)
        judged = judge(split([w for w in writes if is_clear(*w)], bounds))
        out["kafka_probe"] = {k: v for k, v in judged.items()
                              if k in ("quiet", "flood", "ratio")}
        out["kafka_probe"]["writes"] = len(writes)
        cores = sorted(cpu)
        if cores:
            out["kafka_probe"]["cpu"] = _cpu_by_phase(
                [c for c in cores if is_clear(c[0], c[1])], bounds)
        for row in (r for rows in out["slowest_judged"].values() for r in rows):
            lo, secs = start + row["at_s"], row["secs"]
            row["probe_max_ms"] = _slowest_overlap(writes, lo, secs)
            if cores:
                busy = [b for t, d, b, _ in cores if t < lo + secs and lo < t + d]
                row["cpu_busy"] = max(busy) if busy else None
    return out


def _cpu_by_phase(cores: list[tuple[float, float, float, float]],
                  bounds: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
    """Per phase, the mean share of the cores busy and stolen; how often all were busy.

    ``saturated_share``: the share of its intervals with 90 % or more of the cores busy.
    """
    out: dict[str, Any] = {}
    for name, (lo, hi) in bounds.items():
        mine = [(b, st) for t, _d, b, st in cores if lo <= t < hi]
        if mine:
            out[name] = {"intervals": len(mine),
                         "busy_mean": round(sum(b for b, _ in mine) / len(mine), 3),
                         "steal_mean": round(sum(st for _, st in mine) / len(mine), 3),
                         "saturated_share": round(sum(b >= 0.9 for b, _ in mine) / len(mine), 3)}
    return out


def _slowest_overlap(writes: list[tuple[float, float]], t0: float,
                     secs: float) -> float | None:
    """The longest of ``writes`` (sorted by start) that overlapped ``[t0, t0 + secs]``, ms."""
    i = bisect.bisect_left(writes, (t0 - PROBE_LOOKBACK_S,))
    over = [s for lo, s in writes[i:bisect.bisect_right(writes, (t0 + secs, math.inf))]
            if lo + s >= t0]
    return round(max(over) * 1000, 1) if over else None


def slowest(ends: Iterable[Mapping[str, Any]], bounds: Mapping[str, tuple[float, float]],
            n: int = SLOWEST) -> dict[str, list[dict[str, Any]]]:
    """Per phase, its ``n`` slowest commits: when (s after the quiet start), how long, how."""
    start = min((lo for lo, _ in bounds.values()), default=0.0)
    out: dict[str, list[dict[str, Any]]] = {}
    timed = [e for e in ends if commit_samples([e])]
    for name, (lo, hi) in bounds.items():
        mine = sorted((e for e in timed if lo <= float(e["t0"]) < hi),
                      key=lambda e: float(e["t0"]) - float(e["t"]))[:n]
        out[name] = [{"at_s": round(float(e["t0"]) - start, 1),
                      "secs": round(float(e["t"]) - float(e["t0"]), 2),
                      "txn": e.get("txn"), "by": e.get("by"), "outcome": e.get("outcome"),
                      "error": (e.get("error") or "")[:200]} for e in mine]
    return out
