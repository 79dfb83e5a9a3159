"""Bytecode for the ``pyspark.zip`` Spark's Python workers import, compiled once.

Spark starts its Python workers with ``$SPARK_HOME/python/lib/pyspark.zip`` first on
their ``PYTHONPATH``, ahead of the pip-installed ``pyspark``. Python never caches
bytecode for a zip, so every worker process compiles the part of pyspark it imports
from source: 1.9 s of CPU for the streaming source runner here, against 0.65 s from
compiled files. Every query start launches that runner afresh, and Spark gives it 10 s
(hard-coded) to connect back; on a loaded machine the compiling alone used them up
("Python worker failed to connect back").

:func:`precompile` adds, beside each ``x.py`` in the zip, an ``x.pyc`` that
``zipimport`` loads instead: unchecked hash-based bytecode (PEP 552) of this
interpreter, so nothing depends on timestamps. Modules under a ``tests`` directory stay
source-only. Every original entry stays as it was
(data files, sources for tracebacks); running it again changes nothing, and bytecode of
another Python version is replaced. ``make venv`` runs it on the project's venv:

    python -m txnstream_spark.precompile [ZIP ...]   # default: this pyspark's zips
"""

from __future__ import annotations

import copy
import importlib.util
import marshal
import os
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

__all__ = ["MARKER", "precompile", "spark_zips"]

MARKER = "txnstream-precompiled.txt"
"""An entry naming the interpreter the zip's bytecode was made for."""


def spark_zips() -> list[Path]:
    """The zips Spark puts on its Python workers' path, for the pyspark installed here."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed in this interpreter")
    lib = Path(spec.origin).parent / "python" / "lib"
    return sorted(lib.glob("*.zip"))


FORMAT = 2
"""What :func:`precompile` puts in a zip; a zip of another format is made again."""


def _tag() -> str:
    return (f"{sys.implementation.cache_tag} {importlib.util.MAGIC_NUMBER.hex()} "
            f"format {FORMAT}\n")


def precompile(path: Path) -> int:
    """Add this interpreter's bytecode to the zip at ``path``; the number of modules.

    0 when it already has it. The zip is replaced by renaming a new file over it; run it
    while no Spark job uses this pyspark: a running Python worker keeps the old zip's
    directory (``zipimport``) and would read the new file at the old offsets.
    """
    path = Path(path)
    with zipfile.ZipFile(path) as src:
        names = set(src.namelist())
        if MARKER in names and src.read(MARKER).decode() == _tag():
            return 0
        sources = [n for n in names if n.endswith(".py") and not _is_test(n)]
        fd, tmp = tempfile.mkstemp(prefix=path.name, dir=path.parent)
        os.close(fd)
        compiled = 0
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
                for info in src.infolist():
                    if info.filename.endswith(".pyc") or info.filename == MARKER:
                        continue  # bytecode of another run: made again below
                    data = src.read(info)
                    out.writestr(copy.copy(info), data)  # writing moves a ZipInfo's offset
                for name in sorted(sources):
                    code = _bytecode(src.read(name), name)
                    if code is not None:
                        out.writestr(name + "c", code)
                        compiled += 1
                out.writestr(MARKER, _tag())
            os.chmod(tmp, path.stat().st_mode & 0o777)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return compiled


def _is_test(name: str) -> bool:
    """Whether ``name`` is a module of a package's own tests (930 of pyspark.zip's 1,286).

    Workers never import them, and every entry lengthens the directory that each task
    re-reads (``importlib.invalidate_caches()`` in pyspark's worker).
    """
    return "tests" in name.split("/")[:-1]


def _bytecode(source: bytes, name: str) -> bytes | None:
    """Unchecked hash-based ``.pyc`` contents of ``source``, None if it does not compile.

    Such a module (written for another Python version) stays source-only.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pyspark's own tests warn ("is" with a literal)
            code = compile(source, name, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    flags = (0b01).to_bytes(4, "little")  # hash-based, not checked against the source
    source_hash = importlib.util.source_hash(source)
    return importlib.util.MAGIC_NUMBER + flags + source_hash + marshal.dumps(code)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    zips = [Path(a) for a in args] or spark_zips()
    for z in zips:
        n = precompile(z)
        print(f"{z}: {f'{n} modules compiled' if n else 'already compiled'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
