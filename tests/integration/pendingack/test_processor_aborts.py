"""A processor batch that aborts after taking its inputs loses none of them.

The inputs of an aborted batch come back to the processor: those its txn acked by the
abort (Pulsar's pending-ack abort), those it took but never acked by the processor
handing them back to the consumer (Pulsar's ``redeliverUnacknowledgedMessages``).
Real broker; the aborts are the function's own error and a real txn timeout.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.integration.pendingack.conftest import make_topic
from txnstream import Client
from txnstream.errors import TxnStreamError
from txnstream.processor import ExactlyOnceProcessor

pytestmark = pytest.mark.integration

PER_PARTITION = 20


def produce(client, topic: str, partitions: int) -> set[bytes]:
    p = client.create_producer(topic)
    want = set()
    for part in range(partitions):
        for i in range(PER_PARTITION):
            p.send(f"v{part}-{i}".encode(), partition=part)
            want.add(f"V{part}-{i}".encode())
    p.flush()
    return want


def outputs(config, topic: str, expect: int) -> list[bytes]:
    with Client(config=config) as reader:
        c = reader.subscribe(topic, subscription=f"check-{uuid.uuid4().hex[:6]}")
        out: list[bytes] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = c.receive(timeout_s=3 if len(out) < expect else 1)
            if m is None:
                if len(out) >= expect:
                    break
                continue
            out.append(m.value)
        c.close()
    return out


def run_processor(client, src, dst, fn, **kw) -> ExactlyOnceProcessor:
    proc = ExactlyOnceProcessor(client, src, f"abort-{uuid.uuid4().hex[:6]}", dst, fn,
                                batch_size=100, batch_interval_s=0.5, **kw)
    try:
        proc.run(max_idle_s=6)
    finally:
        proc.close()
    return proc


def assert_exactly_once(out: list[bytes], want: set[bytes]) -> None:
    missing = sorted(want - set(out))
    assert not missing, f"{len(missing)} of {len(want)} inputs have no output: {missing[:10]}"
    assert len(out) == len(set(out)), f"{len(out) - len(set(out))} outputs duplicated"
    assert set(out) == want


@pytest.mark.parametrize("cumulative", [True, False])
def test_batch_aborted_by_an_error_after_taking_inputs_redelivers_them(
        config, worker, client, cumulative):
    """The error stands for any abort in the middle of a batch (an ack refused after a
    rebalance, a conflict, a failed send): inputs taken before it must come back."""
    src, dst = make_topic(config, 2, "in"), make_topic(config, 2, "out")
    want = produce(client, src, 2)
    failed: list[bytes] = []

    def fn(msg):
        if not failed and msg.value is not None and msg.value.endswith(b"-5"):
            failed.append(msg.value)
            raise TxnStreamError(f"refused {msg.value!r} once")
        return msg.key, (msg.value or b"").upper()

    proc = run_processor(client, src, dst, fn, cumulative=cumulative)
    assert failed and proc.stats.aborted_batches == 1
    assert_exactly_once(outputs(config, dst, len(want)), want)


def test_batch_whose_txn_times_out_redelivers_its_inputs(config, worker, client):
    """The paused member's case: the txn is aborted at its timeout mid-batch."""
    src, dst = make_topic(config, 2, "in"), make_topic(config, 2, "out")
    want = produce(client, src, 2)
    slept: list[bytes] = []

    def fn(msg):
        if not slept and msg.value is not None and msg.value.endswith(b"-3"):
            slept.append(msg.value)
            time.sleep(2.5)  # past the txn timeout
        return msg.key, (msg.value or b"").upper()

    proc = run_processor(client, src, dst, fn, cumulative=True, txn_timeout_s=1.5)
    assert slept and proc.stats.aborted_batches >= 1
    assert_exactly_once(outputs(config, dst, len(want)), want)


def test_a_checkpoint_whose_predecessor_failed_to_commit_aborts_too_and_order_is_kept(
        config, worker, client):
    """``run()`` commits checkpoint N in the background while N+1 takes inputs. N's
    commit fails (injected: its txn aborted, as a coordinator's refusal would): N+1 may
    not commit either, so both give their inputs back and each partition's inputs are
    processed again from N's first, in offset order; every output exactly once."""
    src, dst = make_topic(config, 2, "in"), make_topic(config, 2, "out")
    want = produce(client, src, 2)
    seen: dict[int, list[int]] = {0: [], 1: []}
    made = []
    real = client.new_transaction

    def new_transaction(**kw):
        txn = real(**kw)
        made.append(txn)
        if len(made) == 1:
            def failing_commit() -> None:
                time.sleep(0.3)  # N+1 takes inputs meanwhile
                txn.abort()
                raise TxnStreamError("injected: the first checkpoint's commit fails")
            txn.commit = failing_commit
        return txn

    client.new_transaction = new_transaction

    def fn(msg):
        seen[msg.partition].append(msg.offset)
        return msg.key, (msg.value or b"").upper()

    proc = run_processor(client, src, dst, fn, commit_every=8)
    assert proc.stats.aborted_checkpoints == 2, proc.stats  # N, and N+1 chained to it
    assert_exactly_once(outputs(config, dst, len(want)), want)
    restarted = 0
    for part, offsets in seen.items():
        drops = [i for i in range(1, len(offsets)) if offsets[i] <= offsets[i - 1]]
        assert len(drops) <= 1, f"partition {part} went back more than once: {offsets}"
        if drops:
            restarted += 1
            again = offsets[drops[0]:]
            assert again == sorted(again), f"partition {part} out of order: {offsets}"
            assert again[0] == offsets[0], f"partition {part} did not restart at N's first"
        assert sorted(set(offsets)) == list(range(PER_PARTITION)), offsets
    assert restarted, f"no partition was processed again: {seen}"


@pytest.mark.parametrize("cumulative", [True, False])
def test_a_checkpoint_aborted_from_outside_while_it_takes_inputs_loses_none(
        config, worker, client, cumulative):
    """An admin (or a monitor) aborts the open checkpoint's txn after its first batch
    was acked: the abort's marks give those inputs back while the checkpoint still takes
    batches, so they come again inside it. Processed again there, their acks fail or the
    commit does; the checkpoint gives everything back, and every input is processed
    exactly once in a later one (the chaos profile's processor once dropped such
    returns and its cursor stayed below them for good)."""
    src, dst = make_topic(config, 1, "in"), make_topic(config, 1, "out")
    want = produce(client, src, 1)
    made = []
    real = client.new_transaction

    def new_transaction(**kw):
        made.append(real(**kw))
        return made[-1]

    client.new_transaction = new_transaction
    aborted: list[object] = []
    again: list[int] = []

    def fn(msg):
        if len(made) == 1 and msg.offset == 5:  # the second batch of the first checkpoint
            if not aborted:
                aborted.append(client.admin.abort_transaction(made[0].id).status)
                time.sleep(1.5)  # the marks give the first batch back meanwhile
        elif len(made) == 1 and msg.offset < 5:
            again.append(msg.offset)
        return msg.key, (msg.value or b"").upper()

    proc = ExactlyOnceProcessor(client, src, f"outside-{uuid.uuid4().hex[:6]}", dst, fn,
                                batch_size=5, batch_interval_s=0.5, commit_interval_s=12.0,
                                cumulative=cumulative)
    try:
        proc.run(max_idle_s=6)
    finally:
        proc.close()
    assert aborted, "the first checkpoint was not aborted from outside"
    assert sorted(again) == sorted([0, 1, 2, 3, 4] * 2), \
        f"the first batch did not come back inside its checkpoint: {again}"
    assert proc.stats.aborted_checkpoints >= 1, proc.stats
    assert_exactly_once(outputs(config, dst, len(want)), want)
