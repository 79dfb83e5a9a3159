"""``txnstream demo``: transactional produce + committed-only consume, with a check."""

from __future__ import annotations

import argparse

from txnstream.cli import console
from txnstream.cli._common import add_topic_flags, config_from_args


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``demo`` command."""
    p = sub.add_parser("demo", help="run the demo pipeline against the broker")
    add_topic_flags(p)
    p.add_argument("--records", type=int, default=2000, help="records to write (default 2000)")
    p.add_argument("--txn-size", type=int, default=50, help="records per transaction")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from txnstream.admin_topics import ensure_topics
    from txnstream.demo.roundtrip import run
    from txnstream.workers_key import ensure_default_key

    config = config_from_args(args)
    ensure_topics(config)
    console.print(ensure_default_key(config), highlight=False, markup=False, soft_wrap=True)
    return 0 if run(config, args.records, args.txn_size, console) else 1
