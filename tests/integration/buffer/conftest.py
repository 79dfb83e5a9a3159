"""Fixtures for committed-only reads: a coordinator worker and data topics."""

from tests.integration.coordinator.conftest import (  # noqa: F401
    client,
    make_topic,
    read_all,
    tc_worker,
    wait_until,
    worker,
    worker_procs,
)
