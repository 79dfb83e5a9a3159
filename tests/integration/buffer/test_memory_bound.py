"""Peak memory of a committed-only consumer stays bounded while a 1 GB txn is open."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from tests.integration.buffer.conftest import make_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RECORD = 512 * 1024
RECORDS = 2048            # 1 GiB in one transaction
BOUND = 32 * 1024 * 1024  # what the consumer may hold: librdkafka's queue (16 MiB) + a fetch
RSS_LIMIT_MB = 128        # Python (~30 MiB) + librdkafka's queue + the bound, far below 1 GiB

CONSUMER = textwrap.dedent("""
    import json, sys, time
    from txnstream import Client, Config, TopicNames
    boot, prefix, topic, want, bound = sys.argv[1:6]
    cfg = Config(bootstrap_servers=boot, topics=TopicNames(prefix))
    with Client(config=cfg) as client:
        c = client.subscribe(topic, subscription="mem-" + str(time.time()),
                             **{"queued.max.messages.kbytes": 16384,
                                "fetch.max.bytes": 8 * 1024 * 1024,
                                "max.partition.fetch.bytes": 2 * 1024 * 1024})
        n, plain, blocked_seen = 0, 0, False
        deadline = time.monotonic() + 600
        while n < int(want) and time.monotonic() < deadline:
            m = c.receive(timeout_s=1)
            if m is None:
                blocked_seen = True
                print("idle", flush=True)
                continue
            n += 1
            plain += m.txn_id is None
            c.acknowledge(m)
        c.close()
    # This process's own peak (VmHWM). Not getrusage's ru_maxrss: Linux carries that
    # across exec, so it would be the (larger) pytest process that spawned this one.
    with open("/proc/self/status") as status:
        hwm_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    rss = hwm_kb / 1024
    print(json.dumps({"received": n, "plain": plain, "peak_rss_mb": rss}), flush=True)
""")


def test_consumer_memory_stays_bounded_while_a_1gb_txn_is_open(config, worker, client,
                                                              tmp_path, proc_reaper):
    topic = make_topic(config, 1)
    producer = client.create_producer(topic, **{"message.max.bytes": 2 * RECORD,
                                                "queue.buffering.max.kbytes": 262144})
    producer.send(b"plain-before", partition=0)
    txn = client.new_transaction(timeout_s=900)
    payload = b"x" * RECORD
    for i in range(RECORDS):
        producer.send(payload, txn=txn, partition=0)
        if i % 64 == 63:
            producer.flush_transaction(txn)
    producer.flush_transaction(txn)
    producer.send(b"plain-after", partition=0)
    producer.flush()
    script = tmp_path / "consumer.py"
    script.write_text(CONSUMER)
    want = RECORDS + 2
    proc = proc_reaper.track(subprocess.Popen(
        [sys.executable, str(script), config.bootstrap_servers, config.topics.prefix, topic,
         str(want), str(BOUND)], stdout=subprocess.PIPE, text=True))
    # the consumer folds the whole open txn while holding at most BOUND bytes of it
    assert proc.stdout is not None
    first = proc.stdout.readline()
    deadline = time.monotonic() + 300
    idles = 0
    while first.strip() == "idle" and idles < 20 and time.monotonic() < deadline:
        idles += 1
        first = proc.stdout.readline()
    txn.commit()
    out = proc.communicate(timeout=600)[0].splitlines()
    result = json.loads(out[-1])
    print("memory-bound result:", result)
    assert result["received"] == want, result
    assert result["plain"] == 2
    assert result["peak_rss_mb"] < RSS_LIMIT_MB, result
