"""Log lines a hostile peer or a failing loop can repeat: one per kind per interval."""

from __future__ import annotations

import logging

import pytest

from txnstream import ratelog
from txnstream.ratelog import RateLimitedLog


def test_a_repeated_kind_is_logged_once_per_interval_and_then_says_how_many_were_held(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    rl = RateLimitedLog(logging.getLogger("t.ratelog"), interval_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t.ratelog"):
        assert rl.warning("refuse", "refused %s", "a")
        for _ in range(1000):
            assert not rl.warning("refuse", "refused %s", "b")
        assert rl.warning("other", "other %d", 1)  # another kind is not held back
        now[0] += 10.5
        assert rl.warning("refuse", "refused %s", "c")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "refused a"
    assert lines[1] == "other 1"
    assert lines[2].startswith("refused c (1000 more like it in the last 10 s")
    assert len(lines) == 3


def test_kinds_kept_are_bounded() -> None:
    rl = RateLimitedLog(logging.getLogger("t.ratelog.bound"))
    for i in range(ratelog.MAX_KINDS * 3):
        rl.warning(f"peer {i}", "x")
    assert len(rl._kinds) == ratelog.MAX_KINDS
