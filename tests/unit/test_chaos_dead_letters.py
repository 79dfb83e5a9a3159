"""The chaos checker's check 4 with a dead-letter topic (issue 38): every processor input
is processed once or dead-lettered once, never both, never neither."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos.checker import check, load_truth
from chaos.reader import Delivered

IN, OUT, DLQ, RETRY = "chaos-in", "chaos-out", "chaos-dlq", "chaos-retry"


def inp(i: int) -> Delivered:
    return Delivered(IN, 0, i, None, {"id": f"in-{i}", "w": "producer-0", "p": 0, "s": i})


def out(i: int, n: int = 0) -> Delivered:
    return Delivered(OUT, 0, 10 * i + n, None, {"id": f"out-{i}-{n}", "w": "processor-0",
                                                "p": 0, "s": 10 * i + n, "in": f"in-{i}"})


def dead(i: int, at: int = 0) -> Delivered:
    return Delivered(DLQ, 0, at, None, {"id": f"in-{i}", "w": "producer-0", "p": 0, "s": i})


def retry(i: int, at: int = 0) -> Delivered:
    """A retry letter of input ``i`` (a copy of it: out of its writer's sequence order)."""
    return Delivered(RETRY, 0, at, None, {"id": f"in-{i}", "w": "producer-0", "p": 0, "s": 0})


def kinds(tmp_path: Path, delivered: list[Delivered]) -> dict[str, Any]:
    (tmp_path / "truth").mkdir(exist_ok=True)
    truth = load_truth(tmp_path / "truth")
    for d in delivered:
        if d.topic not in (DLQ, RETRY) and d.value:
            truth.received[d.value["id"]] += 1
    res = check(truth, {}, delivered, IN, OUT, dlq_topic=DLQ, retry_topic=RETRY)
    got = dict(res.anomalies.counts) | {"dead": res.notes["processor_inputs_dead_lettered"]}
    return got | ({"retried": n} if (n := res.notes["processor_retry_letters"]) else {})


def test_an_input_dead_lettered_once_and_not_processed_is_no_anomaly(tmp_path):
    got = kinds(tmp_path, [inp(0), inp(1), out(0), dead(1)])
    assert got == {"dead": 1}  # not a duplicate of in-1, not out of sequence order


def test_an_input_neither_processed_nor_dead_lettered_is_not_processed(tmp_path):
    assert kinds(tmp_path, [inp(0), inp(1), out(0)])["input_not_processed"] == 1


def test_an_input_both_processed_and_dead_lettered_is_an_anomaly(tmp_path):
    got = kinds(tmp_path, [inp(0), out(0), dead(0)])
    assert got["input_processed_and_dead_lettered"] == 1


def test_an_input_dead_lettered_twice_is_an_anomaly(tmp_path):
    got = kinds(tmp_path, [inp(0), dead(0, 0), dead(0, 1)])
    assert got["input_dead_lettered_twice"] == 1


def test_a_dead_letter_of_no_input_seen_is_an_anomaly(tmp_path):
    assert kinds(tmp_path, [dead(5)])["dead_letter_without_input"] == 1


def test_an_input_retried_then_processed_once_is_no_anomaly(tmp_path):
    got = kinds(tmp_path, [inp(0), inp(1), inp(2), retry(1, 0), retry(2, 1), retry(1, 2),
                           out(0), out(1), out(2)])
    assert got == {"dead": 0, "retried": 3}  # retry letters out of sequence order: fine


def test_an_input_retried_then_dead_lettered_is_no_anomaly(tmp_path):
    assert kinds(tmp_path, [inp(0), retry(0), dead(0)]) == {"dead": 1, "retried": 1}


def test_a_retry_whose_letter_was_lost_or_doubled_is_an_anomaly(tmp_path):
    lost = kinds(tmp_path, [inp(0), retry(0)])  # acked, and its letter never processed
    assert lost["input_not_processed"] == 1
    twice = [Delivered(OUT, 0, 10 + n, None, out(1, n).value | {"txn": None}) for n in (0, 1)]
    doubled = kinds(tmp_path, [inp(1), retry(1, 0), retry(1, 1), *twice])
    assert doubled["input_processed_twice"] == 1


def test_a_retry_letter_of_no_input_seen_is_an_anomaly(tmp_path):
    assert kinds(tmp_path, [retry(7)])["retry_letter_without_input"] == 1
