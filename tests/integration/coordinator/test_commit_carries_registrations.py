"""A commit's END carries the registrations its client has not had confirmed, on the real
broker (issue 22: one coordinator turn per commit, not a registration turn and then an
END turn).

The coordinator applies what an END carries (the activation of a reserved TxnID, the
partitions) before deciding, with the checks of their own requests; a refusal fails the
END and decides nothing. A pipelined registration that arrives after the decision is
answered OK when it adds nothing, and refused when it would add a partition.
"""

from __future__ import annotations

import time

import pytest

from tests.integration.coordinator.conftest import make_topic, wait_until
from tests.integration.coordinator.test_pipelined_registration import (
    committed_values,
    registered_topic,
)
from txnstream.coordinator.protocol import TcOp
from txnstream.errors import InvalidRequestError, InvalidTxnStatusError
from txnstream.types import TopicPartition, TxnStatus

pytestmark = pytest.mark.integration

HOLD_S = 4.0
"""How long a registration's reply is held back from the client."""


def _ends(client) -> list[dict]:
    """Every END this client sends (its fields)."""
    ends: list[dict] = []
    real = client.tc.request

    def request(op, tc_id, **fields):
        if op is TcOp.END:
            ends.append(fields)
        return real(op, tc_id, **fields)

    client.tc.request = request
    return ends


def test_a_commit_waits_for_no_registration_reply_and_every_record_lands_once(
        config, worker, client):
    """Sends to three partitions of a known topic, their registration's reply held back
    (a slow coordinator turn): the commit does not wait for it, its END carries the
    partitions (and the activation), the markers reach all three and a committed-only
    reader gets each record once. On the old code the commit waited out the hold."""
    topic, producer = registered_topic(config, client, 4)
    ends = _ends(client)
    real = client.tc.request

    def slow(op, tc_id, **fields):
        reply = real(op, tc_id, **fields)
        if op in (TcOp.ADD_PARTITIONS, TcOp.ACTIVATE):
            time.sleep(HOLD_S)
        return reply

    client.tc.request = slow
    txn = client.new_transaction(timeout_s=60)
    for p in (1, 2, 3):
        producer.send(f"r{p}".encode(), txn=txn, partition=p)
    t0 = time.monotonic()
    txn.commit()
    took = time.monotonic() - t0
    assert took < HOLD_S / 2, f"the commit waited {took:.1f}s for a registration reply"
    carried = set(ends[-1]["partitions"])
    assert carried == {TopicPartition(topic, p) for p in (1, 2, 3)}, carried
    assert ends[-1]["open_time_ms"] > 0, "the activation was not carried"
    info = client.admin.get_transaction(txn.id)
    assert info.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED)
    assert set(info.partitions) == {f"{topic}-{p}" for p in (1, 2, 3)}
    got = committed_values(client, topic, 4)
    assert sorted(got) == [b"r1", b"r2", b"r3", b"warm"], got


def test_an_end_carrying_a_partition_that_does_not_exist_decides_nothing(
        config, worker, client):
    """The carried partition is checked as ADD_PARTITIONS checks it: the END is refused
    naming it, the txn stays OPEN (nothing was decided) and can still abort."""
    topic = make_topic(config, 2)
    txn = client.new_transaction(timeout_s=60)
    missing = TopicPartition(topic, 7)
    with pytest.raises(InvalidRequestError, match=f"{topic}-7"):
        client.tc.request(TcOp.END, txn.id.tc_id, txn_seq=txn.id.least_bits, commit=True,
                          partitions=(missing,))
    assert client.admin.get_transaction(txn.id).status is TxnStatus.OPEN
    txn.abort()
    assert client.admin.get_transaction(txn.id).status in (TxnStatus.ABORTING,
                                                           TxnStatus.ABORTED)


def test_a_registration_after_the_commit_is_confirmed_if_carried_and_refused_if_new(
        config, worker, client):
    """A pipelined ADD_PARTITIONS that the END overtook adds nothing: answered OK (no
    error for the client, none counted by the worker); one naming a partition the txn
    never had is refused as too late, as before."""
    topic, producer = registered_topic(config, client, 4)
    txn = client.new_transaction(timeout_s=60)
    producer.send(b"a", txn=txn, partition=1)
    txn.commit()
    seq, tc_id = txn.id.least_bits, txn.id.tc_id
    wait_until(lambda: client.admin.get_transaction(txn.id).status.is_final, 15,
               "the txn final")
    client.tc.request(TcOp.ADD_PARTITIONS, tc_id, txn_seq=seq,
                      partitions=(TopicPartition(topic, 1),))
    assert seq not in worker.tcs[tc_id].watchers, \
        "a late registration of a final txn left a watcher (kept for ever)"
    with pytest.raises(InvalidTxnStatusError):
        client.tc.request(TcOp.ADD_PARTITIONS, tc_id, txn_seq=seq,
                          partitions=(TopicPartition(topic, 2),))
    got = committed_values(client, topic, 2)
    assert sorted(got) == [b"a", b"warm"], got
