"""bench's pure helpers: the scale window's latencies and CPU per txn net of rest, the
broker's JIT threads, the plots' reading of table cells."""

from __future__ import annotations

import math

from bench.scale import net_per_txn, window_latencies


def test_window_latencies_count_only_the_window_and_the_missing() -> None:
    sent = {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0}
    seen = {0: 0.5, 1: 1.25, 3: 3.1}  # 2 never came
    lats, missing = window_latencies(sent, seen, 1, 4)
    assert [round(v) for v in lats] == [250, 100]
    assert missing == 1


def test_window_latencies_empty_window() -> None:
    assert window_latencies({}, {}, 5, 5) == ([], 0)


def test_net_per_txn_takes_the_rest_rate_off() -> None:
    # 3 CPU s in a 10 s window, 0.1 cores at rest: 2 s for 100 txns
    assert math.isclose(net_per_txn(3.0, 0.1, 10.0, 100), 0.02)
    assert math.isnan(net_per_txn(1.0, 0.0, 10.0, 0))


def test_scale_axes_move_one_setting_at_a_time_and_run_the_base_once() -> None:
    import argparse

    from bench.scale_axes import BASE, points

    args = argparse.Namespace(readers=[1, 4], workers=[1, 3], coordinators=[4, 32])
    got = [(axis, v, s) for axis, v, s in points(args)]
    assert got == [
        ("readers", 1, BASE),
        ("readers", 4, {**BASE, "readers": 4}),
        ("workers", 3, {**BASE, "n_workers": 3}),
        ("coordinators", 32, {**BASE, "coordinators": 32}),
    ]
    assert points(argparse.Namespace(readers=[], workers=None, coordinators=[8])) == [
        ("coordinators", 8, {**BASE, "coordinators": 8})]


def test_jit_seconds_counts_the_compiler_threads_only(tmp_path) -> None:
    from bench.cpu import CLK_TCK, jit_seconds

    def thread(tid: int, name: str, utime: int, stime: int) -> None:
        d = tmp_path / "7" / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "comm").write_text(name + "\n")
        # pid (comm) state, then fields 4..: utime and stime are fields 14 and 15
        rest = ["S"] + ["0"] * 10 + [str(utime), str(stime)] + ["0"] * 5
        (d / "stat").write_text(f"{tid} ({name}) " + " ".join(rest) + "\n")

    thread(8, "C2 CompilerThre", 300, 100)
    thread(9, "C1 CompilerThre", 50, 0)
    thread(10, "data-plane-kafk", 9000, 900)
    got = jit_seconds(7, proc=str(tmp_path))
    assert got == {8: 400 / CLK_TCK, 9: 50 / CLK_TCK}
    assert jit_seconds(12345, proc=str(tmp_path)) == {}  # gone: nothing, no error


def test_family_plots_read_the_numbers_of_the_tables_cells() -> None:
    from bench.family_plots import number

    assert number("204,360 rows/s") == 204360.0
    assert number("3.1 ms") == 3.1
    assert number("-0.0") == 0.0
    assert number(42) == 42.0
    assert math.isnan(number("n/m"))
