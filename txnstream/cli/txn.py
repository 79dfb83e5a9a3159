"""``txnstream txn list|show|abort|force-end|stats|slow``: admin tools, printed as tables."""

from __future__ import annotations

import argparse

from txnstream.cli import console
from txnstream.cli._common import add_topic_flags, config_from_args, fmt_age, table
from txnstream.client import Client
from txnstream.coordinator.protocol import TxnInfo
from txnstream.types import TxnStatus

_COLUMNS = ("txn", "status", "age", "timeout", "partitions", "subscriptions", "reason")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``txn`` command group."""
    p = sub.add_parser("txn", help="list, inspect and abort transactions")
    ts = p.add_subparsers(dest="txn_command", metavar="ACTION", required=True)
    for name, fn, hlp in (("list", _list, "all transactions the coordinators know"),
                          ("stats", _stats, "per-coordinator statistics")):
        q = ts.add_parser(name, help=hlp)
        add_topic_flags(q)
        q.set_defaults(handler=fn)
        if name == "list":
            q.add_argument("--prepared", action="store_true",
                           help="only prepared transactions, with how long each has waited "
                                "and its maximum prepared age")
    for name, fn, hlp in (("show", _show, "one transaction"),
                          ("abort", _abort, "abort an open transaction"),
                          ("force-end", _force_end,
                           "end a COMMITTING/ABORTING transaction whose markers cannot all "
                           "be written, with those that were (admins only; see "
                           "docs/coordinator.md)")):
        q = ts.add_parser(name, help=hlp)
        add_topic_flags(q)
        q.add_argument("txn_id", help="TxnID as '(most,least)', e.g. '(0,42)'")
        q.set_defaults(handler=fn)
    q = ts.add_parser("slow", help="open transactions older than --min-age")
    add_topic_flags(q)
    q.add_argument("--min-age", type=float, default=30.0, help="seconds (default 30)")
    q.set_defaults(handler=_slow)


def _row(t: TxnInfo) -> tuple[object, ...]:
    return (t.txn_id, t.status.value, fmt_age(t.open_time_ms), f"{t.timeout_ms / 1000:g}s",
            ", ".join(t.partitions), ", ".join(t.subscriptions), t.abort_reason)


def _client(args: argparse.Namespace) -> Client:
    return Client(config=config_from_args(args))


def _list(args: argparse.Namespace) -> int:
    with _client(args) as c:
        txns = c.admin.list_transactions()
    if args.prepared:
        txns = [t for t in txns if t.status is TxnStatus.PREPARED]
        console.print(table(f"{len(txns)} prepared transactions",
                            ("txn", "prepared for", "max prepared", "partitions",
                             "subscriptions", "owner"),
                            [(t.txn_id, fmt_age(t.prepared_at_ms),
                              f"{t.max_prepared_ms / 1000:g}s", ", ".join(t.partitions),
                              ", ".join(t.subscriptions), t.owner) for t in txns]))
        return 0
    console.print(table(f"{len(txns)} transactions", _COLUMNS, map(_row, txns)))
    return 0


def _slow(args: argparse.Namespace) -> int:
    with _client(args) as c:
        txns = c.admin.slow_transactions(args.min_age)
    console.print(table(f"{len(txns)} open longer than {args.min_age:g}s", _COLUMNS,
                        map(_row, txns)))
    return 0


def _show(args: argparse.Namespace) -> int:
    with _client(args) as c:
        t = c.admin.get_transaction(args.txn_id)
    console.print(table(str(t.txn_id), ("field", "value"), [
        ("status", t.status.value), ("age", fmt_age(t.open_time_ms)),
        ("timeout", f"{t.timeout_ms / 1000:g}s"), ("partitions", "\n".join(t.partitions)),
        ("subscriptions", "\n".join(t.subscriptions)), ("abort reason", t.abort_reason),
        ("group key", t.group_key)]))
    return 0


def _abort(args: argparse.Namespace) -> int:
    with _client(args) as c:
        t = c.admin.abort_transaction(args.txn_id)
    console.print(f"{t.txn_id}: {t.status.value}")
    return 0


def _force_end(args: argparse.Namespace) -> int:
    with _client(args) as c:
        t = c.admin.force_end(args.txn_id)
    console.print(f"{t.txn_id}: {t.status.value}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    with _client(args) as c:
        stats = c.admin.coordinator_stats()
    rows = [(s.tc_id, s.owner_id, s.stats.get("status.OPEN"), s.stats.get("status.COMMITTED"),
             s.stats.get("status.ABORTED"), s.stats.get("low_watermark"),
             s.stats.get("next_sequence"), s.stats.get("invalid_records"))
            for s in stats]
    console.print(table("coordinators", ("tc", "owner", "open", "committed", "aborted", "lwm",
                                         "next seq", "invalid records"), rows))
    return 0
