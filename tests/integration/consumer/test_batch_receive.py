"""Batch reads: ``receive_batch`` (Pulsar's batchReceive) and the Arrow path."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.consumer.conftest import make_topic

pytestmark = pytest.mark.integration


def _fill(client, topic: str) -> list[bytes]:
    """3 committed txns of 4, an aborted txn of 3, plain records between: what must come."""
    producer = client.create_producer(topic)
    want: list[bytes] = []
    for t in range(3):
        with client.transaction() as txn:
            vals = [f"c{t}-{i}".encode() for i in range(4)]
            for v in vals:
                producer.send(v, txn=txn, partition=0)
        want += vals
        aborted = client.new_transaction()
        for i in range(3):
            producer.send(f"a{t}-{i}".encode(), txn=aborted, partition=0)
        aborted.abort()
        producer.send(f"p{t}".encode(), partition=0)
        want.append(f"p{t}".encode())
    producer.flush()
    return want


def test_receive_batch_returns_committed_records_in_order_at_most_max(config, worker, client):
    topic = make_topic(config, 1)
    want = _fill(client, topic)
    consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    got = []
    try:
        while len(got) < len(want):
            batch = consumer.receive_batch(4, timeout_s=10)
            assert batch, f"nothing more after {len(got)} of {len(want)}"
            assert len(batch) <= 4
            got += batch
            for m in batch:
                consumer.acknowledge(m)
        assert consumer.receive_batch(100, timeout_s=1) == []
    finally:
        consumer.close()
    assert [m.value for m in got] == want
    assert [m.offset for m in got] == sorted(m.offset for m in got)
    assert all((m.txn_id is None) == m.value.startswith(b"p") for m in got)


def test_receive_arrow_columns_and_acknowledge_rows_move_the_cursor(config, worker, client):
    pytest.importorskip("pyarrow")
    topic = make_topic(config, 1)
    want = _fill(client, topic)
    sub = f"s-{uuid.uuid4().hex[:6]}"
    consumer = client.subscribe(topic, subscription=sub)
    try:
        rb = consumer.receive_arrow(8, timeout_s=10)
        while rb is not None and rb.num_rows < 8:  # a first call may return fewer
            consumer.acknowledge_rows(rb)
            want = want[rb.num_rows:]
            rb = consumer.receive_arrow(8, timeout_s=10)
        assert rb is not None
        assert rb.column_names == ["key", "value", "topic", "partition", "offset",
                                   "timestamp", "headers", "txn_id"]
        assert rb.column("value").to_pylist() == want[:8]
        names = rb.column("txn_id").to_pylist()
        assert all((n is None) == v.startswith(b"p") for n, v in zip(names, want[:8], strict=True))
        consumer.acknowledge_rows(rb)
    finally:
        consumer.close()
    # the cursor moved past the acked rows: a new member of the subscription goes on there
    again = client.subscribe(topic, subscription=sub)
    try:
        rest = []
        while (batch := again.receive_batch(100, timeout_s=5)):
            rest += [m.value for m in batch]
    finally:
        again.close()
    assert rest == want[8:]
