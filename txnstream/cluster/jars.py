"""The Apache Kafka broker's classpath: fetched from Maven Central with ``mvn``, cached, verified.

Two sources, in order:

1. ``$KAFKA_HOME/libs`` when KAFKA_HOME names an unpacked Apache Kafka release (used as is;
   it is the user's directory, so we never repair or delete anything in it).
2. The cache ``<root>/kafka-<version>/`` (root: ``$TXNSTREAM_CACHE`` or
   ``~/.cache/txnstream``), filled by ``mvn dependency:copy-dependencies`` over the pom
   shipped in this package. The version is :data:`KAFKA_VERSION`, overridable with
   ``$TXNSTREAM_KAFKA_VERSION`` (e.g. ``4.1.1``; any 4.x release is expected to work).

Fetching, step by step, and what a crash after each step leaves behind:

1. ``mvn`` copies the jars into ``libs.partial/``. Crash: a stray ``libs.partial/``; the
   next fetch deletes it first.
2. The old ``libs/`` and ``manifest.json`` are deleted, ``libs.partial/`` is renamed
   ``libs/``. Crash: ``libs/`` without a manifest, which counts as "not fetched", so the
   next run fetches again.
3. ``manifest.json`` (jar name -> sha256, size) is written atomically. Only now is the
   cache complete.

Every later run checks each jar against the manifest (size, sha256) and that it opens as
a zip. A bad jar is named, the cache is deleted and fetched again; if the fresh copy is
bad too (a damaged ``~/.m2`` copy), :class:`~txnstream.errors.ClusterError` names it.
An exclusive ``flock`` on ``<root>/kafka-<version>/.lock`` serialises concurrent runs
(parallel test sessions) so none reads a half-written cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from txnstream.cluster.report import Reporter
from txnstream.cluster.tools import find_mvn
from txnstream.errors import ClusterError

__all__ = [
    "KAFKA_VERSION",
    "Classpath",
    "CorruptJarError",
    "JarCache",
    "cache_root",
    "kafka_home_classpath",
    "resolve_classpath",
]

KAFKA_VERSION = os.environ.get("TXNSTREAM_KAFKA_VERSION", "4.4.0")
"""The Apache Kafka release whose broker jars we fetch (newest 4.x that runs on Java 17)."""

MVN_TIMEOUT_S = 900.0
"""A cold fetch is ~45 MB; 15 minutes covers a slow link, and a hung mvn still ends."""

MANIFEST = "manifest.json"
_MVN_TAIL_LINES = 25


class CorruptJarError(ClusterError):
    """A cached jar is missing, changed since it was fetched, or not a valid zip."""

    def __init__(self, jar: Path, reason: str) -> None:
        super().__init__(f"cached Kafka jar {jar} is corrupt ({reason})")
        self.jar = jar
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Classpath:
    """Where the broker's jars are: ``libs_dir/*`` goes on ``java -cp``."""

    libs_dir: Path
    source: str
    """``"cache"``, ``"maven"`` (fetched just now) or ``"KAFKA_HOME"``."""

    @property
    def java_arg(self) -> str:
        """The ``-cp`` value: Java expands the ``*`` itself (no shell involved)."""
        return str(self.libs_dir / "*")


def cache_root() -> Path:
    """``$TXNSTREAM_CACHE`` or ``~/.cache/txnstream``."""
    env = os.environ.get("TXNSTREAM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "txnstream"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_zip(jar: Path) -> None:
    """Raise CorruptJarError unless ``jar`` opens as a zip (its central directory reads)."""
    try:
        with zipfile.ZipFile(jar) as z:
            z.infolist()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise CorruptJarError(jar, f"not a valid zip: {exc}") from exc


def build_manifest(libs_dir: Path) -> dict[str, dict[str, object]]:
    """Jar name -> {"sha256", "size"} for every jar in ``libs_dir``."""
    return {p.name: {"sha256": _sha256(p), "size": p.stat().st_size}
            for p in sorted(libs_dir.glob("*.jar"))}


def verify_manifest(libs_dir: Path, manifest: dict[str, dict[str, object]]) -> None:
    """Raise CorruptJarError for the first jar that is missing, changed, or not a zip.

    Checks, cheapest first: present, size, valid zip, sha256 (catches a bit flip that
    keeps the zip readable).
    """
    if not manifest:
        raise CorruptJarError(libs_dir, "the manifest lists no jars")
    for name, entry in sorted(manifest.items()):
        jar = libs_dir / name
        if not jar.is_file():
            raise CorruptJarError(jar, "missing")
        size = jar.stat().st_size
        if size != entry["size"]:
            raise CorruptJarError(jar, f"{size} bytes, expected {entry['size']}")
        check_zip(jar)
        if _sha256(jar) != entry["sha256"]:
            raise CorruptJarError(jar, "sha256 differs from the manifest")


class JarCache:
    """``<root>/kafka-<version>/{libs/, manifest.json}``, filled by mvn (see module doc)."""

    def __init__(self, root: Path | None = None, version: str = KAFKA_VERSION) -> None:
        self.version = version
        self.dir = (root or cache_root()) / f"kafka-{version}"
        self.libs = self.dir / "libs"
        self.manifest_path = self.dir / MANIFEST

    def is_fetched(self) -> bool:
        """True once a fetch completed (the manifest exists); says nothing of integrity."""
        return self.manifest_path.is_file()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive lock on this version's cache for the block."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)  # released when fh closes, or if we die
            yield

    def verify(self) -> None:
        """Raise CorruptJarError unless every jar matches the manifest."""
        try:
            manifest = json.loads(self.manifest_path.read_text())
        except (OSError, ValueError) as exc:
            raise CorruptJarError(self.manifest_path, f"unreadable manifest: {exc}") from exc
        verify_manifest(self.libs, manifest)

    def clear(self) -> None:
        """Delete the jars and manifest (not the lock file, which others may hold)."""
        self.manifest_path.unlink(missing_ok=True)
        for d in (self.libs, self.dir / "libs.partial"):
            shutil.rmtree(d, ignore_errors=True)

    def fetch(self, reporter: Reporter) -> None:
        """Run mvn into ``libs.partial``, swap it in, write the manifest (module doc)."""
        mvn = find_mvn()
        if mvn is None:
            raise ClusterError(
                f"the Kafka jars are not cached in {self.dir} and `mvn` (Apache Maven) is not "
                "on PATH to fetch them; install Maven, or set KAFKA_HOME to an unpacked "
                "Apache Kafka release")
        partial = self.dir / "libs.partial"
        shutil.rmtree(partial, ignore_errors=True)
        with resources.as_file(resources.files("txnstream.cluster") / "pom.xml") as pom:
            cmd = [str(mvn), "-B", "-Dstyle.color=never", "-f", str(pom),
                   f"-Dkafka.version={self.version}", "dependency:copy-dependencies",
                   f"-DoutputDirectory={partial}"]
            reporter.status(f"fetching Apache Kafka {self.version} jars from Maven Central")
            tail = _run_mvn(cmd, reporter)
        jars = sorted(partial.glob("*.jar")) if partial.is_dir() else []
        if not any(j.name.startswith("kafka_2.13-") for j in jars):
            raise ClusterError(f"mvn finished but put no kafka_2.13 jar in {partial}; "
                               f"its output ended with:\n{tail}")
        self.manifest_path.unlink(missing_ok=True)
        shutil.rmtree(self.libs, ignore_errors=True)
        partial.rename(self.libs)
        manifest = build_manifest(self.libs)
        tmp = self.manifest_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        tmp.replace(self.manifest_path)


def _run_mvn(cmd: list[str], reporter: Reporter) -> str:
    """Run mvn, streaming its download lines to the reporter; the output tail on success.

    On failure (non-zero exit, or no exit within MVN_TIMEOUT_S) raise ClusterError with
    the tail of its output, which is where Maven says what it could not resolve.
    """
    tail: deque[str] = deque(maxlen=_MVN_TAIL_LINES)
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, errors="replace")
    except OSError as exc:
        raise ClusterError(f"cannot run {cmd[0]}: {exc}") from exc
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            line = line.rstrip()
            tail.append(line)
            if line.startswith(("Downloading from", "Copying")):
                reporter.status(line.split("/")[-1] if "/" in line else line)
        rc = proc.wait(MVN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = None
    text = "\n".join(tail)
    if rc != 0:
        why = f"exited with code {rc}" if rc is not None else f"ran over {MVN_TIMEOUT_S:.0f} s"
        raise ClusterError(
            f"fetching the Kafka jars with mvn failed ({why}). Check that Maven Central "
            "(https://repo.maven.apache.org) is reachable, or set KAFKA_HOME to an unpacked "
            f"Apache Kafka release. Command: {' '.join(cmd)}\nLast lines of mvn output:\n{text}")
    return text


def kafka_home_classpath(home: Path) -> Classpath:
    """``$KAFKA_HOME/libs`` after checking it looks like a Kafka release with readable jars."""
    libs = home / "libs"
    jars = sorted(libs.glob("kafka_2.*.jar")) if libs.is_dir() else []
    if not jars:
        raise ClusterError(f"KAFKA_HOME={home} does not look like an unpacked Apache Kafka "
                           f"release: no {libs}/kafka_2.*.jar. Unset KAFKA_HOME to fetch the "
                           "jars with mvn instead.")
    for jar in sorted(libs.glob("*.jar")):
        check_zip(jar)
    return Classpath(libs, "KAFKA_HOME")


def resolve_classpath(reporter: Reporter, root: Path | None = None) -> Classpath:
    """The broker classpath: KAFKA_HOME if set, else the verified (fetched, repaired) cache."""
    home = os.environ.get("KAFKA_HOME")
    if home:
        return kafka_home_classpath(Path(home).expanduser())
    cache = JarCache(root)
    with cache.locked():
        source = "cache"
        if cache.is_fetched():
            try:
                cache.verify()
                return Classpath(cache.libs, source)
            except CorruptJarError as exc:
                reporter.note(f"{exc}; deleting the cached jars in {cache.dir} and fetching again")
                cache.clear()
        cache.fetch(reporter)
        try:
            cache.verify()
        except CorruptJarError as exc:
            raise ClusterError(
                f"{exc} even after fetching it again into {cache.dir}. The copy in your local "
                f"Maven repository (~/.m2/repository) is probably damaged: delete the "
                f"directory holding {exc.jar.name} there and retry.") from exc
        return Classpath(cache.libs, "maven")
