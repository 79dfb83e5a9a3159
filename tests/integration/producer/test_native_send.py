"""``send_batch`` natively and through confluent-kafka, on a real broker: the same records.

The same generated transactions (batches, and ``send()`` calls between them on the same
partitions) go through a producer that sends batches natively and through one made to
take the Python path. Read back raw, each topic holds the same records (values, keys,
partitions, headers byte for byte, order per partition: the order of the calls), each
transaction's recorded offsets (``txn.delivered``, for :mod:`txnstream.fate`) are
exactly where its records landed, and every send was counted and acknowledged. A record
the broker refuses makes the transaction abort-only naming its partition on both paths;
a transaction committed after native sends is delivered to committed-only readers, an
aborted one is not. ``tests/unit/test_native_send.py`` checks the C side with no broker.
"""

from __future__ import annotations

import os
import uuid
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.coordinator.conftest import make_topic, read_all
from txnstream import Client
from txnstream.errors import TxnStreamError
from txnstream.membership import txn_headers
from txnstream.producer import Producer

pytestmark = pytest.mark.integration

PARTITIONS = 3

needs_native = pytest.mark.skipif(os.environ.get("TXNSTREAM_NATIVE") == "0",
                                  reason="TXNSTREAM_NATIVE=0: the pure-Python path only")


def producers(client: Client, topic_native: str, topic_python: str, **kafka: Any
              ) -> tuple[Producer, Producer]:
    """A producer that sends batches natively, and one made to send them through Python."""
    native = client.create_producer(topic_native, **kafka)
    assert native._paths.native(native._kafka) is not None, \
        "txnstream._native_send did not build or load (logged why)"
    python = client.create_producer(topic_python, **kafka)
    python._paths._native = False  # the Python path, for the same calls
    return native, python


record = st.tuples(st.binary(max_size=40) | st.none(), st.binary(max_size=8) | st.none(),
                   st.integers(0, PARTITIONS - 1))
op = st.one_of(st.tuples(st.just("batch"), st.lists(record, min_size=1, max_size=40)),
               st.tuples(st.just("send"), record))
txns = st.lists(st.tuples(st.lists(op, min_size=1, max_size=5), st.booleans()),
                min_size=1, max_size=3)
"""Transactions: their calls in order, and whether a delay header goes with the batches."""


def run(client: Client, producer: Producer, plan: list) -> tuple[list, list, list]:
    """The plan's txns through ``producer``; what each call sent, each txn's recorded
    offsets, and each txn's id and key (for the headers its records must carry)."""
    calls, offsets, ids = [], [], []
    for t, (ops, delayed) in enumerate(plan):
        txn = client.new_transaction(timeout_s=60)
        for kind, body in ops:
            if kind == "batch":
                values, keys, parts = (list(x) for x in zip(*body, strict=True))
                producer.send_batch(values, parts, txn, keys=keys,
                                    deliver_after=7 if delayed else None)
                calls += [(t, v, k, p, delayed) for v, k, p in body]
            else:
                v, k, p = body
                producer.send(v, key=k, txn=txn, partition=p)
                calls.append((t, v, k, p, False))
        txn.flush()  # every send acknowledged: the offsets are all there
        offsets.append(txn.delivered.snapshot(txn.id))
        ids.append((txn.id, txn.key))
        txn.commit()
    assert producer.tracked_txns() == 0, "a txn's sends are still counted after its commit"
    return calls, offsets, ids


def landed(config: Any, topic: str, ids: list) -> tuple[dict, dict]:
    """Per partition, the records in offset order as (txn, value, key, delay header); per
    txn, its records' offsets per partition. Asserts every record carries its txn's
    headers byte for byte."""
    by_id = {i.to_bytes(): n for n, (i, _) in enumerate(ids)}
    per_part: dict[int, list] = defaultdict(list)
    offs: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for m in sorted(read_all(config, topic), key=lambda m: (m.partition(), m.offset())):
        headers = m.headers() or []
        if any(name == "txn.marker" for name, _ in headers):
            continue
        t = by_id[dict(headers)["txn.id"]]
        txn_id, key = ids[t]
        own = txn_headers(txn_id, key, topic, m.partition())
        assert headers[:len(own)] == [(n, v if isinstance(v, bytes) else v.encode())
                                      for n, v in own]
        delay = headers[len(own):]
        assert delay in ([], [("txn.deliver.after", b"7000")])
        per_part[m.partition()].append((t, m.value(), m.key(), bool(delay)))
        offs[t][m.partition()].append(m.offset())
    return per_part, offs


def expected(calls: list) -> dict[int, list]:
    per_part: dict[int, list] = defaultdict(list)
    for t, v, k, p, delayed in calls:
        per_part[p].append((t, v, k, delayed))
    return per_part


@needs_native
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=txns)
def test_native_and_python_batches_write_the_same_records_and_record_the_same_offsets(
        config, worker, client, plan):
    topics = make_topic(config, PARTITIONS), make_topic(config, PARTITIONS)
    native, python = producers(client, *topics)
    results = []
    for producer, topic in zip((native, python), topics, strict=True):
        calls, offsets, ids = run(client, producer, plan)
        per_part, offs = landed(config, topic, ids)
        assert per_part == expected(calls), "records differ from the calls, or their order"
        for t, recorded in enumerate(offsets):  # where each txn's records landed
            assert {tp.partition: o for tp, o in recorded.items()} == \
                {p: o for p, o in offs[t].items()}
            assert all(tp.topic == topic for tp in recorded)
        results.append((per_part, [{tp.partition: len(o) for tp, o in r.items()}
                                   for r in offsets]))
        producer.close()
    assert results[0] == results[1]


@needs_native
def test_a_record_the_broker_refuses_makes_the_txn_abort_only_on_both_paths(
        config, worker, client):
    topics = make_topic(config, 2), make_topic(config, 2)
    # the client lets 2 MB through; the broker (1 MB per record by default) refuses it
    native, python = producers(client, *topics, **{"message.max.bytes": 5_000_000})
    for producer, topic in zip((native, python), topics, strict=True):
        txn = client.new_transaction(timeout_s=60)
        producer.send_batch([b"ok", b"z" * 2_000_000, b"ok"], [1, 1, 1], txn)
        with pytest.raises(TxnStreamError, match=f"send to {topic}-1 failed: .*"
                           "MSG_SIZE_TOO_LARGE"):
            txn.flush()
        with pytest.raises(TxnStreamError, match="aborted instead of committed"):
            txn.commit()
        assert producer.tracked_txns() == 0
        producer.close()


@needs_native
def test_a_txn_committed_after_native_sends_is_delivered_committed_only(
        config, worker, client):
    topic = make_topic(config, PARTITIONS)
    producer = client.create_producer(topic)
    producer.prepare_batches()  # the handle made before the first batch (the processor's)
    assert producer._paths._native, "prepare_batches made no native handle"
    kept, dropped = client.new_transaction(), client.new_transaction()
    values = [f"r{i}".encode() for i in range(500)]
    parts = [i % PARTITIONS for i in range(500)]
    producer.send_batch([b"c" + v for v in values], parts, kept)
    producer.send_batch([b"a" + v for v in values], parts, dropped)
    dropped.abort()
    kept.commit()
    c = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    got = []
    while len(got) < 500:
        m = c.receive(timeout_s=10)
        if m is None:
            break
        got.append((m.partition, m.offset, m.value))
        c.acknowledge(m)
    extra = c.receive(timeout_s=2)
    c.close()
    producer.close()
    assert extra is None, f"delivered beyond the committed txn: {extra}"
    assert sorted(v for _, _, v in got) == sorted(b"c" + v for v in values)
    for p in range(PARTITIONS):  # in send order within each partition
        assert [v for q, _, v in sorted(got) if q == p] == \
            [b"c" + v for v, q in zip(values, parts, strict=True) if q == p]


@needs_native
def test_a_batch_larger_than_librdkafkas_queue_waits_for_room_and_all_of_it_lands(
        config, worker, client):
    topic = make_topic(config, 2)
    producer = client.create_producer(topic, **{"queue.buffering.max.messages": 50})
    assert producer._paths.native(producer._kafka) is not None
    txn = client.new_transaction(timeout_s=60)
    values = [f"q{i}".encode() for i in range(1000)]
    producer.send_batch(values, [i % 2 for i in range(1000)], txn)
    txn.commit()
    got = [m.value() for m in sorted(read_all(config, topic),
                                     key=lambda m: (m.partition(), m.offset()))
           if not any(n == "txn.marker" for n, _ in m.headers() or [])]
    assert got == [v for i, v in enumerate(values) if i % 2 == 0] + \
        [v for i, v in enumerate(values) if i % 2 == 1]
    producer.close()


@needs_native
def test_a_clients_next_producer_takes_the_native_handle_made_ahead(config, worker, client):
    """After a producer's first batch the client keeps one native handle made ahead (its
    producer id ready); the next producer's first batch takes it, its records land and
    commit like any, and a closed client leaves no handle behind."""
    first, second = make_topic(config, PARTITIONS), make_topic(config, PARTITIONS)
    with Client(config=config) as c:
        a = c.create_producer(first)
        with c.transaction() as txn:
            a.send_batch([b"a0", b"a1"], [0, 1], txn)
        assert len(c._spares) == 1, "no handle made ahead after the first batch"
        spare = next(iter(c._spares._spares.values()))
        b = c.create_producer(second)
        with c.transaction() as txn:
            b.send_batch([b"b0", b"b1", b"b2"], [0, 1, 2], txn, keys=[b"k", None, b"k"])
        assert b._paths._native is spare, "the second producer made a handle of its own"
        assert len(c._spares) == 1, "no handle made ahead for the producer after"
        spares = c._spares
    assert len(spares) == 0, "the closed client left a handle made ahead"
    got = sorted((m.partition(), m.value(), m.key()) for m in read_all(config, second)
                 if not any(n == "txn.marker" for n, _ in m.headers() or []))
    assert got == [(0, b"b0", b"k"), (1, b"b1", None), (2, b"b2", b"k")]
    reader = client.subscribe(second, subscription=f"s-{uuid.uuid4().hex[:6]}")
    seen = []
    while len(seen) < 3 and (m := reader.receive(timeout_s=10)) is not None:
        seen.append(m.value)
    reader.close()
    assert sorted(seen) == [b"b0", b"b1", b"b2"], "the committed records are not delivered"
