"""A batch read's task folds its partition as it reads (``_read_folding``), on the real
broker, without Spark: what it delivers is exactly what the driver-side plan would."""

from __future__ import annotations

import pytest

import spark.txnstream_source as src
from tests.spark.conftest import make_topic

pytestmark = pytest.mark.spark


def _values(config, topic, start=0, end=None):
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTP

    c = Consumer(config.consumer("hw"))
    high = c.get_watermark_offsets(KafkaTP(topic, 0), timeout=10)[1]
    c.close()
    part = src.TxnStreamPartition(config, topic, 0, start, min(end or high, high), None,
                                  fold_to=high)
    return [v for rb in src._read_partition(part) for v in rb.column("value").to_pylist()]


def _driver_plan(config, topic):
    from spark.options import SourceOptions

    planner = src._Planner(SourceOptions.parse({
        "kafka.bootstrap.servers": config.bootstrap_servers,
        "txnstream.prefix": config.topics.prefix, "subscribe": topic}))
    try:
        parts = planner.partitions(planner.starts("earliest"), planner.ends())
    finally:
        planner.folder.close()
    return [v for p in parts for rb in src._read_partition(p)
            for v in rb.column("value").to_pylist()]


@pytest.mark.parametrize("held", [100_000, 5])
@pytest.mark.parametrize("fate", ["abort", "commit", "open"])
def test_a_blocking_txn_holds_back_what_follows_and_nothing_is_lost_or_repeated(
        config, worker, client, monkeypatch, held, fate):
    monkeypatch.setattr(src, "MAX_HELD", held)  # 5: the let-go-and-re-read path
    topic = make_topic(config, 1)
    p = client.create_producer(topic)
    with client.transaction() as t:
        p.send(b"c0", txn=t, partition=0)
    blocker = client.new_transaction()
    p.send(b"blocked", txn=blocker, partition=0)
    p.flush_transaction(blocker)
    later = [f"c{i}".encode() for i in range(1, 41)]
    for v in later:
        with client.transaction() as t:
            p.send(v, txn=t, partition=0)
    p.send(b"plain", partition=0)
    p.flush()
    if fate == "abort":
        blocker.abort()
        want = [b"c0", *later, b"plain"]
    elif fate == "commit":
        blocker.commit()
        want = [b"c0", b"blocked", *later, b"plain"]
    else:
        want = [b"c0"]  # everything after the open txn waits for it
    got = _values(config, topic)
    assert got == want
    assert got == _driver_plan(config, topic)
    if fate == "open":
        blocker.abort()


def test_a_range_that_starts_mid_partition_gets_only_its_own_records(config, worker, client):
    topic = make_topic(config, 1)
    p = client.create_producer(topic)
    for i in range(6):
        with client.transaction() as t:  # each txn: a record and its marker
            p.send(f"v{i}".encode(), txn=t, partition=0)
    assert _values(config, topic) == [f"v{i}".encode() for i in range(6)]
    # records at 0, 2, 4, ... and each txn's marker right after: [4, 9) holds v2, v3, v4,
    # and v4's fate (its marker at 9) lies past the range's end
    assert _values(config, topic, start=4, end=9) == [b"v2", b"v3", b"v4"]
    assert _values(config, topic, start=5, end=8) == [b"v3"]


def test_a_long_read_forgets_what_it_delivered_and_delivers_the_same(config, monkeypatch):
    """Over many fetch batches, the task's buffer is trimmed below what it delivered
    (issue 11, item 6): its skip set stays about one batch long, and what it delivers is
    still exactly the committed and plain records, as the driver-side plan says."""
    from confluent_kafka import Producer

    from txnstream.buffer.reader import PartitionFolder
    from txnstream.markers import TXN_ID_HEADER, MarkerKind, TxnMarker
    from txnstream.types import TxnID

    topic = make_topic(config, 1)
    raw = Producer(config.producer(**{"linger.ms": 20}))
    want = []
    for i in range(12_000):  # txns of TC 9 (no coordinator): one in three aborted
        t = TxnID(9, i)
        v = f"t{i}".encode()
        raw.produce(topic, v, partition=0, headers=[(TXN_ID_HEADER, t.to_bytes())])
        m = TxnMarker(t, MarkerKind.ABORT if i % 3 == 0 else MarkerKind.COMMIT, i)
        raw.produce(topic, m.encode(), partition=0, headers=m.headers())
        if i % 3:
            want.append(v)
        if i % 100 == 0:
            raw.produce(topic, f"p{i}".encode(), partition=0)
            want.append(f"p{i}".encode())
            raw.poll(0)
    raw.flush(30)
    seen = []
    scan = PartitionFolder.scan

    def watched(self, *a, **k):
        for buf, batch in scan(self, *a, **k):
            seen.append(len(buf.invisible))
            yield buf, batch

    monkeypatch.setattr(PartitionFolder, "scan", watched)
    got = _values(config, topic)
    assert got == want
    assert len(seen) > 3 and max(seen) <= 5_000 + 2, f"skip set not trimmed: {max(seen)}"
    assert got == _driver_plan(config, topic)
