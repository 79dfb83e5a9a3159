"""``txnstream top``: the live view of coordinators and blocked partitions (txnstream.top)."""

from __future__ import annotations

import argparse

from txnstream.cli import console, err_console
from txnstream.cli._common import add_topic_flags, config_from_args


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``top`` command."""
    p = sub.add_parser("top", help="live view: coordinators, open txns, blocked partitions")
    add_topic_flags(p)
    p.add_argument("--interval", type=float, default=2.0,
                   help="seconds between refreshes (default 2)")
    p.add_argument("--once", action="store_true",
                   help="print one sample's tables and exit (scripts, captures)")
    p.add_argument("--rates", action="store_true",
                   help="with --once: take two samples --interval apart to show rates")
    p.add_argument("--subscription", action="append", default=[], metavar="TOPIC:SUB",
                   type=_topic_sub,
                   help="also show this subscription's pending acks and redelivery counts "
                        "per partition of TOPIC (repeatable)")
    p.set_defaults(handler=_run)


def _topic_sub(text: str) -> tuple[str, str]:
    """``TOPIC:SUBSCRIPTION`` (a Kafka topic name has no ``:``)."""
    topic, sep, sub = text.partition(":")
    if not sep or not topic or not sub:
        raise argparse.ArgumentTypeError(f"--subscription takes TOPIC:SUBSCRIPTION, got {text!r}")
    return topic, sub


def _run(args: argparse.Namespace) -> int:
    import time

    from txnstream.client import Client
    from txnstream.top import Sampler, TopApp, build_view, render

    with Client(config=config_from_args(args)) as client:
        if not args.once:
            TopApp(client, args.interval, args.subscription).run()
            return 0
        sampler = Sampler(client, args.subscription)
        try:
            with err_console.status("reading coordinators and buffer state"):
                prev = sampler.sample() if args.rates else None
                if prev is not None:
                    time.sleep(args.interval)
                cur = sampler.sample()
        finally:
            sampler.close()
        console.print(render(build_view(prev, cur), footer=" "))
    return 0
