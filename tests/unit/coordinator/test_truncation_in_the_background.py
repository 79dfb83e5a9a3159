"""The worker truncates its TC log without waiting on the broker (no broker here).

Kafka answers a ``delete_records`` once every replica has moved its log start, on the
followers' next fetch: about ``replica.fetch.wait.max.ms`` (500 ms) on a topic of 3
replicas. The worker waited for that answer in its loop, after each TC's checkpoint, so
every TC of the worker stood still (in the hostile soak of seed 61 an honest commit took
1.85 s, ending as its worker logged 2 truncations, and 2 more took 1.7-1.9 s; on three
brokers a truncation that advances takes 485-509 ms, one that does not 1-5 ms).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from tests.unit.coordinator.test_worker_consume_errors import (  # the worker's fakes
    CONFIG,
    FakeConsumer,
    FakeProducer,
)
from txnstream.coordinator.metadata_store import TransactionMetadataStore
from txnstream.coordinator.ownership import TcIncarnation, TcPhase
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker


class SlowAdmin:
    """``delete_records`` answered only when the test says so, as a broker of 3 replicas."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.pending: list[Future[Any]] = []
        self.asked: list[str] = []
        """Metadata and ``delete_records``, in order."""

    def list_topics(self, topic: str, timeout: float) -> object:
        self.asked.append(f"metadata {topic}")
        return object()

    def delete_records(self, parts: list[Any], **kw: Any) -> dict[Any, Future[Any]]:
        out = {}
        self.asked.append("delete_records")
        for p in parts:
            self.calls.append((p.partition, p.offset))
            fut: Future[Any] = Future()
            self.pending.append(fut)
            out[p] = fut
        return out

    def answer(self, error: Exception | None = None) -> None:
        for fut in self.pending:
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)
        self.pending.clear()


class Kafka:
    def __init__(self, admin: SlowAdmin) -> None:
        self._admin = admin

    def consumer(self, conf: dict[str, Any]) -> FakeConsumer:
        return FakeConsumer([])

    def producer(self, conf: dict[str, Any]) -> FakeProducer:
        return FakeProducer()

    def admin(self, conf: dict[str, Any]) -> AdminClient:
        return self._admin  # type: ignore[return-value]


def worker_with_a_truncation_due(point: int) -> tuple[CoordinatorWorker, SlowAdmin,
                                                      TcIncarnation, list[int]]:
    admin = SlowAdmin()
    w = CoordinatorWorker(CONFIG, worker_id="w-unit", kafka=Kafka(admin),
                          settings=WorkerSettings(unsigned=True, idle_poll_s=0.01))
    tc = TcIncarnation(0, TransactionMetadataStore(0, "w-unit"), replay_end=0,
                       phase=TcPhase.SERVING)
    tc.next_checkpoint = float("inf")
    forgotten: list[int] = []
    tc.store.truncation_point = lambda now_ms, retention_ms: point  # type: ignore[method-assign]
    tc.store.forget_before = lambda offset: forgotten.append(offset) or 0  # type: ignore[method-assign]
    tc.truncate_pending = True
    w.tcs[0] = tc
    return w, admin, tc, forgotten


def turn_within(w: CoordinatorWorker, seconds: float) -> bool:
    t = threading.Thread(target=w._turn_once, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive()


@pytest.fixture
def due() -> Iterator[tuple[CoordinatorWorker, SlowAdmin, TcIncarnation, list[int]]]:
    """A worker with a truncation to offset 42 due; its listener closed after the test."""
    w, admin, tc, forgotten = worker_with_a_truncation_due(42)
    yield w, admin, tc, forgotten
    admin.answer()
    w._listener.close()


def test_a_truncation_the_broker_has_not_answered_does_not_hold_the_turn(due):
    w, admin, tc, forgotten = due
    assert turn_within(w, 2.0), "the turn waited on delete_records"
    assert admin.calls == [(0, 42)]
    # the leader is asked of fresh metadata: a cached dead one is waited on in a loop
    assert admin.asked == [f"metadata {CONFIG.topics.log}", "delete_records"]
    assert forgotten == []  # not before the broker said it is done
    assert turn_within(w, 2.0)  # still unanswered: the next turns run too
    assert admin.calls == [(0, 42)]  # and ask nothing more meanwhile
    admin.answer()
    assert turn_within(w, 2.0)
    assert forgotten == [42]


def test_a_truncation_to_the_point_already_reached_is_not_asked_again(due):
    w, admin, tc, forgotten = due
    assert turn_within(w, 2.0)
    admin.answer()
    assert turn_within(w, 2.0)
    tc.truncate_pending = True  # the next checkpoint: the point has not moved
    assert turn_within(w, 2.0)
    assert admin.calls == [(0, 42)]


def test_a_failed_truncation_forgets_nothing_and_is_tried_at_the_next_checkpoint(due, caplog):
    w, admin, tc, forgotten = due
    assert turn_within(w, 2.0)
    admin.answer(RuntimeError("broker said no"))
    assert turn_within(w, 2.0)
    assert forgotten == []
    assert "truncation below 42 failed" in caplog.text and "broker said no" in caplog.text
    tc.truncate_pending = True
    assert turn_within(w, 2.0)
    assert admin.calls == [(0, 42), (0, 42)]


def test_a_truncation_answered_after_the_tc_stopped_serving_forgets_nothing(due):
    w, admin, tc, forgotten = due
    assert turn_within(w, 2.0)
    tc.phase = TcPhase.REPLAYING  # revoked and taken again meanwhile
    admin.answer()
    assert turn_within(w, 2.0)
    assert forgotten == []
