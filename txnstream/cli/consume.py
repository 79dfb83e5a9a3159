"""``txnstream consume``: read committed records by hand, with progress and a summary."""

from __future__ import annotations

import argparse
import time
from collections import Counter

from rich.progress import Progress

from txnstream.cli import console
from txnstream.cli._common import add_topic_flags, config_from_args, table
from txnstream.client import Client
from txnstream.lifecycle import DeadLetterPolicy


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
    p.add_argument("--max-redeliveries", type=int, default=0, metavar="N",
                   help="dead-letter a record past N redeliveries (0: no dead-letter policy)")
    p.add_argument("--dead-letter-topic", default=None,
                   help="where (default <topic>-<subscription>-DLQ, which must exist)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    per_partition: Counter[int] = Counter()
    redelivered: Counter[int] = Counter()
    txn_records = 0
    t0 = time.monotonic()
    policy = {"dead_letter_policy": DeadLetterPolicy(args.max_redeliveries,
                                                     args.dead_letter_topic)
              } if args.max_redeliveries or args.dead_letter_topic else {}
    with Client(config=config_from_args(args)) as client:
        consumer = client.subscribe(args.topic, subscription=args.subscription,
                                    initial_position=args.initial, **policy)
        try:
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task(f"consuming {args.topic}", total=args.count or None)
                while not args.count or sum(per_partition.values()) < args.count:
                    msg = consumer.receive(timeout_s=args.idle)
                    if msg is None:
                        break
                    per_partition[msg.partition] += 1
                    txn_records += msg.txn_id is not None
                    redelivered[msg.partition] += msg.redelivery_count > 0
                    if args.show:
                        again = (f" (redelivery {msg.redelivery_count})"
                                 if msg.redelivery_count else "")
                        progress.console.print(f"{msg.partition}@{msg.offset}{again} "
                                               f"{msg.txn_id or '-'} {msg.key!r} {msg.value!r}")
                    consumer.acknowledge(msg)
                    progress.advance(task)
        finally:
            dead = consumer.dead_letters.dead_lettered if consumer.dead_letters else 0
            held = consumer.delayed_total
            consumer.close()
    secs = time.monotonic() - t0
    rows: list[tuple[object, int, int]] = [(p, n, redelivered[p])
                                           for p, n in sorted(per_partition.items())]
    rows.append(("all", sum(per_partition.values()), sum(redelivered.values())))
    console.print(table(f"{args.topic} as {args.subscription}: {txn_records} transactional, "
                        f"{dead} dead-lettered, {held} held for their time, {secs:.1f}s",
                        ("partition", "records", "redelivered"), rows))
    return 0
