"""``txnstream consume``: read committed records by hand, with progress and a summary."""

from __future__ import annotations

import argparse
import time
from collections import Counter

from rich.progress import Progress

from txnstream.cli import console
from txnstream.cli._common import add_topic_flags, config_from_args, table
from txnstream.client import Client


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``consume`` command."""
    p = sub.add_parser("consume", help="consume committed records only")
    add_topic_flags(p)
    p.add_argument("topic")
    p.add_argument("--subscription", default="txnstream-cli", help="consumer group")
    p.add_argument("--count", type=int, default=0, help="stop after this many (0: until idle)")
    p.add_argument("--idle", type=float, default=5.0, help="stop after this many idle seconds")
    p.add_argument("--from", dest="initial", choices=("earliest", "latest"), default="earliest")
    p.add_argument("--print", dest="show", action="store_true", help="print each record")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    per_partition: Counter[int] = Counter()
    txn_records = 0
    t0 = time.monotonic()
    with Client(config=config_from_args(args)) as client:
        consumer = client.subscribe(args.topic, subscription=args.subscription,
                                    initial_position=args.initial)
        try:
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task(f"consuming {args.topic}", total=args.count or None)
                while not args.count or sum(per_partition.values()) < args.count:
                    msg = consumer.receive(timeout_s=args.idle)
                    if msg is None:
                        break
                    per_partition[msg.partition] += 1
                    txn_records += msg.txn_id is not None
                    if args.show:
                        progress.console.print(f"{msg.partition}@{msg.offset} "
                                               f"{msg.txn_id or '-'} {msg.key!r} {msg.value!r}")
                    consumer.acknowledge(msg)
                    progress.advance(task)
        finally:
            consumer.close()
    secs = time.monotonic() - t0
    rows: list[tuple[object, int]] = [(p, n) for p, n in sorted(per_partition.items())]
    rows.append(("all", sum(per_partition.values())))
    console.print(table(f"{args.topic} as {args.subscription}: {txn_records} transactional, "
                        f"{secs:.1f}s", ("partition", "records"), rows))
    return 0
