"""``txnstream produce``: write records by hand, transactional or not, with progress."""

from __future__ import annotations

import argparse
import random
import time

from rich.progress import Progress

from txnstream.cli import console
from txnstream.cli._common import add_topic_flags, config_from_args, table
from txnstream.client import Client


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``produce`` command."""
    p = sub.add_parser("produce", help="produce records (optionally in transactions)")
    add_topic_flags(p)
    p.add_argument("topic")
    p.add_argument("--count", type=int, default=1000, help="records in all (default 1000)")
    p.add_argument("--size", type=int, default=100, help="value bytes (default 100)")
    p.add_argument("--txn-size", type=int, default=0,
                   help="records per transaction; 0 = no transactions (default)")
    p.add_argument("--abort-ratio", type=float, default=0.0,
                   help="fraction of transactions to abort (default 0)")
    p.add_argument("--timeout", type=float, default=60.0, help="transaction timeout seconds")
    p.add_argument("--deliver-after", type=float, default=None, metavar="S",
                   help="delayed delivery: readers deliver each record S seconds after its "
                        "send (in a transaction: after its commit)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if args.count < 0 or args.size < 0 or args.txn_size < 0:
        raise ValueError("--count, --size and --txn-size must not be negative")
    if not 0.0 <= args.abort_ratio <= 1.0:
        raise ValueError(f"--abort-ratio must be within 0..1, got {args.abort_ratio}")
    delay = {} if args.deliver_after is None else {"deliver_after": args.deliver_after}
    rng = random.Random()
    committed = aborted = txns_c = txns_a = 0
    t0 = time.monotonic()
    with Client(config=config_from_args(args)) as client:
        producer = client.create_producer(args.topic)
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"producing to {args.topic}", total=args.count)
            i = 0
            while i < args.count:
                if not args.txn_size:
                    producer.send(f"{i}:".encode() + b"x" * args.size, key=str(i), **delay)
                    committed += 1
                    i += 1
                    progress.advance(task)
                    continue
                n = min(args.txn_size, args.count - i)
                txn = client.new_transaction(timeout_s=args.timeout)
                for j in range(i, i + n):
                    producer.send(f"{j}:".encode() + b"x" * args.size, key=str(j), txn=txn,
                                  **delay)
                if rng.random() < args.abort_ratio:
                    txn.abort()
                    aborted += n
                    txns_a += 1
                else:
                    txn.commit()
                    committed += n
                    txns_c += 1
                i += n
                progress.advance(task, n)
        producer.flush()
    secs = time.monotonic() - t0
    console.print(table(f"produced to {args.topic} in {secs:.1f}s", ("", "records", "txns"), [
        ("committed / plain", committed, txns_c), ("aborted", aborted, txns_a),
        ("rate", f"{args.count / secs:.0f}/s" if secs else "-", "")]))
    return 0
