"""The chaos checker holds every writer's in/out answer to what readers deliver (issue 33).

A writer whose txn another handle committed is told which of its records are out
(``RecordsExcludedError``, logged as an ``excluded`` event with their raw offsets): those
must not be delivered, every other record of the committed txn must be, and a record
whose writer was told neither (``unsure``) is neither demanded nor forbidden.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaos.checker import check, load_truth
from chaos.reader import Delivered, RawPartition, RawRecord

TOPIC = "chaos-data"
IN, OUT = "chaos-in", "chaos-out"
"""The processors' topics: nothing in them here (no input waits for an output)."""
TXN = "(0,7)"


def rec(rid: str, s: int, writer: str = "producer-0.0.t0") -> list[Any]:
    return [rid, TOPIC, 0, writer, s]


def value(rid: str, s: int, writer: str = "producer-0.0.t0") -> dict[str, Any]:
    return {"id": rid, "txn": TXN, "w": writer, "p": 0, "s": s}


def write_truth(tmp_path: Path, events: list[dict[str, Any]]) -> Path:
    d = tmp_path / "truth"
    d.mkdir(parents=True)
    (d / "producer-0.0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return d


def foreign_txn(excluded_at: list[list[Any]] | None, unsure: bool = False
                ) -> list[dict[str, Any]]:
    """An opener's foreign txn: a, b before the peer's commit; c, d after it."""
    events: list[dict[str, Any]] = [
        {"e": "open", "txn": TXN, "by": "producer-0.0.t0", "role": "producer",
         "kind": "foreign", "timeout": 20},
        {"e": "sent", "txn": TXN, "recs": [rec("a", 0), rec("b", 1)]},
        {"e": "end", "txn": TXN, "by": "producer-1.0.co", "want": "cocommit", "co": True,
         "outcome": "committed", "status": "COMMITTED", "error": None},
        {"e": "sent", "txn": TXN, "recs": [rec("c", 2), rec("d", 3)], "foreign": True}
        | ({"unsure": True} if unsure else {})]
    error = None
    if excluded_at is not None:
        events.append({"e": "excluded", "txn": TXN, "by": "producer-0.0.t0", "how": "foreign",
                       "at": excluded_at})
        error = "RecordsExcludedError: ..."
    events.append({"e": "end", "txn": TXN, "by": "producer-0.0.t0", "want": "foreign",
                   "outcome": "committed", "status": "COMMITTED", "error": error})
    return events


def raw_partition() -> dict[tuple[str, int], RawPartition]:
    """a@0, b@1, c@2, then the txn's COMMIT marker @3, then d@4 (a straggler)."""
    rp = RawPartition(TOPIC, 0)
    for off, rid, s in ((0, "a", 0), (1, "b", 1), (2, "c", 2)):
        rp.records.append(RawRecord(off, TXN, None, value(rid, s)))
    rp.records.append(RawRecord(3, TXN, "COMMIT", None))
    rp.first_marker[TXN] = ("COMMIT", 3)
    rp.markers[TXN].append("COMMIT")
    rp.records.append(RawRecord(4, TXN, None, value("d", 3)))
    return {(TOPIC, 0): rp}


def delivered(*rids: str) -> list[Delivered]:
    offs = {"a": 0, "b": 1, "c": 2, "d": 4}
    seqs = {"a": 0, "b": 1, "c": 2, "d": 3}
    return [Delivered(TOPIC, 0, offs[r], TXN, value(r, seqs[r])) for r in rids]


def run(tmp_path: Path, events: list[dict[str, Any]], *rids: str, marker_at: int = 3,
        received: tuple[str, ...] | None = None) -> Any:
    """Check ``events`` against the raw partition (its marker at ``marker_at``) and a
    committed read that delivered ``rids``; the consumers got ``received`` (``rids``)."""
    truth = load_truth(write_truth(tmp_path, events))
    for rid in rids if received is None else received:
        truth.received[rid] += 1
        truth.received_txn[rid] = TXN
    raw = raw_partition()
    raw[(TOPIC, 0)].first_marker[TXN] = ("COMMIT", marker_at)
    return check(truth, raw, delivered(*rids), IN, OUT)


def kinds(res: Any) -> dict[str, int]:
    return dict(res.anomalies.counts)


def test_an_excluded_record_not_delivered_and_the_rest_delivered_is_no_anomaly(tmp_path):
    res = run(tmp_path, foreign_txn([[TOPIC, 0, 4]]), "a", "b", "c")
    assert kinds(res) == {}
    assert res.notes["foreign_records_excluded"] == 1
    assert res.notes["foreign_records_sent_after"] == 2
    assert res.notes["foreign_commits"] == 1
    assert res.notes["foreign_opener_commits_excluded"] == 1


def test_an_excluded_record_delivered_is_an_anomaly(tmp_path):
    # a fold that let d through (as if the marker were after it)
    res = run(tmp_path, foreign_txn([[TOPIC, 0, 4]]), "a", "b", "c", "d", marker_at=5)
    assert kinds(res) == {"excluded_record_visible": 2}  # the committed read, a consumer
    ex = res.anomalies.examples["excluded_record_visible"][0]
    assert ex["id"] == "d" and ex["at"] == f"{TOPIC}-0@4" and ex["how"] == "foreign"
    assert "committed_record_missing" not in res.anomalies.counts


def test_a_consumer_that_got_an_excluded_record_is_an_anomaly(tmp_path):
    res = run(tmp_path, foreign_txn([[TOPIC, 0, 4]]), "a", "b", "c",
              received=("a", "b", "c", "d"))
    assert kinds(res) == {"excluded_record_visible": 1}
    assert res.anomalies.detail["excluded_record_visible"] == {"consumer": 1}


def test_a_record_told_in_must_be_delivered(tmp_path):
    """commit() returned: all in; d (after the marker) not delivered is a missing record."""
    res = run(tmp_path, foreign_txn(None), "a", "b", "c")
    assert kinds(res) == {"committed_record_missing": 1}
    [ex] = res.anomalies.examples["committed_record_missing"]
    assert ex["id"] == "d"
    assert ex["why"] == "sent after a foreign commit, told in: after its txn's first marker " \
                        "(COMMIT)"


def test_a_record_not_named_excluded_must_still_be_delivered(tmp_path):
    res = run(tmp_path, foreign_txn([[TOPIC, 0, 4]]), "a", "b")
    assert kinds(res) == {"committed_record_missing": 1}
    assert res.anomalies.examples["committed_record_missing"][0]["id"] == "c"


def test_an_excluded_offset_that_holds_no_record_of_the_txn_is_an_anomaly(tmp_path):
    """Told the marker's offset is out (wrong offsets): d is missing, the offset unmatched."""
    res = run(tmp_path, foreign_txn([[TOPIC, 0, 3]]), "a", "b", "c")
    assert kinds(res) == {"excluded_offset_unmatched": 1, "committed_record_missing": 1}
    [ex] = res.anomalies.examples["excluded_offset_unmatched"]
    assert ex["holds"] == f"a COMMIT marker of {TXN}"


@pytest.mark.parametrize("got", [("a", "b", "c"), ("a", "b", "c", "d")])
def test_records_of_unknown_fate_are_neither_demanded_nor_forbidden(tmp_path, got):
    events = foreign_txn(None, unsure=True)
    events[-1] |= {"outcome": "unknown", "error": "TransactionOutcomeUnknownError: ..."}
    res = run(tmp_path, events, *got)
    assert kinds(res) == {}
    assert res.notes["records_fate_unknown"] == 2
    assert res.notes["foreign_opener_commits_other_error"] == 1


def test_a_late_send_told_out_must_not_be_delivered_one_told_in_must(tmp_path):
    """The peer's late record d: excluded by its flush, so not delivered; c is in."""
    co = "producer-1.0.co"
    events = [
        {"e": "open", "txn": TXN, "by": "producer-0.0.t0", "kind": "late", "timeout": 20},
        {"e": "sent", "txn": TXN, "recs": [rec("a", 0), rec("b", 1)]},
        {"e": "sent", "txn": TXN, "recs": [rec("c", 0, co)], "co": True},
        {"e": "end", "txn": TXN, "by": "producer-0.0.t0", "want": "late",
         "outcome": "committed", "status": "COMMITTED", "error": None},
        {"e": "sent", "txn": TXN, "recs": [rec("d", 1, co)], "late": True},
        {"e": "excluded", "txn": TXN, "by": co, "how": "late", "at": [[TOPIC, 0, 4]]},
    ]
    res = run(tmp_path, events, "a", "b", "c")
    assert kinds(res) == {}
    assert res.notes["late_sends_excluded"] == 1 and res.notes["late_sends_accepted"] == 0
    res = run(tmp_path / "again", events, "a", "b", "c", "d", marker_at=5)
    assert kinds(res) == {"excluded_record_visible": 2}
    assert res.anomalies.detail["excluded_record_visible"] == {"committed read": 1,
                                                               "consumer": 1}


def test_a_late_send_handed_over_then_unconfirmed_is_logged_and_unsure(tmp_path):
    events = [
        {"e": "open", "txn": TXN, "by": "producer-0.0.t0", "kind": "late", "timeout": 20},
        {"e": "sent", "txn": TXN, "recs": [rec("a", 0), rec("b", 1), rec("c", 2)]},
        {"e": "end", "txn": TXN, "by": "producer-0.0.t0", "want": "late",
         "outcome": "committed", "status": "COMMITTED", "error": None},
        {"e": "late_rejected", "txn": TXN, "error": "TransactionOutcomeUnknownError: ...",
         "rec": rec("d", 3)},
    ]
    res = run(tmp_path, events, "a", "b", "c")
    assert kinds(res) == {}
    assert res.notes["late_sends_rejected"] == 1 and res.notes["records_fate_unknown"] == 1
