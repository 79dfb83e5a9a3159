"""What a chaos run reports about itself besides the checks: logs, counts, the code run."""

from __future__ import annotations

import logging
import subprocess
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

__all__ = ["cursor_tail", "last_error", "file_logger", "code_under_test", "log_errors",
           "txn_counts"]


def cursor_tail(raw: dict[tuple[str, int], Any], tp: str, cursor: int) -> dict[str, int]:
    """What lies between a stuck cursor and the partition's end, by kind."""
    topic, _, part = tp.rpartition("-")
    rp = raw.get((topic, int(part)))
    kinds: Counter[str] = Counter()
    for rec in rp.records if rp is not None else ():
        if rec.offset >= cursor:
            kinds["marker" if rec.marker else
                  "visible" if rp.expected_visible(rec) else "not visible"] += 1
    return dict(kinds)


def last_error(tail: str) -> str:
    """The exception line of a traceback in a log tail (its last line if none)."""
    lines = [ln for ln in tail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        head = ln.split(":", 1)[0].strip()
        if not ln.startswith((" ", "%")) and head.replace(".", "").isidentifier() and \
                head.endswith(("Error", "Exception", "Interrupt")):
            return ln.strip()
    return lines[-1].strip() if lines else ""


def log_errors(procs: dict[str, Any]) -> list[dict[str, Any]]:
    """ERROR lines of the role processes' logs, by role and message (not judged)."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for name, p in procs.items():
        try:
            lines = p.log_path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for ln in lines:
            if " ERROR " not in ln:
                continue
            msg = ln.split(" ERROR ", 1)[1]
            key = (p.role, " ".join(msg.split()[:4]))
            got = seen.setdefault(key, {"role": p.role, "count": 0, "example": msg[:300],
                                        "first_in": name})
            got["count"] += 1
    return sorted(seen.values(), key=lambda e: -e["count"])


def txn_counts(truth: Any, expected: Counter[str]) -> dict[str, Any]:
    """Txns by expected outcome, by role, and producer txns by kind."""
    by_role: dict[str, Counter[str]] = defaultdict(Counter)
    wants: Counter[str] = Counter()
    for txn, opens in truth.opens.items():
        role = opens[0].get("role", "?")
        by_role[role][truth.expected(txn)] += 1
        if opens[0].get("kind"):
            wants[opens[0]["kind"]] += 1
    return {"committed": expected.get("committed", 0), "aborted": expected.get("aborted", 0),
            "unknown": expected.get("unknown", 0),
            "contradictory": expected.get("contradictory", 0),
            "admin_aborted": sum(1 for a in truth.admin.values()
                                 if a.get("status") == "ABORTED"),
            "by_role": {r: dict(c) for r, c in by_role.items()},
            "producer_kinds": dict(wants)}


def file_logger(path: Path) -> logging.Logger:
    """The harness's own librdkafka and cluster messages go to ``path``, not the terminal."""
    lg = logging.getLogger("chaos.harness")
    lg.propagate = False
    lg.setLevel(logging.INFO)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    lg.handlers = [handler]
    for name in ("chaos.cluster", "txnstream"):
        other = logging.getLogger(name)
        other.propagate = False
        other.handlers = [handler]
    return lg


def code_under_test() -> dict[str, Any]:
    """Which txnstream this run exercises: its path, git commit and modified files."""
    import txnstream

    root = Path(txnstream.__file__).resolve().parents[1]
    info: dict[str, Any] = {"txnstream": str(Path(txnstream.__file__).parent)}
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                                        capture_output=True, text=True, timeout=10,
                                        check=False).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--", "txnstream"], cwd=root,
                                capture_output=True, text=True, timeout=10, check=False).stdout
        info["modified"] = [line[3:] for line in status.splitlines()]
    except (OSError, subprocess.SubprocessError):
        pass
    return info
