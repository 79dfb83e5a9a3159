"""Helpers shared by the command modules: config from flags, table rendering."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Sequence

from rich.table import Table

from txnstream.config import Config, TopicNames, load_kafka_properties

__all__ = ["add_topic_flags", "config_from_args", "table", "fmt_age"]


def add_topic_flags(p: argparse.ArgumentParser) -> None:
    """``--prefix`` for the internal topic names."""
    p.add_argument("--prefix", default=None,
                   help="internal topic prefix (default: $TXNSTREAM_TOPIC_PREFIX or __txn)")


def config_from_args(args: argparse.Namespace) -> Config:
    """A Config from ``--bootstrap`` / ``--prefix`` / ``--kafka-config`` and the environment."""
    overrides: dict[str, object] = {}
    if getattr(args, "prefix", None):
        overrides["topics"] = TopicNames(args.prefix)
    if getattr(args, "kafka_config", None):
        overrides["kafka"] = load_kafka_properties(args.kafka_config)
    return Config.from_env(args.bootstrap, **overrides)


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> Table:
    """A rich table of stringified cells."""
    t = Table(title=title)
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    return t


def fmt_age(since_ms: int) -> str:
    """Age of a wall-clock millisecond timestamp, e.g. ``12.3s``."""
    return f"{max(0.0, time.time() - since_ms / 1000):.1f}s"
