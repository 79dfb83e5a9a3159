"""A txn's marker reaches its buffer owner without waiting out the owner's parked fetch.

The owner's data consumer was made to fetch a partition only while nothing it fetched
was left unread (``queued.min.messages`` 1, over the queue its native scan reads all
partitions from). A txn's record left its partition out of the fetch then parked on the
broker, so the commit marker written right after waited for that fetch to end: at the
fetch wait (100 ms), or at the next record on another partition. At 1,024 partitions
that was the produce-to-visible p99 (111 ms against 9 at 4, ``bench.scale``, stop 59).
Here the fetch wait is 3 s, so a marker left out of the parked fetch cannot pass.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.integration.buffer.conftest import make_topic, wait_until
from txnstream import Client
from txnstream.buffer import scan
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker

pytestmark = pytest.mark.integration

WIDTH = 256
FETCH_WAIT_MS = 3000


def test_a_commit_is_served_without_waiting_for_the_owners_parked_fetch(own_config,
                                                                        monkeypatch):
    monkeypatch.setitem(scan.PACED_FETCH, "fetch.wait.max.ms", FETCH_WAIT_MS)
    worker = CoordinatorWorker(own_config, settings=WorkerSettings(session_timeout_ms=6000))
    worker.start()
    client = Client(config=own_config)
    reader = None
    try:
        wait_until(lambda: len(worker.serving()) == own_config.num_coordinators, 60,
                   "worker serving")
        topic = make_topic(own_config, WIDTH)
        producer = client.create_producer(topic)
        with client.transaction() as txn:  # every partition served first
            for p in range(WIDTH):
                producer.send(b"warm", partition=p, txn=txn)
        reader = client.subscribe(topic, subscription=f"mf-{uuid.uuid4().hex[:6]}")
        got = 0
        deadline = time.monotonic() + 60
        while got < WIDTH and time.monotonic() < deadline:
            got += len(reader.receive_batch(100, 0.5))
        assert got == WIDTH
        took = []
        for i in range(6):
            time.sleep(0.3)  # the owner's fetch parks again, nothing else arriving
            with client.transaction() as txn:
                producer.send(str(i).encode(), partition=i % WIDTH, txn=txn)
            done = time.monotonic()
            msgs = []
            while not msgs and time.monotonic() - done < 2 * FETCH_WAIT_MS / 1000:
                msgs = reader.receive_batch(10, 0.05)
            assert [m.value for m in msgs] == [str(i).encode()]
            took.append(round(time.monotonic() - done, 3))
    finally:
        if reader is not None:
            reader.close()
        client.close()
        worker.stop()
    slow = [t for t in took if t > FETCH_WAIT_MS / 1000 / 3]
    assert not slow, (f"commits delivered {took} s after they returned: waited for the "
                      f"owner's parked fetch ({FETCH_WAIT_MS} ms)")
