"""A class-data-sharing (AppCDS) archive of the broker's classes: faster JVM starts.

Loading and verifying Kafka's ~10k classes is most of a broker's start time on a small
machine. Java 13+ can dump the classes a JVM loaded into an archive when it exits
(``-XX:ArchiveClassesAtExit``) and map that archive into later JVMs
(``-XX:SharedArchiveFile``); measured here it cuts ~1 s off each start (2 cores, three
JVMs starting at once).

How it is made, and why a crash cannot leave a bad archive in use:

1. When no archive exists for this java + classpath, node 1 starts with
   ``-XX:ArchiveClassesAtExit=<node dir>/cds-training.jsa``.
2. ``down`` stops it with SIGTERM; the JVM writes that file as it exits.
3. Only if the JVM exited on SIGTERM (no SIGKILL needed) is the file moved into the cache
   with an atomic rename; otherwise it is deleted. A JVM killed mid-dump therefore never
   publishes a partial archive.

Even so, the archive is only an optimisation: a JVM that finds it unusable (another JDK,
changed jars) silently runs without it (``-Xshare:auto``, the default). The key includes the
java binary and the jar list, so a JDK or jar change simply trains a new archive.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

__all__ = ["ClassDataArchive", "publish_training"]

_QUIET = "-Xlog:cds=off,cds+dynamic=off"
"""The dump lists every class it skips as a warning; mismatches are not errors either."""
TRAINING_FILE = "cds-training.jsa"
TARGET_FILE = "cds-training.target"
"""Where the training dump is to be published; read by ``down``, which knows no java path."""


class ClassDataArchive:
    """The shared archive for one (java, classpath) pair, under ``<cache root>/cds/``."""

    def __init__(self, cache_root: Path, java: Path, libs_dir: Path) -> None:
        self.path = cache_root / "cds" / f"kafka-{self._key(java, libs_dir)}.jsa"

    @staticmethod
    def _key(java: Path, libs_dir: Path) -> str:
        h = hashlib.sha256()
        real = Path(os.path.realpath(java))
        h.update(f"{real}:{real.stat().st_mtime_ns}\n".encode())
        for jar in sorted(libs_dir.glob("*.jar")):
            h.update(f"{jar.resolve()}:{jar.stat().st_size}\n".encode())
        return h.hexdigest()[:16]

    def exists(self) -> bool:
        """True once a training run's archive has been published."""
        return self.path.is_file()

    def use_flags(self) -> list[str]:
        """JVM flags mapping the archive, or nothing if there is none yet."""
        return [f"-XX:SharedArchiveFile={self.path}", _QUIET] if self.exists() else []

    def training_flags(self, node_dir: Path) -> list[str]:
        """JVM flags that dump an archive into ``node_dir`` when the JVM exits normally."""
        out = node_dir / TRAINING_FILE
        out.unlink(missing_ok=True)
        (node_dir / TARGET_FILE).write_text(str(self.path))
        return [f"-XX:ArchiveClassesAtExit={out}", _QUIET]


def publish_training(node_dir: Path, clean_exit: bool) -> None:
    """Publish a training dump from ``node_dir`` into the cache if its JVM exited cleanly.

    Call only once the JVM is gone. An unclean exit (SIGKILL) may have cut the dump
    short, so that file is deleted instead. Copy to a temporary name next to the target,
    then rename: readers see no archive or a whole one (the cache may be on another
    filesystem than the state dir, so a plain rename of the dump is not enough).
    """
    out = node_dir / TRAINING_FILE
    target_file = node_dir / TARGET_FILE
    try:
        if not out.exists() or not target_file.exists():
            return
        target = Path(target_file.read_text().strip())
        if not clean_exit or out.stat().st_size == 0 or target.exists():
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        shutil.copyfile(out, tmp)
        os.replace(tmp, target)
    except OSError:
        pass  # an optimisation only: the next start trains again
    finally:
        out.unlink(missing_ok=True)
        target_file.unlink(missing_ok=True)
