"""The ``txnstream`` command: one sub-command group per module in this package.

Each module exposes ``register(subparsers)``; a command handler returns an exit code.
A :class:`~txnstream.errors.TxnStreamError` becomes a one-line message and exit code 2,
never a traceback (set ``TXNSTREAM_DEBUG=1`` to see the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape

from txnstream.cli._common import add_line_flags
from txnstream.config import KAFKA_LOG
from txnstream.errors import TxnStreamError

__all__ = ["main", "console", "err_console"]

console = Console()
err_console = Console(stderr=True)

# Command-group modules, in the order they appear in --help.
_GROUPS = ("cluster", "init", "keygen", "demo", "worker", "txn", "top", "produce", "consume",
           "process", "acks")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="txnstream",
        description="Pulsar-style transactions on Apache Kafka.",
    )
    parser.add_argument("--bootstrap", default=None,
                        help="Kafka bootstrap servers "
                        "(default: $TXNSTREAM_BOOTSTRAP or 127.0.0.1:9092)")
    parser.add_argument("--kafka-config", default=None, metavar="FILE",
                        help="librdkafka settings (key=value lines, e.g. SASL/TLS) for every "
                        "Kafka client (default: $TXNSTREAM_KAFKA_CONFIG); keeps passwords off "
                        "the command line")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    add_line_flags(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _GROUPS:
        try:
            mod = importlib.import_module(f"txnstream.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"txnstream.cli.{name}":
                continue  # that command group has not landed yet
            raise
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``txnstream`` console script."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # librdkafka's warnings (a coordinator still loading, a broker reconnecting) are
        # chatter for a command's user, who gets txnstream's own error when it matters;
        # its errors stay visible, and -v shows everything
        KAFKA_LOG.setLevel(logging.ERROR)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 1
    try:
        return int(args.handler(args) or 0)
    except (TxnStreamError, ValueError) as exc:
        # ValueError: a malformed argument value (a TxnID, a topic-partition) that the
        # parsing code named in its message.
        if os.environ.get("TXNSTREAM_DEBUG"):
            raise
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
