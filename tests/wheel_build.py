"""Build the project's wheel once per test session (``python -m build``), for the tests
that install it the way users do: the wheel smoke test and the Spark standalone cluster."""

from __future__ import annotations

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
        out = Path(tempfile.mkdtemp(prefix="txnstream-wheel-"))
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out),
                               str(ROOT)], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"python -m build failed:\n{proc.stdout}\n{proc.stderr}"
        wheels = list(out.glob("txnstream-*.whl"))
        assert len(wheels) == 1, f"expected one wheel in {out}: {wheels}"
        print(f"built {wheels[0].name} in {time.monotonic() - t0:.1f}s")
        _BUILT["wheel"] = wheels[0]
    return _BUILT["wheel"]


def fresh_venv(where: Path, *requirements: str) -> Path:
    """A new venv at ``where`` (pip-installed ``requirements``); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=300)
    py = where / "bin" / "python"
    if requirements:
        proc = subprocess.run([str(py), "-m", "pip", "install", "-q", *requirements],
                              capture_output=True, text=True, timeout=900, cwd=where)
        assert proc.returncode == 0, f"pip install {requirements} failed:\n{proc.stderr}"
    return py
