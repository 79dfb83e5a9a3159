"""``txnstream acks TOPIC-PARTITION --subscription S``: pending-ack state of a partition."""

from __future__ import annotations

import argparse

from txnstream.cli import console
from txnstream.cli._common import add_topic_flags, config_from_args, table
from txnstream.client import Client


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``acks`` command."""
    p = sub.add_parser("acks", help="pending-ack state of a subscription partition")
    add_topic_flags(p)
    p.add_argument("partition", help="topic-partition, e.g. orders-0")
    p.add_argument("--subscription", required=True)
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    with Client(config=config_from_args(args)) as client:
        st = client.admin.pending_ack_stats(args.partition, args.subscription)
    console.print(table(f"{st.subscription}@{st.tp}", ("field", "value"), [
        ("cursor", st.cursor), ("acked above cursor", st.acked_above_cursor),
        ("pending txns", st.pending_txns), ("pending offsets", st.pending_offsets),
        ("pending cumulative", st.cumulative_pending), ("owner generation", st.generation),
        ("redelivered offsets", st.redelivered_offsets),
        ("highest redelivery count", st.max_redelivery_count)]))
    return 0
