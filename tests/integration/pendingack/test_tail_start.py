"""A subscription's pending-ack tail reads its first ack records at once.

Its consumer is assigned the log partitions of the subscription's input partitions.
librdkafka asks for the metadata of an assigned topic it does not know only at its next
topic scan, once a second, so a new tail read nothing for 0.5-1 s: every processor's
first checkpoint waited that long for its acks' read-back.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.integration.pendingack.conftest import make_topic
from txnstream import Client

pytestmark = pytest.mark.integration

ROUNDS = 4
SCAN_S = 1.0
"""librdkafka's topic scan interval: a tail that waits for it waits up to this long."""


def test_a_new_subscriptions_first_acks_are_read_back_without_a_metadata_scan(config, worker):
    waits = []
    for _ in range(ROUNDS):  # a client of its own each: a tail of its own
        with Client(config=config) as client:
            topic = make_topic(config, 1)
            p = client.create_producer(topic)
            p.send(b"x", partition=0)
            p.flush()
            c = client.subscribe(topic, subscription=f"tail-{uuid.uuid4().hex[:6]}")
            m = c.receive(timeout_s=30)
            assert m is not None, "the record was not delivered"
            txn = client.new_transaction()
            c.acknowledge(m, txn=txn)
            t0 = time.monotonic()
            txn.commit()
            waits.append(time.monotonic() - t0)
            c.close()
    assert max(waits) < SCAN_S / 3, (
        f"first commits with an ack took {[round(w, 3) for w in waits]} s: a wait for "
        "librdkafka's topic scan before the tail fetched")
