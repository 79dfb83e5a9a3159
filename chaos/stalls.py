"""Workers that stood still: the stall watch's dumps in their logs, against the pauses.

A worker (and its buffer child) writes every thread's stack when none of its Python
threads ran for 5 s (:mod:`txnstream.stallwatch`): ``Timeout (0:00:05)!``, then one
``Thread 0x...`` block per thread, the one that held the interpreter lock first. The
nemesis's SIGSTOP makes one such dump when the process is continued. A dump that no
pause of that worker explains is a ``worker_stalled`` anomaly: the whole process stood
still (seed 57's idle hold), and the dump says where.

A dump is explained when a pause of the same worker ended between the last timestamped
log line before it and the first one after it (with :data:`SLACK_S` either side: the
nemesis's clock starts with the workload, within a second of the harness's ``quiet``
phase event). Not "the pause lies between them": when the process is continued, a
thread may log a line before the timer's thread writes the dump (seed 61: 12 of 61
dumps).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

__all__ = ["SLACK_S", "Stall", "find_stalls", "unexplained"]

SLACK_S = 3.0
DUMP = "Timeout (0:00:"
_PY = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")
_RDKAFKA = re.compile(r"%\d\|(\d+\.\d+)\|")
_LOOK = 400
"""Lines searched on each side of a dump for a timestamp (a dump of ~40 threads)."""


@dataclass(frozen=True, slots=True)
class Stall:
    """One dump: the log's times around it, and the first thread's frames."""

    before: float | None
    after: float | None
    frames: list[str] = field(default_factory=list)
    """The first thread's frames, innermost first (the thread that held the lock)."""


def _time(line: str) -> float | None:
    """A log line's time (Python logging's local time, taken as UTC, or librdkafka's)."""
    m = _PY.match(line)
    if m:
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        return t.timestamp() + int(m.group(2)) / 1000
    m = _RDKAFKA.match(line)
    return float(m.group(1)) if m else None


def find_stalls(text: str) -> list[Stall]:
    """Every stall-watch dump in a log."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.startswith(DUMP):
            continue
        before = next((t for t in map(_time, reversed(lines[max(0, i - _LOOK):i]))
                       if t is not None), None)
        after = next((t for t in map(_time, lines[i + 1:i + 1 + _LOOK]) if t is not None),
                     None)
        frames = []
        for nxt in lines[i + 2:i + 2 + 60]:  # the first thread's block
            if not nxt.startswith("  File "):
                break
            frames.append(nxt.strip())
        out.append(Stall(before, after, frames))
    return out


def unexplained(stalls: Iterable[Stall], pauses: Iterable[tuple[float, float]],
                slack_s: float = SLACK_S) -> list[Stall]:
    """The stalls no pause ``(start, end)`` (wall-clock seconds) of the process explains."""
    pauses = list(pauses)
    out = []
    for s in stalls:
        lo = s.before if s.before is not None else float("-inf")
        hi = s.after if s.after is not None else float("inf")
        if not any(start < hi and lo - slack_s <= end <= hi + slack_s
                   for start, end in pauses):
            out.append(s)
    return out
