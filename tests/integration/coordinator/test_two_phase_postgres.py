"""One transaction across Kafka and a real PostgreSQL (issue 39): the recipe of
``txnstream.two_phase``, its application killed -9 after each step (and its coordinator
killed -9 while a txn is prepared), then a recovery in another process. Every run ends
with the database row and the Kafka record both present once or both absent, and the
input acknowledged exactly when the row exists."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.coordinator.conftest import make_topic, owners, wait_until
from tests.integration.coordinator.test_coordinator_faults import all_served_by
from txnstream import Client
from txnstream.two_phase import OutcomeTable
from txnstream.types import TxnStatus

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[3]
STEPS = ["before_prepare", "after_prepare", "after_db_commit", "after_complete", "none"]


def wrote(info, topic: str) -> bool:
    """Whether the txn wrote to ``topic`` (this test's: the session shares coordinators)."""
    return any(p.rpartition("-")[0] == topic for p in info.partitions)


def run_app(config, dsn: str, topic_in: str, topic_out: str, sub: str, crash_at: str):
    return subprocess.run(
        [sys.executable, "-m", "tests.integration.coordinator.two_phase_app",
         config.bootstrap_servers, config.topics.prefix, dsn, topic_in, topic_out, sub,
         crash_at], capture_output=True, text=True, timeout=180, cwd=ROOT)


def outputs(client: Client, topic: str, expect: int = 0) -> list[bytes]:
    """The committed records of ``topic``: waiting up to a minute for ``expect`` of them
    (a buffer owner killed with the coordinator is taken over first), then until nothing
    more comes for 3 s (a duplicate would come as fast)."""
    c = client.subscribe(topic, subscription=f"chk-{uuid.uuid4().hex[:6]}")
    got: list[bytes] = []
    while (m := c.receive(timeout_s=60 if len(got) < expect else 3)) is not None:
        got.append(m.value)
        c.acknowledge(m)
    c.close()
    return got


def redelivered(client: Client, topic: str, sub: str) -> list[bytes]:
    """What the app's subscription still holds (unacked inputs), once its member is gone."""
    c = client.subscribe(topic, subscription=sub, **{"session.timeout.ms": 6000})
    got = []
    while (m := c.receive(timeout_s=10)) is not None:
        got.append(m.value)
    c.close()
    return got


def check_run(config, client, postgres, crash_at: str, kill_coordinator=None) -> None:
    topic_in, topic_out = make_topic(config, 1, "in2pc"), make_topic(config, 1, "out2pc")
    sub = f"app-{uuid.uuid4().hex[:6]}"
    with postgres.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS rows (v BYTEA)")
        conn.execute("DELETE FROM rows")
        conn.commit()
    p = client.create_producer(topic_in)
    p.send(b"v1")
    p.flush()
    app = run_app(config, postgres.dsn, topic_in, topic_out, sub, crash_at)
    if crash_at == "none":
        assert app.returncode == 0 and "done" in app.stdout, app.stderr[-3000:]
    else:
        assert app.returncode == -signal.SIGKILL, (app.returncode, app.stderr[-3000:])
    if kill_coordinator is not None:
        kill_coordinator()
    if crash_at == "before_prepare":  # an open txn: its coordinator aborts it at its timeout
        time.sleep(6)
    with postgres.connect() as conn:  # recovery, from this process
        OutcomeTable(client).recover(conn, only=lambda t: wrote(t, topic_out))
        rows = [bytes(r[0]) for r in conn.execute("SELECT v FROM rows").fetchall()]
        left = conn.execute("SELECT count(*) FROM txnstream_outcomes WHERE outcome = "
                            "'commit'").fetchone()[0]
    out = outputs(client, topic_out, expect=len(rows))
    again = redelivered(client, topic_in, sub)
    assert not [t for t in client.admin.list_transactions()
                if t.status is TxnStatus.PREPARED and wrote(t, topic_out)]
    if rows:
        assert rows == [b"v1"] and out == [b"out-v1"] and again == [], (crash_at, rows, out,
                                                                          again)
    else:
        assert out == [] and again == [b"v1"], (crash_at, rows, out, again)
    assert left == 0, "a commit row outlived its completed txn"
    expect_rows = crash_at in ("after_db_commit", "after_complete", "none")
    assert bool(rows) == expect_rows, (crash_at, rows)


@pytest.mark.parametrize("crash_at", STEPS)
def test_the_database_and_kafka_agree_after_a_crash_at_every_step(config, worker, client,
                                                                  postgres, crash_at):
    check_run(config, client, postgres, crash_at)


def test_they_agree_when_the_coordinator_is_killed_while_the_txn_is_prepared(
        config, worker_procs, client, postgres):
    for name in ("w1", "w2"):
        worker_procs.start(name)
    n = config.num_coordinators
    wait_until(lambda: all_served_by(client, {"w1", "w2"}, n), 90, "2 workers serving")

    def kill_an_owner() -> None:
        victim = owners(client)[0]
        worker_procs.signal(victim, signal.SIGKILL)
        survivor = ({"w1", "w2"} - {victim}).pop()
        wait_until(lambda: all_served_by(client, {survivor}, n), 90, "the survivor")

    check_run(config, client, postgres, "after_db_commit", kill_coordinator=kill_an_owner)


def test_recovery_and_a_slow_writer_cannot_both_win(config, worker, client, postgres):
    """Recovery finds a prepared txn with no row and aborts it, writing its abort row
    first: the writer's later record fails on the key, so its rows never commit."""
    import psycopg

    topic = make_topic(config, 1, "slow2pc")
    p = client.create_producer(topic)
    table = OutcomeTable(client)
    with postgres.connect() as conn:
        table.create(conn)
        conn.execute("CREATE TABLE IF NOT EXISTS rows (v BYTEA)")
        conn.commit()
    txn = client.new_transaction(max_prepared_s=120)
    p.send(b"slow", txn=txn)
    txn.prepare()
    with postgres.connect() as conn:
        assert table.recover(conn, only=lambda t: wrote(t, topic)) == {
            txn.id: TxnStatus.ABORTED}
    with postgres.connect() as conn, pytest.raises(psycopg.errors.UniqueViolation):
        with conn.cursor() as cur:
            cur.execute("INSERT INTO rows (v) VALUES (%s)", (b"slow",))
            table.record(cur, txn)
        conn.commit()
    with postgres.connect() as conn:
        assert conn.execute("SELECT count(*) FROM rows WHERE v = %s",
                            (b"slow",)).fetchone()[0] == 0
    assert outputs(client, topic) == []
