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


def test_init_makes_the_default_workers_key_once(kafka_bootstrap, tmp_path):
    """Old: init made the topics only, and a worker then ran unsigned."""
    import os
    import stat

    from txnstream.workers_key import load_key_file

    env = {k: v for k, v in os.environ.items()
           if k not in ("TXNSTREAM_WORKERS_KEY_FILE", "TXNSTREAM_TC_SECRET",
                        "TXNSTREAM_TC_SECRET_FILE")} | {"TXNSTREAM_HOME": str(tmp_path)}
    argv = [TXNSTREAM_BIN, "--bootstrap", kafka_bootstrap, "init", "--prefix",
            f"__i{uuid.uuid4().hex[:6]}", "--coordinators", "2"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    key = tmp_path / "workers.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(load_key_file(key)) == 32
    assert f"made {key}" in first.stdout.replace("\n", "")
    made = load_key_file(key)
    again = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 0 and "made" not in again.stdout
    assert load_key_file(key) == made, "a key is never replaced"


def test_init_returns_only_once_a_new_client_sees_every_topic_it_created(kafka_bootstrap):
    """A worker or a store started right after ``init`` looks its topics up at once: a
    topic the broker's metadata does not list yet reads as "does not exist" (CI, once)."""
    from confluent_kafka import Producer

    unseen = []
    for _ in range(20):
        cfg = Config(bootstrap_servers=kafka_bootstrap,
                     topics=TopicNames(f"__v{uuid.uuid4().hex[:6]}"), num_coordinators=3)
        reports = ensure_topics(cfg)
        meta = Producer({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10)
        for r in reports:
            have = meta.topics.get(r.name)
            if have is None or have.error is not None or len(have.partitions) != r.partitions:
                unseen.append(r.name)
    assert not unseen, f"init returned before the broker listed {unseen}"
