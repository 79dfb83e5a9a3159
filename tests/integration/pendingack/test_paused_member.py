"""A processor paused past its group session timeout rejoins and carries on; exactly once."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid

import pytest

from tests.integration.pendingack.conftest import make_topic
from tests.integration.pendingack.test_exactly_once_crashes import TXNSTREAM_BIN
from txnstream import Client

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]

INPUTS = 1_500
PAUSE_S = 10          # the processors' session timeout is 6 s
PAUSES = 3


def start_cumulative(config, src, dst, sub, log_path):
    return subprocess.Popen(
        [TXNSTREAM_BIN, "--bootstrap", config.bootstrap_servers, "process", src, dst,
         "--prefix", config.topics.prefix, "--subscription", sub, "--batch-size", "50",
         "--batch-interval", "0.3", "--txn-timeout", "8", "--session-timeout-ms", "6000",
         "--cumulative", "--idle", "300"],
        stdout=open(log_path, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def test_processor_paused_past_its_session_timeout_rejoins_exactly_once(config, worker, client,
                                                                       tmp_path, proc_reaper):
    src, dst = make_topic(config, 4, "in"), make_topic(config, 4, "out")
    sub = f"pause-{uuid.uuid4().hex[:6]}"
    a = proc_reaper.track(start_cumulative(config, src, dst, sub, tmp_path / "a.log"))
    b = proc_reaper.track(start_cumulative(config, src, dst, sub, tmp_path / "b.log"))

    def feed():  # a stream, so work is under way at every pause
        p = client.create_producer(src)
        for i in range(INPUTS):
            p.send(f"v{i}".encode(), key=str(i).encode())
            if i % 25 == 24:
                p.flush()
                time.sleep(0.5)
        p.flush()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    time.sleep(6)
    for _ in range(PAUSES):
        a.send_signal(signal.SIGSTOP)
        time.sleep(PAUSE_S)
        a.send_signal(signal.SIGCONT)
        time.sleep(6)
        assert a.poll() is None, ("the paused processor died on resume:\n"
                                  + (tmp_path / "a.log").read_text()[-3000:])
    feeder.join(120)
    with Client(config=config) as reader:
        c = reader.subscribe(dst, subscription=f"check-{uuid.uuid4().hex[:6]}")
        out: list[bytes] = []
        deadline = time.monotonic() + 180
        while len(set(out)) < INPUTS and time.monotonic() < deadline:
            m = c.receive(timeout_s=2)
            if m is not None:
                out.append(m.value)
        c.close()
    for proc in (a, b):
        assert proc.poll() is None, "a processor exited"
    want = {f"V{i}".encode() for i in range(INPUTS)}
    dupes = len(out) - len(set(out))
    missing = want - set(out)
    assert dupes == 0, f"{dupes} outputs duplicated"
    assert not missing, (f"{len(missing)} of {INPUTS} inputs have no output after the pauses"
                         f"\n{(tmp_path / 'b.log').read_text()[-2000:]}")
