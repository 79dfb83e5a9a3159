"""The nemesis harness's short profile (``make chaos``) must find nothing.

Runs ``python -m chaos --profile short`` as a real process (its own 3-broker cluster,
coordinator workers, producers, processors and consumers, kill -9 / SIGSTOP / broker
kill at random) and asserts on its JSON summary: every fault kind was injected, work was
done and checked, and the checker counted 0 anomalies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.fault]

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 840
"""The short profile takes 3-4 minutes on a 2-core machine; this is well past it."""


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_short_chaos_profile_finds_no_anomaly(tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    seed = os.environ.get("CHAOS_SEED", "11")
    proc = subprocess.run(
        [sys.executable, "-m", "chaos", "--profile", "short", "--seed", seed,
         "--workdir", str(tmp_path / "run"), "--json", str(summary_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert summary_path.exists(), f"no summary; exit {proc.returncode}:\n{proc.stdout[-4000:]}" \
                                  f"\n{proc.stderr[-4000:]}"
    s = json.loads(summary_path.read_text())
    assert s["error"] is None, s["error"]
    for kind in ("kill9", "pause", "broker_kill9"):
        assert s["faults"]["by_kind"][kind] > 0, f"no {kind} fault injected: {s['faults']}"
    for role in ("worker", "processor", "consumer"):
        for kind in ("kill9", "pause"):
            assert s["faults"]["by_role"].get(kind, {}).get(role, 0) > 0, \
                f"no {kind} of a {role}: {s['faults']['by_role']}"
    assert s["txns"]["committed"] > 0, s["txns"]
    assert s["txns"]["aborted"] > 0, s["txns"]
    assert s["records"]["checked"] > 0, s["records"]
    assert s["records"]["visible_out"] > 0, s["records"]
    assert all(b["ok"] for b in s["bounds"].values()), s["bounds"]
    anomalies = {k: (a["count"], a["examples"][:1]) for k, a in s["anomalies"].items()}
    assert s["anomaly_count"] == 0, f"{s['anomaly_count']} anomalies: {anomalies}"
    assert proc.returncode == 0, proc.stdout[-4000:]
