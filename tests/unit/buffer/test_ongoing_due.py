"""The ongoing-txn check's judging waits for the fold, within a bound.

A partition is judged once its fold has reached the end read after a round's answers
(a marker the coordinator wrote before answering is then folded). A partition written
to without pause is never at that end at the moment it is read, so it must wait for
its fold rather than be skipped; an answer too old to rest a marker on is dropped
(the next round asks again).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from txnstream.buffer import ongoing
from txnstream.buffer.ongoing import OngoingTxnCheck
from txnstream.buffer.vouch import TxnAnswer
from txnstream.markers import MarkerKind, TxnMarker
from txnstream.types import TopicPartition, TxnID, TxnStatus

TP = TopicPartition("data", 0)
JUNK = TxnID(0, 7)


@dataclass
class Buf:
    last_offset: int
    ongoing: dict = field(default_factory=lambda: {JUNK: object()})


@dataclass
class Served:
    buf: Buf


class Markers:
    def __init__(self) -> None:
        self.written: list[tuple[TopicPartition, TxnMarker]] = []

    def write(self, tp: TopicPartition, marker: TxnMarker) -> None:
        self.written.append((tp, marker))

    def flush(self, timeout: float) -> None:
        pass


def _check(monkeypatch, now: list[float]) -> tuple[OngoingTxnCheck, Markers]:
    monkeypatch.setattr(ongoing.time, "monotonic", lambda: now[0])
    markers = Markers()
    check = OngoingTxnCheck(None, None, None, markers)  # type: ignore[arg-type]
    # answered: the coordinator committed JUNK without registering TP (records copied)
    check._due[TP] = (100, {JUNK: 50}, {JUNK: TxnAnswer(TxnStatus.COMMITTED)}, now[0])
    return check, markers


def test_a_partition_behind_its_end_waits_and_is_judged_once_its_fold_passes_it(monkeypatch):
    now = [1000.0]
    check, markers = _check(monkeypatch, now)
    buf = Buf(last_offset=97)
    check.run({TP: Served(buf)}, ask=False)
    assert markers.written == [] and check.answered, "judged before the fold reached the end"
    now[0] += 1.0
    buf.last_offset = 140  # written to meanwhile: past the end, never at it
    check.run({TP: Served(buf)}, ask=False)
    assert markers.written == [(TP, TxnMarker(JUNK, MarkerKind.ABORT, 0))]
    assert not check.answered


def test_an_answer_older_than_its_bound_is_dropped_without_a_marker(monkeypatch):
    now = [1000.0]
    check, markers = _check(monkeypatch, now)
    now[0] += ongoing.DUE_MAX_S
    check.run({TP: Served(Buf(last_offset=97))}, ask=False)
    assert markers.written == [] and not check.answered


def test_a_partition_no_longer_served_is_dropped(monkeypatch):
    check, markers = _check(monkeypatch, [1000.0])
    check.run({}, ask=False)
    assert markers.written == [] and not check.answered
