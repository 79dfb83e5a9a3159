"""Helpers shared by the command modules: config from flags, table rendering."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Sequence

from rich.table import Table

from txnstream.config import (
    Config,
    KafkaSettings,
    TopicNames,
    load_kafka_properties,
    read_secret_file,
)

__all__ = ["add_topic_flags", "add_line_flags", "config_from_args", "table", "fmt_age"]


def add_topic_flags(p: argparse.ArgumentParser) -> None:
    """``--prefix`` for the internal topic names."""
    p.add_argument("--prefix", default=None,
                   help="internal topic prefix (default: $TXNSTREAM_TOPIC_PREFIX or __txn)")


class _SecretNotOnCommandLine(argparse.Action):
    """``--tc-secret VALUE``: refused with a message that does not repeat the value.

    Without it argparse would take ``--tc-secret`` for ``--tc-secret-file`` (prefix
    matching) and report the secret as a file it cannot read.
    """

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        parser.error(f"{option_string} is not taken: a command line is visible to every user "
                     "of the host (ps). Put the secret in a file (mode 0600) and give "
                     "--tc-secret-file FILE, or set $TXNSTREAM_TC_SECRET_FILE")


def add_line_flags(p: argparse.ArgumentParser) -> None:
    """Global flags of the coordinator line's client side (every command takes them).

    The secret is only ever read from a file: a command line is visible to every user of
    the host (``ps``), so there is no flag that takes the secret itself.
    """
    g = p.add_argument_group(
        "coordinator line",
        "who this process is on the direct line to coordinator workers and how it proves "
        "it (docs/security.md). Each flag overrides its environment variable; a worker "
        "uses them for its own identity and TLS too.")
    g.add_argument("--tc-principal", default=None, metavar="NAME",
                   help="principal this process acts as; a txn belongs to the principal "
                   "that opened it (default: $TXNSTREAM_TC_PRINCIPAL or txnstream)")
    g.add_argument("--tc-secret-file", default=None, metavar="FILE",
                   help="file holding the secret of --tc-principal, keep it mode 0600 "
                   "(default: $TXNSTREAM_TC_SECRET or the file $TXNSTREAM_TC_SECRET_FILE; "
                   "there is no flag taking the secret itself: ps shows command lines)")
    g.add_argument("--workers-key-file", default=None, metavar="FILE",
                   help="workers: the workers' key (`txnstream keygen FILE`; every worker "
                   "of a deployment needs the same file, mode 0600); it signs markers and "
                   "makes records members of their txns (default: "
                   "$TXNSTREAM_WORKERS_KEY_FILE, else the secret, else "
                   "$TXNSTREAM_HOME/workers.key or ~/.config/txnstream/workers.key)")
    g.add_argument("--tc-tls-ca", default=None, metavar="FILE",
                   help="CA bundle: speak TLS to workers and verify their certificates; "
                   "a worker verifies client certificates with it "
                   "(default: $TXNSTREAM_TC_TLS_CAFILE)")
    g.add_argument("--tc-tls-cert", default=None, metavar="FILE",
                   help="certificate (PEM): a client's for mutual TLS, its common name is its "
                   "principal; a worker's own, with it the worker serves TLS "
                   "(default: $TXNSTREAM_TC_TLS_CERTFILE)")
    g.add_argument("--tc-tls-key", default=None, metavar="FILE",
                   help="private key of --tc-tls-cert, unless that file holds it "
                   "(default: $TXNSTREAM_TC_TLS_KEYFILE)")
    g.add_argument("--tc-secret", action=_SecretNotOnCommandLine, help=argparse.SUPPRESS)


def config_from_args(args: argparse.Namespace, **overrides: object) -> Config:
    """A Config from the global flags, ``--prefix``, ``overrides`` and the environment.

    ``--bootstrap``, ``--kafka-config`` and the coordinator line's flags
    (:func:`add_line_flags`); a flag given wins over its environment variable.
    """
    if getattr(args, "prefix", None):
        overrides["topics"] = TopicNames(args.prefix)
    if getattr(args, "kafka_config", None):
        overrides["kafka"] = KafkaSettings(load_kafka_properties(args.kafka_config),
                                           origin=f"in {args.kafka_config}, from --kafka-config")
    if getattr(args, "tc_principal", None):
        overrides["tc_principal"] = args.tc_principal
    if getattr(args, "tc_secret_file", None):
        overrides["tc_secret"] = read_secret_file(args.tc_secret_file, "--tc-secret-file")
    if getattr(args, "workers_key_file", None):
        overrides["workers_key_file"] = args.workers_key_file
    for flag, name in (("tc_tls_ca", "tc_tls_cafile"), ("tc_tls_cert", "tc_tls_certfile"),
                       ("tc_tls_key", "tc_tls_keyfile")):
        if getattr(args, flag, None):
            overrides[name] = getattr(args, flag)
    return Config.from_env(getattr(args, "bootstrap", None), **overrides)


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
