"""Records fetched past where a partition waits are held, within bounds (issue 37).

A partition waits at the first record its served max read position does not cover (an
open txn's). The old reader paused the fetcher there and sought back, and fetched again
after the commit: a fetch round per wait, and a 5 ms broker long-poll so that the resumed
fetch was not stuck behind a parked one (the readers' at-rest cost at 1,024 partitions).
Now what the fetcher brings beyond is held, and the commit makes it visible at once;
past :data:`~txnstream.ingest.HOLD_PARTITION_BYTES` (per partition) or
:data:`~txnstream.ingest.HOLD_BYTES` (per consumer) the fetcher pauses at the first
record not held and fetches the rest again after the commit.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.integration.consumer.conftest import make_topic
from txnstream import TopicPartition, ingest

pytestmark = pytest.mark.integration

RECORD = b"x" * 10_000


def block_then_commit_behind(client, topic: str, partition: int, txns: int, per_txn: int):
    """An open txn's record at the head of ``partition``, then ``txns`` committed txns of
    ``per_txn`` 10 KB records behind it; returns the open txn and the values in order."""
    producer = client.create_producer(topic)
    head = client.new_transaction(timeout_s=120)
    producer.send(f"head-{partition}".encode(), txn=head, partition=partition)
    producer.flush()
    values = [f"head-{partition}".encode()]
    for t in range(txns):
        txn = client.new_transaction()
        for i in range(per_txn):
            v = f"p{partition}-t{t}-{i}:".encode() + RECORD
            producer.send(v, txn=txn, partition=partition)
            values.append(v)
        txn.commit()
    return head, values


def wait_held(consumer, predicate, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        m = consumer.receive(timeout_s=0.1)
        assert m is None, f"{m.tp}@{m.offset} delivered past an open txn"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"


def receive_all(consumer, n: int, timeout_s: float = 60.0) -> list:
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        m = consumer.receive(timeout_s=0.5)
        if m is not None:
            out.append(m)
            consumer.acknowledge(m)
    return out


def test_records_behind_an_open_txn_are_held_and_delivered_once_in_order_at_its_commit(
        config, worker, client):
    """Under the bound: nothing paused, the records held are what the commit delivers."""
    topic = make_topic(config, 1)
    head, values = block_then_commit_behind(client, topic, 0, 5, 4)
    c = client.subscribe(topic, subscription=f"held-{uuid.uuid4().hex[:6]}")
    tp = TopicPartition(topic, 0)
    wait_held(c, lambda: len(getattr(c._readers.get(tp), "held", ())) >= 1 + 5 * 4 + 5,
              "the records behind the open txn to be held")  # it, 20 records, 5 markers
    r = c._readers[tp]
    assert r.paused_at is None, "the fetcher paused under the hold's bound"
    assert r.wait_at == r.held[0].offset() == 0
    head.commit()
    got = receive_all(c, len(values))
    assert [m.value for m in got] == values, "lost, duplicated or out of order"
    assert [m.offset for m in got] == sorted(m.offset for m in got)
    assert c._ingest.held_bytes == 0 and not r.held
    assert c.receive(timeout_s=1.0) is None, "delivered twice"
    c.close()


def test_a_hold_stops_at_its_partition_bound_and_the_rest_is_fetched_again(
        config, worker, client):
    """4 MB behind an open txn, 1 MiB held: the fetcher pauses at the first record not held."""
    topic = make_topic(config, 1)
    head, values = block_then_commit_behind(client, topic, 0, 40, 10)
    c = client.subscribe(topic, subscription=f"held-{uuid.uuid4().hex[:6]}")
    tp = TopicPartition(topic, 0)
    wait_held(c, lambda: getattr(c._readers.get(tp), "paused_at", None) is not None,
              "the hold to fill and the fetcher to pause")
    r = c._readers[tp]
    for _ in range(20):  # what the fetcher brings after the pause is not held
        assert c.receive(timeout_s=0.1) is None
    assert 0 < r.held_bytes <= ingest.HOLD_PARTITION_BYTES, r.held_bytes
    assert c._ingest.held_bytes == r.held_bytes
    assert r.paused_at == r.held[-1].offset() + 1, "records between the hold and the pause"
    head.commit()
    got = receive_all(c, len(values))
    assert [m.value for m in got] == values, "lost, duplicated or out of order"
    assert c.receive(timeout_s=1.0) is None, "delivered twice"
    c.close()


def test_the_holds_of_all_partitions_stay_within_the_consumers_bound(
        config, worker, client, monkeypatch):
    """Three partitions blocked, each with 400 KB behind: the consumer's bound (set to
    600 KB here) is shared, the partitions past it paused, and nothing is lost."""
    monkeypatch.setattr(ingest, "HOLD_BYTES", 600_000)
    topic = make_topic(config, 3)
    heads, values = [], {}
    for p in range(3):
        head, values[p] = block_then_commit_behind(client, topic, p, 4, 10)
        heads.append(head)
    c = client.subscribe(topic, subscription=f"held-{uuid.uuid4().hex[:6]}")
    tps = [TopicPartition(topic, p) for p in range(3)]

    def settled() -> bool:  # each partition holds all behind it, or paused
        rs = [c._readers.get(tp) for tp in tps]
        return all(r is not None and (r.paused_at is not None or len(r.held) >= 1 + 4 * 10 + 4)
                   for r in rs)

    wait_held(c, settled, "every partition to hold or pause")
    rs = [c._readers[tp] for tp in tps]
    assert c._ingest.held_bytes == sum(r.held_bytes for r in rs) <= 600_000
    assert any(r.paused_at is not None for r in rs), "three 400 KB holds within 600 KB"
    for head in heads:
        head.commit()
    got = receive_all(c, sum(map(len, values.values())))
    for p in range(3):
        assert [m.value for m in got if m.partition == p] == values[p], f"partition {p}"
    assert c.receive(timeout_s=1.0) is None, "delivered twice"
    assert c._ingest.held_bytes == 0
    c.close()
