"""Fixtures of the integration tests beyond the session's broker (``tests/conftest.py``)."""

from tests.postgres import postgres as postgres  # a real PostgreSQL server per test
