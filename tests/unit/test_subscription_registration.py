"""A txn's subscription registrations: sent ahead in the background, awaited by the ack.

An ack may be logged only once its subscription's registration is confirmed (the
coordinator marks only the subscriptions it knows). ``register_subscriptions(wait=False)``
sends it while a batch fills; the ack's ``register_subscriptions()`` then waits for that
request instead of sending its own, and raises its error. No broker: the coordinator
client is a stub that records requests.
"""

from __future__ import annotations

import threading

import pytest

from txnstream.coordinator.log_entry import SubscriptionRef
from txnstream.coordinator.protocol import TcOp
from txnstream.errors import TransactionTimeoutError, TxnStreamError
from txnstream.pipeline import RequestPipeline
from txnstream.transaction import Transaction
from txnstream.types import TxnID

SUBS = [SubscriptionRef("in", p, "sub") for p in range(4)]


class StubTc:
    """Records each request; ``gate`` holds ADD_SUBSCRIPTIONS until set; ``fail`` raises."""

    def __init__(self) -> None:
        self.requests: list[tuple[TcOp, dict]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail: Exception | None = None

    def request(self, op: TcOp, tc_id: int, **kw: object) -> None:
        self.requests.append((op, kw))
        if op is TcOp.ADD_SUBSCRIPTIONS:
            assert self.gate.wait(10)
            if self.fail is not None:
                raise self.fail

    def subscription_requests(self) -> list[tuple[SubscriptionRef, ...]]:
        return [kw["subscriptions"] for op, kw in self.requests  # type: ignore[misc]
                if op is TcOp.ADD_SUBSCRIPTIONS]


@pytest.fixture
def pipeline():
    p = RequestPipeline()
    yield p
    p.close()


def test_one_awaited_registration_names_every_subscription_at_once():
    tc = StubTc()
    txn = Transaction(tc, TxnID(0, 1), 30)  # type: ignore[arg-type]
    txn.register_subscriptions(SUBS)
    txn.register_subscriptions(SUBS[:2])  # known: no request
    assert tc.subscription_requests() == [tuple(SUBS)]


def test_an_ack_waits_for_the_registration_sent_ahead_and_sends_none_of_its_own(pipeline):
    tc = StubTc()
    tc.gate.clear()
    txn = Transaction(tc, TxnID(0, 2), 30, pipeline=pipeline)  # type: ignore[arg-type]
    txn.register_subscriptions(SUBS[:1], wait=False)
    txn.register_subscriptions(SUBS[:1], wait=False)  # on its way: not sent twice
    done = threading.Event()

    def ack() -> None:
        txn.register_subscriptions(SUBS[:1])
        done.set()

    t = threading.Thread(target=ack)
    t.start()
    assert not done.wait(0.3), "the ack went on before its registration was confirmed"
    tc.gate.set()
    assert done.wait(5)
    t.join()
    assert tc.subscription_requests() == [(SUBS[0],)]


def test_a_failed_registration_sent_ahead_refuses_the_ack_naming_the_coordinators_error(
        pipeline):
    tc = StubTc()
    tc.fail = TransactionTimeoutError("transaction (0,3) timed out", TxnID(0, 3))
    txn = Transaction(tc, TxnID(0, 3), 30, pipeline=pipeline)  # type: ignore[arg-type]
    txn.register_subscriptions(SUBS[:1], wait=False)
    with pytest.raises(TxnStreamError, match="timed out"):
        txn.register_subscriptions(SUBS[:1])
    with pytest.raises(TxnStreamError, match="timed out"):  # still not registered
        txn.register_subscriptions(SUBS[:1])
    assert tc.subscription_requests() == [(SUBS[0],)]


def test_without_a_pipeline_nothing_is_sent_ahead_and_the_ack_registers_itself():
    tc = StubTc()
    txn = Transaction(tc, TxnID(0, 4), 30)  # type: ignore[arg-type]
    txn.register_subscriptions(SUBS[:1], wait=False)
    assert tc.subscription_requests() == []
    txn.register_subscriptions(SUBS[:1])
    assert tc.subscription_requests() == [(SUBS[0],)]


@pytest.mark.parametrize("committed", [True, False])
def test_no_write_of_any_kind_after_another_handle_ended_the_txn(committed):
    """Told its txn ended (another handle committed it, or it aborted): a send, a new
    partition's registration and an ack on a subscription already registered all raise,
    and none of them reaches the coordinator."""
    from txnstream.errors import InvalidTxnStatusError
    from txnstream.types import TopicPartition

    tc = StubTc()
    txn = Transaction(tc, TxnID(0, 1), 30)  # type: ignore[arg-type]
    txn.register_subscriptions(SUBS[:1])
    asked = len(tc.requests)
    txn.ended_remotely(None if committed else InvalidTxnStatusError(
        txn.id, None, None, "transaction (0,1) ended ABORTED (admin)"))
    with pytest.raises(InvalidTxnStatusError) as raised:
        with txn.sending():
            pass
    assert ("committed by another handle" if committed else "ABORTED") in str(raised.value)
    with pytest.raises(InvalidTxnStatusError):
        txn.register_partitions([TopicPartition("out", 0)])
    with pytest.raises(InvalidTxnStatusError):
        txn.register_subscriptions(SUBS[:1])  # known: the ack would go out without a request
    assert len(tc.requests) == asked
    assert txn.status.value == "OPEN"  # its own commit() then learns the outcome
