"""Delayed delivery and retry letters on the real broker (issue 38).

A record sent with ``deliver_after``/``deliver_at`` is delivered no earlier than its
time, in a txn counted from the commit; a delayed record ahead of due ones holds back
nothing behind it, keeps the cursor below it, and survives the consumer holding it
(closed, or killed -9) because the log is its index. ``reconsume_later`` writes a
retry letter with its delay and acks the original in one txn; past the count it is
dead-lettered. A consumer holds a bounded number of records: past it the partition
waits, and still nothing is lost or delivered twice.
"""

from __future__ import annotations

import signal
import sys
import textwrap
import time
import uuid

import pytest
from confluent_kafka import Producer as KafkaProducer

from tests.integration.consumer.conftest import make_topic, receive_n
from txnstream import Client, DeadLetterPolicy
from txnstream.errors import ConfigError
from txnstream.types import TopicPartition

pytestmark = [pytest.mark.integration]

DELAY_S = 4.0
SESSION = {"session.timeout.ms": 6000}
CLOCK_SLACK_S = 0.05
"""Timestamps are ms: a record may come up to this much before a float clock says."""


def sub() -> str:
    return f"dly-{uuid.uuid4().hex[:6]}"


def joined(c, timeout_s: float = 30.0) -> None:
    """Return once ``c`` has its partitions (receiving nothing meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while not c.buffer_status():
        assert time.monotonic() < deadline, "no partition assigned"
        assert c.receive(timeout_s=0.2) is None


def receive_all(c, quiet_s: float = 3.0, ack: bool = True) -> list[tuple[float, object]]:
    """``(time received, message)`` until ``quiet_s`` with nothing new, each acked."""
    out = []
    while (m := c.receive(timeout_s=quiet_s)) is not None:
        out.append((time.time(), m))
        if ack:
            c.acknowledge(m)
    return out


def test_a_delayed_record_ahead_of_due_ones_holds_back_nothing_and_outlives_its_consumer(
        config, worker, client):
    topic = make_topic(config, 1, "dly")
    p = client.create_producer(topic)
    s = sub()
    c = client.subscribe(topic, subscription=s, **SESSION)
    joined(c)
    sent_at = time.time()
    p.send(b"late", partition=0, deliver_after=DELAY_S, headers=[("h", b"1")])
    for i in range(5):
        p.send(f"now-{i}".encode(), partition=0)
    p.flush()
    first = receive_n(c, 5, timeout_s=DELAY_S - 1)
    assert [m.value for m in first] == [f"now-{i}".encode() for i in range(5)], \
        "the records behind a delayed one waited for it (or came out of order)"
    assert time.time() < sent_at + DELAY_S, "the due records came only after the delay"
    for m in first:
        c.acknowledge(m)
    stats = c.pending_ack_stats(TopicPartition(topic, 0))
    assert (stats.cursor, stats.acked_above_cursor) == (0, 5), \
        "the cursor moved past the held record (a restart would lose it)"
    c.close()  # before it is due: the next consumer must hold it again

    c = client.subscribe(topic, subscription=s, **SESSION)
    got = receive_all(c, quiet_s=DELAY_S + 3)
    c.close()
    assert [m.value for _, m in got] == [b"late"], \
        f"after a restart: {[m.value for _, m in got]} (the due ones again, or the late one lost)"
    at, late = got[0]
    assert at >= sent_at + DELAY_S - CLOCK_SLACK_S, \
        f"delivered {sent_at + DELAY_S - at:.2f} s early"
    assert late.headers == (("h", b"1"),), "the delay header was handed to the user"


def test_a_delayed_record_of_a_txn_counts_its_delay_from_the_commit(config, worker, client):
    topic = make_topic(config, 2, "dlytx")
    p = client.create_producer(topic)
    txn = client.new_transaction()
    p.send(b"later", partition=0, txn=txn, deliver_after=DELAY_S)
    p.send(b"with-commit", partition=0, txn=txn)
    p.send_batch([b"b0", b"b1"], [0, 1], txn, deliver_after=DELAY_S)
    time.sleep(2.0)  # the delay counts from the commit, not from these sends
    committing = time.time()
    txn.commit()
    c = client.subscribe(topic, subscription=sub(), **SESSION)
    got = receive_all(c, quiet_s=DELAY_S + 3)
    c.close()
    by_value = {m.value: at for at, m in got}
    assert sorted(by_value) == [b"b0", b"b1", b"later", b"with-commit"], \
        f"records delivered: {[m.value for _, m in got]}"
    assert by_value[b"with-commit"] < committing + DELAY_S, "an undelayed record waited"
    for v in (b"later", b"b0", b"b1"):
        assert by_value[v] >= committing + DELAY_S - CLOCK_SLACK_S, \
            f"{v!r} came {committing + DELAY_S - by_value[v]:.2f} s before commit + delay"
        assert by_value[v] < committing + DELAY_S + 10, f"{v!r} was held far past its time"


def test_deliver_at_is_kept_and_a_bad_delay_header_from_outside_delays_nothing(
        config, worker, client):
    topic = make_topic(config, 1, "dlyat")
    p = client.create_producer(topic)
    at_ms = int(time.time() * 1000) + int(DELAY_S * 1000)
    txn = client.new_transaction()
    p.send(b"at", partition=0, txn=txn, deliver_at=at_ms)
    txn.commit()
    raw = KafkaProducer({"bootstrap.servers": config.bootstrap_servers})
    raw.produce(topic, b"junk-delay", partition=0, headers=[("txn.deliver.at", b"soon")])
    raw.flush(10)
    for bad in ({"deliver_after": -1}, {"deliver_at": "tomorrow"},
                {"deliver_after": 1, "deliver_at": at_ms},
                {"headers": [("txn.deliver.at", b"1")]}):
        with pytest.raises(ConfigError):
            p.send(b"refused", partition=0, **bad)  # type: ignore[arg-type]
    c = client.subscribe(topic, subscription=sub(), **SESSION)
    got = receive_all(c, quiet_s=DELAY_S + 2)
    c.close()
    assert [m.value for _, m in got] == [b"junk-delay", b"at"]
    assert got[0][0] < at_ms / 1000, "a header that does not parse held its record"
    assert got[1][0] >= at_ms / 1000 - CLOCK_SLACK_S


HOLDER = textwrap.dedent("""
    import sys, time
    from txnstream import Client, Config
    from txnstream.config import TopicNames

    bootstrap, prefix, topic, sub = sys.argv[1:5]
    client = Client(config=Config(bootstrap_servers=bootstrap, topics=TopicNames(prefix),
                                  num_coordinators=4))
    c = client.subscribe(topic, subscription=sub, **{"session.timeout.ms": 6000})
    got = []
    while len(got) < 3:
        m = c.receive(timeout_s=1)
        if m is not None:
            got.append(m)
    with client.transaction() as txn:
        c.acknowledge_batch(got, txn)
    print("HOLDING", [m.value.decode() for m in got], flush=True)
    time.sleep(3600)
""")


def test_a_consumer_killed_while_holding_a_delayed_record_leaves_it_to_the_next(
        config, worker, client, tmp_path, proc_reaper):
    topic = make_topic(config, 1, "dlykill")
    p = client.create_producer(topic)
    txn = client.new_transaction()
    p.send(b"held", partition=0, txn=txn, deliver_after=3 * DELAY_S)
    for i in range(3):
        p.send(f"due-{i}".encode(), partition=0, txn=txn)
    txn.commit()
    committed_at = time.time()
    s = sub()
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    a = proc_reaper.start_until([sys.executable, str(script), config.bootstrap_servers,
                                 config.topics.prefix, topic, s], tmp_path / "holder.log",
                                b"HOLDING")
    assert b"'due-0', 'due-1', 'due-2'" in (tmp_path / "holder.log").read_bytes()
    a.send_signal(signal.SIGKILL)
    a.wait(10)
    c = client.subscribe(topic, subscription=s, **SESSION)
    got = receive_all(c, quiet_s=3 * DELAY_S + 3)
    c.close()
    assert [m.value for _, m in got] == [b"held"], \
        f"after the kill: {[m.value for _, m in got]} (acked ones again, or the held one lost)"
    assert got[0][0] >= committed_at + 3 * DELAY_S - 1.0, "delivered before its time"


def test_reconsume_later_retries_with_its_delay_then_dead_letters_in_one_txn_each(
        config, worker, client):
    topic = make_topic(config, 1, "rin")
    retry, dlq = make_topic(config, 1, "rretry"), make_topic(config, 1, "rdlq")
    p = client.create_producer(topic)
    p.send(b"flaky", key=b"k", partition=0, headers=[("trace", b"t-9")])
    p.send(b"fine", partition=0)
    p.flush()
    s = sub()
    policy = DeadLetterPolicy(2, dlq, retry_letter_topic=retry)
    c = client.subscribe(topic, subscription=s, dead_letter_policy=policy, **SESSION)
    seen: list[tuple[float, int]] = []
    last = 0.0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(seen) < 3:
        m = c.receive(timeout_s=1)
        if m is None:
            continue
        if m.value == b"fine":
            c.acknowledge(m)
            continue
        now = time.time()
        assert now >= last + 1.5 - CLOCK_SLACK_S, "a retry came before its delay"
        times = int(dict(m.headers).get("RECONSUMETIMES", b"0"))
        seen.append((now, times))
        if times:
            h = dict(m.headers)
            assert (m.topic, h["REAL_TOPIC"], h["ORIGIN_MESSAGE_ID"], h["trace"]) == \
                (retry, topic.encode(), f"{topic}-0@0".encode(), b"t-9")
        last = now
        if times == 0:
            with client.transaction() as txn:  # in the caller's txn
                c.reconsume_later(m, 1.5, txn)
        else:
            c.reconsume_later(m, 1.5)  # in one of its own
    more = receive_all(c, quiet_s=4)
    c.close()
    assert [t for _, t in seen] == [0, 1, 2], f"retries seen: {seen}"
    assert more == [], f"delivered after it was dead-lettered: {[m.value for _, m in more]}"
    assert c.dead_letters is not None and c.dead_letters.dead_lettered == 1

    with Client(config=config) as reader:
        d = reader.subscribe(dlq, subscription=sub())
        dead = receive_all(d)
        d.close()
    assert [m.value for _, m in dead] == [b"flaky"]
    h = dict(dead[0][1].headers)
    assert (h["REAL_TOPIC"], h["ORIGIN_MESSAGE_ID"], h["RECONSUMETIMES"]) == \
        (topic.encode(), f"{topic}-0@0".encode(), b"2")


def test_a_consumer_holding_all_it_may_waits_and_loses_nothing(
        config, worker, client, monkeypatch):
    monkeypatch.setattr("txnstream.ingest.MAX_HELD", 3)
    topic = make_topic(config, 1, "dlybound")
    p = client.create_producer(topic)
    c = client.subscribe(topic, subscription=sub(), **SESSION)
    joined(c)
    sent_at = time.time()
    for i in range(6):
        p.send(f"d{i}".encode(), partition=0, deliver_after=DELAY_S)
    p.send(b"plain-0", partition=0)
    p.send(b"plain-1", partition=0)
    p.flush()
    tp = TopicPartition(topic, 0)
    early, most_held = [], 0
    while time.time() < sent_at + DELAY_S - 0.5:
        if (m := c.receive(timeout_s=0.2)) is not None:
            early.append(m.value)
        most_held = max(most_held, len(c._readers[tp].delayed))  # noqa: SLF001
    got = [m.value for _, m in receive_all(c, quiet_s=3)]
    c.close()
    assert early == [], f"past the bound, records behind the held ones came early: {early}"
    assert most_held == 3, f"held {most_held} records, the bound is 3"
    assert sorted(got) == sorted([f"d{i}".encode() for i in range(6)] + [b"plain-0", b"plain-1"])
    assert len(got) == len(set(got)), f"delivered twice: {got}"


def test_records_delayed_from_their_commit_are_held_within_the_bound_too(
        config, worker, client, monkeypatch):
    """Their time comes from the served state (the owner resolved it at the commit), not
    from the marker ahead of them: the consumer pauses at the bound, holding no more."""
    monkeypatch.setattr("txnstream.ingest.MAX_HELD", 3)
    topic = make_topic(config, 1, "dlytxnbound")
    p = client.create_producer(topic)
    c = client.subscribe(topic, subscription=sub(), **SESSION)
    joined(c)
    with client.transaction() as txn:
        for i in range(8):
            p.send(f"d{i}".encode(), partition=0, txn=txn, deliver_after=DELAY_S)
        p.send(b"plain-0", partition=0, txn=txn)
    committed = time.time()
    tp = TopicPartition(topic, 0)
    early, most_held = [], 0
    while time.time() < committed + DELAY_S - 0.5:
        if (m := c.receive(timeout_s=0.2)) is not None:
            early.append(m.value)
        most_held = max(most_held, len(c._readers[tp].delayed))  # noqa: SLF001
    got = [(t, m.value) for t, m in receive_all(c, quiet_s=3)]
    c.close()
    assert early == [], f"records came before their time or past the bound: {early}"
    assert most_held == 3, f"held {most_held} records, the bound is 3"
    values = [v for _, v in got]
    assert sorted(values) == sorted([f"d{i}".encode() for i in range(8)] + [b"plain-0"])
    assert len(values) == len(set(values)), f"delivered twice: {values}"
    assert min(t for t, v in got if v.startswith(b"d")) >= committed + DELAY_S - CLOCK_SLACK_S
