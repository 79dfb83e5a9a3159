"""``txnstream demo`` beside workers that already serve every coordinator (the compose
stack's case: its workers run before and after the demo)."""

from __future__ import annotations

import subprocess

import pytest

from tests.integration.coordinator.conftest import (  # noqa: F401  (fixture)
    TXNSTREAM_BIN,
    wait_until,
    worker_procs,
)
from txnstream import Client
from txnstream.errors import TxnStreamError

pytestmark = pytest.mark.integration


def test_the_demo_passes_beside_workers_already_serving(config, worker_procs):  # noqa: F811
    """Old: the demo's own worker waited to serve all coordinators itself, which it never
    does while another worker holds some: it failed after 60 s (exit 2)."""
    worker_procs.start("w1")
    with Client(config=config) as c:

        def all_served() -> bool:
            try:
                return len(c.admin.coordinator_stats()) == config.num_coordinators
            except TxnStreamError:  # e.g. a coordinator still replaying its log: not yet
                return False        # (a full run: STATS to one went unanswered for 10 s)

        wait_until(all_served, 60, "the worker serving every coordinator")
    out = subprocess.run([TXNSTREAM_BIN, "--bootstrap", config.bootstrap_servers, "demo",
                          "--prefix", config.topics.prefix, "--records", "300",
                          "--txn-size", "30"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
