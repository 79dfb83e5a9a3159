"""A point of the processor sweep (bench.processor.point): medians of rounds, not one run."""

from __future__ import annotations

from bench.processor import point


def test_a_point_is_the_median_of_its_rounds_and_of_their_ratios():
    # One round's at-least-once loop ran alone on the machine (the 0.24x of stop 64):
    # the medians leave it out of the rates and of the ratio.
    got = point(eo=[100_000.0, 52_000.0, 110_000.0], alo=[105_000.0, 220_000.0, 100_000.0])
    assert got["exactly-once rec/s"] == 100_000
    assert got["at-least-once rec/s"] == 105_000
    assert got["rounds' ratios"] == "0.95, 0.24, 1.10"
    assert got["ratio"] == "0.95x"
    assert got["exactly-once range"] == [52_000, 110_000]
    assert got["at-least-once range"] == [100_000, 220_000]


def test_a_round_with_no_at_least_once_rate_counts_as_a_zero_ratio():
    got = point(eo=[10.0], alo=[0.0])
    assert got["ratio"] == "0.00x"
