"""The nemesis harness's hostile profile, short length, must find nothing.

Runs ``python -m chaos --profile hostile`` as a real process (its own 3-broker cluster,
coordinator workers, producers, processors and consumers on an authenticated line, kill
-9 / SIGSTOP / broker kill at random, two-phase writers with a PostgreSQL that is killed
-9 too, and an intruder: a stranger principal sending
requests about the honest txns, clients without valid credentials, raw connections)
and asserts on its JSON summary: every fault kind was injected, every intruder kind
was refused, forged markers, txn.ids and endpoint records were written, a co-writer
committed txns from another process while their openers still wrote (issue 33), the
two-phase writers wrote rows and records and their inputs were all processed (issue
39), work was done and checked, and the checker counted 0 anomalies (none of the forged records
delivered; every writer's in/out answer what readers deliver).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.fault, pytest.mark.chaos]  # CI runs it as its own step

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 840
"""The short profile takes 3-4 minutes on a 2-core machine; this is well past it."""


def run_harness(workdir: Path, summary_path: Path, seed: str,
                profile: str = "hostile") -> tuple[int, str]:
    """Run ``profile``; on a timeout or an interrupt, let it tear down (SIGTERM)."""
    out_path = workdir.parent / "chaos.out"
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chaos", "--profile", profile, "--seed", seed,
             "--workdir", str(workdir), "--json", str(summary_path)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:  # timed out or interrupted: its own teardown first
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(90)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(30)
                    subprocess.run([sys.executable, "-m", "chaos", "--cleanup", str(workdir)],
                                   cwd=ROOT, timeout=120, check=False)
    return proc.returncode, out_path.read_text(errors="replace")


@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_hostile_chaos_profile_finds_no_anomaly(tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    seed = os.environ.get("CHAOS_SEED", "11")
    code, output = run_harness(tmp_path / "run", summary_path, seed)
    assert summary_path.exists(), f"no summary; exit {code}:\n{output[-6000:]}"
    s = json.loads(summary_path.read_text())
    assert s["error"] is None, s["error"]
    for kind in ("kill9", "pause", "broker_kill9", "postgres_kill9"):
        assert s["faults"]["by_kind"][kind] > 0, f"no {kind} fault injected: {s['faults']}"
    for role in ("worker", "processor", "consumer", "twophase"):
        for kind in ("kill9", "pause"):
            assert s["faults"]["by_role"].get(kind, {}).get(role, 0) > 0, \
                f"no {kind} of a {role}: {s['faults']['by_role']}"
    asked = s["notes"].get("intruder_requests", {})
    for who, outcome in (("stranger", "not_authorized"), ("anonymous", "credentials_refused"),
                         ("wrong_secret", "credentials_refused"), ("raw", "closed"),
                         ("forger", "written")):
        assert any(k.startswith(f"{who} ") and k.endswith(f" {outcome}") for k in asked), \
            f"no {who} request ended {outcome}: {asked}"
    assert s["txns"]["committed"] > 0, s["txns"]
    assert s["txns"]["aborted"] > 0, s["txns"]
    assert s["records"]["checked"] > 0, s["records"]
    assert s["records"]["visible_out"] > 0, s["records"]
    assert s["notes"]["foreign_commits"] > 0, s["notes"]  # the co-writer committed some
    two = s["twophase"]  # rows and records alike (judged per txn: 0 anomalies), and
    assert two["records"] == two["rows"] > 0, two  # every input's after a full drain
    assert not two["drain_complete"] or two["rows"] == two["fed"], two
    assert s["notes"]["foreign_records_sent_after"] > 0, s["notes"]  # and openers wrote on
    assert all(b["ok"] for b in s["bounds"].values()), s["bounds"]
    anomalies = {k: (a["count"], a["examples"][:1]) for k, a in s["anomalies"].items()}
    assert s["anomaly_count"] == 0, f"{s['anomaly_count']} anomalies: {anomalies}"
    assert code == 0, output[-4000:]
