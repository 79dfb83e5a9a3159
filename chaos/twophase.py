"""The harness's side of the two-phase writers (issue 39): PostgreSQL, the feed, the check.

A run with ``twophase_writers`` starts a PostgreSQL server of its own
(:class:`chaos.postgres.PostgresServer`, log in ``WORKDIR/logs/postgres.log``) and the
tables, feeds ``twophase_rate`` inputs a second to :data:`IN_TOPIC` while the workload
runs (plain records ``{"id": "in-K"}``), and starts the writers
(:mod:`chaos.roles.twophase`, principal :data:`PRINCIPAL`). The nemesis kills PostgreSQL
too (``postgres_kill9``). After the drain, :meth:`TwoPhase.check` reads the table and
:data:`OUT_TOPIC` committed-only and :func:`judge` holds them to the recipe's promise:

- ``twophase_not_atomic``: a txn whose rows and whose delivered records name different
  inputs (one side without the other);
- ``twophase_duplicate``: an input with two rows or two delivered records;
- ``twophase_lost``: after a complete drain (the writers' subscription caught up, no txn
  open or prepared), an input fed and acknowledged without a row (the input is gone
  and nothing was written for it);
- ``twophase_told_committed``: a txn ``complete()`` said COMMITTED without its row and
  record.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from chaos.credentials import TWOPHASE as PRINCIPAL
from chaos.postgres import PostgresServer
from chaos.profile import Profile
from chaos.reader import MarkerCheck, read_committed, read_raw
from chaos.roles.twophase import OUTCOMES, ROWS
from chaos.truth import encode_value, read_events
from txnstream import Client, Config
from txnstream.errors import TxnStreamError

__all__ = ["IN_TOPIC", "OUT_TOPIC", "PRINCIPAL", "SUBSCRIPTION", "TwoPhase", "judge"]

log = logging.getLogger(__name__)

IN_TOPIC = "chaos-2pc-in"
OUT_TOPIC = "chaos-2pc-out"
SUBSCRIPTION = "chaos-2pc"
TXN_TIMEOUT_S = 15.0
MAX_PREPARED_S = 300.0
"""Room for the writers' recovery to come round: the coordinator's age abort asks no
database, so it must not decide here. Recovery lists every coordinator, and under the
hostile profiles' forged endpoints and faults one LIST took up to a minute (soak seed 36:
two prepared txns recovered 62 and 69 s after their prepare)."""
STALE_S = 5.0
"""A prepared txn older than this is another incarnation's or a stalled writer's: the
writers' periodic recovery completes it as the database says (a live writer records
within milliseconds of its prepare)."""
RECOVER_EVERY_S = 3.0
STEP_S = (0.0, 0.3)
"""A writer's work after its prepare and after its database commit: windows for faults."""


class TwoPhase:
    """PostgreSQL, the input feed and the check of one run."""

    def __init__(self, profile: Profile, logs: Path) -> None:
        self.p = profile
        self.logs = logs
        self.pg: PostgresServer | None = None
        self.fed = 0
        self.delivered: set[str] = set()
        self._producer: Producer | None = None
        self._credit = 0.0

    @property
    def enabled(self) -> bool:
        """Whether the profile runs two-phase writers."""
        return self.p.twophase_writers > 0

    def start(self, client: Client) -> None:
        """Start PostgreSQL and create the tables."""
        from txnstream.two_phase import OutcomeTable

        self.pg = PostgresServer(self.logs, db="chaos", settings={"log_lock_waits": "on"})
        self.pg.start()
        with self.pg.connect() as conn:
            conn.execute(f"CREATE TABLE {ROWS} (id BIGSERIAL PRIMARY KEY, input TEXT NOT NULL, "
                         "txn TEXT NOT NULL, writer TEXT NOT NULL)")
            conn.commit()
            OutcomeTable(client, OUTCOMES).create(conn)

    def spec(self) -> dict[str, Any]:
        """A writer's role settings."""
        assert self.pg is not None
        return {"dsn": self.pg.dsn, "input": IN_TOPIC, "output": OUT_TOPIC,
                "subscription": SUBSCRIPTION, "txn_timeout_s": TXN_TIMEOUT_S,
                "max_prepared_s": MAX_PREPARED_S, "stale_s": STALE_S,
                "recover_every_s": RECOVER_EVERY_S, "step_s": list(STEP_S),
                "session_timeout_ms": self.p.session_timeout_ms}

    def feed(self, config: Config, seconds: float) -> None:
        """Write the inputs due for ``seconds`` more of the workload (plain records)."""
        if self._producer is None:
            self._producer = Producer(config.producer())
        self._credit += seconds * self.p.twophase_rate
        while self._credit >= 1.0:
            self._credit -= 1.0
            in_id = f"in-{self.fed}"
            self.fed += 1
            self._producer.produce(IN_TOPIC, encode_value({"id": in_id}),
                                   on_delivery=self._on_delivery(in_id))
        self._producer.poll(0)

    def _on_delivery(self, in_id: str) -> Any:
        def done(err: Any, _msg: Any) -> None:
            if err is None:
                self.delivered.add(in_id)
            else:
                log.warning("input %s not written: %s", in_id, err)
        return done

    def close_feed(self) -> None:
        """Wait for the inputs' delivery reports."""
        if self._producer is not None:
            self._producer.flush(60)
            self._producer = None

    # ------------------------------------------------------------ the check

    def check(self, client: Client, markers: MarkerCheck, truth_dir: Path,
              complete: bool) -> tuple[list[tuple[str, dict[str, Any], str]], dict[str, Any]]:
        """The anomalies (kind, detail, sub) and notes; ``complete``: the drain was.

        The writers are stopped. First the harness recovers what they left prepared (a
        drain that did not complete can leave some), as the recipe's recovery does: the
        database decides each. Then it reads the table and the output.
        """
        from txnstream.two_phase import OutcomeTable

        assert self.pg is not None
        config = client.config
        self.pg.start()  # up again if the nemesis's last kill left it down
        with self.pg.connect() as conn:
            try:
                done = OutcomeTable(client, OUTCOMES).recover(
                    conn, only=lambda info: info.owner == PRINCIPAL)
                left_prepared: Any = {str(t): s.value for t, s in done.items()}
            except TxnStreamError as exc:  # judged as they are: may show as not atomic
                left_prepared = f"recovery failed: {exc}"
            rows = conn.execute(f"SELECT input, txn FROM {ROWS}").fetchall()
            left = dict(conn.execute(f"SELECT outcome, count(*) FROM {OUTCOMES} "
                                     "GROUP BY outcome").fetchall())
        raw = read_raw(config, [OUT_TOPIC], check=markers)
        targets = {tp: rp.last_expected_visible() for tp, rp in raw.items()}
        seen = read_committed(config, [OUT_TOPIC], targets)
        records = [(d.value["in"], d.value["txn"]) for d in seen if d.value and "in" in d.value]
        events = [ev for _, ev in read_events(truth_dir)]
        told = {ev["txn"]: ev["outcome"] for ev in events if ev.get("e") == "end"}
        found = judge(self.delivered, rows, records, told, complete)
        kinds = Counter(ev.get("e") for ev in events)
        recovered = Counter(ev["status"] for ev in events if ev.get("e") == "recovered")
        notes = {"fed": len(self.delivered), "rows": len(rows), "records": len(records),
                 "events": dict(kinds), "recovered": dict(recovered),
                 "outcome_rows_left": left, "drain_complete": complete,
                 "recovered_by_harness": left_prepared}
        return found, notes

    def close(self) -> None:
        """Stop PostgreSQL and remove its cluster (its log stays)."""
        self.close_feed()
        if self.pg is not None:
            self.pg.close()


def judge(fed: set[str], rows: list[tuple[str, str]], records: list[tuple[str, str]],
          told: dict[str, str], complete: bool) -> list[tuple[str, dict[str, Any], str]]:
    """The two-phase anomalies of a run (module docstring): ``(kind, detail, sub)``.

    ``rows`` and ``records``: ``(input, txn)`` of the table and of the delivered output
    records; ``told``: txn -> the status ``complete()`` returned; ``fed``: the inputs
    written; ``complete``: whether the drain completed.
    """
    out: list[tuple[str, dict[str, Any], str]] = []
    by_txn: dict[str, tuple[Counter[str], Counter[str]]] = defaultdict(
        lambda: (Counter(), Counter()))
    for in_id, txn in rows:
        by_txn[txn][0][in_id] += 1
    for in_id, txn in records:
        by_txn[txn][1][in_id] += 1
    for txn, (in_db, in_log) in sorted(by_txn.items()):
        if set(in_db) != set(in_log):
            out.append(("twophase_not_atomic", {"txn": txn, "rows": sorted(in_db),
                                                "records": sorted(in_log)}, "db vs log"))
    for where, pairs in (("rows", rows), ("records", records)):
        count = Counter(in_id for in_id, _ in pairs)
        for in_id, n in sorted(count.items()):
            if n > 1:
                txns = sorted(t for i, t in pairs if i == in_id)
                out.append(("twophase_duplicate", {"input": in_id, "in": where, "count": n,
                                                   "txns": txns}, where))
    if complete:
        have = {in_id for in_id, _ in rows}
        for in_id in sorted(fed - have):
            out.append(("twophase_lost", {"input": in_id}, "acked without a row"))
    for txn, outcome in sorted(told.items()):
        in_db, in_log = by_txn.get(txn, (Counter(), Counter()))
        if outcome == "COMMITTED" and not (in_db and in_log):
            out.append(("twophase_told_committed", {"txn": txn, "rows": sorted(in_db),
                                                    "records": sorted(in_log)}, "missing"))
    return out
