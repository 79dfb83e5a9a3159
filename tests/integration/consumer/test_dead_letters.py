"""Redelivery counts and dead letters on the real broker (issue 38).

A poison record whose processing txn aborts comes back with its count one higher each
time, also after the consumer holding it is killed -9 (the count is in the pending-ack
log, not in a process), and past the policy's count it is written to the dead-letter
topic and acked in one txn: dead-lettered exactly once, never delivered again.
"""

from __future__ import annotations

import signal
import sys
import textwrap
import time
import uuid

import pytest

from tests.integration.consumer.conftest import make_topic, wait_until
from txnstream import Client, DeadLetterPolicy
from txnstream.errors import ConfigError

pytestmark = [pytest.mark.integration, pytest.mark.fault]

MAX = 2
"""The policy's ``max_redeliver_count``: the poison is delivered 1 + MAX times."""
SESSION = {"session.timeout.ms": 6000}

HOLDER = textwrap.dedent("""
    import sys, time
    from txnstream import Client, Config, DeadLetterPolicy
    from txnstream.config import TopicNames

    bootstrap, prefix, topic, dlq, sub = sys.argv[1:6]
    client = Client(config=Config(bootstrap_servers=bootstrap, topics=TopicNames(prefix),
                                  num_coordinators=4))
    c = client.subscribe(topic, subscription=sub, **{"session.timeout.ms": 6000},
                         dead_letter_policy=DeadLetterPolicy({max}, dlq))
    while True:
        m = c.receive(timeout_s=1)
        if m is None:
            continue
        if m.value != b"poison":
            c.acknowledge(m)
            continue
        txn = client.new_transaction(timeout_s=5)
        c.acknowledge(m, txn)  # its processing acks it, then the process dies
        txn.flush()
        print("HOLDING", m.redelivery_count, flush=True)
        time.sleep(3600)
""")


def dead_letters(config, dlq: str, quiet_s: float = 3.0) -> list:
    """Every committed record of ``dlq`` (until ``quiet_s`` with nothing new)."""
    with Client(config=config) as reader:
        c = reader.subscribe(dlq, subscription=f"dlq-check-{uuid.uuid4().hex[:6]}")
        out = []
        while (m := c.receive(timeout_s=quiet_s)) is not None:
            out.append(m)
        c.close()
    return out


def test_a_poison_record_is_dead_lettered_once_with_its_ack_and_its_count_survives_a_kill(
        config, worker, client, tmp_path, proc_reaper):
    topic, dlq = make_topic(config, 1, "in"), make_topic(config, 1, "dlq")
    p = client.create_producer(topic)
    p.send(b"before", key=b"k0", partition=0)
    p.send(b"poison", key=b"kp", partition=0, headers=[("trace", b"t-1")])
    p.send(b"after", key=b"k2", partition=0)
    p.flush()
    sub = f"dl-{uuid.uuid4().hex[:6]}"
    script = tmp_path / "holder.py"
    script.write_text(HOLDER.replace("{max}", str(MAX)))
    out_log = tmp_path / "holder.log"
    a = proc_reaper.start_until([sys.executable, str(script), config.bootstrap_servers,
                                 config.topics.prefix, topic, dlq, sub], out_log, b"HOLDING")
    assert b"HOLDING 0" in out_log.read_bytes(), "the first delivery's count is not 0"
    a.send_signal(signal.SIGKILL)  # its txn holding the poison's ack times out: aborted
    a.wait(10)
    wait_until(lambda: client.admin.pending_ack_stats(f"{topic}-0", sub).max_redelivery_count
               == 1, 30, "the killed holder's txn aborted, counted in the pending-ack log")

    c = client.subscribe(topic, subscription=sub, dead_letter_policy=DeadLetterPolicy(MAX, dlq),
                         **SESSION)
    counts: list[int] = []
    others: list[bytes] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        m = c.receive(timeout_s=4)
        if m is None:
            if counts and counts[-1] == MAX:
                break  # the last delivery aborted: the next turn dead-letters it
            continue
        if m.value != b"poison":
            others.append(m.value)
            c.acknowledge(m)
            continue
        counts.append(m.redelivery_count)
        with pytest.raises(RuntimeError):
            with client.transaction() as txn:  # its processing fails: the txn aborts
                c.acknowledge(m, txn)
                raise RuntimeError("poison")
    c.close()
    assert counts == list(range(1, MAX + 1)), (
        f"the poison came with counts {counts}: the killed holder's abort was not counted "
        f"(it is 1 after the kill), or a count was skipped or repeated")
    assert b"after" in others and b"poison" not in others

    dead = dead_letters(config, dlq)
    assert [m.value for m in dead] == [b"poison"], f"dead letters: {[m.value for m in dead]}"
    d = dead[0]
    h = dict(d.headers)
    assert d.key == b"kp" and h["trace"] == b"t-1"
    assert h["REAL_TOPIC"] == topic.encode() and h["REAL_SUBSCRIPTION"] == sub.encode()
    assert h["ORIGIN_MESSAGE_ID"] == f"{topic}-0@1".encode()
    assert h["REDELIVERY_COUNT"] == str(MAX + 1).encode()

    with Client(config=config) as again:  # acked with its dead letter: never delivered again
        c2 = again.subscribe(topic, subscription=sub, **SESSION)
        later = []
        while (m := c2.receive(timeout_s=5)) is not None:
            later.append(m.value)
            c2.acknowledge(m)
        c2.close()
    assert b"poison" not in later, "a dead-lettered record was delivered again"


def test_negative_acks_count_across_a_rebalance_and_dead_letter_without_a_txn(
        config, worker, client):
    topic, dlq = make_topic(config, 1, "in"), make_topic(config, 1, "dlq")
    p = client.create_producer(topic)
    p.send(b"poison", partition=0)
    p.flush()
    sub = f"nk-{uuid.uuid4().hex[:6]}"
    policy = DeadLetterPolicy(1, dlq)
    c = client.subscribe(topic, subscription=sub, dead_letter_policy=policy,
                         nack_delay_s=0.2, **SESSION)
    m = c.receive(timeout_s=30)
    assert m is not None and m.redelivery_count == 0
    c.negative_acknowledge(m)
    c.negative_acknowledge(m)  # nacked twice before it comes back: it comes back once
    m = c.receive(timeout_s=10)
    assert m is not None and m.redelivery_count == 1
    c.close()  # the next owner knows the count from the pending-ack log

    c = client.subscribe(topic, subscription=sub, dead_letter_policy=policy,
                         nack_delay_s=0.2, **SESSION)
    m = c.receive(timeout_s=30)
    assert m is not None and m.redelivery_count == 1, "the count was lost in the rebalance"
    c.negative_acknowledge(m)
    assert c.receive(timeout_s=3) is None, "a record past the count was handed out"
    c.close()
    assert [d.value for d in dead_letters(config, dlq)] == [b"poison"]


def test_a_dead_letter_topic_that_is_missing_or_read_is_refused_naming_the_option(
        config, worker, client):
    topic = make_topic(config, 1, "in")
    missing = f"nope-{uuid.uuid4().hex}"
    with pytest.raises(ConfigError, match=f"dead_letter_topic.*{missing}.*does not exist"):
        client.subscribe(topic, subscription="s",
                         dead_letter_policy=DeadLetterPolicy(3, missing))
    from confluent_kafka.admin import AdminClient

    assert missing not in AdminClient(config.admin()).list_topics(timeout=10).topics, \
        "checking the dead-letter topic created it"
    with pytest.raises(ConfigError, match="a topic this subscription reads"):
        client.subscribe(topic, subscription="s", dead_letter_policy=DeadLetterPolicy(3, topic))
    with pytest.raises(ConfigError, match=r"default dead-letter topic.*does not exist"):
        client.subscribe(topic, subscription="s", dead_letter_policy=DeadLetterPolicy(3))
    with pytest.raises(ConfigError, match="dead_letter_policy must be"):
        client.subscribe(topic, subscription="s", dead_letter_policy={"max": 3})
