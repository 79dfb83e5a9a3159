"""What every role process shares: its arguments, the stop signal, the client."""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txnstream import Client, Config, TopicNames, TxnStatus
from txnstream.errors import RequestTimeoutError

__all__ = ["RoleArgs", "parse_args", "install_stop", "make_client", "commit_outcome",
           "run_role"]


@dataclass(frozen=True, slots=True)
class RoleArgs:
    """One role process's arguments; ``spec`` holds the role-specific settings."""

    role: str
    bootstrap: str
    prefix: str
    name: str
    incarnation: int
    truth: Path
    seed: int
    spec: dict[str, Any]

    @property
    def writer(self) -> str:
        """The writer id of this incarnation: sequences restart with every incarnation."""
        return f"{self.name}.{self.incarnation}"


def parse_args(argv: list[str]) -> RoleArgs:
    """Parse ``ROLE --bootstrap ... --spec JSON``."""
    ap = argparse.ArgumentParser(prog="python -m chaos.roles")
    ap.add_argument("role", choices=("producer", "processor", "consumer", "intruder", "flooder",
                                     "twophase"))
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--prefix", default="__txn")
    ap.add_argument("--name", required=True)
    ap.add_argument("--incarnation", type=int, default=0)
    ap.add_argument("--truth", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spec", default="{}", help="role settings as a JSON object")
    a = ap.parse_args(argv)
    return RoleArgs(a.role, a.bootstrap, a.prefix, a.name, a.incarnation, a.truth, a.seed,
                    json.loads(a.spec))


def install_stop() -> threading.Event:
    """An event set by SIGTERM/SIGINT or the harness's death: finish the unit, exit."""
    stop = threading.Event()

    def handler(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    parent = os.getppid()

    def orphaned() -> None:  # the harness died (kill -9): do not run on without it
        while not stop.wait(1.0):
            if os.getppid() != parent:
                stop.set()

    threading.Thread(target=orphaned, daemon=True, name="orphan-watch").start()
    return stop


def make_client(args: RoleArgs) -> Client:
    """A txnstream client of the chaos cluster, as the principal the environment names."""
    logging.basicConfig(level=logging.WARNING,
                        format=f"%(asctime)s %(levelname)s {args.writer} %(name)s: %(message)s")
    return Client(config=Config.from_env(args.bootstrap, topics=TopicNames(args.prefix),
                                         replication_factor=3))


def commit_outcome(txn: Any, exc: BaseException | None) -> str:
    """What a careful client may believe after ``commit()`` returned or raised ``exc``.

    Returned: committed. A request timeout: unknown, whatever the client's status says
    (item 8: today it says ABORTED). Otherwise the client's status decides; a status
    that is not final is unknown.
    """
    if exc is None:
        return "committed"
    if isinstance(exc, RequestTimeoutError):
        return "unknown"
    st = txn.status
    if st is TxnStatus.ABORTED:
        return "aborted"
    if st is TxnStatus.COMMITTED:
        return "committed"
    return "unknown"


def run_role(make_role: Any, args: RoleArgs) -> int:
    """Run ``make_role(args, client, stop).loop()`` until SIGTERM; close it and the client.

    SIGUSR1 writes every thread's stack to the log (the harness asks when a drain stalls).
    """
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    stop = install_stop()
    client = make_client(args)
    role = make_role(args, client, stop)
    try:
        role.loop()
    finally:
        try:
            role.close()
        finally:
            client.close()
    return 0
