"""CPU time of the processes a benchmark runs on, per group: this client process, the
``txnstream worker`` processes with their children (the buffer role's child process),
and the broker JVMs of the local cluster.

Each process's CPU is utime + stime of ``/proc/<pid>/stat`` (all its threads). A window
(:meth:`CpuMeter.window`):

1. waits until the workers and the broker are at rest, so what the last measurement
   left them to do is not counted here;
2. samples every process and runs the measured code (its timing window);
3. waits until the workers and the broker are at rest again, so the work the measured
   code handed them and they finish after it returned (markers, folding) *is* counted;
4. counts each group's CPU from step 2 to the first of the calm steps that ended the
   wait, less, for the time between the code's return and those steps, the group's rate
   in the calm steps: the timing window (idle use included) plus the work beyond idle
   that followed it. When the code left nothing behind, that is exactly the timing
   window.

"At rest": :data:`QUIET_STEPS` steps of :data:`QUIET_STEP_S` in a row in which the
workers and the broker used at most their idle rate (:meth:`CpuMeter.measure_idle`, once,
the median of a few seconds) plus :data:`QUIET_MARGIN_CORES`. A worker's children are
looked up (psutil) at each sample; a process that started in the window counts from
zero, one that ended in it is lost (none does in these benches). ``broker=None`` (an
external broker): that group is not measured (NaN).

Of the broker's CPU, its JIT compiler threads' is also counted apart (``jit``): a fresh
broker compiles for minutes, and a loop that exercises more broker code pays more of it
(stop 58: in a first window the compiler threads took more than the request threads). It
is a lower bound: the JVM ends compiler threads it no longer needs, and a thread that
ended within a window takes its part of that window with it.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil

CLK_TCK = os.sysconf("SC_CLK_TCK")
GROUPS = ("client", "worker", "broker")
JIT = "jit"
"""The broker's compiler threads (part of ``broker``): :func:`jit_seconds`."""
JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")
"""A HotSpot compiler thread's name as ``/proc/<pid>/task/<tid>/comm`` has it (15 chars)."""
QUIET_STEP_S = 0.5
QUIET_STEPS = 2
"""Two quiet steps in a row: one lull in the middle of a commit is not the end."""
QUIET_MARGIN_CORES = 0.1
"""Above the idle rate, the slack of 'at rest': 10% of a core. At rest the broker's use
beside an idle worker varies by about 5% of a core from one second to the next (and one
clock tick, ``CLK_TCK`` = 100, is 2% of a core in a 0.5 s step); the work a window
leaves behind (markers, folding) takes far more."""
QUIET_TIMEOUT_S = 15.0
"""Give up waiting for rest after this long (the window then counts what it has)."""
RESTED_S = 0.2
"""A window starting this soon after the last wait found rest does not wait again."""
IDLE_STEP_S = 1.0
IDLE_STEPS = 5
"""The idle rate: the median of 5 steps of 1 s (1% of a core is one clock tick)."""


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def jit_seconds(pid: int, proc: str = "/proc") -> dict[int, float]:
    """Thread id -> utime + stime, in seconds, of each JIT compiler thread of JVM ``pid``."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{proc}/{pid}/task/{tid}/comm") as f:
                if f.read().strip() not in JIT_THREADS:
                    continue
            with open(f"{proc}/{pid}/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:  # ended since it was listed
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def with_children(pids: Sequence[int]) -> list[int]:
    """``pids`` and every live descendant of each."""
    out = []
    for pid in pids:
        try:
            out += [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
        except psutil.NoSuchProcess:
            pass
    return out


def jit_text(seconds: float, records: int) -> str:
    """The broker's compiler threads in µs per record (``n/m``: not measured)."""
    return "n/m" if math.isnan(seconds) or not records else f"{seconds / records * 1e6:.1f}"


def cpu_text(cpu: dict[str, float]) -> str:
    """``client / worker / broker`` microseconds per record (``n/m``: not measured)."""
    return " / ".join("n/m" if math.isnan(cpu[g]) else f"{cpu[g]:.1f}" for g in GROUPS)


@dataclass
class CpuUse:
    """CPU seconds per group over one window (NaN: the group is not measured)."""

    seconds: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    """From the start to the calm steps that ended the wait for rest."""
    settle_s: float = 0.0
    """Of ``wall_s``, the part after the measured code returned (the work it left)."""

    @property
    def total(self) -> float:
        """All measured groups (a group not measured counts as 0; ``jit`` is the broker's)."""
        return sum(v for g, v in self.seconds.items() if g in GROUPS and not math.isnan(v))

    def __add__(self, other: CpuUse) -> CpuUse:
        return CpuUse({g: self.seconds.get(g, 0.0) + other.seconds.get(g, 0.0)
                       for g in (*GROUPS, JIT)},
                      self.wall_s + other.wall_s, self.settle_s + other.settle_s)


Sample = dict[str, dict[int, float]]
"""Group -> pid -> CPU seconds so far (``jit``: broker compiler thread id -> seconds)."""


@dataclass(frozen=True)
class Rest:
    """The end of a wait for rest: its calm steps ran from ``start`` (sampled at
    ``t_start``) to ``end`` (at ``t_end``)."""

    start: Sample
    t_start: float
    end: Sample
    t_end: float
    reached: bool
    """False: the wait timed out; its last steps stand in for the calm ones."""


class CpuMeter:
    """Samples the CPU of the client (this process), the workers and the broker."""

    def __init__(self, workers: Sequence[int], broker: Sequence[int] | None,
                 client: int | None = None) -> None:
        self.roots = {"client": [client or os.getpid()], "worker": list(workers),
                      "broker": None if broker is None else list(broker)}
        self.idle: dict[str, float] | None = None
        """Group -> cores used at rest (:meth:`measure_idle`)."""
        self.timeouts = 0
        """Waits for rest that timed out."""
        self._rested_at = -math.inf
        """When :meth:`quiet` last found them at rest (monotonic)."""

    def sample(self) -> Sample:
        """Group -> pid -> CPU seconds so far (the broker group empty if not measured)."""
        out: Sample = {}
        for group, roots in self.roots.items():
            pids = [] if roots is None else (
                roots if group == "client" else with_children(roots))
            out[group] = {}
            for pid in pids:
                try:
                    out[group][pid] = cpu_seconds(pid)
                except OSError:  # ended since it was listed
                    pass
        out[JIT] = {tid: v for pid in out["broker"] for tid, v in jit_seconds(pid).items()}
        return out

    def _delta(self, a: Sample, b: Sample) -> dict[str, float]:
        """Each group's CPU seconds from ``a`` to ``b``; ``jit``: of the compiler threads
        alive at both (one started since counts from zero)."""
        out = {g: float("nan") if self.roots[g] is None
               else sum(v - a[g].get(pid, 0.0) for pid, v in b[g].items())
               for g in GROUPS}
        out[JIT] = float("nan") if self.roots["broker"] is None else \
            sum(v - a[JIT].get(tid, 0.0) for tid, v in b[JIT].items())
        return out

    def _background(self, a: Sample, b: Sample) -> float:
        """Workers + broker CPU seconds from ``a`` to ``b``: what :meth:`quiet` watches."""
        d = self._delta(a, b)
        return d["worker"] + (0.0 if math.isnan(d["broker"]) else d["broker"])

    def measure_idle(self) -> dict[str, float]:
        """Each group's CPU at rest, in cores: the median of :data:`IDLE_STEPS` steps of
        :data:`IDLE_STEP_S` (its background part sets what :meth:`quiet` calls rest)."""
        steps: list[dict[str, float]] = []
        a = self.sample()
        for _ in range(IDLE_STEPS):
            time.sleep(IDLE_STEP_S)
            b = self.sample()
            steps.append({g: v / IDLE_STEP_S for g, v in self._delta(a, b).items()})
            a = b
        self.idle = {g: statistics.median(st[g] for st in steps) for g in (*GROUPS, JIT)}
        return self.idle

    def quiet(self, timeout_s: float = QUIET_TIMEOUT_S) -> Rest:
        """Wait until the workers and the broker are at rest."""
        if self.idle is None:
            self.measure_idle()
        assert self.idle is not None
        idle = sum(v for g, v in self.idle.items()
                   if g in ("worker", "broker") and not math.isnan(v))
        limit = (idle + QUIET_MARGIN_CORES) * QUIET_STEP_S
        t0 = time.monotonic()
        samples = [(self.sample(), t0)]
        calm = 0
        while calm < QUIET_STEPS and time.monotonic() - t0 < timeout_s:
            time.sleep(QUIET_STEP_S)
            samples.append((self.sample(), time.monotonic()))
            calm = calm + 1 if self._background(samples[-2][0], samples[-1][0]) <= limit \
                else 0
        reached = calm >= QUIET_STEPS
        if reached:
            self._rested_at = time.monotonic()
        else:
            self.timeouts += 1
        (start, t_start), (end, t_end) = samples[-1 - QUIET_STEPS], samples[-1]
        return Rest(start, t_start, end, t_end, reached)

    @contextmanager
    def window(self) -> Iterator[CpuUse]:
        """Measure the CPU of the ``with`` body and of the work it left behind; the
        :class:`CpuUse` is filled in when the block ends."""
        use = CpuUse()
        if time.monotonic() - self._rested_at > RESTED_S:  # else the last window's wait holds
            self.quiet()
        a, t0 = self.sample(), time.monotonic()
        yield use
        t_body = time.monotonic()
        rest = self.quiet()
        # the body's window and the work after it: to the calm steps, less their rate
        # for the time between the body's end and them (that part's idle use)
        rest_s = rest.t_end - rest.t_start
        rate = {g: v / rest_s for g, v in self._delta(rest.start, rest.end).items()}
        tail = max(0.0, rest.t_start - t_body)
        use.seconds = {g: v - rate[g] * tail
                       for g, v in self._delta(a, rest.start).items()}
        use.wall_s, use.settle_s = rest.t_start - t0, tail
