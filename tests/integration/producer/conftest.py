"""Fixtures for the producer's tests: a coordinator worker, a client and data topics."""

from tests.integration.coordinator.conftest import (  # noqa: F401
    client,
    tc_worker,
    worker,
)
