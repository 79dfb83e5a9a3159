"""Honest commit latency by phase, and the flood rule (issue 34's Show): pure logic."""

from __future__ import annotations

from typing import Any

import pytest

from chaos.latency import (
    MIN_COMMITS,
    commit_samples,
    judge,
    percentile,
    phase_bounds,
    split,
    summarize,
)


def end(t0: float, secs: float, want: str = "commit", **extra: Any) -> dict[str, Any]:
    return {"e": "end", "want": want, "t0": t0, "t": t0 + secs, **extra}


PHASES = [{"e": "phase", "phase": "quiet", "t": 100.0},
          {"e": "phase", "phase": "flood", "t": 200.0},
          {"e": "phase", "phase": "flood", "t": 260.0},  # a second incarnation: the first counts
          {"e": "phase", "phase": "end", "t": 400.0}]


def test_only_honest_openers_commits_are_timed():
    ends = [end(1, 0.5), end(2, 0.25, "late"), end(3, 9, "slow"), end(4, 1, "abort"),
            end(5, 1, "foreign"), end(6, 1, "cocommit", co=True),
            {"e": "end", "want": "commit", "t": 7.0}]  # no t0: an older truth file
    assert commit_samples(ends) == [(1.0, 0.5), (2.0, 0.25)]


def test_phases_are_split_by_the_first_event_of_each():
    assert phase_bounds(PHASES) == {"quiet": (100.0, 200.0), "flood": (200.0, 400.0)}
    assert phase_bounds(PHASES[:1] + PHASES[-1:]) == {"quiet": (100.0, 400.0)}


def test_a_commit_belongs_to_the_phase_it_started_in():
    got = split([(99.0, 1.0), (150.0, 2.0), (199.9, 30.0), (200.0, 3.0), (400.0, 4.0)],
                phase_bounds(PHASES))
    assert got == {"quiet": [2.0, 30.0], "flood": [3.0]}


def test_p99_is_the_nearest_rank():
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 99) == 99.0
    assert percentile(xs, 50) == 50.0
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 99) is None
    assert percentile([float(i) for i in range(1, 51)], 99) == 50.0  # 50 values: the max


def quiet_and_flood(quiet_p99: float, flood_p99: float, n: int = 100) -> dict[str, list[float]]:
    """The two slowest of ``n`` commits set each p99 (nearest rank: the 99th of 100)."""
    return {"quiet": [0.01] * (n - 2) + [quiet_p99] * 2,
            "flood": [0.01] * (n - 2) + [flood_p99] * 2}


def test_a_flood_p99_over_twice_the_quiet_one_is_an_anomaly():
    out = judge(quiet_and_flood(0.1, 0.25))
    assert out["verdict"] == "flood_latency"
    assert out["ratio"] == 2.5
    assert out["quiet"] == {"commits": 100, "p50_ms": 10.0, "p90_ms": 10.0, "p99_ms": 100.0}
    assert judge(quiet_and_flood(0.1, 0.01) | {"flood": [0.01] * 99 + [9.0]})["verdict"] == "ok"


def test_within_twice_is_ok():
    by = {"quiet": [0.1] * 60, "flood": [0.2] * 60}
    assert judge(by)["verdict"] == "ok"
    assert judge(by)["ratio"] == 2.0


@pytest.mark.parametrize("short", ["quiet", "flood"])
def test_too_few_commits_in_a_phase_are_not_judged(short: str):
    by = {"quiet": [0.1] * 80, "flood": [9.0] * 80}
    by[short] = by[short][:MIN_COMMITS - 1]
    out = judge(by)
    assert out["verdict"].startswith("not judged")
    assert short in out["verdict"]
    assert out["ratio"] == 90.0  # still reported


def test_summarize_end_to_end():
    ends = [end(100.0 + i, 0.1) for i in range(60)] + [end(200.0 + i, 0.5) for i in range(60)]
    out = summarize(ends, PHASES)
    assert out["quiet"]["commits"] == 60 and out["flood"]["commits"] == 60
    assert out["ratio"] == 5.0
    assert out["verdict"] == "flood_latency"
    assert out["phases"] == {"quiet": [100.0, 200.0], "flood": [200.0, 400.0]}
    assert [e["at_s"] for e in out["slowest"]["flood"]] == [100.0, 101.0, 102.0, 103.0, 104.0]
    assert out["slowest"]["quiet"][0]["secs"] == 0.1


def test_no_flood_phase_reports_quiet_only():
    out = summarize([end(150.0, 0.1)], PHASES[:1] + PHASES[-1:])
    assert out["flood"]["commits"] == 0
    assert out["verdict"].startswith("not judged")


def test_commits_overlapping_a_fault_are_left_out_of_the_verdict():
    ends = [end(110.0, 0.1), end(150.0, 8.0), end(210.0, 0.2), end(300.0, 0.3)]
    faults = [{"at": 45.0, "duration_s": 2.0},  # 145-147 (+10 s): hits the 150 s commit
              {"at": 190.0, "duration_s": 5.0}]  # 290-305: hits the 300 s commit
    out = summarize(ends, PHASES, faults)
    assert out["quiet"]["commits"] == 1 and out["quiet"]["p99_ms"] == 100.0
    assert out["flood"]["commits"] == 1 and out["flood"]["p99_ms"] == 200.0
    assert out["ratio"] == 2.0
    every = out["all_commits"]
    assert every["quiet"]["commits"] == 2 and every["flood"]["commits"] == 2
    assert every["quiet"]["p90_ms"] == 8000.0
    assert out["judged"].startswith("the 2 of 4 commits clear of the 2 faults")
    # the slowest are every commit's; the slowest judged, the verdict's own
    assert [e["secs"] for e in out["slowest"]["quiet"]] == [8.0, 0.1]
    assert [e["secs"] for e in out["slowest_judged"]["quiet"]] == [0.1]
    assert [e["secs"] for e in out["slowest_judged"]["flood"]] == [0.2]


def stream(lo: float, n: int, secs: float) -> list[dict[str, Any]]:
    """``n`` commits of ``secs`` each, one a second from ``lo``."""
    return [end(lo + i, secs) for i in range(n)]


def test_a_long_fault_in_the_flood_alone_is_not_a_flood_latency():
    # A broker killed for 40 s in the flood: the commits waiting on it take up to 40 s,
    # and by every commit the flood's p99 is 400x the quiet one. Clear of it, it is 1x.
    ends = stream(100.0, 90, 0.1) + stream(200.0, 100, 0.1) + stream(320.0, 20, 40.0)
    out = summarize(ends, PHASES, [{"at": 220.0, "duration_s": 40.0}])
    assert out["all_commits"]["ratio"] == 400.0
    assert out["verdict"] == "ok" and out["ratio"] == 1.0


def test_a_flood_that_slows_commits_clear_of_faults_is_still_an_anomaly():
    ends = stream(100.0, 90, 0.1) + stream(200.0, 100, 0.5) + stream(320.0, 20, 40.0)
    out = summarize(ends, PHASES, [{"at": 220.0, "duration_s": 40.0}])
    assert out["flood"]["commits"] == 100  # 300-319 s and 320-370 s + 10 s are clear
    assert out["verdict"] == "flood_latency" and out["ratio"] == 5.0


def test_a_commit_in_a_faults_settling_time_is_left_out():
    faults = [{"at": 50.0, "duration_s": 1.0}]  # 150-151, settling until 161
    out = summarize([end(160.0, 0.1), end(161.5, 0.1)], PHASES, faults)
    assert out["quiet"]["commits"] == 1
    assert out["all_commits"]["quiet"]["commits"] == 2


def test_a_fault_is_placed_on_the_commits_clock_by_its_wall_time():
    """The nemesis times faults on the monotonic clock, the roles time commits on the
    wall clock; a VM paused and resumed steps the wall clock only (seed 72: 22 s from
    its 14th minute on), so every later fault was judged 22 s before it happened. A fault
    that carries its wall time is placed by it."""
    ends = stream(100.0, 60, 0.1) + stream(200.0, 60, 0.1) + [end(300.0, 3.0)]
    # by "at" the fault was at 250-255 s; it really was at 298-303 s (wall_at)
    fault = {"at": 150.0, "duration_s": 5.0, "wall_at": 298.0}
    out = summarize(ends, PHASES, [fault])
    assert out["flood"]["commits"] == 60, "the 3 s commit inside the fault is left out"
    assert out["verdict"] == "ok"


def test_a_step_of_the_wall_clock_is_a_fault_of_the_machine():
    """Every process stood still while the wall clock went on: sessions and txn
    timeouts measured on it expire at once. Commits near the step are left out."""
    from chaos.latency import ClockWatch

    wall, mono = [1000.0], [50.0]
    watch = ClockWatch(wall=lambda: wall[0], mono=lambda: mono[0])
    for _ in range(5):  # ordinary ticks, with jitter under the step threshold
        wall[0] += 1.0
        mono[0] += 1.0 + 0.01
        watch.check()
    assert watch.steps == []
    wall[0] += 23.0  # a second on the monotonic clock, 23 s on the wall clock
    mono[0] += 1.0
    watch.check()
    [step] = watch.steps
    assert step["kind"] == "clock_step" and step["role"] == "machine"
    assert step["duration_s"] == pytest.approx(23.0, abs=1.01)
    assert step["wall_at"] <= wall[0] - 22.0
    ends = stream(100.0, 60, 0.1) + stream(300.0, 60, 0.1) + [end(wall[0] - 1000 + 200, 2.0)]
    shifted = [dict(step, wall_at=step["wall_at"] - 1000 + 200)]  # onto the test's clock
    out = summarize(ends, PHASES, shifted)
    assert out["flood"]["commits"] == 60 and out["verdict"] == "ok"


def test_a_commit_is_timed_by_its_monotonic_duration_when_it_has_one():
    e = end(210.0, 22.5, dt=0.4)  # the wall clock stepped while it waited
    assert commit_samples([e]) == [(210.0, 0.4)]


def test_the_clusters_own_writes_are_judged_beside_the_verdict_not_in_it():
    """The probe's writes (:mod:`chaos.probe`) are split and cleared of faults by the
    commits' rule; the verdict stays the commits' own."""
    ends = stream(100.0, 60, 0.1) + stream(200.0, 60, 0.5)
    writes = ([(100.0 + i, 0.01) for i in range(90)] + [(200.0 + i, 0.05) for i in range(90)]
              + [(352.0, 9.0)])  # inside the fault below: left out
    out = summarize(ends, PHASES, [{"at": 250.0, "duration_s": 5.0}], probe=writes)
    assert out["verdict"] == "flood_latency" and out["ratio"] == 5.0
    probe = out["kafka_probe"]
    assert probe["quiet"]["commits"] == 90 and probe["flood"]["commits"] == 90
    assert probe["quiet"]["p99_ms"] == 10.0 and probe["flood"]["p99_ms"] == 50.0
    assert probe["ratio"] == 5.0 and probe["writes"] == 181


def test_each_slowest_judged_commit_names_the_slowest_write_that_overlapped_it():
    ends = [end(110.0, 0.1), end(210.0, 0.4), end(300.0, 0.2)]
    writes = [(109.0, 0.5), (110.05, 0.02), (209.0, 0.3), (210.2, 0.35), (211.0, 2.0),
              (250.0, 0.1)]
    out = summarize(ends, PHASES, probe=writes)
    quiet, flood = out["slowest_judged"]["quiet"], out["slowest_judged"]["flood"]
    assert [r["probe_max_ms"] for r in quiet] == [20.0], "109.0-109.5 ended before 110"
    assert [(r["secs"], r["probe_max_ms"]) for r in flood] == [(0.4, 350.0), (0.2, None)]


def test_without_a_probe_nothing_is_reported_of_it():
    out = summarize(stream(100.0, 60, 0.1), PHASES)
    assert "kafka_probe" not in out
    assert all("probe_max_ms" not in r for rows in out["slowest_judged"].values() for r in rows)


def test_the_machines_cores_are_reported_by_phase_and_around_each_slowest_commit():
    ends = [end(110.0, 0.1), end(210.0, 0.4)]
    cpu = ([(100.0 + i, 1.0, 0.5, 0.0) for i in range(100)]
           + [(200.0 + i, 1.0, 0.95 if i % 2 else 0.7, 0.01) for i in range(100)])
    out = summarize(ends, PHASES, probe=[], cpu=cpu)
    quiet, flood = out["kafka_probe"]["cpu"]["quiet"], out["kafka_probe"]["cpu"]["flood"]
    assert quiet == {"intervals": 100, "busy_mean": 0.5, "steal_mean": 0.0,
                     "saturated_share": 0.0}
    assert flood["busy_mean"] == 0.825 and flood["saturated_share"] == 0.5
    assert out["slowest_judged"]["flood"][0]["cpu_busy"] == 0.7  # 210.0-210.4: second 10
    assert out["slowest_judged"]["quiet"][0]["cpu_busy"] == 0.5
