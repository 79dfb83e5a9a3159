"""The wheel a user installs works outside the checkout.

``python -m build`` makes the wheel; a fresh venv in a temp directory installs
``txnstream[spark]`` from it (pip, as a user would); from there, with the checkout nowhere
on the path, the smoke script imports every module and round-trips every schema, and
``txnstream --help`` runs, and a transactional round trip (one of three transactions aborted)
against a ``txnstream worker`` started from the same venv reads back exactly the committed
records, on the session's real broker.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.wheel_build import clean_env, fresh_venv, project_wheel

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_wheel_installs_and_runs_outside_the_checkout(tmp_path: Path,
                                                       kafka_bootstrap: str) -> None:
    t0 = time.monotonic()
    wheel = project_wheel()
    names = subprocess.run(["unzip", "-Z1", str(wheel)], capture_output=True, text=True,
                           check=True).stdout.split()
    assert any(n.startswith("txnstream/schemas/") and n.endswith(".avsc") for n in names)
    assert not any(n.startswith("spark/") for n in names), "wheel ships a top-level spark/"

    py = fresh_venv(tmp_path / "venv", f"{wheel}[spark]")
    t_install = time.monotonic() - t0
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    shutil.copy(Path(__file__).with_name("smoke.py"), workdir / "smoke.py")
    env = clean_env()
    smoke = subprocess.run([str(py), "smoke.py"], cwd=workdir, env=env, capture_output=True,
                           text=True, timeout=300)
    assert smoke.returncode == 0 and "SMOKE OK" in smoke.stdout, smoke.stdout + smoke.stderr

    cli = str(tmp_path / "venv" / "bin" / "txnstream")
    help_run = subprocess.run([cli, "--help"], cwd=workdir, env=env, capture_output=True,
                              text=True, timeout=60)
    assert help_run.returncode == 0 and "worker" in help_run.stdout, help_run.stderr

    prefix = f"__w{uuid.uuid4().hex[:8]}"
    init = subprocess.run([cli, "--bootstrap", kafka_bootstrap, "init", "--prefix", prefix],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert init.returncode == 0, f"txnstream init from the wheel:\n{init.stdout}{init.stderr}"
    shutil.copy(Path(__file__).with_name("roundtrip.py"), workdir / "roundtrip.py")
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen([cli, "--bootstrap", kafka_bootstrap, "worker", "--prefix",
                               prefix], cwd=workdir, env=env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        trip = subprocess.run([str(py), "roundtrip.py", kafka_bootstrap, prefix,
                               f"wheel-{prefix}"], cwd=workdir, env=env, capture_output=True,
                              text=True, timeout=300)
        assert worker.poll() is None, "txnstream worker from the wheel exited early"
    finally:
        os.killpg(worker.pid, signal.SIGKILL)  # the worker and its buffer-role child
        worker.wait(30)
        log.close()
    assert trip.returncode == 0 and "ROUNDTRIP OK" in trip.stdout, (
        trip.stdout + trip.stderr + (tmp_path / "worker.log").read_text()[-3000:])
    print(f"wheel smoke: install {t_install:.1f}s, total {time.monotonic() - t0:.1f}s")
