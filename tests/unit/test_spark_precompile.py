"""txnstream_spark.precompile: bytecode in the zip Spark's Python workers import."""

from __future__ import annotations

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
         "pkgx/py2only.py": "print 'no'\n"}


def test_modules_gain_bytecode_and_everything_else_stays(tmp_path):
    z = _zip(tmp_path / "lib.zip", FILES)
    assert precompile(z) == 2  # py2only.py does not compile here: left as source
    with zipfile.ZipFile(z) as got:
        names = set(got.namelist())
        assert {"pkgx/__init__.pyc", "pkgx/mod.pyc", MARKER} <= names
        assert "pkgx/py2only.pyc" not in names
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


def test_the_py4j_zip_spark_ships_is_read_whole(tmp_path):
    # a zip made by another tool (py4j's: extra fields in its local headers); writing an
    # entry must not move where the source zip's entries are read from
    shipped = next(z for z in spark_zips() if z.name.startswith("py4j"))
    z = tmp_path / shipped.name
    z.write_bytes(shipped.read_bytes())
    assert precompile(z) > 0
    with zipfile.ZipFile(z) as got, zipfile.ZipFile(shipped) as old:
        assert got.testzip() is None
        assert all(got.read(i.filename) == old.read(i) for i in old.infolist())
    assert _run_from(z, "import py4j.java_gateway as g; print(g.__name__)") == \
        "py4j.java_gateway"
