"""One transaction across Kafka and a database: the database decides, txnstream follows.

The recipe (docs/api.md, *Prepared transactions*): consume, then

1. write the outputs and acknowledge the inputs in a txnstream txn, and ``txn.prepare()``
   (durable: PREPARED outlives its timeout and any crash, up to its maximum prepared age);
2. in one database transaction, write the rows and :meth:`OutcomeTable.record` the txn
   as committed, then COMMIT the database: **this commit is the decision**;
3. :meth:`OutcomeTable.complete`: commit the txnstream txn, then forget its row.

On restart (or from any process of the same principal), :meth:`OutcomeTable.recover`
completes every prepared txn: commit where the database holds its commit row, else
abort. To tell "the database never committed it" from "its writer is just slow",
recovery first writes an *abort* row for such a txn in its own database transaction: the
table's primary key lets only one of the two rows exist, so the database and Kafka agree
whichever comes first (the writer's database commit then fails, and its rows with it).
Abort rows are kept :data:`ABORT_ROWS_KEPT_S` for that reason; commit rows only until
their txn is completed.

The one outcome no table can rule out: the coordinator aborts a prepared txn at its
maximum prepared age without asking the database (it must: the txn blocks its
partitions' readers). :meth:`OutcomeTable.record` refuses a txn past
:data:`RECORD_BEFORE` of that age, so only a writer that stalls for the rest of it
between ``record`` and its database COMMIT can commit rows whose records were aborted;
give ``max_prepared_s`` room for your worst stall and recovery time.

The table (:meth:`OutcomeTable.create`)::

    CREATE TABLE IF NOT EXISTS txnstream_outcomes (
        txn_id     TEXT PRIMARY KEY,                  -- "(tc,seq)"
        outcome    TEXT NOT NULL,                     -- 'commit' or 'abort'
        decided_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)

Any DB-API 2.0 connection whose driver takes ``%s`` placeholders (psycopg, the
PostgreSQL driver the tests run; MySQL's drivers too).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from txnstream import validate
from txnstream.errors import (
    ConfigError,
    InvalidTxnStatusError,
    TransactionNotFoundError,
    TransactionTimeoutError,
)
from txnstream.types import TxnID, TxnStatus

if TYPE_CHECKING:
    from txnstream.client import Client
    from txnstream.coordinator.protocol import TxnInfo
    from txnstream.transaction import Transaction

__all__ = ["ABORT", "ABORT_ROWS_KEPT_S", "COMMIT", "RECORD_BEFORE", "OutcomeTable"]

log = logging.getLogger(__name__)

COMMIT, ABORT = "commit", "abort"
ABORT_ROWS_KEPT_S = 7 * 86_400.0
"""How long recovery's abort rows are kept: far past any writer that could still try to
record the txn (its maximum prepared age is at most a day by default)."""
RECORD_BEFORE = 0.5
""":meth:`OutcomeTable.record` refuses a txn prepared longer ago than this share of its
maximum prepared age (the rest is the writer's margin to commit its database)."""
_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class OutcomeTable:
    """The database's record of which prepared txnstream txns commit.

    ``client``: the txnstream client (its principal owns the txns; an admin's recovers
    every principal's: give each application its own principal). ``table``: the table's
    name (a plain SQL identifier).
    """

    def __init__(self, client: Client, table: str = "txnstream_outcomes") -> None:
        if not isinstance(table, str) or not _TABLE.fullmatch(table):
            raise ConfigError(f"table must be a plain SQL identifier (letters, digits, _), "
                              f"got {table!r:.80}")
        self.client = client
        self.table = table

    def create(self, conn: Any) -> None:
        """Create the table if it does not exist (and commit)."""
        with _cursor(conn) as cur:
            cur.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (txn_id TEXT PRIMARY KEY, "
                        "outcome TEXT NOT NULL, "
                        "decided_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)")
        conn.commit()

    def record(self, cur: Any, txn: Transaction) -> None:
        """Inside the application's database transaction: ``txn`` commits with it.

        ``txn`` must be PREPARED (``txn.prepare()`` returned), less than
        :data:`RECORD_BEFORE` of its maximum prepared age ago. If recovery already
        decided to abort it, the insert fails on the primary key: roll the database
        transaction back (its rows must not exist without the txn's records).
        """
        if txn.status is not TxnStatus.PREPARED or txn.prepared_at_s is None:
            raise InvalidTxnStatusError(
                txn.id, TxnStatus.PREPARED, txn.status,
                f"record {txn.id} only once it is prepared: it is {txn.status.value}")
        max_s = txn.max_prepared_s or self.client.config.default_max_prepared_s
        waited = txn._clock() - txn.prepared_at_s  # noqa: SLF001 - the txn's own clock
        if waited > RECORD_BEFORE * max_s:
            raise TransactionTimeoutError(
                f"{txn.id} was prepared {waited:.1f} s ago, past {RECORD_BEFORE:g} of its "
                f"maximum prepared age ({max_s:g} s): not recorded, roll the database back "
                "and abort it", txn.id)
        cur.execute(f"INSERT INTO {self.table} (txn_id, outcome) VALUES (%s, %s)",
                    (str(txn.id), COMMIT))

    def complete(self, conn: Any, txn_id: TxnID | str) -> TxnStatus:
        """After the database committed: commit the txn, then forget its row."""
        tid = validate.txn_id(txn_id, "txn_id")
        status = self.client.complete_transaction(tid, True)
        self._forget(conn, tid)
        return status

    def recover(self, conn: Any, only: Callable[[TxnInfo], bool] | None = None
                ) -> dict[TxnID, TxnStatus]:
        """Complete every prepared txn this client may see, as the database decides.

        ``only``: which of them are this application's (e.g. by the partitions they
        wrote); default every prepared txn of the client's principal.

        A txn whose row says commit is committed; one without a row gets an abort row
        first (its writer's database commit can no longer succeed), then is aborted.
        Commit rows whose txn is no longer prepared are forgotten (a crash between a
        completion and its forgetting), and abort rows past :data:`ABORT_ROWS_KEPT_S`.
        Returns what it completed.
        """
        done: dict[TxnID, TxnStatus] = {}
        prepared = set()
        for info in self.client.admin.list_transactions():
            if info.status is not TxnStatus.PREPARED:
                continue
            prepared.add(str(info.txn_id))
            if only is not None and not only(info):
                continue
            outcome = self._decide(conn, info.txn_id)
            try:
                done[info.txn_id] = self.client.complete_transaction(info.txn_id,
                                                                     outcome == COMMIT)
            except (TransactionTimeoutError, InvalidTxnStatusError) as exc:
                log.error("recovery of %s: the database says %s, its coordinator: %s",
                          info.txn_id, outcome, exc)
                continue
            self._forget(conn, info.txn_id)  # a commit row (an abort row stays)
        self._sweep(conn, prepared)
        return done

    def _decide(self, conn: Any, tid: TxnID) -> str:
        """The outcome the database holds for ``tid``, writing ``abort`` if none."""
        row = self._outcome(conn, tid)
        if row is None:
            try:
                with _cursor(conn) as cur:
                    cur.execute(f"INSERT INTO {self.table} (txn_id, outcome) VALUES (%s, %s)",
                                (str(tid), ABORT))
                conn.commit()
                return ABORT
            except Exception:  # noqa: BLE001 - a driver's duplicate-key error: the
                conn.rollback()  # writer's commit got there first
                row = self._outcome(conn, tid)
        if row not in (COMMIT, ABORT):
            raise ConfigError(f"table {self.table}: txn {tid} has outcome {row!r}, not "
                              f"{COMMIT!r} or {ABORT!r}")
        return str(row)

    def _outcome(self, conn: Any, tid: TxnID) -> str | None:
        with _cursor(conn) as cur:
            cur.execute(f"SELECT outcome FROM {self.table} WHERE txn_id = %s", (str(tid),))
            row = cur.fetchone()
        conn.commit()
        return None if row is None else row[0]

    def _forget(self, conn: Any, tid: TxnID) -> None:
        with _cursor(conn) as cur:
            cur.execute(f"DELETE FROM {self.table} WHERE txn_id = %s AND outcome = %s",
                        (str(tid), COMMIT))
        conn.commit()

    def _sweep(self, conn: Any, prepared: set[str]) -> None:
        """Forget commit rows of completed txns and abort rows past their keeping."""
        cutoff = dt.datetime.now() - dt.timedelta(seconds=ABORT_ROWS_KEPT_S)
        with _cursor(conn) as cur:
            cur.execute(f"SELECT txn_id FROM {self.table} WHERE outcome = %s", (COMMIT,))
            done = [r[0] for r in cur.fetchall() if r[0] not in prepared]
            for txn_id in done:
                try:
                    status = self.client.admin.get_transaction(txn_id).status
                except TransactionNotFoundError:
                    status = TxnStatus.COMMITTED  # ended and forgotten long ago
                if status.is_final or status is TxnStatus.COMMITTING:
                    cur.execute(f"DELETE FROM {self.table} WHERE txn_id = %s", (txn_id,))
            cur.execute(f"DELETE FROM {self.table} WHERE outcome = %s AND decided_at < %s",
                        (ABORT, cutoff))
        conn.commit()


@contextmanager
def _cursor(conn: Any) -> Iterator[Any]:
    cur = conn.cursor()
    try:
        yield cur
    finally:
        cur.close()
