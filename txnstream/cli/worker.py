"""``txnstream worker``: host transaction coordinators and the buffer role."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from txnstream.cli import console
from txnstream.cli._common import add_topic_flags, config_from_args
from txnstream.coordinator.worker import CoordinatorWorker, WorkerSettings


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``worker`` command."""
    p = sub.add_parser("worker", help="run a coordinator worker (scale out by starting more)")
    add_topic_flags(p)
    p.add_argument("--id", default=None, help="worker id (default: host-pid-random)")
    p.add_argument("--session-timeout-ms", type=int, default=WorkerSettings().session_timeout_ms,
                   help="group session timeout: how fast a dead worker's TCs move")
    p.add_argument("--buffer-topics", default=None,
                   help="serve only these data topics in the buffer role (comma-separated "
                        "names, or regexes starting with ^; default: every topic a txn "
                        "registers)")
    p.add_argument("--no-buffer-role", action="store_true",
                   help="host coordinators only (another worker must serve buffers)")
    p.add_argument("--listen", default=WorkerSettings().listen,
                   help="address of the direct line to clients, host:port (port 0: any "
                        "free port; default %(default)s)")
    p.add_argument("--advertise", default=None,
                   help="host:port clients are told to connect to (default: the bound "
                        "listen address)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve Prometheus metrics on 127.0.0.1:PORT (default: off)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    logging.getLogger("txnstream").setLevel(logging.INFO)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO)
    config = config_from_args(args)
    topics = (tuple(t for t in args.buffer_topics.split(",") if t)
              if args.buffer_topics else None)
    worker = CoordinatorWorker(config, args.id, WorkerSettings(
        session_timeout_ms=args.session_timeout_ms, buffer_role=not args.no_buffer_role,
        buffer_topics=topics, listen=args.listen, advertise=args.advertise))
    if args.metrics_port:
        from txnstream import metrics

        metrics.serve(args.metrics_port)
    done = threading.Event()

    def stop(signum: int, _frame: object) -> None:
        console.print(f"signal {signum}: leaving the group")
        worker.stop(0)
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    console.print(f"worker {worker.worker_id} on {config.bootstrap_servers} "
                  f"(prefix {config.topics.prefix}), clients connect to {worker.address}")
    worker.run()
    return 0
