"""``txnstream keygen [FILE]``: make the workers' key (docs/security.md).

Every worker of a deployment needs the same key: it signs their markers and endpoint
records and makes records members of their txns (:mod:`txnstream.workers_key`). A key
is never overwritten: workers holding different keys take each other's markers for
forgeries.
"""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

from txnstream.cli import console
from txnstream.cli._common import table
from txnstream.errors import ConfigError
from txnstream.workers_key import default_key_path, generate_key_file


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``keygen`` command."""
    p = sub.add_parser("keygen", help="make the workers' key (every worker needs the same)",
                       description="Write a new random workers' key to FILE (mode 0600). "
                       "An existing key is never overwritten.")
    p.add_argument("file", nargs="?", default=None, metavar="FILE",
                   help="where to write it (default: the global --workers-key-file, else "
                   "$TXNSTREAM_WORKERS_KEY_FILE, else where a worker given no key looks: "
                   "$TXNSTREAM_HOME/workers.key or ~/.config/txnstream/workers.key)")
    p.add_argument("--if-missing", action="store_true",
                   help="keep a key already there and exit 0 (what a deployment's init "
                   "step runs every time)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    path = Path(args.file or getattr(args, "workers_key_file", None)
                or os.environ.get("TXNSTREAM_WORKERS_KEY_FILE") or default_key_path())
    made = generate_key_file(path)
    if not made and not args.if_missing:
        raise ConfigError(f"{path} exists: a workers' key is never overwritten (workers "
                          "holding different keys take each other's markers for "
                          "forgeries). Keep it (--if-missing), or remove it first and then "
                          "give the new key to every worker")
    mode = stat.S_IMODE(os.stat(path).st_mode)
    console.print(table("workers' key", ("file", "mode", "status"),
                        [(path, f"{mode:04o}", "made" if made else "kept")]))
    console.print(f"{'made' if made else 'kept'} {path}: every worker of this deployment "
                  f"needs this same file (--workers-key-file {path}, or "
                  f"TXNSTREAM_WORKERS_KEY_FILE={path})", highlight=False, markup=False,
                  soft_wrap=True)
    return 0
