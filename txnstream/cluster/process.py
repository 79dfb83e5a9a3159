"""Starting, finding and stopping the broker JVMs we own, by pid, never by name.

A JVM is *ours* when its pid is in a pid file under the state dir **and** its command
line names that node's ``server.properties`` (an absolute path inside the state dir).
The second check is what keeps a stale pid file, whose pid the kernel has since given to
some unrelated process, from ever making us signal that process. The window between the
check and the signal is microseconds; a pid cannot be reused that fast in practice.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "cmdline",
    "is_alive",
    "log_tail",
    "owned_pid",
    "port_in_use",
    "read_pid_file",
    "spawn",
    "stop_pids",
    "write_pid_file",
]

KILL_WAIT_S = 10.0
"""After SIGKILL the kernel frees a process at once; 10 s only guards against a stuck D-state."""


def cmdline(pid: int) -> str | None:
    """The process's command line, space-joined, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        return raw.replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return None
    except OSError:
        pass
    if Path("/proc/self").exists():
        return None
    # No procfs (macOS): ask ps.
    out = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True,
                         text=True, check=False)
    return out.stdout.strip() or None


def is_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie; reaps it first if it is our exited child."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False  # our child, and it had exited: now reaped
    except ChildProcessError:
        pass  # not our child (or already reaped): look at it from outside
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_pid_file(path: Path) -> int | None:
    """The pid recorded in ``path``, or None if it is absent or garbled."""
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def write_pid_file(path: Path, pid: int) -> None:
    """Record ``pid`` atomically (a reader sees the old file or the new, never half)."""
    tmp = path.with_suffix(".pid.tmp")
    tmp.write_text(f"{pid}\n")
    tmp.replace(path)


def owned_pid(pid_path: Path, marker: str) -> int | None:
    """The live pid in ``pid_path`` whose command line contains ``marker``, else None.

    The command line is checked first so that nothing is done (not even reaping) to a
    process that is not ours; a zombie has an empty command line and so is never ours.
    """
    pid = read_pid_file(pid_path)
    if pid is None:
        return None
    line = cmdline(pid)
    if line is None or marker not in line:
        return None
    return pid if is_alive(pid) else None


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True if something listens on ``host:port`` (a bind with SO_REUSEADDR fails).

    SO_REUSEADDR matches what the JVM sets on its server sockets, so connections left in
    TIME_WAIT by a previous broker do not count as "in use".
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def spawn(cmd: Sequence[str], log_path: Path, header: str) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session, stdout+stderr appended to ``log_path``.

    Its own session (``setsid``) means Ctrl-C in the terminal that ran ``cluster up`` does
    not reach the broker, and the broker outlives the command that started it.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(header.encode())
        log.flush()
        return subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=log_path.parent)


def log_tail(path: Path, offset: int = 0, lines: int = 30) -> str:
    """The last ``lines`` lines of ``path`` written after byte ``offset``."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    text = data.decode(errors="replace").rstrip("\n")
    return "\n".join(text.splitlines()[-lines:]) if text else "(empty)"


def stop_pids(pids: Mapping[int, int], grace_s: float,
              sig: signal.Signals = signal.SIGTERM) -> list[int]:
    """Send ``sig`` to every pid, SIGKILL those still alive after ``grace_s``; the killed keys.

    ``pids`` maps a caller's key (a node id) to a pid the caller has verified as its own.
    Signalling all first and then waiting lets the nodes shut down in parallel. Returns
    the keys that needed SIGKILL. Returns once every pid is gone (or KILL_WAIT_S passed).
    """
    for pid in pids.values():
        _signal(pid, sig)
    _wait_gone(pids.values(), grace_s)
    killed = [k for k, pid in pids.items() if is_alive(pid)]
    for k in killed:
        _signal(pids[k], signal.SIGKILL)
    _wait_gone(pids.values(), KILL_WAIT_S)
    return killed


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass  # already gone


def _wait_gone(pids: Iterable[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(pids)
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if is_alive(p)]
        if pending:
            time.sleep(0.05)
