"""Deferred runs in a stream's offsets: what a batch reads follows from its offsets alone."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txnstream.types import TopicPartition
from txnstream_spark import deferred
from txnstream_spark.deferred import (
    DEFERRED_KEY,
    MAX_DEFERRED_RUNS,
    RunGate,
    clusters,
    defer,
    join,
    offsets_floor,
    split,
    subtract,
)

TP = TopicPartition("t", 0)


def test_join_and_split_round_trip_and_leave_offsets_without_runs_alone():
    offsets = {"t": {"0": 12, "1": 4}, "@log_epochs": {"t": {"0": 1}}}
    assert join(offsets, {TP: []}) == offsets
    noted = join(offsets, {TP: [(5, 6, 1_000)]})
    assert noted[DEFERRED_KEY] == {"t": {"0": [[5, 6, 1_000]]}}
    rest, runs = split(noted)
    assert rest == offsets and runs == {TP: [(5, 6, 1_000)]}


@pytest.mark.parametrize("bad, names", [
    ({DEFERRED_KEY: [1]}, "must map topics"),
    ({DEFERRED_KEY: {"t": 3}}, "of topic 't' must map partitions"),
    ({DEFERRED_KEY: {"t": {"0": [[1, 2]]}}}, "t-0"),
    ({DEFERRED_KEY: {"t": {"0": [[5, 2, 9]]}}}, "ascending and disjoint"),
    ({DEFERRED_KEY: {"t": {"0": [[1, 5, 9], [5, 6, 9]]}}}, "ascending and disjoint"),
])
def test_a_hand_edited_entry_is_refused_naming_it(bad, names):
    with pytest.raises(ValueError, match=names):
        split(bad)


def test_defer_keeps_what_is_not_due_and_releases_the_rest():
    carried = [(1, 1, 500), (3, 4, 2_000)]
    later, end = defer(carried, [(10, 10, 3_000), (11, 11, 900)], 20, now_ms=1_000)
    assert later == [(3, 4, 2_000), (10, 10, 3_000)] and end == 20
    assert subtract([(f, la) for f, la, _ in carried], [(f, la) for f, la, _ in later]) \
        == [(1, 1)]


def test_defer_past_the_bound_ends_the_range_before_the_first_run_that_does_not_fit():
    carried = [(i, i, 9_000) for i in range(MAX_DEFERRED_RUNS - 1)]
    base = MAX_DEFERRED_RUNS * 2
    found = [(base, base, 9_000), (base + 5, base + 5, 9_000), (base + 9, base + 9, 9_000)]
    later, end = defer(carried, found, base + 20, now_ms=1_000)
    assert end == base + 5 and later[-1] == (base, base, 9_000)
    assert len(later) == MAX_DEFERRED_RUNS


def test_the_gate_passes_only_released_spans_or_everything_but_deferred_ones():
    only, but = RunGate([(3, 4), (9, 9)], True), RunGate([(3, 4), (9, 9)], False)
    assert [o for o in range(12) if not only.blocks(o)] == [3, 4, 9]
    assert [o for o in range(12) if not but.blocks(o)] == [0, 1, 2, 5, 6, 7, 8, 10, 11]


def test_clusters_group_nearby_spans():
    assert clusters([(1, 2), (10, 12), (50_000, 50_001)], gap=100) == [
        [(1, 2), (10, 12)], [(50_000, 50_001)]]


def test_the_floor_keeps_state_down_to_the_first_deferred_offset():
    assert offsets_floor({"t": {"0": 40, "1": 7}}, {TP: [(12, 13, 5)]}) == {
        "t": {"0": 12, "1": 7}}


spans = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 6)), max_size=12).map(
    lambda xs: [(a, a + n) for a, n in xs])


@settings(max_examples=300, deadline=None)
@given(spans, spans)
def test_subtract_leaves_exactly_the_offsets_in_no_removed_span(a, b):
    got = subtract(a, b)
    inside = {o for f, la in a for o in range(f, la + 1)}
    removed = {o for f, la in b for o in range(f, la + 1)}
    assert sorted(o for f, la in got for o in range(f, la + 1)) == sorted(inside - removed)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(0, 3)),
                min_size=1, max_size=12), st.integers(0, 8))
def test_batches_read_every_offset_once_and_none_before_its_time(gaps, clock_steps):
    """A stream of batches over runs with due times: each offset read by exactly one
    batch, none before its due time, whatever the clock does between batches."""
    runs, at = [], 0
    for gap, length, due in gaps:
        runs.append((at + gap, at + gap + length, due * 10))
        at += gap + length + 1
    top = at + 3
    read: dict[int, int] = {}
    carried: list = []
    start, now = 0, 0
    for step in range(clock_steps + 5):
        end = min(top, start + 7) if step < clock_steps + 4 else top
        found = [(max(f, start), min(la, end - 1), d) for f, la, d in runs
                 if la >= start and f < end and d > now]
        later, end = defer(carried, found, end, now)
        released = subtract([(f, la) for f, la, _ in carried], [(f, la) for f, la, _ in later])
        deferred_now = [(f, la) for f, la, _ in later]
        main = [o for o in range(start, end) if not any(f <= o <= la for f, la in deferred_now)]
        for o in main + [o for f, la in released for o in range(f, la + 1)]:
            assert o not in read, f"offset {o} read twice"
            due = next((d for f, la, d in runs if f <= o <= la), 0)
            assert due <= now, f"offset {o} read at {now}, before its time {due}"
            read[o] = now
        carried, start = later, end
        now += 10 if step < clock_steps else 100
    assert sorted(read) == list(range(top)), "not every offset was read"
    assert deferred.MAX_DEFERRED_RUNS == MAX_DEFERRED_RUNS
