"""Exactly-once Spark sink through kill -9 of the driver, restarted from its checkpoint."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.spark.conftest import make_topic
from txnstream import Client

pytestmark = [pytest.mark.spark, pytest.mark.fault]

JOB = str(Path(__file__).with_name("upper_job.py"))
ROWS = 3000


def test_driver_killed_and_restarted_writes_every_row_exactly_once(config, worker, client,
                                                                   tmp_path, proc_reaper):
    src, dst = make_topic(config, 2, "src"), make_topic(config, 2, "dst")
    p = client.create_producer(src)
    with client.transaction() as txn:
        for i in range(ROWS):
            p.send(f"r{i}".encode(), key=str(i).encode(), txn=txn)
    ckpt = str(tmp_path / "ckpt")
    args = [sys.executable, JOB, config.bootstrap_servers, config.topics.prefix, src, dst, ckpt]
    rng = random.Random(5)
    kills = 0
    batches_at_kill: list[int] = []
    for attempt in range(3):
        log = open(tmp_path / f"run{attempt}.log", "ab")
        proc = proc_reaper.track(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                                  start_new_session=True))
        time.sleep(rng.uniform(22, 32))      # Spark start-up (~20 s here), then mid-batches
        if proc.poll() is None:
            commits = Path(ckpt) / "commits"
            batches_at_kill.append(len([f for f in commits.iterdir() if f.name.isdigit()])
                                   if commits.exists() else 0)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills += 1
    final = proc_reaper.track(subprocess.Popen(args, stdout=open(tmp_path / "final.log", "ab"),
                                               stderr=subprocess.STDOUT, start_new_session=True))
    assert final.wait(300) == 0, (tmp_path / "final.log").read_text()[-3000:]
    assert kills >= 1
    print("committed batches at each kill:", batches_at_kill)
    # at least one kill came after some batches committed and before the last (10 in all)
    assert any(0 < b < ROWS // 300 for b in batches_at_kill), batches_at_kill
    with Client(config=config) as reader:
        c = reader.subscribe(dst, subscription=f"chk-{uuid.uuid4().hex[:6]}")
        out = []
        while (m := c.receive(timeout_s=15)) is not None:
            out.append(m.value)
            c.acknowledge(m)
        c.close()
    assert len(out) - len(set(out)) == 0, "a row was written twice"
    assert set(out) == {f"R{i}".encode() for i in range(ROWS)}
