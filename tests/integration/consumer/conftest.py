"""Fixtures for consumer tests: a coordinator worker and data topics."""

from tests.integration.coordinator.conftest import (  # noqa: F401
    client,
    make_topic,
    read_all,
    wait_until,
    worker,
)
