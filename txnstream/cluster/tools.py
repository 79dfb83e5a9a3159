"""Finding the external programs a local broker needs: ``java`` always, ``mvn`` to fetch jars."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from txnstream.errors import ClusterError

__all__ = ["find_java", "find_mvn", "require_tools"]

_HOW_TO_GET = {
    "java": "java (a Java 17+ runtime; set JAVA_HOME or put it on PATH)",
    "mvn": "mvn (Apache Maven, used once to fetch the Kafka jars from Maven Central)",
}
_INSTALL_HINT = (
    "Install what is missing (e.g. `sudo apt-get install openjdk-17-jre-headless maven`, "
    "or `brew install openjdk@17 maven`)"
)
_KAFKA_HOME_HINT = (
    "set KAFKA_HOME to an unpacked Apache Kafka 4.x release "
    "(https://kafka.apache.org/downloads) to use its libs/ instead of fetching with mvn"
)


def find_java() -> Path | None:
    """``$JAVA_HOME/bin/java`` if JAVA_HOME names a JDK/JRE, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("java")
    return Path(found) if found else None


def find_mvn() -> Path | None:
    """``mvn`` on PATH."""
    found = shutil.which("mvn")
    return Path(found) if found else None


def require_tools(need_mvn: bool) -> Path:
    """The java executable, or a ClusterError naming every missing tool and how to get it.

    ``need_mvn`` is true when the jars must be fetched (no valid cache, no KAFKA_HOME); both
    tools are checked before anything starts so one message lists everything to install.
    """
    java = find_java()
    missing = [] if java else ["java"]
    if need_mvn and find_mvn() is None:
        missing.append("mvn")
    if not missing:
        assert java is not None
        return java
    names = " and ".join(f"`{m}`" for m in missing)
    what = "; ".join(_HOW_TO_GET[m] for m in missing)
    hint = _INSTALL_HINT
    if "mvn" in missing:
        hint += f"; or {_KAFKA_HOME_HINT}"
    raise ClusterError(f"cannot start a local Kafka broker: {names} not found on PATH "
                       f"({what}). {hint}.")
