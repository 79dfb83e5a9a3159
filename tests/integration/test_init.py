"""``txnstream init``: idempotent, reports mismatches, fails fast and clearly on a dead broker."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from txnstream import Config, TopicNames
from txnstream.admin_topics import ensure_topics

pytestmark = pytest.mark.integration
TXNSTREAM_BIN = str(Path(sys.executable).with_name("txnstream"))


def test_init_twice_is_harmless(kafka_bootstrap):
    cfg = Config(bootstrap_servers=kafka_bootstrap,
                 topics=TopicNames(f"__i{uuid.uuid4().hex[:6]}"), num_coordinators=3)
    first = {r.name: r for r in ensure_topics(cfg)}
    second = {r.name: r for r in ensure_topics(cfg)}
    assert {r.status for r in first.values()} == {"created"}
    assert {r.status for r in second.values()} == {"exists"}
    assert {n: r.partitions for n, r in first.items()} == {n: r.partitions
                                                           for n, r in second.items()}
    assert second[cfg.topics.log].partitions == 3
    other = {r.name: r for r in ensure_topics(cfg.with_(num_coordinators=5))}
    assert other[cfg.topics.log].status == "mismatch"
    assert "has 3 partitions" in other[cfg.topics.log].detail


def test_init_against_a_dead_broker_fails_fast_and_clearly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # nothing listens here once closed
    t0 = time.monotonic()
    proc = subprocess.run([TXNSTREAM_BIN, "--bootstrap", f"127.0.0.1:{port}", "init"],
                          capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 2
    assert f"127.0.0.1:{port}" in proc.stderr and "no Kafka broker answers" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert took < 20
