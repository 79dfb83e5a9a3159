"""Consume-transform-produce exactly once through kill -9 of processor processes."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.pendingack.conftest import make_topic
from txnstream import Client

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]

TXNSTREAM_BIN = str(Path(sys.executable).with_name("txnstream"))
INPUTS = 60_000
FEED_CHUNKS = 60
FEED_PAUSE_S = 0.15
"""The inputs are fed in chunks over ~9 s while the processors start, so the first kill,
made as soon as outputs appear, lands while inputs are still arriving: fed at once,
20,000 and then 60,000 were all processed before it (native sends since stop 51, a
commit's first request 15 ms since stop 63: 60,008 records and markers out at the
first kill in stop 64's run)."""


def records_in(config, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(config.consumer(f"hw-{uuid.uuid4().hex[:6]}"))
    try:
        return sum(c.get_watermark_offsets(TopicPartition(topic, i), timeout=10)[1]
                   for i in range(4))
    finally:
        c.close()


def start(config, src, dst, sub, log_path):
    return subprocess.Popen(
        [TXNSTREAM_BIN, "--bootstrap", config.bootstrap_servers, "process", src, dst,
         "--prefix", config.topics.prefix, "--subscription", sub, "--batch-size", "200",
         "--batch-interval", "0.3", "--txn-timeout", "6", "--session-timeout-ms", "6000",
         "--idle", "25"],
        stdout=open(log_path, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def test_three_processors_killed_at_random_output_exactly_once(config, worker, client,
                                                               tmp_path, proc_reaper):
    src, dst = make_topic(config, 4, "in"), make_topic(config, 4, "out")
    p = client.create_producer(src)
    sub = f"eo-{uuid.uuid4().hex[:6]}"
    rng = random.Random(11)
    procs = {n: proc_reaper.track(start(config, src, dst, sub, tmp_path / f"{n}.log"))
             for n in ("a", "b", "c")}

    def feed() -> None:
        per = INPUTS // FEED_CHUNKS
        for chunk in range(FEED_CHUNKS):
            for i in range(chunk * per, (chunk + 1) * per):
                p.send(f"v{i}".encode(), key=str(i).encode())
            p.flush()
            time.sleep(FEED_PAUSE_S)

    feeder = threading.Thread(target=feed, name="feeder", daemon=True)
    feeder.start()
    kills = 0
    written_at_kill: list[int] = []
    t_end = time.monotonic() + 60
    while kills < 6 and time.monotonic() < t_end:
        if kills:
            time.sleep(rng.uniform(2.0, 5.0))
        else:  # the first kill as soon as outputs are being written, while inputs still
            # arrive: mid-work, however fast the processors are
            while records_in(config, dst) == 0 and time.monotonic() < t_end:
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.3))
        name = rng.choice(list(procs))
        if procs[name].poll() is None:
            written_at_kill.append(records_in(config, dst))
            procs[name].send_signal(signal.SIGKILL)
            procs[name].wait(10)
            kills += 1
        time.sleep(rng.uniform(0.5, 2.0))
        procs[name] = proc_reaper.track(start(config, src, dst, sub, tmp_path / f"{name}.log"))
    feeder.join(60)
    assert not feeder.is_alive(), "the inputs were not all sent within 60 s"
    print("output records+markers at each kill:", written_at_kill)
    for proc in procs.values():
        proc.wait(300)      # each stops after 25 s without input
    assert kills >= 3
    # the first kill landed while work was under way (records + markers written so far)
    assert written_at_kill[0] < INPUTS, written_at_kill
    with Client(config=config) as reader:
        c = reader.subscribe(dst, subscription=f"check-{uuid.uuid4().hex[:6]}")
        out = []
        while (m := c.receive(timeout_s=8)) is not None:
            out.append(m.value)
            c.acknowledge(m)
        c.close()
        pending = [reader.admin.pending_ack_stats(f"{src}-{i}", sub) for i in range(4)]
    want = {f"V{i}".encode() for i in range(INPUTS)}
    dupes = len(out) - len(set(out))
    missing = want - set(out)
    assert dupes == 0, f"{dupes} outputs duplicated"
    assert not missing, f"{len(missing)} inputs have no output, e.g. {sorted(missing)[:3]}"
    assert set(out) == want
    assert all(s.pending_offsets == 0 and s.cumulative_pending is None for s in pending), pending
