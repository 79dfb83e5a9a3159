"""``LocalCluster``: a real Apache Kafka (KRaft) cluster on 127.0.0.1, started without Docker.

One node for development, three for failure tests. Each node is one JVM running
``kafka.Kafka`` in combined broker+controller mode; nothing is shared between nodes but
the jars. See :mod:`txnstream.cluster.layout` for ports and the state directory.

``up`` step by step, and what a crash (or Ctrl-C) right after each step leaves behind:

1. Check ports and tools, fetch/verify the jars (:mod:`txnstream.cluster.jars`).
   Crash: nothing, or a partial jar cache that the next run repairs.
2. Write ``cluster.json`` (layout + cluster id) and each node's ``server.properties``.
   Crash: files only; the next ``up`` reuses the cluster id, so nodes formatted later
   join the same cluster.
3. Format KRaft storage of every node that has no ``data/meta.properties`` yet.
   Crash: some nodes formatted; the next ``up`` formats the rest with the same id.
4. Start the JVMs, writing each pid file right after its ``Popen``. Crash: brokers
   running with pid files, so ``down`` (or the next ``up``, which adopts them) finds them.
5. Wait until the cluster answers a metadata request naming every node. If a node exits
   or the deadline passes, the nodes this call started are stopped again before the
   error is raised, so a failed ``up`` leaves no JVM behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from txnstream.cluster import process
from txnstream.cluster.cds import publish_training
from txnstream.cluster.jars import JarCache
from txnstream.cluster.jvm import (
    LOG_TAIL_LINES,
    Runtime,
    broker_command,
    exit_hint,
    format_storage,
    prepare_runtime,
)
from txnstream.cluster.layout import (
    ClusterLayout,
    ScramUser,
    new_cluster_id,
    read_cluster_file,
    render_server_properties,
    write_cluster_file,
)
from txnstream.cluster.probe import ClusterProbe
from txnstream.cluster.report import Reporter, StderrReporter
from txnstream.config import load_kafka_properties
from txnstream.errors import ClusterError

__all__ = ["LocalCluster", "NodeStatus", "StartupReport", "CLIENT_PROPERTIES"]

CLIENT_PROPERTIES = "client.properties"
"""A secured cluster's client settings, in its state dir (``--kafka-config`` takes it)."""

DEFAULT_UP_TIMEOUT_S = 90.0
"""A cold 3-node start on a loaded 2-core machine takes ~10 s; 90 s means something is wrong."""
DEFAULT_DOWN_TIMEOUT_S = 30.0
"""Grace for a clean shutdown (flushes logs, so the next start skips log recovery)."""


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node as ``status`` sees it."""

    node_id: int
    pid: int | None
    """The JVM's pid if it runs (verified as ours), else None."""
    alive: bool
    port: int
    controller_port: int
    log_path: Path


@dataclass(frozen=True, slots=True)
class StartupReport:
    """What the last ``up`` did and how long each part took (seconds)."""

    started: tuple[int, ...]
    """Node ids this call started; empty when all were already running."""
    classpath: str
    """Where the jars came from: ``cache``, ``maven`` (fetched now), ``KAFKA_HOME``, or ``""``."""
    fetch_s: float
    format_s: float
    answer_s: float
    """From launching the JVMs to the cluster answering with every node in its metadata."""
    total_s: float


class LocalCluster:
    """A local KRaft Kafka cluster whose state lives in ``state_dir``.

    Usable as a context manager (``up`` on entry, ``down`` on exit). Only processes whose
    pid files are in ``state_dir`` and whose command line names this state dir are ever
    signalled (see :mod:`txnstream.cluster.process`).

    Args:
        state_dir: node data, logs, pid files (see :mod:`txnstream.cluster.layout`).
        brokers: 1, or 3 for failure tests.
        port: client port of node 1; node i listens on ``port + i - 1``.
        controller_port: controller port of node 1 (default ``port + 100``).
        heap: ``-Xmx`` of each broker JVM.
        sasl: a SCRAM user: the client listener then takes SASL_PLAINTEXT logins of that
            user only; clients use :attr:`client_settings` or ``client.properties``.
        cache_dir: jar cache root (default ``$TXNSTREAM_CACHE`` or ``~/.cache/txnstream``).
        reporter: receives progress; default logs, and prints notes to stderr.
    """

    def __init__(
        self,
        state_dir: Path,
        brokers: int = 1,
        port: int = 9092,
        controller_port: int | None = None,
        heap: str = "512m",
        *,
        sasl: ScramUser | None = None,
        cache_dir: Path | None = None,
        reporter: Reporter | None = None,
    ) -> None:
        self.layout = ClusterLayout.create(Path(state_dir), brokers, port, controller_port)
        self.heap = heap
        self.sasl = sasl
        self.cache_dir = cache_dir
        self.reporter: Reporter = reporter or StderrReporter()
        self.last_up: StartupReport | None = None
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    @classmethod
    def from_state_dir(cls, state_dir: Path, *, cache_dir: Path | None = None,
                       reporter: Reporter | None = None) -> LocalCluster | None:
        """The cluster recorded in ``state_dir`` by an earlier ``up``, or None if none was."""
        recorded = read_cluster_file(Path(state_dir))
        if recorded is None:
            return None
        layout, _ = recorded
        sasl = None
        props = layout.state_dir / CLIENT_PROPERTIES
        if props.exists():
            conf = load_kafka_properties(props)
            sasl = ScramUser(conf["sasl.username"], conf["sasl.password"],
                             conf["sasl.mechanisms"])
        return cls(layout.state_dir, layout.brokers, layout.port, layout.controller_port,
                   sasl=sasl, cache_dir=cache_dir, reporter=reporter)

    # --- introspection ---------------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        """Absolute state directory."""
        return self.layout.state_dir

    @property
    def brokers(self) -> int:
        """Number of nodes."""
        return self.layout.brokers

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients, e.g. ``127.0.0.1:9092``."""
        return self.layout.bootstrap

    @property
    def client_settings(self) -> dict[str, str]:
        """The librdkafka settings a client needs besides ``bootstrap.servers`` (SASL or none)."""
        return self.sasl.client_settings() if self.sasl else {}

    @property
    def client_properties(self) -> Path | None:
        """``<state_dir>/client.properties`` (mode 0600) of a secured cluster, else None.

        Give it to the CLI as ``--kafka-config`` or ``$TXNSTREAM_KAFKA_CONFIG``.
        """
        return self.state_dir / CLIENT_PROPERTIES if self.sasl else None

    def _write_secret(self, path: Path, text: str) -> None:
        """Write a file that holds the SCRAM password: readable by its owner only."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(path, 0o600)

    def _pid(self, node_id: int) -> int | None:
        proc = self._procs.get(node_id)
        if proc is not None and proc.poll() is not None:
            del self._procs[node_id]  # our child exited: reaped by poll()
        return process.owned_pid(self.layout.pid_path(node_id),
                                 str(self.layout.properties_path(node_id)))

    def pids(self) -> dict[int, int]:
        """Node id -> pid of every node of ours that is running."""
        out = {}
        for i in self.layout.node_ids:
            pid = self._pid(i)
            if pid is not None:
                out[i] = pid
        return out

    def status(self) -> list[NodeStatus]:
        """Every node, running or not."""
        out = []
        for i in self.layout.node_ids:
            pid = self._pid(i)
            out.append(NodeStatus(i, pid, pid is not None, self.layout.client_port(i),
                                  self.layout.controller_port_of(i), self.layout.log_path(i)))
        return out

    # --- up --------------------------------------------------------------------------

    def up(self, timeout_s: float = DEFAULT_UP_TIMEOUT_S) -> None:
        """Start every node that is not running and wait until the cluster answers.

        A no-op (that reports the running nodes) when all nodes already run. ``timeout_s``
        bounds the wait once the JVMs are launched (fetching jars has its own limit,
        ``jars.MVN_TIMEOUT_S``). Timings land in :attr:`last_up`. Raises ClusterError with
        an actionable message on any failure; see the module docstring for the steps and
        what each leaves behind.
        """
        t0 = time.monotonic()
        cluster_id = self._adopt_recorded_layout()
        running = self.pids()
        if len(running) == self.brokers:
            self.reporter.note(f"already running: {self._describe(running)}")
            self.last_up = StartupReport((), "", 0.0, 0.0, 0.0, time.monotonic() - t0)
            return
        to_start = [i for i in self.layout.node_ids if i not in running]
        self._check_ports(to_start)
        rt = prepare_runtime(self.state_dir, self.reporter, self.cache_dir,
                             need_mvn=not JarCache(self.cache_dir).is_fetched())
        t_fetch = time.monotonic()

        write_cluster_file(self.layout, cluster_id)
        if self.sasl:
            self._write_secret(self.state_dir / CLIENT_PROPERTIES, "".join(
                f"{k}={v}\n" for k, v in self.sasl.client_settings().items()))
        for i in to_start:
            self.layout.node_dir(i).mkdir(parents=True, exist_ok=True)
            self._write_secret(self.layout.properties_path(i),
                               render_server_properties(self.layout, i, self.sasl))
        format_storage(rt, self.layout, cluster_id, to_start, self.reporter, self.sasl)
        t_format = time.monotonic()

        offsets = {}
        try:
            for i in to_start:
                offsets[i] = self._launch(rt, i)
            self.reporter.status(f"waiting for {self.bootstrap} to answer")
            self._wait_ready(list(self.layout.node_ids), offsets, t_format + timeout_s)
        except BaseException:
            # Leave nothing half-started behind: stop exactly the nodes this call started.
            self._stop({i: pid for i, pid in self.pids().items() if i in offsets}, 5.0)
            raise
        t_ready = time.monotonic()
        self.last_up = StartupReport(tuple(to_start), rt.classpath.source, t_fetch - t0,
                                     t_format - t_fetch, t_ready - t_format, t_ready - t0)
        logs = ", ".join(str(self.layout.log_path(i)) for i in to_start)
        self.reporter.note(f"node logs: {logs}")

    def _adopt_recorded_layout(self) -> str:
        """The cluster id to use, after reconciling the requested layout with the recorded one.

        A formatted state dir cannot change its node count (the KRaft voters are fixed at
        format time). While nodes run, their recorded ports win over the requested ones.
        """
        recorded = read_cluster_file(self.state_dir)
        if recorded is None:
            return new_cluster_id()
        layout, cluster_id = recorded
        formatted = any((layout.data_dir(i) / "meta.properties").exists()
                        for i in layout.node_ids)
        if layout.brokers != self.brokers and formatted:
            raise ClusterError(
                f"{self.state_dir} holds a {layout.brokers}-broker cluster, not "
                f"{self.brokers}: run `txnstream cluster down` and delete that directory, "
                "or pass another --state-dir")
        if layout != self.layout and self._pids_of(layout):
            self.reporter.note(f"nodes already run with ports from {layout.bootstrap}; using those")
            self.layout = layout
        return cluster_id

    def _pids_of(self, layout: ClusterLayout) -> dict[int, int]:
        """Running nodes of ours under another layout of the same state dir."""
        return {i: pid for i in layout.node_ids
                if (pid := process.owned_pid(layout.pid_path(i),
                                             str(layout.properties_path(i)))) is not None}

    def _check_ports(self, node_ids: list[int]) -> None:
        """ClusterError naming the first taken port, before anything is started."""
        for i in node_ids:
            for kind, port in (("client", self.layout.client_port(i)),
                               ("controller", self.layout.controller_port_of(i))):
                if process.port_in_use(port):
                    raise ClusterError(
                        f"port {port} on 127.0.0.1 is already in use (the {kind} port of node "
                        f"{i}); stop whatever listens there, or choose other ports with "
                        f"--port N (node i listens on N+i-1 and its controller on N+100+i-1)")

    def _launch(self, rt: Runtime, node_id: int) -> int:
        """Start one node's JVM and record its pid; the log offset where this run begins."""
        log = self.layout.log_path(node_id)
        offset = log.stat().st_size if log.exists() else 0
        cmd = broker_command(rt, self.layout, node_id, self.heap)
        header = (f"\n===== txnstream: starting node {node_id} at "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}, jars from {rt.classpath.source}: "
                  f"{rt.classpath.libs_dir} =====\n")
        self.reporter.status(f"starting node {node_id} on 127.0.0.1:"
                             f"{self.layout.client_port(node_id)}")
        proc = process.spawn(cmd, log, header)
        # Written at once: from here on `down` can find this JVM even if we crash now.
        process.write_pid_file(self.layout.pid_path(node_id), proc.pid)
        self._procs[node_id] = proc
        return offset + len(header.encode())

    def _wait_ready(self, expect: list[int], offsets: dict[int, int], deadline: float) -> None:
        """Return once a metadata request lists every node in ``expect``.

        Raises ClusterError if a node we started exits (with the tail of its log) or the
        deadline passes.
        """
        probe = ClusterProbe(self.bootstrap, [self.layout.client_port(i) for i in expect],
                             self.client_settings)
        while True:
            for i, offset in offsets.items():
                proc = self._procs.get(i)
                if proc is not None and proc.poll() is not None:
                    raise self._exited_early(i, proc.returncode, offset)
            seen = probe.brokers()
            if set(expect) <= seen:
                return
            if time.monotonic() >= deadline:
                missing = sorted(set(expect) - seen)
                tails = "\n".join(
                    f"--- {self.layout.log_path(i)} ---\n"
                    f"{process.log_tail(self.layout.log_path(i), offsets.get(i, 0), 10)}"
                    for i in missing or expect)
                raise ClusterError(f"timed out waiting for {self.bootstrap} to answer with "
                                   f"node(s) {missing or expect} in its metadata; last log "
                                   f"lines:\n{tails}")
            time.sleep(0.1)

    def _exited_early(self, node_id: int, rc: int | None, offset: int) -> ClusterError:
        log = self.layout.log_path(node_id)
        tail = process.log_tail(log, offset, LOG_TAIL_LINES)
        hint = exit_hint(tail, self.layout, node_id, self.heap)
        return ClusterError(f"Kafka node {node_id} exited during startup (exit code {rc})."
                            f"{hint} Log: {log}; it ends with:\n{tail}")

    # --- down, failures --------------------------------------------------------------

    def down(self, timeout_s: float = DEFAULT_DOWN_TIMEOUT_S) -> None:
        """Stop every node of ours: SIGTERM, then SIGKILL whatever still runs after the grace.

        Stale pid files (process gone, or the pid now belongs to something else) are removed
        without signalling anything. Data stays in the state dir for the next ``up``.
        """
        self._stop(self.pids(), timeout_s)

    def _stop(self, pids: dict[int, int], grace_s: float) -> None:
        if pids:
            self.reporter.status(f"stopping {self._describe(pids)}")
            killed = process.stop_pids(pids, grace_s)
            if killed:
                self.reporter.note(f"node(s) {killed} ignored SIGTERM for {grace_s:.0f} s; "
                                   "sent SIGKILL")
            for i in pids:
                publish_training(self.layout.node_dir(i), clean_exit=i not in killed)
        for i in self.layout.node_ids:
            if i in pids or self._pid(i) is None:
                self.layout.pid_path(i).unlink(missing_ok=True)
                self._procs.pop(i, None)

    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one running node (fault tests); after SIGKILL, wait until it is gone.

        Other signals (SIGTERM, SIGSTOP, SIGCONT) return at once.
        """
        pid = self._pid(node_id)
        if pid is None:
            raise ClusterError(f"node {node_id} of {self.state_dir} is not running")
        if sig == signal.SIGKILL:
            process.stop_pids({node_id: pid}, 0.0, signal.SIGKILL)
            publish_training(self.layout.node_dir(node_id), clean_exit=False)
            self.layout.pid_path(node_id).unlink(missing_ok=True)
            self._procs.pop(node_id, None)
        else:
            os.kill(pid, sig)

    def start_node(self, node_id: int, timeout_s: float = DEFAULT_UP_TIMEOUT_S) -> None:
        """(Re)start one node and wait until the cluster lists it again. No-op if it runs."""
        if node_id not in self.layout.node_ids:
            raise ClusterError(f"node {node_id} is not in a {self.brokers}-node cluster")
        if self._pid(node_id) is not None:
            return
        recorded = read_cluster_file(self.state_dir)
        if recorded is None or not (self.layout.data_dir(node_id) / "meta.properties").exists():
            raise ClusterError(f"node {node_id} of {self.state_dir} was never formatted; "
                               "use up() first")
        self._check_ports([node_id])
        rt = prepare_runtime(self.state_dir, self.reporter, self.cache_dir, need_mvn=False)
        t0 = time.monotonic()
        offset = self._launch(rt, node_id)
        try:
            self._wait_ready([node_id], {node_id: offset}, t0 + timeout_s)
        except BaseException:
            self._stop({node_id: pid} if (pid := self._pid(node_id)) else {}, 5.0)
            raise

    # --- helpers ---------------------------------------------------------------------

    def _describe(self, pids: dict[int, int]) -> str:
        return ", ".join(f"node {i} (pid {pid}, 127.0.0.1:{self.layout.client_port(i)})"
                         for i, pid in sorted(pids.items()))

    def __enter__(self) -> LocalCluster:
        self.up()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.down()

    def __repr__(self) -> str:
        return (f"LocalCluster({str(self.state_dir)!r}, brokers={self.brokers}, "
                f"bootstrap={self.bootstrap!r})")
