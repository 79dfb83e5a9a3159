"""Build the project's wheel once per test session (``python -m build``), for the tests
that install it the way users do: the wheel smoke test and the Spark standalone cluster.

Under pytest-xdist the workers of one run share the wheel: the first to ask builds it
under a file lock (a build writes ``build/`` and ``*.egg-info`` in the checkout, so two
at once make a broken wheel), the others wait and take it."""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_BUILT: dict[str, Path] = {}


def project_wheel() -> Path:
    """The path of ``txnstream-*.whl`` built from this checkout (built on first call)."""
    if "wheel" not in _BUILT:
        # The run's directory (tests/conftest.py makes it, shared by the xdist workers and
        # removed when the run ends); else one of this process's, removed at its exit.
        scratch = os.environ.get("TXNSTREAM_TEST_RUN_DIR")
        if scratch is None:
            scratch = tempfile.mkdtemp(prefix="txnstream-wheel-")
            atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        out = Path(scratch) / "wheel"
        out.mkdir(exist_ok=True)
        with open(Path(tempfile.gettempdir()) / "txnstream-wheel.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time in this checkout
            wheels = list(out.glob("txnstream-*.whl"))
            if not wheels:
                t0 = time.monotonic()
                proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir",
                                       str(out), str(ROOT)],
                                      capture_output=True, text=True, timeout=600)
                assert proc.returncode == 0, \
                    f"python -m build failed:\n{proc.stdout}\n{proc.stderr}"
                wheels = list(out.glob("txnstream-*.whl"))
                print(f"built {[w.name for w in wheels]} in {time.monotonic() - t0:.1f}s")
        assert len(wheels) == 1, f"expected one wheel in {out}: {wheels}"
        _BUILT["wheel"] = wheels[0]
    return _BUILT["wheel"]


def clean_env() -> dict[str, str]:
    """This environment minus anything that would put the checkout on the path.

    A pip run with the checkout on ``PYTHONPATH`` sees its ``txnstream.egg-info``, finds
    txnstream "already satisfied", and installs only its dependencies (under
    pytest-xdist, a worker that ran a Spark test before the wheel test did exactly that,
    while the Spark session fixture left the checkout there; it no longer does, and a
    developer's own ``PYTHONPATH`` may still hold it).
    """
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(ROOT)))
    return env


def fresh_venv(where: Path, *requirements: str) -> Path:
    """A new venv at ``where`` (pip-installed ``requirements``); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=300,
                   env=clean_env())
    py = where / "bin" / "python"
    if requirements:
        proc = subprocess.run([str(py), "-m", "pip", "install", "-q", *requirements],
                              capture_output=True, text=True, timeout=900, cwd=where,
                              env=clean_env())
        assert proc.returncode == 0, f"pip install {requirements} failed:\n{proc.stderr}"
    return py
