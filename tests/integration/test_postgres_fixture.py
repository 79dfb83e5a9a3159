"""The ``postgres`` fixture (``tests/postgres.py``) gives a real server that prepared
transactions survive: killed with SIGKILL (postmaster and backends at once) and started
again on the same cluster, it keeps what was committed, loses what was not, and still
lists the transaction prepared but not completed, which then commits.

No Kafka: the test asks for no broker fixture (``kafka_bootstrap`` is not autouse).
"""

from __future__ import annotations

import psutil
import pytest

from tests.postgres import PostgresServer

pytestmark = pytest.mark.integration


def _rows(pg: PostgresServer) -> list[int]:
    with pg.connect() as conn:
        return [r[0] for r in conn.execute("SELECT id FROM t ORDER BY id")]


def _prepared(pg: PostgresServer) -> list[str]:
    with pg.connect() as conn:
        return [r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts "
                                           "WHERE database = current_database() ORDER BY gid")]


def test_prepared_transactions_survive_kill9(postgres: PostgresServer) -> None:
    pg = postgres
    assert pg.dsn.startswith("postgresql://") and f"127.0.0.1:{pg.port}/" in pg.dsn
    with pg.connect(autocommit=True) as conn:
        assert conn.execute("SHOW max_prepared_transactions").fetchone() == ("20",)
        assert conn.execute("SHOW fsync").fetchone() == ("on",)
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL)")
        # two-phase commit, completed from another session
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
        conn.execute("PREPARE TRANSACTION 'x'")
        # prepared and left so: it must outlive the crash
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (3, 'c')")
        conn.execute("PREPARE TRANSACTION 'y'")
        conn.execute("INSERT INTO t VALUES (4, 'd')")  # plain autocommit
    with pg.connect(autocommit=True) as conn:
        conn.execute("COMMIT PREPARED 'x'")
    assert _rows(pg) == [1, 2, 4]
    assert _prepared(pg) == ["y"]

    open_conn = pg.connect()  # a txn still open at the crash: lost
    open_conn.execute("INSERT INTO t VALUES (5, 'e')")
    old_pid = pg.pid
    assert old_pid is not None
    pg.kill9()
    assert pg.pid is None and not psutil.pid_exists(old_pid)
    open_conn.close()

    pg.start()
    assert pg.pid is not None and pg.pid != old_pid
    assert "automatic recovery in progress" in pg.log_tail(20_000), \
        "the restart ran no crash recovery: was it a crash?"
    assert _rows(pg) == [1, 2, 4]
    assert _prepared(pg) == ["y"]
    with pg.connect(autocommit=True) as conn:
        conn.execute("COMMIT PREPARED 'y'")
    assert _rows(pg) == [1, 2, 3, 4]
    assert _prepared(pg) == []
