"""``txnstream top`` against a real broker and worker: it names the blocked partition and
its txn, and its abort key unblocks the partition."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.coordinator.conftest import (  # noqa: F401
    client,
    make_topic,
    wait_until,
    worker,
)
from txnstream.top import Sampler, abort_selected, build_view
from txnstream.types import TopicPartition

pytestmark = pytest.mark.integration


def _top_once(config) -> str:  # type: ignore[no-untyped-def]
    out = subprocess.run(
        [str(Path(sys.executable).parent / "txnstream"), "--bootstrap",
         config.bootstrap_servers, "top", "--prefix", config.topics.prefix, "--once"],
        capture_output=True, text=True, timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin"})
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_top_names_the_blocked_partition_and_aborts_its_txn(config, worker, client) -> None:  # noqa: F811
    topic = make_topic(config, 1, "top")
    producer = client.create_producer(topic)
    holder = client.new_transaction(timeout_s=120)
    producer.send(b"held", partition=0, txn=holder)
    holder.flush()
    with client.transaction() as behind:
        producer.send(b"behind", partition=0, txn=behind)
    tp = TopicPartition(topic, 0)

    sampler = Sampler(client)
    try:
        def blocked_view():  # type: ignore[no-untyped-def]
            view = build_view(None, sampler.sample())
            rows = [r for r in view.partitions if r.tp == tp and r.blocking_txn is not None]
            return view if rows else None

        wait_until(lambda: blocked_view() is not None, 30, "top to see the blocked partition")
        text = _top_once(config)
        assert f"{topic}-0" in text and str(holder.id) in text, text

        view = blocked_view()
        assert view is not None and view.blocking == [holder.id]
        assert abort_selected(client, view, 0) == holder.id
        wait_until(lambda: all(r.blocking_txn is None for r in
                               build_view(None, sampler.sample()).partitions if r.tp == tp),
                   30, "the partition to unblock after the abort")
    finally:
        sampler.close()

    consumer = client.subscribe(topic, subscription="top-check")
    got = []
    end = time.monotonic() + 30
    while not got and time.monotonic() < end:
        m = consumer.receive(timeout_s=1)
        if m is not None:
            got.append(m.value)
    extra = consumer.receive(timeout_s=2)
    consumer.close()
    assert extra is None, f"the aborted record was delivered: {extra.value!r}"
    assert got == [b"behind"], f"after the abort, the committed record behind: {got}"


def test_top_shows_a_watched_subscriptions_redelivery_counts(config, worker, client) -> None:  # noqa: F811
    topic = make_topic(config, 2, "topsub")
    producer = client.create_producer(topic)
    producer.send(b"poison", partition=1)
    producer.flush()
    c = client.subscribe(topic, subscription="top-billing")
    for _ in range(2):  # its processing txn aborts twice: counted in the pending-ack log
        m = c.receive(timeout_s=30)
        assert m is not None and m.value == b"poison"
        with client.transaction() as txn:
            c.acknowledge(m, txn)
            txn.abort()
    c.close()
    wait_until(lambda: client.admin.pending_ack_stats(f"{topic}-1", "top-billing")
               .max_redelivery_count == 2, 30, "the second abort's mark in the pending-ack log")
    out = subprocess.run(
        [str(Path(sys.executable).parent / "txnstream"), "--bootstrap",
         config.bootstrap_servers, "top", "--prefix", config.topics.prefix, "--once",
         "--subscription", f"{topic}:top-billing"],
        capture_output=True, text=True, timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin"})
    assert out.returncode == 0, out.stdout + out.stderr
    line = next((x for x in out.stdout.splitlines() if f"{topic}-1" in x and "top-billing" in x),
                None)
    assert line is not None, out.stdout
    cells = [c.strip() for c in line.split("│") if c.strip()]
    assert cells[-2:] == ["1", "2"], f"redelivered offsets / highest count: {line}"
