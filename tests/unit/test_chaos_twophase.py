"""The two-phase checker (chaos.twophase.judge): the database and the log must agree."""

from __future__ import annotations

from chaos.twophase import judge


def kinds(found: list[tuple[str, dict[str, object], str]]) -> list[str]:
    return [k for k, _, _ in found]


def test_both_sides_of_each_txn_agree_and_nothing_is_found() -> None:
    rows = [("in-0", "(0,1)"), ("in-1", "(1,1)")]
    found = judge({"in-0", "in-1"}, rows, list(rows), {"(0,1)": "COMMITTED"}, complete=True)
    assert found == []


def test_a_row_without_its_record_is_not_atomic() -> None:
    found = judge({"in-0"}, [("in-0", "(0,1)")], [], {}, complete=False)
    assert kinds(found) == ["twophase_not_atomic"]
    assert found[0][1] == {"txn": "(0,1)", "rows": ["in-0"], "records": []}


def test_a_record_without_its_row_is_not_atomic() -> None:
    found = judge(set(), [], [("in-0", "(0,1)")], {}, complete=False)
    assert kinds(found) == ["twophase_not_atomic"]


def test_an_input_written_twice_is_a_duplicate_on_each_side() -> None:
    rows = [("in-0", "(0,1)"), ("in-0", "(0,2)")]
    found = judge({"in-0"}, rows, list(rows), {}, complete=True)
    assert sorted(kinds(found)) == ["twophase_duplicate", "twophase_duplicate"]
    assert {d["in"] for _, d, _ in found} == {"rows", "records"}
    assert found[0][1]["txns"] == ["(0,1)", "(0,2)"]


def test_an_input_without_a_row_is_lost_only_after_a_complete_drain() -> None:
    rows = [("in-0", "(0,1)")]
    assert judge({"in-0", "in-1"}, rows, list(rows), {}, complete=False) == []
    found = judge({"in-0", "in-1"}, rows, list(rows), {}, complete=True)
    assert found == [("twophase_lost", {"input": "in-1"}, "acked without a row")]


def test_a_txn_told_committed_must_have_its_row_and_record() -> None:
    found = judge(set(), [], [], {"(2,7)": "COMMITTED", "(2,8)": "ABORTED"}, complete=False)
    assert found == [("twophase_told_committed", {"txn": "(2,7)", "rows": [], "records": []},
                      "missing")]
