"""Pipelined partition registration, the client-side deadline and attaching from another
process, on the real broker (issue 13).

A transaction's new partitions are registered in the background once this client has
registered the topic before; the first registration of a topic is awaited (the
coordinator writes the topic's buffer registration before it confirms it). Commit carries
the ones not confirmed yet; one that failed aborts the txn and nothing of it is delivered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter

import pytest

from tests.integration.coordinator.conftest import make_topic
from txnstream.coordinator.protocol import TcOp
from txnstream.errors import InvalidTxnStatusError, TransactionTimeoutError
from txnstream.types import TxnStatus

pytestmark = pytest.mark.integration


def committed_values(client, topic: str, n_expected: int, timeout_s: float = 20.0,
                     quiet_s: float = 1.5, seen: dict | None = None) -> list[bytes]:
    """What a committed-only reader delivers: up to ``n_expected``, then ``quiet_s``
    with nothing more (so a duplicate or an extra record would be seen).

    ``seen``: filled with what the reader knew at the end (for a failure's message)."""
    c = client.subscribe(topic, subscription=f"check-{uuid.uuid4().hex[:6]}")
    out: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            m = c.receive(timeout_s=0.3)
            if m is not None:
                out.append(m.value)
                quiet_until = None
            elif len(out) >= n_expected:
                quiet_until = quiet_until or time.monotonic() + quiet_s
                if time.monotonic() >= quiet_until:
                    break
    finally:
        if seen is not None:
            seen.update(reader_state(c))
        c.close()
    return out


def reader_state(c) -> dict:
    """A reader's word on each partition: junk skipped, status, its view's bounds."""
    return {"skipped as junk": c.unregistered_skipped(), "status": c.buffer_status(),
            "views": {tp: (v.log_epoch, v.position, v.max_read_position, sorted(v.hidden),
                           dict(v.aborted)) for tp, v in c._follower.views.items()}}


def where_missing(config, worker, topic: str, missing: set[bytes], seen: dict) -> str:
    """Where records a reader missed lie, and what the owner and the reader said of them."""
    from confluent_kafka import Consumer as KafkaConsumer

    from txnstream.types import TopicPartition as TP

    raw = KafkaConsumer(config.consumer(f"raw-{uuid.uuid4().hex[:6]}"))
    found: dict[bytes, tuple[int, int, list]] = {}
    try:
        raw.subscribe([topic])
        deadline = time.monotonic() + 15
        while len(found) < len(missing) and time.monotonic() < deadline:
            m = raw.poll(0.5)
            if m is not None and m.error() is None and m.value() in missing:
                found[m.value()] = (m.partition(), m.offset(),
                                    [k for k, _ in m.headers() or ()])
    finally:
        raw.close()
    lines = [f"in the log: {found}"]
    bw = worker.buffers
    for p in sorted({p for p, _, _ in found.values()}):
        s = bw.served.get(TP(topic, p))
        buf = s.buf if s is not None else None
        lines.append(f"owner of {topic}-{p}: " + (
            "not served" if buf is None else
            f"epoch {buf.log_epoch}, last {buf.last_offset}, junk {buf.junk}, forged "
            f"{buf.forged}, invisible {sorted(buf.invisible)[:20]}, restarts "
            f"{bw._logs.restarts}, native {bw._scan.native}"))
    lines.append(f"reader: {seen}")
    return "\n".join(lines)


def record_registrations(client) -> list[tuple[tuple, str]]:
    """Every ADD_PARTITIONS this client sends, with the thread that sent it."""
    sent: list[tuple[tuple, str]] = []
    real = client.tc.request

    def request(op, tc_id, **fields):
        if op is TcOp.ADD_PARTITIONS:
            sent.append((fields["partitions"], threading.current_thread().name))
        return real(op, tc_id, **fields)

    client.tc.request = request
    return sent


def registered_topic(config, client, partitions: int):
    """A fresh topic this client registered (one txn wrote ``b"warm"`` to partition 0):
    its later registrations are pipelined. The topic and a producer for it."""
    topic = make_topic(config, partitions)
    producer = client.create_producer(topic)
    with client.transaction() as warm:
        producer.send(b"warm", txn=warm, partition=0)
    return topic, producer


def test_a_topics_first_registration_is_awaited_and_later_ones_are_pipelined(
        config, worker, client):
    """The safety rule: a record is written only after the first ADD_PARTITIONS of its
    topic was confirmed (so the buffer registration precedes it); once confirmed, the
    topic's other partitions are registered off the writer's thread."""
    topic = make_topic(config, 4)
    sent = record_registrations(client)
    producer = client.create_producer(topic)
    me = threading.current_thread().name
    with client.transaction() as txn:
        producer.send(b"a", txn=txn, partition=0)
        assert [(p[0].partition, t) for p, t in sent] == [(0, me)], \
            "the first registration of the topic was not awaited by the send"
        producer.send(b"b", txn=txn, partition=1)
        producer.send(b"c", txn=txn, partition=2)
    # Later ones: off the writer's thread, partitions met within the linger in one
    # request, or carried by the commit's END (test_commit_carries_registrations.py).
    assert all(t.startswith("txnstream-register") for _, t in sent[1:]), sent
    assert {tp.partition for p, _ in sent[1:] for tp in p} <= {1, 2}, sent
    info = client.admin.get_transaction(txn.id)
    assert info.status is TxnStatus.COMMITTED
    assert set(info.partitions) == {f"{topic}-{p}" for p in (0, 1, 2)}
    assert sorted(committed_values(client, topic, 3)) == [b"a", b"b", b"c"]


def test_a_txn_writing_to_many_partitions_of_a_registered_topic_delivers_each_record_once(
        config, worker, client):
    """Many pipelined registrations in one txn (and in txns side by side): each
    partition is registered (by its own request or the commit's END), gets its marker,
    and readers get everything once."""
    parts = 16
    topic, producer = registered_topic(config, client, parts)
    sent = record_registrations(client)
    txns = [client.new_transaction(timeout_s=60) for _ in range(3)]
    want = [b"warm"]
    for round_ in range(5):
        for p in range(parts):
            for i, txn in enumerate(txns):
                value = f"t{i}-p{p}-r{round_}".encode()
                producer.send(value, txn=txn, partition=p)
                want.append(value)
    for txn in txns:
        txn.commit()
        info = client.admin.get_transaction(txn.id)
        assert len(info.partitions) == parts, info.partitions
    per_txn = Counter(tp for p, _ in sent for tp in p)
    assert max(per_txn.values(), default=0) <= 3, "a partition registered twice by a txn"
    assert all(t.startswith("txnstream-register") for _, t in sent), \
        "a registration of a registered topic was not pipelined"
    seen: dict = {}
    got = committed_values(client, topic, len(want), seen=seen)
    dupes = {v: n for v, n in Counter(got).items() if n > 1}
    assert not dupes, f"delivered more than once: {list(dupes)[:5]}"
    missing = set(want) - set(got)
    assert not missing, (f"missing {sorted(missing)[:5]}\n"
                         + where_missing(config, worker, topic, missing, seen))
    assert sorted(got) == sorted(want), f"extra {sorted(set(got) - set(want))[:5]}"


def test_a_failed_pipelined_registration_aborts_the_commit_and_nothing_is_delivered(
        config, worker, client):
    """An admin aborts the txn while it is still writing: its next (pipelined)
    registration is refused, commit raises the coordinator's InvalidTxnStatusError
    instead of committing, and a committed-only reader gets none of its records (the
    one in the partition the coordinator never learnt of included)."""
    topic, producer = registered_topic(config, client, 4)
    txn = client.new_transaction(timeout_s=60)
    producer.send(b"doomed-0", txn=txn, partition=0)
    txn.flush()                                            # partition 0 is registered
    client.abort_transaction(txn.id)                       # an admin aborts it
    for p in (1, 2):
        try:  # pipelined: refused later, or at once once the coordinator's notice is in
            producer.send(f"doomed-{p}".encode(), txn=txn, partition=p)
        except InvalidTxnStatusError:
            pass
    with pytest.raises(InvalidTxnStatusError) as exc:
        txn.commit()
    assert str(txn.id) in str(exc.value)
    assert txn.status is TxnStatus.ABORTED
    info = client.admin.get_transaction(txn.id)
    assert info.status is TxnStatus.ABORTED
    assert set(info.partitions) == {f"{topic}-0"}, "a refused registration was recorded"
    # Committed after it on the same coordinator: its markers' low watermark ends the
    # aborted txn in the partitions that got no marker of it.
    with client.new_transaction(timeout_s=60, tc_id=txn.id.tc_id) as after:
        for p in range(3):
            producer.send(f"after-{p}".encode(), txn=after, partition=p)
    got = committed_values(client, topic, 4)
    assert sorted(got) == [b"after-0", b"after-1", b"after-2", b"warm"], got


def test_commit_past_the_client_deadline_raises_without_asking_and_the_txn_aborts(
        config, worker, client):
    """The client knows the deadline: status reads TIMED_OUT with no request, commit
    raises TransactionTimeoutError without an END commit, and the best-effort abort it
    sends ends the txn before the coordinator's own timeout would notice."""
    topic = make_topic(config, 1)
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout_s=1.5)
    producer.send(b"late", txn=txn, partition=0)
    time.sleep(1.6)
    sent: list[tuple] = []
    real = client.tc.request

    def request(op, tc_id, **fields):
        sent.append((op, fields.get("commit")))
        return real(op, tc_id, **fields)

    client.tc.request = request
    assert txn.status is TxnStatus.TIMED_OUT
    assert sent == [], "reading the status asked the coordinator"
    with pytest.raises(TransactionTimeoutError) as exc:
        txn.commit()
    assert str(txn.id) in str(exc.value)
    assert (TcOp.END, True) not in sent, "a commit was sent past the deadline"
    deadline = time.monotonic() + 10
    while txn.status is not TxnStatus.ABORTED and time.monotonic() < deadline:
        time.sleep(0.05)
    assert txn.status is TxnStatus.ABORTED
    assert (TcOp.END, False) in sent
    assert client.admin.get_transaction(txn.id).status is TxnStatus.ABORTED
    with client.transaction() as after:
        producer.send(b"after", txn=after, partition=0)
    assert committed_values(client, topic, 1) == [b"after"]


CHILD = """
import sys
from txnstream import Client

txn_text, topic = sys.argv[1], sys.argv[2]
with Client() as client:                  # TXNSTREAM_BOOTSTRAP, TXNSTREAM_TOPIC_PREFIX
    txn = client.attach_transaction(txn_text)
    producer = client.create_producer(topic)
    producer.send(b"from-child", txn=txn, partition=1)
    txn.flush()                           # durable, and the txn was still OPEN
print("flushed", txn.id)
"""


def test_a_txn_attached_by_id_in_another_process_commits_both_writers_records_once(
        config, worker, client):
    """The opener passes str(txn.id) to another process, which attaches, sends and
    flushes; then the opener commits: a committed-only reader gets both records once."""
    topic = make_topic(config, 2)
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout_s=60)
    producer.send(b"from-parent", txn=txn, partition=0)
    env = dict(os.environ, TXNSTREAM_BOOTSTRAP=config.bootstrap_servers,
               TXNSTREAM_TOPIC_PREFIX=config.topics.prefix)
    child = subprocess.run([sys.executable, "-c", CHILD, str(txn.id), topic], env=env,
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    assert f"flushed {txn.id}" in child.stdout
    assert txn.status is TxnStatus.OPEN
    txn.commit()
    info = client.admin.get_transaction(txn.id)
    assert info.status is TxnStatus.COMMITTED
    assert set(info.partitions) == {f"{topic}-0", f"{topic}-1"}
    assert sorted(committed_values(client, topic, 2)) == [b"from-child", b"from-parent"]


def test_txns_committed_in_the_background_overlap_and_each_lands_once_or_raises(
        config, worker, client):
    """One producer keeps several txns open at once (a Kafka producer keeps one): each is
    written while the ones before commit (``commit_async``). Every committed record is
    delivered once; a txn an admin aborted meanwhile fails its future, and nothing of it
    is delivered."""
    topic, producer = registered_topic(config, client, 4)
    futures, want = [], [b"warm"]
    doomed = None
    for t in range(6):
        txn = client.new_transaction(timeout_s=60)
        values = [f"t{t}-{i}".encode() for i in range(50)]
        producer.send_batch(values, [i % 4 for i in range(50)], txn)
        if t == 3:
            txn.flush()
            client.abort_transaction(txn.id)
            doomed = txn
        else:
            want += values
        futures.append(txn.commit_async())
    outcomes = []
    for f in futures:
        try:
            f.result(60)
            outcomes.append("ok")
        except InvalidTxnStatusError:
            outcomes.append("aborted")
    assert outcomes == ["ok", "ok", "ok", "aborted", "ok", "ok"]
    assert doomed is not None and doomed.status is TxnStatus.ABORTED
    got = committed_values(client, topic, len(want))
    assert sorted(got) == sorted(want), "a record lost, duplicated, or of the aborted txn"
