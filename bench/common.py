"""Shared benchmark plumbing: broker, topics, workers, stats, machine description."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka.admin import AdminClient, NewTopic

from txnstream import Config, TopicNames
from txnstream.workers_key import generate_key_file

if TYPE_CHECKING:
    from txnstream.cluster import LocalCluster

TXNSTREAM_BIN = str(Path(sys.executable).with_name("txnstream"))
WORKERS_KEY = Path(".txnstream/bench/workers.key")
"""The benchmark workers' key (made once; theirs alone): they sign markers, as every
deployment's workers do."""


def machine() -> str:
    """One line about this machine."""
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB"
    except OSError:
        pass
    cpu = platform.processor() or platform.machine()
    return (f"{os.cpu_count()} cores{mem}, {cpu}, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def local_cluster(prefix: str = "txnstream-bench-", brokers: int = 1) -> LocalCluster:
    """A local cluster of ``brokers`` (1 or 3; KRaft, 1 GB heap each) on free ports, up;
    :func:`discard_cluster` ends it. For a run given no ``--bootstrap`` /
    ``TXNSTREAM_BOOTSTRAP``."""
    from tests.conftest import _free_port_pair
    from txnstream.cluster import LocalCluster

    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix=prefix)), brokers=brokers,
                           port=_free_port_pair(), heap="1g")
    cluster.up()
    return cluster


def discard_cluster(cluster: LocalCluster) -> None:
    """Stop a :func:`local_cluster` and delete its state (gigabytes of logs)."""
    cluster.down()
    shutil.rmtree(cluster.state_dir, ignore_errors=True)


@dataclass
class RunBroker:
    """Where a standalone bench runs: ``TXNSTREAM_BOOTSTRAP``'s broker, or a local one."""

    bootstrap: str
    pids: list[int] | None
    """The local broker JVM's pids (its CPU is measured); None for a given broker."""
    load: str
    """The load average before the run (1, 5, 15 min)."""
    brokers: int = 1
    """Brokers of the local cluster (1 or 3)."""

    def where(self) -> str:
        if self.pids is None:
            return self.bootstrap
        return "one local broker (KRaft, 1 GB heap)" if self.brokers == 1 else \
            f"{self.brokers} local brokers (KRaft, 1 GB heap each, topics replicated " \
            f"{self.brokers} times)"


@contextmanager
def run_broker(prefix: str, brokers: int = 1) -> Iterator[RunBroker]:
    """The broker for a standalone bench (``python -m bench.scale`` and its kin): the
    one ``TXNSTREAM_BOOTSTRAP`` names, else a :func:`local_cluster` of ``brokers``
    discarded after."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    given = os.environ.get("TXNSTREAM_BOOTSTRAP")
    if given:
        yield RunBroker(given, None, load)
        return
    cluster = local_cluster(prefix, brokers)
    try:
        yield RunBroker(cluster.bootstrap, list(cluster.pids().values()), load, brokers)
    finally:
        discard_cluster(cluster)


def run_line(module: str, argv: list[str], load: str) -> str:
    """A report's first line: the command, the commit, when, and the load before it."""
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    when = dt.datetime.now(dt.UTC)
    return (f"Run: `python -m {module} {' '.join(argv)}` at {rev} on {when:%Y-%m-%d %H:%M} "
            f"UTC, load average before it {load}.  \n")


def plots_line(plots: list[Path]) -> str:
    return ("Plots: " + ", ".join(f"`{p}`" for p in plots) + "\n" if plots
            else "No plots: matplotlib is not installed (the `bench` extra).\n")


def save_figure(fig: Any, path: Path) -> Path:
    """Lay ``fig`` out, write it to ``path`` (100 dpi) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def publish(md: str, out: Path | str | None) -> None:
    """Append a report to ``out``, or print it."""
    if out:
        with open(out, "a") as f:
            f.write(md)
        print(f"appended to {out}")
    else:
        print(md)


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) of ``values``."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def fresh_config(bootstrap: str, coordinators: int = 4, replication: int = 1) -> Config:
    """A Config with a unique topic prefix, internal topics created, the workers' key;
    every topic (the bench's data topics too) replicated ``replication`` times."""
    from txnstream.admin_topics import ensure_topics

    generate_key_file(WORKERS_KEY)
    cfg = Config(bootstrap_servers=bootstrap, topics=TopicNames(f"__b{uuid.uuid4().hex[:6]}"),
                 num_coordinators=coordinators, workers_key_file=str(WORKERS_KEY.resolve()),
                 replication_factor=replication)
    ensure_topics(cfg)
    return cfg


def make_topic(cfg: Config, partitions: int, name: str | None = None) -> str:
    """A data topic for one measurement."""
    name = name or f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(cfg.admin())
    for f in admin.create_topics([NewTopic(name, partitions,
                                           cfg.replication_factor)]).values():
        f.result(30)
    deadline = time.monotonic() + 30
    while name not in admin.list_topics(timeout=5).topics and time.monotonic() < deadline:
        time.sleep(0.1)
    return name


@contextmanager
def worker_processes(cfg: Config, names: list[str], log_dir: Path | None = None,
                     session_timeout_ms: int | None = None
                     ) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """Real ``txnstream worker`` processes, one per name (its ``--id``), for the duration.

    ``session_timeout_ms``: the workers' group session timeout (None: the worker's
    default). Every process still running at the end is terminated, then killed, by pid.
    """
    log_dir = log_dir or Path(".txnstream/bench-logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in names:
            cmd = [TXNSTREAM_BIN, "--bootstrap", cfg.bootstrap_servers,
                   *(["--workers-key-file", cfg.workers_key_file] if cfg.workers_key_file
                     else []), "worker", "--prefix", cfg.topics.prefix, "--id", name]
            if session_timeout_ms is not None:
                cmd += ["--session-timeout-ms", str(session_timeout_ms)]
            with open(log_dir / f"worker-{cfg.topics.prefix}-{name}.log", "ab") as log:
                procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True)
        _wait_serving(cfg)
        yield procs
    finally:
        for p in procs.values():
            p.terminate()  # a no-op for one already dead and reaped
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


@contextmanager
def workers(cfg: Config, count: int = 1, log_dir: Path | None = None) -> Iterator[list[int]]:
    """``count`` real ``txnstream worker`` processes for the duration; pids yielded."""
    names = [f"{cfg.topics.prefix}-{i}" for i in range(count)]
    with worker_processes(cfg, names, log_dir) as procs:
        yield [p.pid for p in procs.values()]


def _wait_serving(cfg: Config, timeout_s: float = 90) -> None:
    from txnstream import Client

    deadline = time.monotonic() + timeout_s
    with Client(config=cfg) as c:
        while time.monotonic() < deadline:
            try:
                if len(c.admin.coordinator_stats()) == cfg.num_coordinators:
                    return
            except Exception:
                pass
            time.sleep(0.5)
    raise RuntimeError("coordinator workers did not start serving")


def goal_row(measure: str, txnstream: str, anchor: str, anchor_value: str,
             ratio: float | None, op: str, target: float) -> dict:
    """One row of an issue's goal table: the ratio, the goal (``op`` is ``>=`` or ``<=``)
    and whether this run met it; the unrounded ratio under ``_ratio`` (keys starting with
    ``_`` are not shown)."""
    if ratio is None or ratio != ratio:  # missing or NaN
        met = "n/a"
    else:
        met = "yes" if (ratio >= target if op == ">=" else ratio <= target) else "no"
    return {"measure": measure, "txnstream": txnstream, "anchor": anchor,
            "anchor value": anchor_value,
            "ratio": None if ratio is None else f"{ratio:.2f}x",
            "goal": f"{op} {target}x", "met": met, "_ratio": ratio}


def ratio(a: float, b: float) -> float | None:
    """``a / b``, None when ``b`` is zero or either is missing."""
    return a / b if a == a and b == b and b else None
