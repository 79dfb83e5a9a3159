"""The chaos harness's bound on the TC log's oldest record (pure logic)."""

from __future__ import annotations

from chaos.profile import Bounds, profile


def test_without_txns_held_open_the_log_keeps_its_retention_and_checkpoints():
    b = Bounds()
    # 300 s of ended txns, 3 checkpoint intervals of 30 s, a takeover in the drain.
    assert b.log_age_bound(None) == 480.0


def test_txns_held_open_through_the_run_keep_the_log_since_they_began():
    b = Bounds()
    assert b.log_age_bound(1200.0) == 1200.0 + b.log_held_margin_s
    # A flood begun a moment ago holds no more than the retention would.
    assert b.log_age_bound(10.0) == b.log_oldest_s


def test_a_log_never_truncated_in_a_soak_is_over_the_bound():
    p = profile("soak", minutes=30)
    assert p.workload_s + p.drain_s > p.bounds.log_age_bound(None)
    hostile = profile("hostile-soak", minutes=30)
    held = hostile.workload_s * (1 - hostile.flood_quiet_share) + hostile.drain_s
    assert hostile.workload_s + hostile.drain_s > hostile.bounds.log_age_bound(held)
