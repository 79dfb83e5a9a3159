"""Prepared transactions on the real broker (issue 39).

``txn.prepare()`` makes a txn that can no longer change, outlives its timeout, holds its
partitions' committed-only readers, and is completed by any process of its owner
(``client.complete_transaction``), also after a coordinator failover; past its maximum
prepared age the coordinator aborts it and says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from tests.integration.coordinator.conftest import TXNSTREAM_BIN, make_topic, owners, wait_until
from tests.integration.coordinator.test_coordinator_faults import all_served_by
from txnstream import Client
from txnstream.errors import InvalidTxnStatusError, TransactionTimeoutError
from txnstream.types import TxnStatus

pytestmark = [pytest.mark.integration]


def complete_elsewhere(config, txn_id: str, commit: bool) -> str:
    """``complete_transaction`` from a new process; what it printed (the status)."""
    code = textwrap.dedent(f"""
        from txnstream import Client
        from txnstream.config import Config, TopicNames
        cfg = Config(bootstrap_servers={config.bootstrap_servers!r},
                     topics=TopicNames({config.topics.prefix!r}),
                     num_coordinators={config.num_coordinators})
        with Client(config=cfg) as c:
            print(c.complete_transaction({txn_id!r}, {commit!r}).value)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def read_committed(client: Client, topic: str, quiet_s: float, expect: int = 0) -> list[bytes]:
    """Committed records of ``topic``: up to a minute for ``expect`` of them (a buffer
    owner may be taking over), then until none comes for ``quiet_s``."""
    c = client.subscribe(topic, subscription=f"prep-{uuid.uuid4().hex[:6]}")
    got: list[bytes] = []
    while (m := c.receive(timeout_s=60 if len(got) < expect else quiet_s)) is not None:
        got.append(m.value)
        c.acknowledge(m)
    c.close()
    return got


def test_a_prepared_txn_outlives_its_timeout_and_another_process_commits_it(
        config, worker, client):
    topic = make_topic(config, 2)
    p = client.create_producer(topic)
    txn = client.new_transaction(timeout_s=2, max_prepared_s=120)
    p.send(b"a", partition=0, txn=txn)
    p.send(b"b", partition=1, txn=txn)
    txn.prepare()
    assert txn.status is TxnStatus.PREPARED and txn.info().status is TxnStatus.PREPARED
    txn.prepare()  # again: nothing changes
    with pytest.raises(InvalidTxnStatusError, match="PREPARED"):
        p.send(b"late", partition=0, txn=txn)
    # twice its timeout: readers see none of it, and the coordinator keeps it
    assert read_committed(client, topic, quiet_s=4.0) == []
    assert client.admin.get_transaction(txn.id).status is TxnStatus.PREPARED
    listed = subprocess.run(
        [TXNSTREAM_BIN, "--bootstrap", config.bootstrap_servers, "txn",
         "list", "--prepared", "--prefix", config.topics.prefix],  # 4 coordinators, as here
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"})
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "prepared transactions" in listed.stdout and str(txn.id) in listed.stdout
    assert "120s" in listed.stdout, listed.stdout  # its maximum prepared age
    assert complete_elsewhere(config, str(txn.id), True) == "COMMITTED"
    assert complete_elsewhere(config, str(txn.id), True) == "COMMITTED"  # idempotent
    assert sorted(read_committed(client, topic, quiet_s=3.0, expect=2)) == [b"a", b"b"]
    with pytest.raises(InvalidTxnStatusError):
        client.complete_transaction(txn.id, False)  # it committed: no abort now


def test_a_prepared_txn_aborted_by_another_process_is_never_read(config, worker, client):
    topic = make_topic(config, 1)
    p = client.create_producer(topic)
    with client.transaction() as before:
        p.send(b"before", txn=before)
    txn = client.new_transaction(max_prepared_s=60)
    p.send(b"gone", txn=txn)
    txn.prepare()
    assert complete_elsewhere(config, str(txn.id), False) == "ABORTED"
    with client.transaction() as after:
        p.send(b"after", txn=after)
    assert read_committed(client, topic, quiet_s=3.0, expect=2) == [b"before", b"after"]


def test_past_its_maximum_prepared_age_it_is_aborted_and_reported(config, worker, client):
    topic = make_topic(config, 1)
    p = client.create_producer(topic)
    txn = client.new_transaction(timeout_s=30, max_prepared_s=2)
    p.send(b"x", txn=txn)
    txn.prepare()
    wait_until(lambda: client.admin.get_transaction(txn.id).status is TxnStatus.ABORTED, 30,
               "the coordinator aborting it at its maximum prepared age")
    info = client.admin.get_transaction(txn.id)
    assert info.abort_reason == "prepared-age"
    with pytest.raises(TransactionTimeoutError, match="maximum prepared age"):
        client.complete_transaction(str(txn.id), True)
    assert read_committed(client, topic, quiet_s=3.0) == []


def test_a_prepared_txn_survives_its_coordinators_kill9(config, worker_procs, client):
    topic = make_topic(config, 2)
    for name in ("w1", "w2"):
        worker_procs.start(name)
    n = config.num_coordinators
    wait_until(lambda: all_served_by(client, {"w1", "w2"}, n), 90, "2 workers serving")
    p = client.create_producer(topic)
    txn = client.new_transaction(timeout_s=3, max_prepared_s=300)
    p.send(b"p0", partition=0, txn=txn)
    p.send(b"p1", partition=1, txn=txn)
    txn.prepare()
    victim = owners(client)[txn.id.tc_id]
    worker_procs.signal(victim, signal.SIGKILL)
    survivor = ({"w1", "w2"} - {victim}).pop()
    wait_until(lambda: all_served_by(client, {survivor}, n), 90, "the survivor taking over")
    time.sleep(4)  # past its timeout on the new owner too
    assert client.admin.get_transaction(txn.id).status is TxnStatus.PREPARED
    assert complete_elsewhere(config, str(txn.id), True) == "COMMITTED"
    assert sorted(read_committed(client, topic, quiet_s=3.0, expect=2)) == [b"p0", b"p1"]
