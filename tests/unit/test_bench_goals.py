"""Issue 22's goal table reads the produce part's floor (issue 35: a missed goal is argued
from a floor measured in the same run)."""

from __future__ import annotations

from bench.issue22 import table


def produce_row(variant: str, rate: int, cpu: tuple[float, float, float]) -> dict:
    client, worker, broker = cpu
    return {"variant": variant, "rec/s (median)": rate,
            "_cpu_us": {"client": client, "worker": worker, "broker": broker}}


def goals(rows: list[dict]) -> dict[int, dict]:
    return {r["#"]: r for r in table({"produce": rows}, set())}


ROWS = [produce_row("txn send", 90_000, (6.5, 4.3, 8.3)),
        produce_row("txn send_batch async", 140_000, (7.8, 3.8, 6.2)),
        produce_row("plain", 467_000, (2.8, 0.0, 1.7)),
        produce_row("kafka txn", 186_000, (2.0, 0.2, 9.7))]


def test_rows_3_5_6_name_the_floor_of_one_more_read_with_our_ratio_to_it():
    g = goals([*ROWS, produce_row("plain + read", 280_000, (4.0, 0.0, 3.0))])
    assert "floor, plain produce + one more plain read of every record: 280000 rec/s " \
           "(ratio 0.50x)" in g[3]["anchor"]
    assert "2nd anchor: Kafka txn producer" in g[3]["anchor"]
    assert "(ratio 0.32x)" in g[6]["anchor"] and "280000 rec/s" in g[6]["anchor"]
    assert "floor, plain produce + one more plain read of every record: 7.0 µs/rec " \
           "(client 4.0 + worker 0.0 + broker 3.0) (ratio 2.54x)" in g[5]["anchor"]
    assert g[3]["ratio"] == "0.30x" and g[5]["ratio"] == "3.96x"  # still against plain


def test_without_the_floor_the_anchors_are_as_before():
    g = goals(ROWS)
    assert "floor" not in g[3]["anchor"] + g[5]["anchor"] + g[6]["anchor"]
    assert g[6]["anchor"] == "plain produce (same txnstream Producer, no txn)"
