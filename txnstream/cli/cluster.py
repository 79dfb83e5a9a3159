"""``txnstream cluster up|status|down``: a local Apache Kafka broker without Docker.

``up`` fetches the broker jars from Maven Central with ``mvn`` (once; cached), formats
KRaft storage and starts one node (or three with ``--brokers 3``) on 127.0.0.1, then
prints the bootstrap string and makes the workers' key where workers given none look
(:func:`~txnstream.workers_key.ensure_default_key`), if there is none. The brokers keep
running after the command exits; ``down`` stops them (only the processes recorded in
the state dir). Errors are one line and exit code 2 (see :mod:`txnstream.cli`).
"""

from __future__ import annotations

import argparse
import functools
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.status import Status
from rich.table import Table

from txnstream.cli import console, err_console
from txnstream.cli._common import config_from_args, table
from txnstream.cluster import KAFKA_VERSION, LocalCluster, NodeStatus, ScramUser
from txnstream.cluster.local import DEFAULT_DOWN_TIMEOUT_S, DEFAULT_UP_TIMEOUT_S
from txnstream.errors import ClusterError
from txnstream.workers_key import ensure_default_key

__all__ = ["register", "default_state_dir"]


def default_state_dir() -> Path:
    """``$TXNSTREAM_STATE_DIR`` or ``./.txnstream/cluster`` (relative to the cwd)."""
    return Path(os.environ.get("TXNSTREAM_STATE_DIR") or Path.cwd() / ".txnstream" / "cluster")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``cluster`` command group."""
    p = sub.add_parser("cluster", help="run a local Apache Kafka broker (no Docker needed)",
                       description="Run Apache Kafka (KRaft) on 127.0.0.1 from jars fetched "
                       "with mvn: one node, or three for failure tests.")
    actions = p.add_subparsers(dest="cluster_command", metavar="ACTION")

    up = actions.add_parser("up", help="fetch Kafka if needed, start the broker(s), wait")
    up.add_argument("--brokers", type=int, choices=(1, 3), default=1,
                    help="1 for development, 3 for failure tests (default 1)")
    up.add_argument("--port", type=int, default=9092,
                    help="client port of node 1; node i uses port+i-1 (default 9092)")
    up.add_argument("--controller-port", type=int, default=None,
                    help="KRaft controller port of node 1 (default: --port + 100)")
    up.add_argument("--heap", default="512m", help="JVM heap per broker (default 512m)")
    up.add_argument("--timeout", type=float, default=DEFAULT_UP_TIMEOUT_S,
                    help=f"seconds to wait for the cluster to answer (default "
                    f"{DEFAULT_UP_TIMEOUT_S:.0f})")
    up.add_argument("--sasl-scram", metavar="USER", default=None,
                    help="secure the client listener with SASL/SCRAM-SHA-512 for USER; the "
                    "password comes from $TXNSTREAM_SASL_PASSWORD or is generated, and is "
                    "written only to <state-dir>/client.properties (mode 0600)")
    _add_state_dir(up)
    up.set_defaults(handler=_plain_errors(_up))

    status = actions.add_parser("status", help="show the nodes (exit 0 only if all run)")
    _add_state_dir(status)
    status.set_defaults(handler=_plain_errors(_status))

    down = actions.add_parser("down", help="stop the broker(s) started by `up`")
    down.add_argument("--timeout", type=float, default=DEFAULT_DOWN_TIMEOUT_S,
                      help="seconds of grace after SIGTERM before SIGKILL (default "
                      f"{DEFAULT_DOWN_TIMEOUT_S:.0f})")
    _add_state_dir(down)
    down.set_defaults(handler=_plain_errors(_down))

    def _usage(_args: argparse.Namespace) -> int:
        p.print_help()
        return 1

    p.set_defaults(handler=_usage)


def _add_state_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", type=Path, default=None,
                   help="where node data, logs and pid files live "
                   "(default: $TXNSTREAM_STATE_DIR or ./.txnstream/cluster)")


def _plain_errors(handler: Callable[[argparse.Namespace], int]
                  ) -> Callable[[argparse.Namespace], int]:
    """Print a ClusterError as one escaped message and return exit code 2.

    Cluster errors quote broker logs, whose ``[RaftManager id=1]``-style prefixes rich
    would take for markup (and a ``[/...]`` would make it raise), so the text is escaped
    here rather than relying on the generic handler in :mod:`txnstream.cli`.
    """

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except ClusterError as exc:
            if os.environ.get("TXNSTREAM_DEBUG"):
                raise
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
            return 2

    return run


class _RichReporter:
    """Drives a rich spinner with the cluster's progress; notes are printed above it."""

    def __init__(self, out: Console, spinner: Status) -> None:
        self.out = out
        self.spinner = spinner

    def status(self, text: str) -> None:
        """Show ``text`` next to the spinner."""
        self.spinner.update(text)

    def note(self, text: str) -> None:
        """Print ``text`` as a lasting line."""
        self.out.print(text, highlight=False, markup=False)


def _nodes_table(nodes: list[NodeStatus]) -> Table:
    return table("txnstream local Kafka", ["node", "pid", "alive", "port", "controller", "log"],
                 [(n.node_id, n.pid, "yes" if n.alive else "no", n.port, n.controller_port,
                   n.log_path) for n in nodes])


def _up(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or default_state_dir()
    sasl = None
    if args.sasl_scram:
        recorded = LocalCluster.from_state_dir(state_dir)
        password = (os.environ.get("TXNSTREAM_SASL_PASSWORD")
                    or (recorded.sasl.password if recorded and recorded.sasl else None)
                    or secrets.token_urlsafe(24))
        sasl = ScramUser(args.sasl_scram, password)
    with err_console.status("starting local Kafka") as spinner:
        cluster = LocalCluster(state_dir, brokers=args.brokers, port=args.port,
                               controller_port=args.controller_port, heap=args.heap,
                               sasl=sasl, reporter=_RichReporter(err_console, spinner))
        cluster.up(timeout_s=args.timeout)
    report = cluster.last_up
    assert report is not None
    if report.started:
        console.print(
            f"Apache Kafka {KAFKA_VERSION}: {cluster.brokers} node(s) answered "
            f"{report.answer_s:.1f} s after start ({report.total_s:.1f} s in all: jars "
            f"{report.fetch_s:.1f} s from {report.classpath}, format {report.format_s:.1f} s)",
            highlight=False, markup=False)
    console.print(_nodes_table(cluster.status()))
    console.print(f"bootstrap: {cluster.bootstrap}", highlight=False, markup=False,
                  soft_wrap=True)
    console.print(f"  export TXNSTREAM_BOOTSTRAP={cluster.bootstrap}",
                  highlight=False, markup=False, soft_wrap=True)
    if cluster.client_properties:
        console.print(f"SASL/SCRAM user {args.sasl_scram}: clients take "
                      f"--kafka-config {cluster.client_properties}\n"
                      f"  export TXNSTREAM_KAFKA_CONFIG={cluster.client_properties}",
                      highlight=False, markup=False, soft_wrap=True)
    console.print(ensure_default_key(config_from_args(args)), highlight=False, markup=False,
                  soft_wrap=True)
    console.print(f"stop with: txnstream cluster down --state-dir {cluster.state_dir}",
                  highlight=False, markup=False)
    return 0


def _status(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or default_state_dir()
    cluster = LocalCluster.from_state_dir(state_dir)
    if cluster is None:
        console.print(f"no local cluster in {Path(state_dir).resolve()} "
                      "(start one with `txnstream cluster up`)", highlight=False, markup=False)
        return 1
    nodes = cluster.status()
    console.print(_nodes_table(nodes))
    console.print(f"bootstrap: {cluster.bootstrap}", highlight=False, markup=False,
                  soft_wrap=True)
    return 0 if all(n.alive for n in nodes) else 1


def _down(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or default_state_dir()
    with err_console.status("stopping local Kafka") as spinner:
        cluster = LocalCluster.from_state_dir(state_dir,
                                              reporter=_RichReporter(err_console, spinner))
        if cluster is None:
            console.print(f"no local cluster in {Path(state_dir).resolve()}: nothing to stop",
                          highlight=False, markup=False)
            return 0
        running = cluster.pids()
        cluster.down(timeout_s=args.timeout)
    if running:
        console.print("stopped " + ", ".join(f"node {i} (pid {pid})"
                                             for i, pid in sorted(running.items())),
                      highlight=False, markup=False)
    else:
        console.print("no node was running", highlight=False, markup=False)
    return 0
