"""``txnstream worker``: host transaction coordinators and the buffer role.

The buffer role runs in a child process of its own by default: both roles are Python
loops, and in one process they share one interpreter lock (the buffer's fold took a
quarter of a busy coordinator's samples). The child leaves when its parent does,
within :data:`PARENT_WATCH_S` even after a kill -9. ``--buffer-in-process`` keeps both in
one process (one metrics endpoint); otherwise the child serves its metrics on the next
port.
"""

from __future__ import annotations

import argparse
import logging
import math
import multiprocessing
import os
import signal
import threading
import time

from txnstream.buffer.worker import BufferWorker
from txnstream.cli import console
from txnstream.cli._common import add_topic_flags, config_from_args
from txnstream.config import KAFKA_LOG, Config
from txnstream.coordinator.kafka_clients import TC_ASSIGNMENT_STRATEGIES
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.kafka.clients import COOPERATIVE


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``worker`` command."""
    p = sub.add_parser("worker", help="run a coordinator worker (scale out by starting more)")
    add_topic_flags(p)
    p.add_argument("--id", default=None, help="worker id (default: host-pid-random)")
    p.add_argument("--session-timeout-ms", type=int, default=WorkerSettings().session_timeout_ms,
                   help="group session timeout: how fast a dead worker's TCs move")
    p.add_argument("--tc-assignment-strategy", choices=TC_ASSIGNMENT_STRATEGIES,
                   default=WorkerSettings().tc_assignment_strategy,
                   help="how the coordinators' group hands TCs out: cooperative-sticky "
                        "moves only the TCs that change owner; range (eager) is the "
                        "protocol of workers before this version: a group cannot mix "
                        "the two, so pass it for a rolling upgrade from them")
    p.add_argument("--buffer-topics", default=None,
                   help="serve only these data topics in the buffer role (comma-separated "
                        "names, or regexes starting with ^; default: every topic a txn "
                        "registers)")
    p.add_argument("--no-buffer-role", action="store_true",
                   help="host coordinators only (another worker must serve buffers)")
    p.add_argument("--buffer-in-process", action="store_true",
                   help="run the buffer role in this process (default: a child process, "
                        "so the two roles do not share one interpreter lock)")
    p.add_argument("--listen", default=WorkerSettings().listen,
                   help="address of the direct line to clients, host:port (port 0: any "
                        "free port; default %(default)s)")
    p.add_argument("--advertise", default=None,
                   help="host:port clients are told to connect to (default: the bound "
                        "listen address)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve Prometheus metrics on --metrics-host:PORT, and the buffer "
                   "role's (a child process) on PORT+1 (default: off)")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address the metrics endpoints bind (default 127.0.0.1; 0.0.0.0 in a "
                   "container, so Prometheus can scrape them)")
    _add_auth_flags(p)
    _add_limit_flags(p)
    p.set_defaults(handler=_run)


def _add_auth_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "authentication of clients",
        "who may use this worker's line (docs/security.md); the worker's own principal, "
        "secret and TLS files are the global --tc-* flags, given before 'worker'. Each "
        "flag overrides its environment variable.")
    g.add_argument("--tc-users-file", default=None, metavar="FILE",
                   help="more principals this worker accepts, one principal=secret line "
                   "each (keep it mode 0600); the worker's own --tc-principal is always "
                   "one (default: $TXNSTREAM_TC_USERS_FILE)")
    g.add_argument("--tc-admin", action="append", default=None, metavar="PRINCIPAL",
                   dest="tc_admins",
                   help="a principal that may list, inspect and abort every txn; repeat for "
                   "more (default: $TXNSTREAM_TC_ADMINS, comma-separated, else the "
                   "worker's own principal)")
    g.add_argument("--tls-client-auth", action=argparse.BooleanOptionalAction, default=None,
                   help="require a client certificate signed by --tc-tls-ca (mutual TLS; "
                   "needs --tc-tls-cert/--tc-tls-key for the worker's own); its common "
                   "name is the client's principal (default: $TXNSTREAM_TC_TLS_CLIENT_AUTH)")
    g.add_argument("--allow-unauthenticated", action="store_true",
                   help="serve the line beyond loopback with no secret, users file or "
                   "mutual TLS; anyone who reaches the port can then act as anyone, so "
                   "the worker refuses to start that way without this flag")
    g.add_argument("--unsigned", action="store_true",
                   help="run without the workers' key: markers are not signed and records' "
                   "membership of txns is not checked, so any producer of a data topic can "
                   "forge markers. A worker with no key (the global --workers-key-file, "
                   "the workers' secret, or the default file `txnstream keygen` and "
                   "`txnstream init` make) refuses to start without this flag")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"must be a share in (0, 1], got {text}")
    return value


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    d = WorkerSettings()
    g = p.add_argument_group(
        "limits", "caps on what clients may hold on this worker, so that no client, or crowd of "
        "them, can exhaust it")
    g.add_argument("--max-connections", type=_positive_int, default=d.max_connections,
                   metavar="N", help="open client connections; one more is refused "
                   "(default %(default)s)")
    g.add_argument("--max-open-txns-per-principal", type=_positive_int,
                   default=d.max_open_txns_per_principal, metavar="N",
                   help="open txns one principal may hold on one coordinator, reserved "
                   "TxnIDs included; a new txn past it is refused (default %(default)s)")
    g.add_argument("--idle-timeout-s", type=_positive_seconds, default=d.idle_timeout_s,
                   metavar="S", help="a connection silent this long is closed; clients "
                   "reconnect on demand (default %(default)s)")
    g.add_argument("--slow-request-s", type=_positive_seconds, default=d.slow_request_s,
                   metavar="S", help="a request answered this long after it arrived is "
                   "logged with where its time went (default %(default)s)")
    g.add_argument("--max-request-bytes", type=_positive_int, default=d.max_request_bytes,
                   metavar="N", help="a request frame larger than this closes its "
                   "connection; honest requests are a few KB (default %(default)s)")
    g.add_argument("--max-inflight-per-connection", type=_positive_int,
                   default=d.max_inflight_per_connection, metavar="N",
                   help="requests of one connection awaiting their reply; past it further "
                   "requests are refused until replies drain (default %(default)s)")
    g.add_argument("--max-handshakes", type=_positive_int, default=d.max_handshakes,
                   metavar="N", help="connections still in their handshake, from every "
                   "address; one more is closed at once (default %(default)s)")
    g.add_argument("--max-handshakes-per-host", type=_positive_int,
                   default=d.max_handshakes_per_host, metavar="N",
                   help="... from one address (default %(default)s)")
    g.add_argument("--max-queued-per-connection", type=_positive_int,
                   default=d.max_queued_per_connection, metavar="N",
                   help="requests of one connection read and not yet handled; the "
                   "connection is not read past it (default %(default)s)")
    g.add_argument("--max-queued-bytes-per-connection", type=_positive_int,
                   default=d.max_queued_bytes_per_connection, metavar="N",
                   help="... and their bytes (default %(default)s)")
    g.add_argument("--max-queued-bytes", type=_positive_int, default=d.max_queued_bytes,
                   metavar="N", help="bytes of every connection's requests read and not "
                   "yet handled; no connection is read past it (default %(default)s)")
    g.add_argument("--read-share", type=_share, default=d.read_share, metavar="F",
                   help="share of the worker's time one principal's reads (GET, LIST, "
                   "STATS) may take; past it its requests wait (admins exempt; default "
                   "%(default)s)")
    g.add_argument("--read-burst-s", type=_positive_seconds, default=d.read_burst_s,
                   metavar="S", help="handling time a principal's reads may take at once "
                   "before the share applies (default %(default)s)")


def worker_config_from_args(args: argparse.Namespace) -> Config:
    """The worker's Config: the global flags, its client-authentication flags, the env."""
    overrides: dict[str, object] = {}
    if args.tc_users_file:
        overrides["tc_users_file"] = args.tc_users_file
    if args.tc_admins:
        overrides["tc_admins"] = tuple(args.tc_admins)
    if args.tls_client_auth is not None:
        overrides["tc_tls_client_auth"] = args.tls_client_auth
    return config_from_args(args, **overrides)


def worker_settings_from_args(args: argparse.Namespace) -> WorkerSettings:
    """The WorkerSettings the ``worker`` command's flags ask for."""
    return WorkerSettings(
        session_timeout_ms=args.session_timeout_ms,
        tc_assignment_strategy=args.tc_assignment_strategy,
        buffer_role=not args.no_buffer_role and args.buffer_in_process,
        buffer_topics=_buffer_topics(args),
        listen=args.listen, advertise=args.advertise,
        allow_unauthenticated=args.allow_unauthenticated, unsigned=args.unsigned,
        max_connections=args.max_connections,
        max_inflight_per_connection=args.max_inflight_per_connection,
        max_request_bytes=args.max_request_bytes,
        idle_timeout_s=args.idle_timeout_s, slow_request_s=args.slow_request_s,
        max_open_txns_per_principal=args.max_open_txns_per_principal,
        max_handshakes=args.max_handshakes,
        max_handshakes_per_host=args.max_handshakes_per_host,
        max_queued_per_connection=args.max_queued_per_connection,
        max_queued_bytes_per_connection=args.max_queued_bytes_per_connection,
        max_queued_bytes=args.max_queued_bytes,
        read_share=args.read_share, read_burst_s=args.read_burst_s)


def _buffer_topics(args: argparse.Namespace) -> tuple[str, ...] | None:
    return (tuple(t for t in args.buffer_topics.split(",") if t)
            if args.buffer_topics else None)


def _run(args: argparse.Namespace) -> int:
    logging.getLogger("txnstream").setLevel(logging.INFO)
    KAFKA_LOG.setLevel(logging.WARNING)  # an operator acts on librdkafka's warnings
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO)
    config = worker_config_from_args(args)
    topics = _buffer_topics(args)
    child = not args.no_buffer_role and not args.buffer_in_process
    settings = worker_settings_from_args(args)
    worker = CoordinatorWorker(config, args.id, settings)
    if args.metrics_port:
        from txnstream import metrics

        metrics.serve(args.metrics_port, args.metrics_host)
    buffers = None
    if child:
        buffers = multiprocessing.get_context("spawn").Process(
            target=run_buffer_role, name=f"txnstream-buffers-{worker.worker_id}",
            # the worker's config names the key file it found: the child uses the same
            args=(worker.config, topics, worker.worker_id, settings.session_timeout_ms,
                  settings.buffer_snapshot_interval_s,
                  args.metrics_port + 1 if args.metrics_port else 0, os.getpid(),
                  args.metrics_host, settings.unsigned, settings.tc_assignment_strategy))
        buffers.start()
    done = threading.Event()

    def stop(signum: int, _frame: object) -> None:
        console.print(f"signal {signum}: leaving the group")
        worker.stop(0)
        if buffers is not None and buffers.pid is not None:
            os.kill(buffers.pid, signal.SIGTERM)
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    console.print(f"worker {worker.worker_id} on {config.bootstrap_servers} "
                  f"(prefix {config.topics.prefix}), clients connect to {worker.address}")
    try:
        worker.run()
    finally:
        if buffers is not None:
            buffers.join(15)
    return 0


PARENT_WATCH_S = 0.5
"""How often the buffer child checks that its worker is still alive."""


def run_buffer_role(config: Config, topics: tuple[str, ...] | None, member: str,
                    session_timeout_ms: int, snapshot_interval_s: float, metrics_port: int,
                    parent: int, metrics_host: str = "127.0.0.1",
                    unsigned: bool = False,
                    assignment_strategy: str = COOPERATIVE) -> None:
    """The buffer role of worker ``member`` (pid ``parent``), in a child process.

    ``unsigned``, ``assignment_strategy``: the worker's ``--unsigned`` and
    ``--tc-assignment-strategy``; the child makes the same choices.
    """
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("txnstream").setLevel(logging.INFO)
    if metrics_port:
        from txnstream import metrics

        metrics.serve(metrics_port, metrics_host)
    bw = BufferWorker(config, list(topics) if topics is not None else None,
                      snapshot_interval_s=snapshot_interval_s, member=member,
                      session_timeout_ms=session_timeout_ms, unsigned=unsigned,
                      assignment_strategy=assignment_strategy)

    def watch() -> None:  # a worker killed -9 takes its buffer role with it
        while True:
            time.sleep(PARENT_WATCH_S)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: bw.stop(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker stops it (Ctrl-C reaches both)
    bw.run()
