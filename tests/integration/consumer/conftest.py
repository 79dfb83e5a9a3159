"""Fixtures for consumer tests: a coordinator worker and data topics."""

from tests.integration.coordinator.conftest import (  # noqa: F401
    client,
    fill,
    make_topic,
    read_all,
    receive_n,
    wait_until,
    worker,
)
