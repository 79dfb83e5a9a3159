"""Fixtures for fault tests: real worker processes and a client."""

from tests.integration.coordinator.conftest import (  # noqa: F401
    client,
    worker_procs,
)
