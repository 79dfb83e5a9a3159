"""The client-side deadline of a ``Transaction``: pure logic, a stub coordinator, a fake clock.

A transaction knows its timeout and when it opened: once the deadline passes while it is
still OPEN, ``status`` reads TIMED_OUT with no request, and ``commit()`` raises the
coordinator's ``TransactionTimeoutError`` without asking it (it only tells it to abort,
in the background, so the coordinator frees the txn's resources sooner).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from txnstream import pipeline as pipeline_module
from txnstream.coordinator.protocol import TcOp
from txnstream.errors import InvalidTxnStatusError, TransactionTimeoutError
from txnstream.pipeline import RequestPipeline
from txnstream.transaction import Transaction
from txnstream.types import TopicPartition, TxnID, TxnStatus


@dataclass
class Reply:
    txn_seq: int = 0
    already: bool = False


@dataclass
class StubTc:
    """Records every coordinator request; answers each at once (or with ``fail[op]``)."""

    calls: list[tuple[TcOp, dict[str, Any]]] = field(default_factory=list)
    fail: dict[TcOp, Exception] = field(default_factory=dict)
    answered: threading.Event = field(default_factory=threading.Event)

    def request(self, op: TcOp, tc_id: int, **fields: Any) -> Reply:
        self.calls.append((op, fields))
        self.answered.set()
        if op in self.fail:
            raise self.fail[op]
        return Reply()

    def ends(self) -> list[bool]:
        return [f["commit"] for op, f in self.calls if op is TcOp.END]


def eventually(cond, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_txn(tc: StubTc, clock: Clock, timeout_s: float = 10.0,
             pipeline: RequestPipeline | None = None) -> Transaction:
    return Transaction(tc, TxnID(1, 7), timeout_s, clock=clock, pipeline=pipeline)  # type: ignore[arg-type]


def test_status_reads_timed_out_once_the_deadline_passes_without_any_request():
    tc, clock = StubTc(), Clock()
    txn = make_txn(tc, clock, timeout_s=10)
    assert txn.status is TxnStatus.OPEN
    clock.now += 9.9
    assert txn.status is TxnStatus.OPEN
    assert txn.deadline_s == pytest.approx(1010.0)
    clock.now += 0.2
    assert txn.status is TxnStatus.TIMED_OUT
    assert "TIMED_OUT" in repr(txn)
    assert tc.calls == [], "reading the status asked the coordinator"


def test_commit_after_the_deadline_raises_the_timeout_without_a_commit_request():
    tc, clock = StubTc(), Clock()
    pipeline = RequestPipeline()
    try:
        txn = make_txn(tc, clock, timeout_s=2, pipeline=pipeline)
        ended = []
        txn.add_end_listener(ended.append, key="consumer")
        clock.now += 2.5
        with pytest.raises(TransactionTimeoutError) as exc:
            txn.commit()
        assert exc.value.txn_id == TxnID(1, 7)
        assert "(1,7)" in str(exc.value) and "2000 ms" in str(exc.value)
        assert True not in tc.ends(), "a commit was sent after the deadline"
        # Best effort, in the background: the coordinator is told to abort.
        assert tc.answered.wait(5)
        pipeline.close(wait=True)
        assert tc.ends() == [False]
        assert txn.status is TxnStatus.ABORTED
        assert ended == [False], "end listeners learn the abort once it is confirmed"
        with pytest.raises(TransactionTimeoutError):
            txn.commit()                  # asking again gives the same answer
    finally:
        pipeline.close()


def test_commit_before_the_deadline_asks_the_coordinator():
    tc, clock = StubTc(), Clock()
    txn = make_txn(tc, clock, timeout_s=2)
    clock.now += 1.9
    txn.commit()
    assert tc.ends() == [True]
    assert txn.status is TxnStatus.COMMITTED
    clock.now += 100
    assert txn.status is TxnStatus.COMMITTED, "an ended txn never reads TIMED_OUT"


def test_timed_out_txn_refuses_sends_after_the_commit_and_abort_still_works():
    tc, clock = StubTc(), Clock()
    txn = make_txn(tc, clock, timeout_s=1)        # no pipeline: a thread of its own
    clock.now += 5
    with pytest.raises(TransactionTimeoutError):
        txn.commit()
    assert eventually(lambda: txn.status is TxnStatus.ABORTED), txn.status
    assert tc.ends() == [False]
    with pytest.raises(InvalidTxnStatusError):
        with txn.sending():
            pass
    txn.abort()                                   # already aborted: a no-op
    assert tc.ends() == [False]


def test_a_best_effort_abort_that_fails_leaves_the_txn_timed_out():
    tc, clock = StubTc(fail={TcOp.END: TransactionTimeoutError("gone")}), Clock()
    txn = make_txn(tc, clock, timeout_s=1)
    clock.now += 5
    with pytest.raises(TransactionTimeoutError):
        txn.commit()
    assert eventually(lambda: tc.ends() == [False])
    time.sleep(0.05)
    assert txn.status is TxnStatus.TIMED_OUT


def test_abort_after_the_deadline_aborts():
    tc, clock = StubTc(), Clock()
    txn = make_txn(tc, clock, timeout_s=1)
    clock.now += 5
    txn.abort()
    assert tc.ends() == [False] and txn.status is TxnStatus.ABORTED


def test_context_manager_past_its_deadline_raises_the_timeout():
    tc, clock = StubTc(), Clock()
    with pytest.raises(TransactionTimeoutError):
        with make_txn(tc, clock, timeout_s=1):
            clock.now += 5
    assert eventually(lambda: tc.ends() == [False])


def test_registrations_of_a_topic_are_pipelined_only_after_its_first_succeeded():
    """The first ADD_PARTITIONS of a topic by this client is sent by the writer itself
    (the coordinator writes the buffer registration before it answers); later ones go
    out on the pipeline's threads after a linger, or the commit's END carries them."""
    tc, clock = StubTc(), Clock()
    threads: list[tuple[tuple[TopicPartition, ...], str]] = []
    real = tc.request

    def request(op, tc_id, **f):
        if op is TcOp.ADD_PARTITIONS:
            threads.append((f["partitions"], threading.current_thread().name))
        return real(op, tc_id, **f)

    tc.request = request  # type: ignore[method-assign]
    pipeline = RequestPipeline()
    try:
        txn = make_txn(tc, clock, pipeline=pipeline)
        txn.register_partitions([TopicPartition("t", 0)])
        txn.register_partitions([TopicPartition("t", 1)])
        txn.register_partitions([TopicPartition("u", 0)])
        txn.commit()
        me = threading.current_thread().name
        mine = [(p[0].topic, p[0].partition) for p, t in threads if t == me]
        assert mine == [("t", 0), ("u", 0)], \
            "a topic's first registration was not awaited, or a later one was"
        carried = [f.get("partitions", ()) for op, f in tc.calls if op is TcOp.END][0]
        pipelined = [p for p, t in threads if t != me]
        assert pipelined == [(TopicPartition("t", 1),)] or \
            TopicPartition("t", 1) in carried, "t-1 was neither pipelined nor carried"
        ops = [op for op, _ in tc.calls]
        assert ops[-1] is TcOp.END and tc.ends() == [True]
    finally:
        pipeline.close()


def txn_on_a_known_topic(tc: StubTc, clock: Clock, pipeline: RequestPipeline) -> Transaction:
    """Txn (1,8), after another txn registered topic ``t`` (its later partitions are
    pipelined)."""
    first = make_txn(tc, clock, pipeline=pipeline)
    first.register_partitions([TopicPartition("t", 0)])
    first.commit()
    return Transaction(tc, TxnID(1, 8), 10, clock=clock, pipeline=pipeline)  # type: ignore[arg-type]


def test_a_failed_pipelined_registration_aborts_the_commit_with_its_error():
    tc, clock = StubTc(), Clock()
    pipeline = RequestPipeline()
    try:
        txn = txn_on_a_known_topic(tc, clock, pipeline)
        refused = InvalidTxnStatusError(TxnID(1, 8), TxnStatus.OPEN, TxnStatus.ABORTED)
        tc.fail[TcOp.ADD_PARTITIONS] = refused
        txn.register_partitions([TopicPartition("t", 3)])      # returns before the answer
        assert eventually(lambda: any(op is TcOp.ADD_PARTITIONS and f["partitions"] == (
            TopicPartition("t", 3),) for op, f in tc.calls))  # sent after the linger
        time.sleep(0.1)  # its refusal reached the txn
        with pytest.raises(InvalidTxnStatusError) as exc:
            txn.commit()
        assert exc.value is refused
        assert tc.ends() == [True, False], "the failed txn was committed, or not aborted"
        assert txn.status is TxnStatus.ABORTED
    finally:
        pipeline.close()


def test_a_commit_carries_the_registrations_not_confirmed_and_their_refusal_aborts_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit sent before a pipelined registration's reply carries it in its END; the
    coordinator applies it with the same checks, so a refusal fails the END (the stub
    refuses it as the coordinator would) and the txn is aborted, not committed.

    The linger is made long: with its 5 ms the commit came after it on a loaded CI
    machine (stop 50), the registration was confirmed first, and there was none to carry.
    """
    monkeypatch.setattr(pipeline_module, "LINGER_S", 30.0)  # the commit comes within it
    tc, clock = StubTc(), Clock()
    pipeline = RequestPipeline()
    try:
        txn = txn_on_a_known_topic(tc, clock, pipeline)
        txn.register_partitions([TopicPartition("t", 3)])
        refused = InvalidTxnStatusError(TxnID(1, 8), TxnStatus.OPEN, TxnStatus.ABORTED)
        tc.fail[TcOp.END] = refused
        with pytest.raises(InvalidTxnStatusError) as exc:
            txn.commit()                                       # at once: within the linger
        assert exc.value is refused
        end = [f for op, f in tc.calls if op is TcOp.END][-1]
        assert end["commit"] and TopicPartition("t", 3) in end["partitions"], \
            "the commit's END did not carry the unconfirmed registration"
        assert txn.status is TxnStatus.ABORTED
    finally:
        pipeline.close()
