"""A takeover ends a dead predecessor's txn at once: inputs come back in order (issue 20 #6).

A processor acks inputs 0..49 in its txn and is killed -9 before committing. Before,
the member that took the partition over held those inputs until the dead txn timed out
(15 s) and processed 50..299 first: output 0 landed at position 250. Now the takeover
aborts the txn of the predecessor that is no longer in the group, so the outputs keep
the input order.
"""

from __future__ import annotations

import signal
import sys
import textwrap
import time
import uuid

import pytest

from tests.integration.pendingack.conftest import make_topic, wait_until
from txnstream import Client
from txnstream.processor import ExactlyOnceProcessor
from txnstream.types import TxnStatus

pytestmark = [pytest.mark.integration, pytest.mark.fault]

INPUTS = 300
BATCH = 50
TXN_TIMEOUT_S = 15

DYING_PROCESSOR = textwrap.dedent("""
    import sys, time
    from txnstream import Client, Config
    from txnstream.config import TopicNames
    from txnstream.processor import ExactlyOnceProcessor
    from txnstream.transaction import Transaction

    bootstrap, prefix, src, dst, sub = sys.argv[1:6]
    client = Client(config=Config(bootstrap_servers=bootstrap, topics=TopicNames(prefix),
                                  num_coordinators=4))

    def stuck_commit(self):  # acks and outputs durable, then the process dies (kill -9)
        self.flush()
        print("ACKED", self.id, flush=True)
        time.sleep(3600)

    Transaction.commit = stuck_commit
    p = ExactlyOnceProcessor(client, src, sub, dst, lambda m: m.value.upper(),
                             batch_size={batch}, batch_interval_s=5, txn_timeout_s={timeout},
                             **{"session.timeout.ms": 6000})
    while True:  # until a batch is taken (joining the group takes a while)
        p.run_batch()
""")


def test_takeover_aborts_a_killed_processors_txn_and_keeps_input_order(config, worker, client,
                                                                      tmp_path, proc_reaper):
    src, dst = make_topic(config, 1, "in"), make_topic(config, 1, "out")
    p = client.create_producer(src)
    for i in range(INPUTS):
        p.send(f"v{i}".encode(), partition=0)
    p.flush()
    sub = f"take-{uuid.uuid4().hex[:6]}"
    script = tmp_path / "dying.py"
    script.write_text(DYING_PROCESSOR.replace("{batch}", str(BATCH))
                      .replace("{timeout}", str(TXN_TIMEOUT_S)))
    out_log = tmp_path / "a.log"
    a = proc_reaper.start_until([sys.executable, str(script), config.bootstrap_servers,
                                 config.topics.prefix, src, dst, sub], out_log, b"ACKED")
    a.send_signal(signal.SIGKILL)
    a.wait(10)
    killed_at = time.monotonic()

    b = ExactlyOnceProcessor(client, src, sub, dst, lambda m: m.value.upper(),
                             batch_size=BATCH, batch_interval_s=0.3,
                             txn_timeout_s=TXN_TIMEOUT_S, **{"session.timeout.ms": 6000})
    first_input_at = None
    try:
        deadline = time.monotonic() + 90
        while b.stats.inputs < INPUTS and time.monotonic() < deadline:
            if b.run_batch() and first_input_at is None:
                first_input_at = time.monotonic()
    finally:
        b.close()
    assert b.stats.inputs == INPUTS, f"only {b.stats.inputs} of {INPUTS} inputs processed"

    with Client(config=config) as reader:
        c = reader.subscribe(dst, subscription=f"check-{uuid.uuid4().hex[:6]}")
        out: list[bytes] = []
        while len(out) < INPUTS and (m := c.receive(timeout_s=5)) is not None:
            out.append(m.value)
        c.close()
    want = [f"V{i}".encode() for i in range(INPUTS)]
    assert sorted(out) == sorted(want), "an output is missing or duplicated"
    assert out == want, (f"outputs out of input order: output V0 at position "
                         f"{out.index(b'V0')}, first outputs {out[:3]}")
    assert first_input_at is not None
    waited = first_input_at - killed_at
    assert waited < TXN_TIMEOUT_S, (f"the replacement's first batch came {waited:.1f}s after "
                                    f"the kill: it waited for the dead txn's timeout")


SESSION = {"session.timeout.ms": 6000}


def test_taking_one_partition_leaves_the_txn_on_the_other_alone(config, worker, client):
    topic = make_topic(config, 2)
    p = client.create_producer(topic)
    for i in range(10):
        p.send(f"m{i}".encode(), partition=i % 2)
    p.flush()
    sub = f"live-{uuid.uuid4().hex[:6]}"
    # the exactly-once processor's setting: a takeover aborts a predecessor's OPEN txn
    a = client.subscribe(topic, subscription=sub, abort_predecessor_txns=True, **SESSION)
    got = {}
    deadline = time.monotonic() + 20
    while len(got) < 2 and time.monotonic() < deadline:
        m = a.receive(timeout_s=1)
        if m is not None:
            got.setdefault(m.partition, m)
    t = {part: client.new_transaction(timeout_s=60) for part in got}
    for part, m in got.items():
        a.acknowledge(m, txn=t[part])
        t[part].flush()
    b = client.subscribe(topic, subscription=sub, abort_predecessor_txns=True, **SESSION)
    wait_until(lambda: (a.receive(timeout_s=0.2), b.receive(timeout_s=0.2))
               and len(b._readers) == 1 and len(a._readers) == 1, 60, "a rebalance 1:1")
    moved = next(iter(b._readers)).partition
    kept = next(iter(a._readers)).partition
    assert client.admin.get_transaction(t[moved].id).status is TxnStatus.ABORTED, (
        "the txn holding acks on the partition taken over is aborted")
    t[kept].commit()                 # its member still owns that partition: untouched
    assert client.admin.get_transaction(t[kept].id).status is TxnStatus.COMMITTED
    a.close()
    b.close()
