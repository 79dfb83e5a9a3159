"""The harness's watcher while the workload runs, through ``client.admin`` and psutil.

Every second it reaps role processes that died on their own (and restarts them); every
few seconds it samples the workers' memory (RSS) and lists the coordinators' txns to
catch one left un-ended past its timeout plus a grace; now and then it aborts an open
txn through ``client.admin.abort_transaction`` and writes the result to the truth dir.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from chaos.credentials import FLOODER, TWOPHASE
from chaos.profile import Profile
from chaos.supervisor import Supervisor
from chaos.truth import TruthLog
from txnstream import Client, TxnStatus

__all__ = ["Monitor", "StuckTxn"]

log = logging.getLogger(__name__)

SAMPLE_EVERY_S = 4.0
MIN_ABORT_AGE_S = 0.3
"""Admin aborts pick txns open at least this long: the opener is holding them."""


@dataclass
class StuckTxn:
    """A txn seen un-ended past its timeout plus the grace."""

    txn: str
    status: str
    age_s: float
    timeout_s: float
    partitions: list[str]


@dataclass(eq=False)
class Monitor(threading.Thread):
    """Watches until :meth:`halt`."""

    sup: Supervisor
    client: Client
    profile: Profile
    truth: TruthLog
    seed: int
    restart_crashed: bool = True
    rss_max_mb: dict[str, float] = field(default_factory=dict)
    stuck: dict[str, StuckTxn] = field(default_factory=dict)
    admin_aborts: int = 0
    admin_errors: int = 0
    listed: int = 0
    asked_ms: float = 0.0
    """When the last LIST was asked (ms since the epoch)."""

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, name="monitor", daemon=True)
        self._halt = threading.Event()
        self._aborting = True
        self.rng = random.Random(f"{self.seed}/admin")

    def halt(self) -> None:
        """Stop watching."""
        self._halt.set()

    def stop_aborting(self) -> None:
        """No more admin aborts (the drain phase)."""
        self._aborting = False

    def run(self) -> None:
        """Reap exits every second; sample, check and abort every few seconds."""
        next_sample = next_abort = time.monotonic() + 2.0
        while not self._halt.wait(1.0):
            self.sup.reap_unexpected(restart=self.restart_crashed)
            now = time.monotonic()
            if now >= next_sample:
                next_sample = now + SAMPLE_EVERY_S
                self.sample_rss()
                txns = self.list_txns()
                if txns is not None:
                    self.check_stuck(txns)
                    if self._aborting and now >= next_abort:
                        next_abort = now + self.profile.admin_abort_every_s
                        self.admin_abort(txns)

    def sample_rss(self) -> None:
        """Record each worker's RSS if it is the largest seen."""
        for name in self.sup.names("worker"):
            pid = self.sup.procs[name].pid
            if pid is None:
                continue
            try:
                mb = psutil.Process(pid).memory_info().rss / 2**20
            except psutil.Error:
                continue
            self.rss_max_mb[name] = max(self.rss_max_mb.get(name, 0.0), mb)

    def list_txns(self) -> list[Any] | None:
        """Every txn the coordinators know, or None if a coordinator did not answer.

        Notes when it asked (:attr:`asked_ms`): a coordinator answers at some point of a
        LIST that may take seconds (others failing over), so an age measured when the
        call returns can exceed the txn's age when its coordinator answered.
        """
        self.asked_ms = time.time() * 1000
        try:
            txns = self.client.admin.list_transactions()
        except Exception as exc:  # noqa: BLE001 - a coordinator may be failing over
            self.admin_errors += 1
            log.info("list_transactions: %s", exc)
            return None
        self.listed += 1
        return txns

    def check_stuck(self, txns: list[Any]) -> list[StuckTxn]:
        """Txns not ended past timeout + grace (recorded once each, worst age kept).

        A PREPARED txn's timeout stopped at its prepare: it is held to its maximum
        prepared age since then (past it, its coordinator aborts it).

        Ages are taken at the time the LIST was asked (:attr:`asked_ms`), a lower bound of
        each txn's age when its coordinator answered: a txn flagged was surely still open
        that long (one ended just after its coordinator answered is not flagged late).
        """
        now_ms = self.asked_ms
        found = []
        for t in txns:
            if t.status in (TxnStatus.COMMITTED, TxnStatus.ABORTED):
                continue
            since, limit_ms = t.open_time_ms, t.timeout_ms
            if t.status is TxnStatus.PREPARED:  # its timeout stopped; its prepared age runs
                since, limit_ms = t.prepared_at_ms, t.max_prepared_ms
            age = (now_ms - since) / 1000
            if age > limit_ms / 1000 + self.profile.grace_s:
                s = StuckTxn(str(t.txn_id), t.status.value, round(age, 1), limit_ms / 1000,
                             list(t.partitions))
                self.stuck[s.txn] = s
                found.append(s)
        return found

    def abort_left_by(self, owner: str) -> int:
        """Abort, as an operator would, the OPEN txns ``owner`` left; how many ended.

        For the stopped flooder: its own txns have a worker's longest timeout and its stop
        releases them, retried for 8 s within the stop's grace. When a TC has no working
        owner all that time (seed 28: TC 0 moved five times in its last 100 s), they stay
        open past any drain, and the checks that need a complete drain never run.
        """
        try:
            left = [t for t in self.client.admin.list_transactions()
                    if t.owner == owner and t.status is TxnStatus.OPEN]
        except Exception:  # noqa: BLE001 - a coordinator failing over: the next turn
            return 0
        ended = 0
        for t in left:
            try:
                self.client.admin.abort_transaction(t.txn_id)
                ended += 1
            except Exception:  # noqa: BLE001 - ended meanwhile, or the next turn
                pass
        return ended

    def admin_abort(self, txns: list[Any]) -> None:
        """Abort one open txn through the admin API; log the result as truth.

        Not the two-phase writers': one listed OPEN may be PREPARED by the time the
        abort comes, and an operator's abort of a prepared txn overrules the database
        that decides it (what the checker would rightly call not atomic).
        """
        now_ms = time.time() * 1000
        open_ = [t for t in txns if t.status is TxnStatus.OPEN and t.owner not in (
                 FLOODER, TWOPHASE)
                 and now_ms - t.open_time_ms >= MIN_ABORT_AGE_S * 1000]  # (its 1,000s)
        if not open_:
            return
        t = self.rng.choice(open_)
        try:
            info = self.client.admin.abort_transaction(t.txn_id)
            status, error = info.status.value, None
        except Exception as exc:  # noqa: BLE001 - e.g. it committed meanwhile
            status, error = None, f"{type(exc).__name__}: {exc}"
        self.admin_aborts += 1
        self.truth.write({"e": "admin_abort", "txn": str(t.txn_id), "status": status,
                          "error": error, "partitions": list(t.partitions), "t": time.time()})
