"""Every writer learns its records' fate by the readers' rule (issue 33 items 4, 5).

On the old code another process could commit a txn while its opener still wrote: the
opener's later sends and its ``commit()`` returned normally, and readers got 3 of its 8
records. A commit is now answered once its decision is durable (Kafka's order), and a
handle whose txn another handle ended compares where its records landed with the
txn's first marker (:mod:`txnstream.fate`): "in" exactly when readers deliver them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from tests.integration.consumer.conftest import make_topic
from txnstream import Client, TopicPartition
from txnstream.errors import InvalidTxnStatusError, RecordsExcludedError

pytestmark = pytest.mark.integration

CO_WRITER = """
import sys
from txnstream import Client
from txnstream.config import Config
client = Client(config=Config.from_env())
txn = client.attach_transaction(sys.argv[1])
client.create_producer(sys.argv[2]).send(b"co-writer", txn=txn, partition=0)
txn.commit()
client.close()
print("committed", flush=True)
"""


def commit_from_another_process(config, proc_reaper, txn, topic: str) -> None:
    """A real second process attaches to ``txn``, writes one record to ``topic`` and commits."""
    env = {**os.environ, "TXNSTREAM_BOOTSTRAP": config.bootstrap_servers,
           "TXNSTREAM_TOPIC_PREFIX": config.topics.prefix}
    co = proc_reaper.track(subprocess.Popen(
        [sys.executable, "-c", CO_WRITER, str(txn.id), topic], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    out, err = co.communicate(timeout=120)
    assert co.returncode == 0 and b"committed" in out, err.decode()[-2000:]


def delivered(client: Client, topic: str, want: int, limit_s: float = 30.0) -> dict[int, bytes]:
    """Offset -> value of every record a committed-only reader delivers (``want`` or more)."""
    c = client.subscribe(topic, subscription=f"check-{uuid.uuid4().hex[:6]}")
    got: dict[int, bytes] = {}
    deadline = time.monotonic() + limit_s
    try:
        while time.monotonic() < deadline:
            m = c.receive(timeout_s=0.5)
            if m is not None:
                got[m.offset] = m.value or b""
            elif len(got) >= want:
                break
    finally:
        c.close()
    return got


def test_an_opener_whose_txn_another_process_committed_is_told_which_records_are_out(
        config, worker, client, proc_reaper, monkeypatch):
    """The opener never hears of the commit (its notice is dropped here: a connection past
    the coordinator's bound of watchers, or one that reconnected), so its sends after the
    markers go out; its commit names each of them."""
    topic = make_topic(config, 1)
    tp = TopicPartition(topic, 0)
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout_s=60)
    monkeypatch.setattr(client.tc, "_txn_ended", lambda notice: None)
    for i in range(3):
        producer.send(f"before-{i}".encode(), txn=txn, partition=0)
    producer.flush_transaction(txn)
    commit_from_another_process(config, proc_reaper, txn, topic)
    # The markers are written and folded once a reader sees the co-writer's record:
    # everything the opener sends from now on follows them.
    assert b"co-writer" in delivered(client, topic, 4).values()
    for i in range(5):
        producer.send(f"after-{i}".encode(), txn=txn, partition=0)
    with pytest.raises(RecordsExcludedError) as raised:
        txn.commit()
    assert isinstance(raised.value, InvalidTxnStatusError)  # what callers caught before
    mine = txn.delivered.snapshot()[tp]
    assert len(mine) == 8
    seen = delivered(client, topic, 4)
    not_delivered = [o for o in mine if o not in seen]
    assert raised.value.excluded == {tp: not_delivered}, (raised.value.excluded, seen)
    assert sorted(seen[o] for o in mine if o in seen) == [b"before-0", b"before-1",
                                                          b"before-2"]
    assert len(not_delivered) == 5 and str(tp) in str(raised.value)


def test_an_attached_writer_is_told_in_exactly_when_readers_deliver(config, worker, client):
    """The commit is answered at its decision, before its markers: a record the attached
    handle sends right after may land on either side of them, or be refused if the handle
    was already told of the commit. Its flush() must say which, as readers will."""
    topic = make_topic(config, 1)
    tp = TopicPartition(topic, 0)
    other = Client(config=config)
    try:
        for _ in range(5):
            txn = client.new_transaction(timeout_s=30)
            joined = other.attach_transaction(str(txn.id))
            p2 = other.create_producer(topic)
            p2.send(b"in-time", txn=joined, partition=0)
            joined.flush()  # still OPEN: it precedes the markers
            txn.commit()
            try:
                p2.send(b"racing", txn=joined, partition=0)
            except InvalidTxnStatusError as exc:  # told of the commit first: nothing sent
                assert "committed by another handle" in str(exc)
            try:
                joined.flush()
                out: list[int] = []
            except RecordsExcludedError as exc:
                out = exc.excluded[tp]
            mine = joined.delivered.snapshot()[tp]
            seen = delivered(other, topic, 1, limit_s=10)
            assert out == [o for o in mine if o not in seen], (out, mine, seen)
            assert [o for o in mine if o in seen] == [o for o in mine if o not in out]
            topic = make_topic(config, 1)
            tp = TopicPartition(topic, 0)
    finally:
        other.close()


def test_an_opener_told_another_process_committed_its_txn_sends_nothing_more(
        config, worker, client, proc_reaper):
    """Every connection that wrote into a txn is told when it commits, not only the last
    writer when it aborts: the opener's next send raises and writes nothing (on the old
    code it was written after the markers, and only the fate check at commit caught it)."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTP

    topic = make_topic(config, 1)
    tp = TopicPartition(topic, 0)
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout_s=60)
    producer.send(b"before", txn=txn, partition=0)
    producer.flush_transaction(txn)
    commit_from_another_process(config, proc_reaper, txn, topic)
    assert sorted(delivered(client, topic, 2).values()) == [b"before", b"co-writer"]
    # The notice goes out with the markers: give it a moment to arrive, sending meanwhile.
    slipped = 0
    deadline = time.monotonic() + 10
    with pytest.raises(InvalidTxnStatusError) as raised:
        while True:
            producer.send(b"slipped", txn=txn, partition=0)
            slipped += 1
            assert time.monotonic() < deadline, f"{slipped} sends after the commit went out"
            time.sleep(0.05)
    assert "committed by another handle" in str(raised.value)
    probe = Consumer(config.consumer(f"probe-{uuid.uuid4().hex[:6]}"))
    try:
        high = probe.get_watermark_offsets(KafkaTP(topic, 0), timeout=10)[1]
        with pytest.raises(InvalidTxnStatusError):
            producer.send(b"after", txn=txn, partition=0)
        with pytest.raises(InvalidTxnStatusError):  # a new partition: not registered either
            client.create_producer(make_topic(config, 1)).send(b"x", txn=txn, partition=0)
        producer.flush()
        assert probe.get_watermark_offsets(KafkaTP(topic, 0), timeout=10)[1] == high
    finally:
        probe.close()
    mine = txn.delivered.snapshot()[tp]
    assert len(mine) == 1 + slipped
    if slipped:  # sent before the notice came: after the markers, so out
        with pytest.raises(RecordsExcludedError) as excluded:
            txn.commit()
        assert excluded.value.excluded == {tp: mine[1:]}
    else:
        txn.commit()  # its one record is in: the commit says so
    assert txn.status.value == "COMMITTED"
    assert sorted(delivered(client, topic, 2).values()) == [b"before", b"co-writer"]
