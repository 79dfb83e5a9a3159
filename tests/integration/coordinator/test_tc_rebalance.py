"""The coordinators' group moves only the TCs that change owner (cooperative rebalancing).

With the eager protocol every worker gave up every TC at every change of the group and
replayed each one it got back from its log: in the hostile soaks a worker's pause or
kill stopped every TC of the cluster two or three times in 15 s, 1-3 s each (seed 72,
09:38:00-09:38:22), and commits on TCs that never moved waited for it.
"""

from __future__ import annotations

import re
import signal

import pytest

from tests.integration.coordinator.conftest import owners, wait_until
from tests.integration.coordinator.test_coordinator_faults import all_served_by

pytestmark = [pytest.mark.integration, pytest.mark.fault]


def dropped(log: str) -> list[int]:
    """TCs the worker stopped serving, in order, from its log."""
    return [int(tc) for tc in re.findall(r"tc (\d+): \S+ stops serving", log)]


def test_tcs_that_keep_their_owner_serve_on_while_workers_join_and_leave(
        config, worker_procs, client):
    n = config.num_coordinators
    worker_procs.start("a")
    wait_until(lambda: all_served_by(client, {"a"}, n), 90, "a serving every TC")
    worker_procs.start("b")
    wait_until(lambda: all_served_by(client, {"a", "b"}, n)
               and set(owners(client).values()) == {"a", "b"}, 90, "b serving some TCs")
    kept = {tc for tc, owner in owners(client).items() if owner == "a"}
    moved = set(range(n)) - kept
    assert kept and moved
    assert sorted(dropped(worker_procs.log("a"))) == sorted(moved), (
        "a stopped serving only the TCs b took", worker_procs.log("a")[-3000:])

    worker_procs.signal("b", signal.SIGKILL)  # b's TCs come back to a after its session
    wait_until(lambda: all_served_by(client, {"a"}, n), 60, "a serving every TC again")
    assert sorted(dropped(worker_procs.log("a"))) == sorted(moved), (
        "a kept serving its own TCs while b's came back", worker_procs.log("a")[-3000:])
    assert worker_procs.log("a").count("replaying offsets") == n + len(moved), (
        "each TC replayed once when taken, none again", worker_procs.log("a")[-3000:])
