"""The ``postgres`` fixture: a real PostgreSQL server of the test's own.

The server itself is :class:`chaos.postgres.PostgresServer` (binaries, running as an
unprivileged user under root, kill -9 and restart): the chaos harness's two-phase
writers use the same one. Integration tests get the fixture through
``tests/integration/conftest.py``; elsewhere, import it (``from tests.postgres import
postgres``) or use :func:`start_postgres`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.postgres import DB_USER, OS_USER, PostgresServer, find_binaries, start_postgres

__all__ = ["DB_USER", "OS_USER", "PostgresServer", "find_binaries", "postgres", "start_postgres"]


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[PostgresServer]:
    """A started PostgreSQL server of this test's own: ``.dsn``, ``.pid``, ``.connect()``,
    ``.kill9()``, ``.start()``; stopped and its cluster removed at teardown, whatever the
    test's outcome."""
    with start_postgres(tmp_path) as server:
        yield server
