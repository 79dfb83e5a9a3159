"""A record is in a txn only if its writers made it so (issue 33 items 1, 2), on a real broker.

Forged records come from a plain confluent-kafka producer, as any producer that may
write a data topic could write them; the worker holds the workers' secret. On the old
code a ``txn.id`` header was enough to claim membership:

* junk naming the next TxnIDs made the buffer owner write a signed ABORT marker for
  each ("never issued: forged"), which ended those TxnIDs there for good: the honest
  txns later issued under them committed, and no reader saw a record of them;
* junk naming a live txn held its partition for that txn's whole life.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer as KafkaProducer

from tests.integration.buffer.test_forged_records import (  # noqa: F401  (a fixture)
    receive_all,
    registered_topic,
    signed,
)
from txnstream import TxnID
from txnstream.markers import TXN_ID_HEADER, TXN_TAG_HEADER

pytestmark = pytest.mark.integration

FUTURE = 400
"""Sequences forged ahead on every coordinator: more than the 40 txns the test commits
take, whatever blocks the client reserves."""


def test_junk_naming_future_txnids_hides_no_later_commit(signed):  # noqa: F811
    """Old: 0 of 40 honest commits delivered (each sat after 'its' ABORT marker)."""
    cfg, client = signed
    topic = registered_topic(cfg, client)
    raw = KafkaProducer(cfg.producer())
    for tc in range(cfg.num_coordinators):
        for seq in range(FUTURE):
            raw.produce(topic, b"junk", partition=0,
                        headers=[(TXN_ID_HEADER, TxnID(tc, seq).to_bytes())])
    raw.produce(topic, b"junk-tagged", partition=0,  # a tag of its own making
                headers=[(TXN_ID_HEADER, TxnID(0, 1).to_bytes()),
                         (TXN_TAG_HEADER, b"\x01" * 16)])
    raw.produce(topic, b"after-junk", partition=0)
    raw.flush(30)
    # Once a reader is past the junk, the owner has judged it (the old owner, by writing
    # an ABORT marker for each TxnID not issued yet).
    first = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    try:
        assert b"after-junk" in receive_all(first, {b"after-junk"}, 60)
    finally:
        first.close()
    producer = client.create_producer(topic)
    want: set[bytes] = set()
    for i in range(40):
        with client.new_transaction() as txn:
            assert txn.id.least_bits < FUTURE
            v = f"honest-{i}".encode()
            producer.send(v, txn=txn, partition=0)
            want.add(v)
    consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    try:
        got = receive_all(consumer, want | {b"first", b"after-junk"}, 60)
    finally:
        consumer.close()
    assert want | {b"first"} <= set(got), f"{len(want - set(got))} of 40 commits hidden"
    assert b"junk" not in got and b"junk-tagged" not in got
    assert len(got) == len(set(got)) == 42, "a record delivered twice"


def test_junk_naming_a_live_txn_holds_nothing_and_joins_nothing(signed):  # noqa: F811
    """Old: the reader stopped at the junk record for the live txn's whole life."""
    cfg, client = signed
    topic = registered_topic(cfg, client)
    alice = client.new_transaction(timeout_s=120)
    raw = KafkaProducer(cfg.producer())
    raw.produce(topic, b"forged", partition=0,
                headers=[(TXN_ID_HEADER, alice.id.to_bytes())])
    raw.produce(topic, b"plain-after", partition=0)
    raw.flush(10)
    consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    try:
        t0 = time.monotonic()
        early = receive_all(consumer, {b"first", b"plain-after"}, 20)
        took = time.monotonic() - t0
        assert b"plain-after" in early, "a junk txn.id held the partition for a live txn"
        assert took < 20
        client.create_producer(topic).send(b"alice", txn=alice, partition=0)
        alice.commit()
        late = receive_all(consumer, {b"alice"}, 30)
    finally:
        consumer.close()
    assert b"alice" in late
    assert b"forged" not in early + late, "a forged record joined the txn it named"
