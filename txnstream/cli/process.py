"""``txnstream process``: an exactly-once consume-transform-produce demo (upper-cases values)."""

from __future__ import annotations

import argparse
import signal

from txnstream.cli import console
from txnstream.cli._common import add_topic_flags, config_from_args, table
from txnstream.client import Client
from txnstream.message import Message
from txnstream.processor import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_COMMIT_EVERY,
    DEFAULT_COMMIT_INTERVAL_S,
    ExactlyOnceProcessor,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``process`` command."""
    p = sub.add_parser("process", help="exactly-once consume-transform-produce (demo)")
    add_topic_flags(p)
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--subscription", default="txnstream-process")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                   help="inputs per transform turn (default %(default)s)")
    p.add_argument("--commit-interval", type=float, default=DEFAULT_COMMIT_INTERVAL_S,
                   help="seconds: a checkpoint (one txn) commits at most this long after "
                        "its first input (default %(default)s)")
    p.add_argument("--commit-every", type=int, default=DEFAULT_COMMIT_EVERY,
                   help="... or once it holds this many inputs (default %(default)s)")
    p.add_argument("--batch-interval", type=float, default=None,
                   help="the commit interval's old name (each batch was a txn)")
    p.add_argument("--txn-timeout", type=float, default=30.0)
    p.add_argument("--session-timeout-ms", type=int, default=10_000,
                   help="consumer group session timeout: how fast a dead instance's "
                        "partitions move (default 10000)")
    p.add_argument("--cumulative", action="store_true",
                   help="accepted for compatibility: every batch now acks with one "
                        "pending-ack record per partition (cumulative where exact)")
    p.add_argument("--idle", type=float, default=None, help="stop after this many idle seconds")
    p.set_defaults(handler=_run)


def _upper(msg: Message) -> tuple[bytes | None, bytes]:
    return msg.key, (msg.value or b"").upper()


def _run(args: argparse.Namespace) -> int:
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    with Client(config=config_from_args(args)) as client:
        interval = args.commit_interval if args.batch_interval is None else args.batch_interval
        proc = ExactlyOnceProcessor(client, args.input, args.subscription, args.output, _upper,
                                    args.batch_size, txn_timeout_s=args.txn_timeout,
                                    cumulative=args.cumulative, commit_interval_s=interval,
                                    commit_every=args.commit_every,
                                    **{"session.timeout.ms": args.session_timeout_ms,
                                       "heartbeat.interval.ms": 1000})
        try:
            stats = proc.run(max_idle_s=args.idle, stop=lambda: bool(stopping))
        finally:
            proc.close()
    console.print(table("processed", ("checkpoints", "batches", "inputs", "outputs",
                                      "aborted checkpoints"),
                        [(stats.checkpoints, stats.batches, stats.inputs, stats.outputs,
                          stats.aborted_checkpoints)]))
    return 0
