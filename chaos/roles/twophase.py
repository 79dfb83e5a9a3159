"""The two-phase writer (issue 39): one transaction across Kafka and PostgreSQL.

Per input of ``input`` (its subscription, individual acks), the recipe of
:mod:`txnstream.two_phase`:

1. a txnstream txn: one output record to ``output`` (its value names the input and the
   txn) and the input's ack; ``txn.prepare()``;
2. one database transaction: a row ``(input, txn, writer)`` in :data:`ROWS` and
   ``OutcomeTable.record``; COMMIT (the decision);
3. ``OutcomeTable.complete``.

A failure before the prepare aborts the txn (its ack comes back through the abort, the
input is delivered again). A duplicate key at step 2 means recovery decided first (the
txn is aborted by it): the database rolls back. A lost connection at step 2 leaves the
decision unknown: the writer connects again and lets recovery decide this txn by the
table. A thread of its own (with its own connection) recovers, at start and every
``recover_every_s``, the principal's txns prepared more than ``stale_s`` ago (its dead
incarnations', its peer's: a paused peer's txn too, whose database commit then fails on
the abort row); when stopped, the writer recovers until none is left. Recovery asks every
coordinator (a LIST), which can take a while when one fails over; so it runs beside the
inputs, as an application's recovery sweeper would, not in their way.

Between the steps it waits ``step_s`` (uniform; the application's own work), so the
nemesis's kill -9, its pause past the session timeout and its kill of PostgreSQL fall
after each step too, not only in the round trips.
Truth events (file in ``truth/twophase/``): ``open`` (``txn``, ``in``), ``prepared``,
``db_committed``, ``db_refused``, ``db_unknown``, ``end`` (``outcome``: the status
``complete`` returned), ``complete_error``, ``aborted`` (before the prepare),
``recovered`` (``txn``, ``status``). The checker trusts only PostgreSQL and Kafka.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from typing import Any

import psycopg

from chaos.roles.common import RoleArgs, run_role
from chaos.truth import TruthLog, decode_value, encode_value
from txnstream import Client
from txnstream.errors import TxnStreamError
from txnstream.message import Message
from txnstream.two_phase import OutcomeTable

log = logging.getLogger("chaos.twophase")

ROWS = "chaos_twophase"
"""The application's table: ``(id BIGSERIAL, input, txn, writer)``, no key on input, so
a second row for one input is seen, not refused."""
OUTCOMES = "chaos_outcomes"
"""The :class:`~txnstream.two_phase.OutcomeTable` of the writers."""
IDLE_REPORT_S = 30.0
"""No input for this long: the writer logs its readers' state (a diagnosis of a stall, read
with the stacks the harness asks for when its drain does not complete)."""
FINAL_RECOVERY_S = 60.0
"""When stopped: how long the writer keeps recovering leftovers (a txn is recovered once
it is ``stale_s`` old; a coordinator failover may delay the answers)."""


class TwoPhaseRole:
    """Processes ``input`` into ``output`` and the database, one input per txn."""

    def __init__(self, args: RoleArgs, client: Client, stop: threading.Event) -> None:
        sp = args.spec
        self.args = args
        self.client = client
        self.stop = stop
        self.dsn: str = sp["dsn"]
        self.txn_timeout_s: float = sp["txn_timeout_s"]
        self.max_prepared_s: float = sp["max_prepared_s"]
        self.stale_s: float = sp["stale_s"]
        self.recover_every_s: float = sp["recover_every_s"]
        self.writer = args.writer
        self.truth = TruthLog(args.truth)
        self.table = OutcomeTable(client, OUTCOMES)
        self.conns: dict[str, Any] = {}
        """The inputs' connection (``main``) and recovery's (``recovery``)."""
        self.consumer = client.subscribe(sp["input"], subscription=sp["subscription"], **{
            "session.timeout.ms": sp["session_timeout_ms"], "heartbeat.interval.ms": 1000})
        self.producer = client.create_producer(sp["output"])
        self.ids = itertools.count()
        lo, hi = sp.get("step_s", (0.0, 0.0))
        self.step_s = (float(lo), float(hi))
        self.rng = random.Random(f"{args.seed}/{args.writer}")

    # ------------------------------------------------------------ the database

    def _db(self, use: str = "main") -> Any:
        """The ``use`` connection, connected again (until stopped) after PostgreSQL went away."""
        while (conn := self.conns.get(use)) is None or conn.closed or conn.broken:
            try:
                self.conns[use] = psycopg.connect(self.dsn, connect_timeout=3)
            except psycopg.OperationalError as exc:
                if self.stop.is_set():
                    raise
                log.warning("connecting to the database: %s", exc)
                self.stop.wait(0.5)
        return conn

    def _rollback(self, use: str) -> None:
        """End a failed database transaction on a connection still open (else nothing)."""
        conn = self.conns.get(use)
        if conn is not None and not conn.closed and not conn.broken:
            try:
                conn.rollback()
            except psycopg.Error:
                pass

    def _recover(self, only_txn: str | None = None, use: str = "main") -> int:
        """Recover the stale prepared txns (or ``only_txn``, now); how many were left.

        The database decides each: commit if its commit row is there, else abort.
        """
        left = 0

        def mine(info: Any) -> bool:
            nonlocal left
            if only_txn is not None:
                return str(info.txn_id) == only_txn
            stale = time.time() * 1000 - info.prepared_at_ms > self.stale_s * 1000
            left += not stale
            return stale

        while True:
            left = 0
            try:
                done = self.table.recover(self._db(use), only=mine)
                break
            except psycopg.OperationalError as exc:
                log.warning("recovery: the database went away: %s", exc)
                self._rollback(use)
                if self.stop.is_set() and only_txn is None:
                    return 1
                time.sleep(0.5)  # a txn whose outcome is unknown: until the database is back
            except TxnStreamError as exc:
                log.warning("recovery: %s", exc)
                return 1
        for tid, status in done.items():
            self.truth.write({"e": "recovered", "txn": str(tid), "status": status.value,
                              "by": self.writer})
        return left

    # ------------------------------------------------------------ the loop

    def loop(self) -> None:
        """Input after input until stopped; then recover what is left."""
        sweeper = threading.Thread(target=self._sweeper, daemon=True, name="recovery")
        sweeper.start()
        idle_since = time.monotonic()
        while not self.stop.is_set():
            msg = self.consumer.receive(timeout_s=0.5)
            if msg is not None:
                self._one(msg)
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_REPORT_S:
                log.warning("no input for %.0f s; readers: %s",
                            time.monotonic() - idle_since, self._readers())
                idle_since = time.monotonic()
        sweeper.join(FINAL_RECOVERY_S)
        deadline = time.monotonic() + FINAL_RECOVERY_S
        while self._recover() and time.monotonic() < deadline:
            time.sleep(1.0)

    def _sweeper(self) -> None:
        """Recover stale prepared txns now and every ``recover_every_s`` until stopped."""
        while True:
            try:
                self._recover(use="recovery")
            except Exception:  # noqa: BLE001 - logged; the next turn tries again
                log.exception("recovery")
                self._rollback("recovery")
            if self.stop.wait(self.recover_every_s):
                return

    def _readers(self) -> str:
        """Each assigned partition's delivery state (the consumer's, read for the log)."""
        out = []
        for tp, r in list(self.consumer._readers.items()):  # noqa: SLF001 - a diagnosis
            h = r.handle
            out.append(f"{tp}: {r.status.value} deliver {r.deliver_pos} cursor {r.cursor()} "
                       f"wait_at {r.wait_at} unacked {len(r.unacked)} inflight "
                       f"{len(r.inflight)} held_back {len(r.held_back)} pending "
                       f"{len(h.pending) if h is not None else '-'}")
        return "; ".join(out) or "none assigned"

    def _one(self, msg: Message) -> None:
        v = decode_value(msg.value)
        in_id = v["id"] if v else f"{msg.topic}-{msg.partition}@{msg.offset}"
        try:
            txn = self.client.new_transaction(timeout_s=self.txn_timeout_s,
                                              max_prepared_s=self.max_prepared_s)
        except TxnStreamError as exc:
            log.warning("new_transaction: %s", exc)
            self.consumer.negative_acknowledge(msg)
            return
        tid = str(txn.id)
        self.truth.write({"e": "open", "txn": tid, "in": in_id, "by": self.writer})
        acked = False
        try:
            self.producer.send(encode_value({"id": f"{self.writer}-{next(self.ids)}",
                                             "in": in_id, "txn": tid, "w": self.writer}),
                               txn=txn)
            self.consumer.acknowledge(msg, txn=txn)
            acked = True
            txn.prepare()
        except TxnStreamError as exc:
            # Unknown whether PREPARED is logged: if it is, recovery aborts it (no row).
            log.warning("%s before its prepare: %s", tid, exc)
            try:
                txn.abort()
            except TxnStreamError as e:
                log.warning("abort %s: %s", tid, e)
            if not acked:
                self.consumer.negative_acknowledge(msg)
            self.truth.write({"e": "aborted", "txn": tid, "error": str(exc)[:300]})
            return
        self.truth.write({"e": "prepared", "txn": tid})
        self._work()
        if not self._decide(txn, tid, in_id):
            return
        self._work()
        try:
            status = self.table.complete(self._db(), tid)
        except (TxnStreamError, psycopg.Error) as exc:  # recovery commits it later
            log.warning("complete %s: %s", tid, exc)
            self.truth.write({"e": "complete_error", "txn": tid, "error": str(exc)[:300]})
            return
        self.truth.write({"e": "end", "txn": tid, "outcome": status.value})

    def _work(self) -> None:
        self.stop.wait(self.rng.uniform(*self.step_s))

    def _decide(self, txn: Any, tid: str, in_id: str) -> bool:
        """Step 2: the row and the commit row in one database transaction; True if committed."""
        conn = self._db()
        try:
            with conn.cursor() as cur:
                cur.execute(f"INSERT INTO {ROWS} (input, txn, writer) VALUES (%s, %s, %s)",
                            (in_id, tid, self.writer))
                self.table.record(cur, txn)
            conn.commit()
        except psycopg.errors.UniqueViolation:  # recovery wrote its abort row first
            conn.rollback()
            self.truth.write({"e": "db_refused", "txn": tid})
            return False
        except psycopg.OperationalError as exc:
            # Committed or not: the table knows. Recovery asks it, for this txn now.
            log.warning("%s: the database went away in its transaction: %s", tid, exc)
            self.truth.write({"e": "db_unknown", "txn": tid, "error": str(exc)[:300]})
            self._rollback("main")
            self._recover(only_txn=tid)
            return False
        except TxnStreamError as exc:  # record() refused it: past its share of the age
            conn.rollback()
            self.truth.write({"e": "db_refused", "txn": tid, "error": str(exc)[:300]})
            return False
        self.truth.write({"e": "db_committed", "txn": tid})
        return True

    def close(self) -> None:
        """Leave the group, close the database and the truth file."""
        self.consumer.close()
        for conn in self.conns.values():
            conn.close()
        self.truth.close()


def run(args: RoleArgs) -> int:
    """Process inputs until SIGTERM."""
    return run_role(TwoPhaseRole, args)
