"""The owner-fencing rule and owner-record write shared by the three roles, no broker."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError

from txnstream.fencing import admits, supersedes, write_owner_record


def test_only_a_newer_claim_supersedes_and_only_the_current_generation_is_admitted():
    assert supersedes(8, 7) and not supersedes(7, 7) and not supersedes(6, 7)
    assert admits(7, 7) and not admits(6, 7) and not admits(8, 7)


class Producer:
    """Reports each record as ``outcome`` says when flushed; ``left`` stays queued."""

    def __init__(self, outcome: KafkaError | int | None, left: int = 0) -> None:
        self.outcome, self.left = outcome, left
        self.sent: list[tuple[str, bytes, dict[str, Any]]] = []
        self._due: list[Any] = []

    def produce(self, topic: str, value: bytes, **kw: Any) -> None:
        self.sent.append((topic, value, kw))
        self._due.append(kw["on_delivery"])

    def flush(self, timeout: float) -> int:
        for cb in self._due:
            if isinstance(self.outcome, KafkaError):
                cb(self.outcome, None)
            elif self.outcome is not None:
                cb(None, SimpleNamespace(offset=lambda at=self.outcome: at))
        self._due = []
        return self.left


def test_an_owner_record_written_reports_its_offset_to_its_partition():
    p = Producer(41)
    w = write_owner_record(p, "state", 3, b"3", b"owner", 10.0)  # type: ignore[arg-type]
    assert (w.offset, w.error, w.undelivered) == (41, None, 0)
    [(topic, value, kw)] = p.sent
    assert (topic, value, kw["key"], kw["partition"]) == ("state", b"owner", b"3", 3)


def test_an_owner_record_refused_or_not_delivered_in_time_has_no_offset():
    err = KafkaError(KafkaError._MSG_TIMED_OUT)
    refused = write_owner_record(Producer(err), "t", 0, b"k", b"v", 1.0)  # type: ignore[arg-type]
    assert refused.offset is None and refused.error is err
    late = write_owner_record(Producer(None, left=1), "t", 0, b"k", b"v", 1.0)  # type: ignore[arg-type]
    assert (late.offset, late.error, late.undelivered) == (None, None, 1)
