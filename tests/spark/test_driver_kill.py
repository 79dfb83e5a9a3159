"""Exactly-once Spark sink through kill -9 of the driver, restarted from its checkpoint."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.spark.conftest import drain, make_topic
from txnstream import TxnStatus

# By itself, after the parallel run (`alone`): beside it (load average 16 on 2 cores) a
# driver's Spark Python worker once took longer than Spark's fixed 10 s to connect back
# ("Python worker failed to connect back", SPARK-45245), and the query died before the
# kill it was waiting for (stop 44's CI). Each test is a few JVMs at once anyway.
pytestmark = [pytest.mark.spark, pytest.mark.fault, pytest.mark.slow, pytest.mark.alone,
              pytest.mark.xdist_group("spark-drivers")]  # one at a time: JVM-heavy

JOB = str(Path(__file__).with_name("upper_job.py"))
ROWS = 3000
START_S = 420
"""How long a driver may take to get where the test kills it: on a quiet 2-core machine a
minute (JVM, Spark's Python workers, the first batch); under the whole suite's load, in
CI, 5x that was seen."""
RUN_TIMEOUT_S = 2 * START_S + 300 + 120
"""The whole test: its own waits (two drivers killed, the last run, the drain) fail it
with a message first; pytest-timeout's default (600 s) is shorter than their sum."""


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_driver_killed_and_restarted_writes_every_row_exactly_once(config, worker, client,
                                                                   tmp_path, proc_reaper):
    src, dst = make_topic(config, 2, "src"), make_topic(config, 2, "dst")
    _fill(client, src, ROWS)
    ckpt = str(tmp_path / "ckpt")
    args = [sys.executable, JOB, config.bootstrap_servers, config.topics.prefix, src, dst, ckpt]
    rng = random.Random(5)
    commits = Path(ckpt) / "commits"

    def committed() -> int:
        return len([f for f in commits.iterdir() if f.name.isdigit()]) if commits.exists() else 0

    kills = 0
    batches_at_kill: list[int] = []
    for attempt in range(2):  # two kills, then a run to the end
        log = open(tmp_path / f"run{attempt}.log", "ab")
        proc = proc_reaper.track(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                                  start_new_session=True))
        # kill once the job has committed attempt+1 batches in all (whatever its start-up
        # takes on a busy machine), a random moment later: mid-batch or mid-commit
        deadline = time.monotonic() + START_S
        while committed() < attempt + 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(rng.uniform(0, 1.5))
        if proc.poll() is None:
            batches_at_kill.append(committed())
            os.killpg(proc.pid, signal.SIGKILL)  # the whole driver: Python, JVM, workers
            proc.wait(10)
            kills += 1
    final = proc_reaper.track(subprocess.Popen(args + ["--available-now"],
                                               stdout=open(tmp_path / "final.log", "ab"),
                                               stderr=subprocess.STDOUT, start_new_session=True))
    assert final.wait(300) == 0, (tmp_path / "final.log").read_text()[-3000:]
    assert kills >= 1
    print("committed batches at each kill:", batches_at_kill)
    # at least one kill came after some batches committed and before the last (10 in all)
    assert any(0 < b < ROWS // 300 for b in batches_at_kill), batches_at_kill
    out = drain(config, dst, expect=ROWS)
    assert len(out) - len(set(out)) == 0, "a row was written twice"
    assert set(out) == {f"R{i}".encode() for i in range(ROWS)}


def _fill(client, src: str, rows: int) -> None:
    p = client.create_producer(src)
    with client.transaction() as txn:
        for i in range(rows):
            p.send(f"r{i}".encode(), key=str(i).encode(), txn=txn)


@pytest.mark.timeout(RUN_TIMEOUT_S)
@pytest.mark.parametrize("point", ["sink-commit-before-end", "sink-commit-after-end"])
def test_driver_killed_inside_a_commit_writes_every_row_exactly_once(
        point, config, worker, client, tmp_path, proc_reaper):
    """kill -9 of the whole driver (JVM, Python driver and workers) while batch 2 commits.

    before-end: the tasks' transactions are open, the group end not sent; the restart
    replays batch 2 in new transactions, and its group end aborts the orphans (they were
    opened for the same key), long before their 600 s timeout would.
    after-end: the coordinator has committed the group (query id, 2) but Spark has not
    recorded the batch; the restart replays it, finds the key committed, and the
    coordinator aborts the replay's transactions.
    """
    rows = 1500
    src, dst = make_topic(config, 2, "src"), make_topic(config, 2, "dst")
    _fill(client, src, rows)
    ckpt = tmp_path / "ckpt"
    flag = tmp_path / "paused"
    args = [sys.executable, JOB, config.bootstrap_servers, config.topics.prefix, src, dst,
            str(ckpt)]
    env = dict(os.environ, TXNSTREAM_PAUSE_AT=f"{point}:2:{flag}")
    with open(tmp_path / "crash.log", "ab") as log:
        proc = proc_reaper.track(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                                  env=env, start_new_session=True))
    deadline = time.monotonic() + START_S
    while not flag.exists():
        assert proc.poll() is None, (tmp_path / "crash.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the job never reached the pause point"
        time.sleep(0.2)
    # inside the commit of batch 2: planned (offsets/2) but not recorded (commits/2)
    assert (ckpt / "offsets" / "2").exists() and not (ckpt / "commits" / "2").exists()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    with open(tmp_path / "final.log", "ab") as log:
        final = proc_reaper.track(subprocess.Popen(args + ["--available-now"], stdout=log,
                                                   stderr=subprocess.STDOUT,
                                                   start_new_session=True))
        assert final.wait(300) == 0, (tmp_path / "final.log").read_text()[-3000:]
    if point == "sink-commit-after-end":
        assert "was committed before: its replay was aborted" in \
            (tmp_path / "final.log").read_text(), "batch 2 was not replayed against its key"
    out = drain(config, dst, expect=rows)
    assert len(out) - len(set(out)) == 0, "a row was written twice"
    assert set(out) == {f"R{i}".encode() for i in range(rows)}
    batch2 = [t for t in client.admin.list_transactions()
              if t.group_key and t.group_key.endswith("/2")]
    committed = [t for t in batch2 if t.status is TxnStatus.COMMITTED]
    aborted = [t for t in batch2 if t.status is not TxnStatus.COMMITTED]
    assert committed, "batch 2 committed nothing"
    assert aborted, "no orphan or replayed transaction of batch 2"
    # ended by batch 2's group end, not by their timeout: readers were never held 600 s
    assert all(t.status is TxnStatus.ABORTED and t.abort_reason == "group" for t in aborted), \
        [(str(t.txn_id), t.status.value, t.abort_reason) for t in aborted]
