"""The nemesis: faults at random (seeded), overlapping across roles, each healed.

Faults (kind, target role):

- ``kill9`` of a coordinator worker, processor or consumer, restarted after a moment;
- ``pause`` (SIGSTOP, SIGCONT after ``pause_s``, longer than the session timeout, so the
  group moves the member's partitions and the member comes back as a zombie);
- ``broker_kill9``: kill -9 of one of the three brokers, restarted after a few seconds;
- with two-phase writers (:mod:`chaos.twophase`): ``kill9`` and ``pause`` of a writer,
  and ``postgres_kill9``: the database's postmaster and backends killed at once,
  restarted (crash recovery) after a moment.

Every ``fault_gap_s`` a new fault starts on a role that has none running: at most one
fault per role at a time (so one coordinator worker always runs, and one broker at most
is down), but a worker may be down while a processor is paused and a broker restarts.
The first faults are a shuffled deck holding every (kind, role) once, so even a short
run injects each; after that each is drawn at random. Every fault is healed (SIGCONT,
restart), also when the harness halts the nemesis in the middle of it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

from chaos.cluster import ChaosCluster
from chaos.postgres import PostgresServer
from chaos.profile import Profile
from chaos.supervisor import Supervisor

__all__ = ["Nemesis", "Fault", "FAULTS", "TWOPHASE_FAULTS"]

log = logging.getLogger(__name__)

FAULTS: tuple[tuple[str, str], ...] = (
    ("kill9", "worker"), ("kill9", "processor"), ("kill9", "consumer"),
    ("pause", "worker"), ("pause", "processor"), ("pause", "consumer"),
    ("broker_kill9", "broker"),
)
TWOPHASE_FAULTS: tuple[tuple[str, str], ...] = (
    ("kill9", "twophase"), ("pause", "twophase"), ("postgres_kill9", "postgres"),
)


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault."""

    kind: str
    role: str
    target: str
    pid: int | None
    at: float
    """Seconds since the nemesis started."""
    duration_s: float
    """Until healed (restarted, resumed, broker back in the cluster)."""
    error: str | None = None
    wall_at: float | None = None
    """``time.time()`` when it started: the clock the roles time commits on (``at`` is
    the monotonic one's, which a VM's pause does not advance: chaos.latency)."""


@dataclass
class _Active:
    kind: str
    role: str
    target: str
    pid: int | None
    started: float
    heal_at: float
    heal: Callable[[], None]
    background: bool = False
    """Heal in a thread (a broker restart waits for the cluster to list it)."""
    wall_started: float = 0.0


class Nemesis(threading.Thread):
    """Injects faults until :meth:`halt`; :attr:`faults` lists what it did."""

    def __init__(self, sup: Supervisor, cluster: ChaosCluster, profile: Profile, seed: int,
                 on_fault: Callable[[Fault], None] | None = None,
                 postgres: PostgresServer | None = None) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.sup = sup
        self.cluster = cluster
        self.profile = profile
        self.rng = random.Random(seed)
        self.faults: list[Fault] = []
        self.on_fault = on_fault
        self.postgres = postgres
        self.kinds = FAULTS + (TWOPHASE_FAULTS if postgres is not None else ())
        self._halt = threading.Event()
        self._t0 = time.monotonic()
        self._active: dict[str, _Active] = {}
        self._healing: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def halt(self) -> None:
        """Stop injecting; heal every running fault, then return from :meth:`run`."""
        self._halt.set()

    def counts(self) -> Counter[str]:
        """Faults by kind (healed ones)."""
        with self._lock:
            return Counter(f.kind for f in self.faults if f.error is None)

    def run(self) -> None:
        """Inject, heal, repeat; heal everything on halt (a profile without faults: wait)."""
        if not self.profile.faults:
            self._halt.wait()
            return
        deck = list(self.kinds)
        self.rng.shuffle(deck)
        next_at = time.monotonic() + self.rng.uniform(*self.profile.fault_gap_s)
        try:
            while not self._halt.is_set():
                now = time.monotonic()
                self._heal_due(now)
                if now >= next_at:
                    pick = self._pick(deck)
                    if pick is not None:
                        self._inject(*pick, deck)
                    next_at = now + self.rng.uniform(*self.profile.fault_gap_s)
                due = [a.heal_at for a in self._active.values()] + [next_at]
                self._halt.wait(max(0.05, min(due) - time.monotonic()))
        finally:
            self._heal_due(float("inf"))
            for th in list(self._healing.values()):
                th.join(180)

    def _busy(self) -> set[str]:
        return set(self._active) | {r for r, th in self._healing.items() if th.is_alive()}

    def _pick(self, deck: list[tuple[str, str]]) -> tuple[str, str] | None:
        busy = self._busy()
        for i, (_kind, role) in enumerate(deck):
            if role not in busy:
                return deck.pop(i)
        free = [f for f in self.kinds if f[1] not in busy]
        return self.rng.choice(free) if free else None

    def _inject(self, kind: str, role: str, deck: list[tuple[str, str]]) -> None:
        now, wall = time.monotonic(), time.time()
        p = self.profile
        try:
            if kind == "broker_kill9":
                node = self.rng.choice(self.cluster.node_ids())
                pid = self.cluster.node_pids().get(node)
                self.cluster.kill_node(node)
                act = _Active(kind, role, f"broker-{node}", pid, now,
                              now + self.rng.uniform(*p.broker_down_s),
                              lambda: self.cluster.start_node(node), background=True)
            elif kind == "postgres_kill9":
                pg = self.postgres
                assert pg is not None
                pid = pg.pid
                pg.kill9()
                act = _Active(kind, role, "postgres", pid, now,
                              now + self.rng.uniform(*p.restart_delay_s), pg.start,
                              background=True)
            else:
                name = self.rng.choice(self.sup.names(role))
                if kind == "kill9":
                    pid = self.sup.kill9(name)
                    act = _Active(kind, role, name, pid, now,
                                  now + self.rng.uniform(*p.restart_delay_s),
                                  lambda: self._restart(name))
                else:
                    pid = self.sup.pause(name)
                    act = _Active(kind, role, name, pid, now, now + p.pause_s,
                                  lambda: self.sup.resume(name))
                if pid is None:
                    # It died on its own: the monitor reports and restarts it.
                    self._record(Fault(kind, role, name, None, now - self._t0, 0.0,
                                       "target not running", wall))
                    deck.append((kind, role))  # try that one again later
                    return
        except Exception as exc:  # noqa: BLE001 - a failed fault is recorded, not fatal
            log.exception("fault %s/%s failed", kind, role)
            self._record(Fault(kind, role, "?", None, now - self._t0, 0.0, repr(exc), wall))
            deck.append((kind, role))
            return
        act.wall_started = wall
        self._active[role] = act

    def _restart(self, name: str) -> None:
        self.sup.start(name)

    def _heal_due(self, now: float) -> None:
        for role, act in list(self._active.items()):
            if act.heal_at > now:
                continue
            del self._active[role]
            if act.background:
                th = threading.Thread(target=self._heal, args=(act,), daemon=True,
                                      name=f"heal-{act.target}")
                self._healing[role] = th
                th.start()
            else:
                self._heal(act)

    def _heal(self, act: _Active) -> None:
        error = None
        try:
            act.heal()
        except Exception as exc:  # noqa: BLE001 - recorded with the fault
            log.exception("healing %s failed", act.target)
            error = f"heal failed: {exc!r}"
        self._record(Fault(act.kind, act.role, act.target, act.pid, act.started - self._t0,
                           time.monotonic() - act.started, error, act.wall_started))

    def _record(self, fault: Fault) -> None:
        with self._lock:
            self.faults.append(fault)
        if self.on_fault is not None:
            self.on_fault(fault)

    def as_dicts(self) -> list[dict[str, object]]:
        """The fault log, for the JSON summary."""
        with self._lock:
            return [asdict(f) for f in self.faults]
