"""Every process the harness starts: started, killed, paused, restarted, always reaped.

Each role process runs in its own session (``start_new_session=True``), so a signal to
its process group reaches it and nothing else. :meth:`Supervisor.cleanup` (called from
the harness's ``finally``, also on Ctrl-C) sends SIGCONT then SIGKILL to the group of
every process it ever started that may still run, by pid, never by name.

An exit the harness did not cause (no kill, no stop) is recorded as an
:class:`UnexpectedExit` with the tail of the process's log, and the process is started
again: a role that dies on its own is a finding (a paused consumer must carry on).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Supervisor", "RoleProc", "UnexpectedExit", "TXNSTREAM_BIN", "cleanup_workdir"]

log = logging.getLogger(__name__)

TXNSTREAM_BIN = str(Path(sys.executable).with_name("txnstream"))
PROJECT_ROOT = Path(__file__).resolve().parents[1]
PIDS_FILE = "pids.txt"
"""Every pid started, one per line, so a harness killed with -9 can be cleaned up after."""
STOP_GRACE_S = 20.0
"""SIGTERM grace: a producer ends its current txn (a slow one holds ~6 s) and exits."""


@dataclass(frozen=True, slots=True)
class UnexpectedExit:
    """A role process that exited without being told to."""

    name: str
    incarnation: int
    returncode: int
    at: float
    tail: str


@dataclass
class RoleProc:
    """One named role; a new incarnation per (re)start."""

    name: str
    role: str
    """``worker``, ``producer``, ``processor`` or ``consumer``."""
    argv: Callable[[int], list[str]]
    """The command line of incarnation ``n``."""
    log_path: Path
    incarnation: int = -1
    popen: subprocess.Popen[bytes] | None = None
    expected_exit: bool = False
    paused: bool = False
    started_at: float = 0.0
    history: list[int] = field(default_factory=list)
    """Pids of every incarnation."""
    env: dict[str, str] = field(default_factory=dict)
    """Added to the harness's environment (the role's line credentials)."""

    @property
    def pid(self) -> int | None:
        """The current incarnation's pid."""
        return self.popen.pid if self.popen is not None else None

    def alive(self) -> bool:
        """Whether the current incarnation runs."""
        return self.popen is not None and self.popen.poll() is None


class Supervisor:
    """Starts and signals the harness's role processes; thread-safe."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, RoleProc] = {}
        self.exits: list[UnexpectedExit] = []
        self.restarts = 0
        self._all: list[subprocess.Popen[bytes]] = []
        self._lock = threading.RLock()

    def add(self, name: str, role: str, argv: Callable[[int], list[str]],
            env: dict[str, str] | None = None) -> RoleProc:
        """Declare a role process (not started); ``env`` is added to its environment."""
        p = RoleProc(name, role, argv, self.log_dir / f"{name}.log", env=dict(env or {}))
        self.procs[name] = p
        return p

    def names(self, role: str) -> list[str]:
        """Names of a role's processes."""
        return [n for n, p in self.procs.items() if p.role == role]

    def start(self, name: str) -> RoleProc:
        """Start the next incarnation of ``name`` (which must not be running)."""
        with self._lock:
            p = self.procs[name]
            if p.alive():
                return p
            p.incarnation += 1
            with p.log_path.open("ab") as out:
                out.write(f"\n===== chaos: {name} incarnation {p.incarnation} at "
                          f"{time.strftime('%H:%M:%S')} =====\n".encode())
                out.flush()
                env = dict(os.environ) | p.env
                env["PYTHONPATH"] = os.pathsep.join(
                    [str(PROJECT_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
                p.popen = subprocess.Popen(p.argv(p.incarnation), stdout=out,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           cwd=PROJECT_ROOT, env=env, start_new_session=True)
            self._all.append(p.popen)
            p.history.append(p.popen.pid)
            with (self.log_dir / PIDS_FILE).open("a") as f:  # for ``python -m chaos --cleanup``
                f.write(f"{p.popen.pid} {name}\n")
            p.expected_exit = False
            p.paused = False
            p.started_at = time.monotonic()
            if p.incarnation:
                self.restarts += 1
            return p

    def _signal(self, p: RoleProc, sig: int) -> None:
        if p.popen is None:
            return
        try:
            os.killpg(p.popen.pid, sig)
        except ProcessLookupError:
            pass

    def kill9(self, name: str) -> int | None:
        """Kill -9 the process group of ``name``; its pid, or None if it was not running."""
        with self._lock:
            p = self.procs[name]
            if not p.alive():
                return None
            p.expected_exit = True
            self._signal(p, signal.SIGCONT)
            self._signal(p, signal.SIGKILL)
            assert p.popen is not None
            pid = p.popen.pid
        p.popen.wait(30)
        return pid

    def pause(self, name: str) -> int | None:
        """SIGSTOP ``name``; its pid, or None if it was not running."""
        with self._lock:
            p = self.procs[name]
            if not p.alive():
                return None
            self._signal(p, signal.SIGSTOP)
            p.paused = True
            return p.pid

    def dump_stacks(self, names: list[str]) -> None:
        """SIGUSR1 to each running role process of ``names``: its threads' stacks, logged.

        Each writes them to its log (``faulthandler``, :func:`chaos.roles.common.run_role`).
        """
        with self._lock:
            for n in names:
                p = self.procs[n]
                if p.alive() and p.popen is not None and not p.paused:
                    try:
                        os.kill(p.popen.pid, signal.SIGUSR1)
                    except ProcessLookupError:
                        pass

    def resume(self, name: str) -> None:
        """SIGCONT ``name``."""
        with self._lock:
            p = self.procs[name]
            self._signal(p, signal.SIGCONT)
            p.paused = False

    def reap_unexpected(self, restart: bool = True) -> list[UnexpectedExit]:
        """Exits nobody caused since the last call; restarts those processes if asked."""
        found = []
        with self._lock:
            for p in self.procs.values():
                if p.popen is None or p.expected_exit or p.popen.poll() is None:
                    continue
                ex = UnexpectedExit(p.name, p.incarnation, p.popen.returncode, time.time(),
                                    self.tail(p.name))
                p.expected_exit = True  # reported once
                self.exits.append(ex)
                found.append(ex)
                log.warning("%s (incarnation %d) exited on its own with %s", p.name,
                            p.incarnation, p.popen.returncode)
                if restart:
                    self.start(p.name)
        return found

    def ensure_running(self) -> None:
        """SIGCONT every process and start the ones that are not running."""
        with self._lock:
            for p in self.procs.values():
                if p.alive():
                    self.resume(p.name)
                else:
                    self.start(p.name)

    def stop(self, names: list[str], grace_s: float = STOP_GRACE_S) -> dict[str, int | None]:
        """SIGTERM ``names`` together, SIGKILL what still runs after ``grace_s``; exit codes."""
        with self._lock:
            procs = [self.procs[n] for n in names]
            for p in procs:
                if p.alive():
                    p.expected_exit = True
                    self._signal(p, signal.SIGCONT)
                    self._signal(p, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in procs:
            if p.popen is None:
                continue
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(p, signal.SIGKILL)
                p.popen.wait(30)
        return {p.name: None if p.popen is None else p.popen.returncode for p in procs}

    def pids(self, role: str) -> list[int]:
        """Running pids of a role."""
        with self._lock:
            return [p.popen.pid for p in self.procs.values()
                    if p.role == role and p.popen is not None and p.popen.poll() is None]

    def tail(self, name: str, lines: int = 25) -> str:
        """The last lines of ``name``'s log."""
        try:
            text = self.procs[name].log_path.read_bytes()[-20_000:].decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def cleanup(self) -> None:
        """SIGCONT + SIGKILL the group of every process ever started here; wait for them."""
        with self._lock:
            for pop in self._all:
                if pop.poll() is None:
                    for sig in (signal.SIGCONT, signal.SIGKILL):
                        try:
                            os.killpg(pop.pid, sig)
                        except ProcessLookupError:
                            pass
            for pop in self._all:
                try:
                    pop.wait(10)
                except subprocess.TimeoutExpired:
                    log.error("pid %d did not exit after SIGKILL", pop.pid)


def cleanup_workdir(workdir: Path, marker: str) -> list[int]:
    """Kill what a harness killed with -9 left behind in ``workdir``; the pids killed.

    A pid from the pids file is signalled only if its command line still contains
    ``marker`` (the run's bootstrap string), so a reused pid is never touched.
    """
    from txnstream.cluster.process import cmdline

    killed = []
    try:
        lines = (workdir / "logs" / PIDS_FILE).read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        pid = int(line.split()[0])
        cmd = cmdline(pid)
        if cmd is None or marker not in cmd:
            continue
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        killed.append(pid)
    return killed
