"""The buffer owners' group moves only the slots that change owner (cooperative).

With the eager protocol every owner gave up every slot at every change of the group (a
final snapshot each, then a claim and a scan of the slot again), so one worker's pause
or kill held every committed-only reader of the cluster until its slots were claimed
again, two or three times within 15 s.
"""

from __future__ import annotations

import logging
import re

import pytest

from tests.integration.buffer.conftest import wait_until
from txnstream.buffer.worker import BufferWorker

pytestmark = [pytest.mark.integration]


def dropped(caplog: pytest.LogCaptureFixture, member: str) -> list[int]:
    """Slots ``member`` stopped owning, from its log lines."""
    return [int(m.group(1)) for r in caplog.records
            if (m := re.match(rf"buffer worker {member}: slot (\d+) (?:revoked|lost)",
                              r.getMessage()))]


def test_slots_that_keep_their_owner_are_served_on_while_owners_join_and_leave(
        config, caplog):
    n = config.num_buffer_slots
    caplog.set_level(logging.INFO, logger="txnstream.buffer.worker")
    a = BufferWorker(config, member="a", session_timeout_ms=6_000).start()
    try:
        wait_until(lambda: len(a.owned_slots()) == n, 60, "a owning every slot")
        b = BufferWorker(config, member="b", session_timeout_ms=6_000).start()
        try:
            wait_until(lambda: b.owned_slots() and a.owned_slots()
                       and len(a.owned_slots()) + len(b.owned_slots()) == n, 60,
                       "a and b sharing the slots")
            moved = sorted(b.owned_slots())
            assert sorted(dropped(caplog, "a")) == moved, "a gave up only the slots b took"
        finally:
            b.stop()
        wait_until(lambda: len(a.owned_slots()) == n, 60, "a owning every slot again")
        assert sorted(dropped(caplog, "a")) == moved, \
            "a kept its own slots while b's came back"
    finally:
        a.stop()
