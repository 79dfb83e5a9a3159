"""The worker's log appends never produce behind five unanswered entries of a partition.

librdkafka's idempotent producer spins its broker thread while a partition it has a
record ready for has five or more in flight (``IDEMPOTENT_IN_FLIGHT``; the real case is
``tests/fault/test_producer_spin.py``). Here a fake producer that answers only when told
shows the rule: an append behind five unanswered entries serves reports until fewer are
unanswered, and produces nothing if they still are at its deadline; fewer than five, or
another TC's partition, hold nothing.
"""

from __future__ import annotations

from typing import Any

from tests.unit.coordinator.test_txn_log import entries
from txnstream.coordinator.txn_log import KafkaClients, KafkaTransactionLog
from txnstream.kafka.clients import IDEMPOTENT_IN_FLIGHT


class _Msg:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset


class HeldProducer:
    """Keeps every record unanswered until ``answer_at_poll`` polls have passed."""

    def __init__(self, answer_at_poll: int | None) -> None:
        self.answer_at_poll = answer_at_poll
        self.polls = 0
        self.waited = 0.0  # the timeouts polls were given
        self.produced: list[tuple[int, int]] = []  # (partition, held when produced)
        self.held: list[Any] = []
        self.offset = 0

    def produce(self, topic: str, value: bytes, partition: int, on_delivery: Any) -> None:
        self.produced.append((partition, len(self.held)))
        self.held.append(on_delivery)

    def poll(self, timeout: float) -> int:
        self.polls += 1
        self.waited += timeout
        if self.answer_at_poll is not None and self.polls >= self.answer_at_poll:
            return self._answer_all()
        return 0

    def flush(self, timeout: float) -> int:
        if self.answer_at_poll is not None:
            self._answer_all()
        return len(self.held)

    def _answer_all(self) -> int:
        served, self.held = self.held, []
        for cb in served:
            cb(None, _Msg(self.offset))
            self.offset += 1
        return len(served)


def _log(producer: HeldProducer, flush_timeout_s: float = 5.0) -> KafkaTransactionLog:
    clients = KafkaClients(consumer=None, producer=producer, admin=None)  # type: ignore[arg-type]
    return KafkaTransactionLog(clients, "log", flush_timeout_s=flush_timeout_s,
                               admin_timeout_s=1.0)


def test_an_append_behind_five_unanswered_entries_waits_for_their_reports_first() -> None:
    producer = HeldProducer(answer_at_poll=3)
    log = _log(producer)
    lost: list[Any] = []
    log.append_async(0, entries(IDEMPOTENT_IN_FLIGHT + 2), lost.append)
    result = log.append(0, entries(2, first_seq=10))
    assert result.ok, result.error
    assert not lost
    behind = [n for _, n in producer.produced[IDEMPOTENT_IN_FLIGHT + 2:]]
    assert behind == [0, 1], f"produced behind {behind} unanswered entries"
    assert producer.polls >= 3


def test_fewer_than_five_unanswered_or_another_partitions_hold_no_append() -> None:
    producer = HeldProducer(answer_at_poll=None)
    log = _log(producer, flush_timeout_s=0.2)
    log.append_async(0, entries(IDEMPOTENT_IN_FLIGHT - 1), lambda e: None)
    log.append_async(1, entries(IDEMPOTENT_IN_FLIGHT + 3), lambda e: None)
    log.append_async(0, entries(1, first_seq=20), lambda e: None)
    assert producer.waited == 0, "an append waited though fewer than five were unanswered"
    assert len(producer.produced) == 2 * IDEMPOTENT_IN_FLIGHT + 3


def test_entries_still_unanswered_at_the_deadline_fail_the_append_and_produce_nothing() -> None:
    producer = HeldProducer(answer_at_poll=None)
    log = _log(producer, flush_timeout_s=0.3)
    log.append_async(0, entries(IDEMPOTENT_IN_FLIGHT), lambda e: None)
    failures: list[Any] = []
    log.append_async(0, entries(1, first_seq=9), failures.append)
    result = log.append(0, entries(1, first_seq=10))
    assert not result.ok
    assert "log [0]: 5 earlier entries still unanswered after 0.3 s" in str(result.error)
    assert len(failures) == 1 and "unanswered" in str(failures[0])
    assert len(producer.produced) == IDEMPOTENT_IN_FLIGHT
