"""``txnstream init``: create the internal topics (idempotent) and report what exists.

It also makes the workers' key where workers given none look, if there is none
(:func:`~txnstream.workers_key.ensure_default_key`).
"""

from __future__ import annotations

import argparse

from txnstream.admin_topics import ensure_topics
from txnstream.cli import console
from txnstream.cli._common import add_topic_flags, config_from_args, table
from txnstream.workers_key import ensure_default_key


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``init`` command."""
    p = sub.add_parser("init", help="create the internal topics and the workers' key "
                       "(safe to repeat)")
    add_topic_flags(p)
    p.add_argument("--coordinators", type=int, default=4,
                   help="number of transaction coordinators (partitions of the log)")
    p.add_argument("--replication", type=int, default=1, help="replication factor")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    config = config_from_args(args).with_(num_coordinators=args.coordinators,
                                          replication_factor=args.replication)
    reports = ensure_topics(config)
    console.print(table(f"internal topics on {config.bootstrap_servers}",
                        ("topic", "partitions", "status", "detail"),
                        [(r.name, r.partitions, r.status, r.detail) for r in reports]))
    console.print(ensure_default_key(config), highlight=False, markup=False, soft_wrap=True)
    return 1 if any(r.status == "mismatch" for r in reports) else 0
