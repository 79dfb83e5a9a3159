"""txnstream_spark.precompile: bytecode in the zip Spark's Python workers import."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from pathlib import Path

from txnstream_spark.precompile import MARKER, precompile, spark_zips


def _zip(path: Path, files: dict[str, str] | dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def _run_from(zip_path: Path, code: str) -> str:
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, "
                          f"{str(zip_path)!r}); {code}"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


FILES = {"pkgx/__init__.py": "from pkgx.mod import VALUE\n",
         "pkgx/mod.py": "VALUE = sum(range(10))\n",
         "pkgx/data.json": '{"a": 1}',
         "pkgx/py2only.py": "print 'no'\n",
         "pkgx/tests/test_mod.py": "X = 1\n"}


def test_modules_gain_bytecode_and_everything_else_stays(tmp_path):
    z = _zip(tmp_path / "lib.zip", FILES)
    assert precompile(z) == 2  # py2only.py does not compile here: left as source
    with zipfile.ZipFile(z) as got:
        names = set(got.namelist())
        assert {"pkgx/__init__.pyc", "pkgx/mod.pyc", MARKER} <= names
        assert "pkgx/py2only.pyc" not in names
        assert "pkgx/tests/test_mod.pyc" not in names  # workers never import tests
        for name, text in FILES.items():  # originals byte for byte
            assert got.read(name).decode() == text
    assert _run_from(z, "import pkgx; print(pkgx.VALUE)") == "45"


def test_workers_import_the_bytecode_not_the_source(tmp_path):
    z = _zip(tmp_path / "lib.zip", FILES)
    precompile(z)
    # the source now raises; the import still gives the compiled module's value
    with zipfile.ZipFile(z) as old:
        entries = {i.filename: old.read(i) for i in old.infolist()}
    entries["pkgx/mod.py"] = b"raise SystemExit('source was compiled')\n"
    _zip(z, entries)
    assert _run_from(z, "import pkgx; print(pkgx.VALUE)") == "45"


def test_a_second_run_changes_nothing(tmp_path):
    z = _zip(tmp_path / "lib.zip", FILES)
    precompile(z)
    before = z.read_bytes()
    assert precompile(z) == 0
    assert z.read_bytes() == before


def test_bytecode_of_another_interpreter_is_replaced(tmp_path):
    z = _zip(tmp_path / "lib.zip", {**FILES, "pkgx/mod.pyc": "not this python's",
                                    MARKER: "cpython-27 0000\n"})
    assert precompile(z) == 2
    assert _run_from(z, "import pkgx; print(pkgx.VALUE)") == "45"


def test_the_installed_pyspark_zips_are_found():
    zips = spark_zips()
    assert any(z.name == "pyspark.zip" for z in zips), zips


class _Stream(io.RawIOBase):
    """A pipe-like file: no seek, no tell (zipfile then writes data descriptors)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        self.data += b
        return len(b)


def test_a_zip_streamed_by_another_tool_is_read_whole(tmp_path):
    # entries with data descriptors after them (a zip written to a stream): the rewrite
    # lays entries out at other offsets, and reading a source entry must not use them
    # (the shipped py4j zip failed so: "Bad magic number for file header")
    stream = _Stream()
    with zipfile.ZipFile(stream, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in FILES.items():
            z.writestr(name, text)
    path = tmp_path / "streamed.zip"
    path.write_bytes(bytes(stream.data))
    assert precompile(path) == 2
    with zipfile.ZipFile(path) as got:
        assert got.testzip() is None
        assert all(got.read(n).decode() == t for n, t in FILES.items())
    assert _run_from(path, "import pkgx; print(pkgx.VALUE)") == "45"
