"""How the two JVMs we run are launched: Kafka's storage formatter and the broker itself.

Everything here is about command lines and their one-shot side effects (formatting); the
lifecycle of running brokers (pid files, waiting, stopping) lives in
:mod:`txnstream.cluster.local` and :mod:`txnstream.cluster.process`.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from txnstream.cluster import process
from txnstream.cluster.cds import ClassDataArchive
from txnstream.cluster.jars import KAFKA_VERSION, Classpath, cache_root, resolve_classpath
from txnstream.cluster.layout import ClusterLayout, ScramUser
from txnstream.cluster.report import Reporter
from txnstream.cluster.tools import require_tools
from txnstream.errors import ClusterError

__all__ = ["Runtime", "prepare_runtime", "format_storage", "broker_command", "exit_hint"]

FORMAT_TIMEOUT_S = 120.0
"""The storage formatter is a short-lived JVM (~1 s); 2 min only catches a hung one."""
LOG_TAIL_LINES = 30

FORMATTER_JVM = ["-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
"""The formatter runs for about a second: C1 only and the serial GC start fastest."""
BROKER_JVM = ["-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError",
              "-Djava.awt.headless=true"]
"""As Kafka's own ``kafka-run-class.sh``; exit on OOM so a dead broker is visibly dead."""
STORAGE_TOOL = "kafka.tools.StorageTool"
"""``kafka-storage.sh``'s main class (in kafka_2.13, unchanged through 4.x)."""
BROKER_MAIN = "kafka.Kafka"


@dataclass(frozen=True, slots=True)
class Runtime:
    """What launching a JVM needs: found and verified once per ``up``/``start_node``."""

    java: Path
    classpath: Classpath
    log4j: Path
    cds: ClassDataArchive


def prepare_runtime(state_dir: Path, reporter: Reporter, cache_dir: Path | None,
                    need_mvn: bool) -> Runtime:
    """Find java (and mvn if the jars must be fetched), get the jars, place the log4j config.

    Raises ClusterError naming whatever is missing before anything is downloaded.
    """
    java = require_tools(need_mvn and not os.environ.get("KAFKA_HOME"))
    classpath = resolve_classpath(reporter, cache_dir)
    cds = ClassDataArchive(cache_dir or cache_root(), java, classpath.libs_dir)
    return Runtime(java, classpath, _write_log4j_config(state_dir), cds)


def _write_log4j_config(state_dir: Path) -> Path:
    """Copy the packaged log4j2.properties into the state dir (a stable path for the JVMs)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "log4j2.properties"
    text = (resources.files("txnstream.cluster") / "log4j2.properties").read_text()
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def format_storage(rt: Runtime, layout: ClusterLayout, cluster_id: str,
                   node_ids: list[int], reporter: Reporter,
                   scram: ScramUser | None = None) -> None:
    """Format KRaft storage of each node that has none yet, all in parallel.

    A node counts as formatted once ``data/meta.properties`` exists (the formatter writes
    it last), so a crash mid-format is redone by the next call with the same cluster id.
    """
    todo = [i for i in node_ids if not (layout.data_dir(i) / "meta.properties").exists()]
    if not todo:
        return
    reporter.status(f"formatting KRaft storage of node(s) {todo}")

    def run(i: int) -> tuple[int, int | None]:
        out = layout.node_dir(i) / "format.log"
        cmd = [str(rt.java), *FORMATTER_JVM, *rt.cds.use_flags(),
               f"-Dlog4j2.configurationFile={rt.log4j}", "-Dtxnstream.log.level=WARN",
               "-cp", rt.classpath.java_arg, STORAGE_TOOL,
               "format", "-t", cluster_id, "-c", str(layout.properties_path(i))]
        if scram:  # the SCRAM credential is bootstrapped into the metadata log (KRaft)
            cmd += ["--add-scram", scram.format_arg()]
        with out.open("wb") as fh:
            try:
                return i, subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, check=False,
                                         timeout=FORMAT_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                return i, None

    with ThreadPoolExecutor(len(todo)) as pool:
        results = list(pool.map(run, todo))
    for i, rc in results:
        if rc != 0:
            log = layout.node_dir(i) / "format.log"
            raise ClusterError(
                f"formatting KRaft storage of node {i} failed "
                f"({'timed out' if rc is None else f'exit code {rc}'}); {log} ends with:\n"
                f"{process.log_tail(log, 0, LOG_TAIL_LINES)}")


def broker_command(rt: Runtime, layout: ClusterLayout, node_id: int, heap: str) -> list[str]:
    """The ``java ... kafka.Kafka server.properties`` command line of one node.

    The properties path in it is absolute and inside the state dir: that is how
    :func:`txnstream.cluster.process.owned_pid` recognises the JVM as ours. Node 1 trains
    the class-data archive when there is none yet (:mod:`txnstream.cluster.cds`).
    """
    if rt.cds.exists():
        cds = rt.cds.use_flags()
    elif node_id == 1:
        cds = rt.cds.training_flags(layout.node_dir(node_id))
    else:
        cds = []
    return [str(rt.java), f"-Xmx{heap}", *BROKER_JVM, *cds,
            f"-Dlog4j2.configurationFile={rt.log4j}", "-Dtxnstream.log.level=INFO",
            "-cp", rt.classpath.java_arg, BROKER_MAIN, str(layout.properties_path(node_id))]


def exit_hint(tail: str, layout: ClusterLayout, node_id: int, heap: str) -> str:
    """A sentence saying what to do about a broker that died with ``tail`` in its log."""
    if "Address already in use" in tail:
        return (f" A port of node {node_id} ({layout.client_port(node_id)} or "
                f"{layout.controller_port_of(node_id)}) was taken; pick others with --port.")
    if "UnsupportedClassVersionError" in tail:
        return f" Kafka {KAFKA_VERSION} needs Java 17 or newer; point JAVA_HOME at one."
    if "OutOfMemoryError" in tail:
        return f" The JVM ran out of memory with -Xmx{heap}; give it more heap."
    if "InconsistentClusterIdException" in tail or "Invalid cluster.id" in tail:
        return (f" The storage under {layout.state_dir} belongs to another cluster; delete "
                "the state dir to start over.")
    return ""
