"""The chaos harness's processor role, against a real broker and worker.

Found by CI (the hostile chaos profile, seed 11, and the soak of seed 47): the monitor
aborted a processor's checkpoint txn from outside while the checkpoint was still taking
batches. The abort's marks gave the inputs that txn had acked back to the consumer,
which delivered them again inside the same checkpoint; the role took each for a double
delivery of one it already held ("dup_in_batch") and dropped it. The consumer counts a
dropped message as delivered and unacked, so nothing gave it back again: the
subscription's cursor stayed below it for good and the inputs were never processed.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest

from chaos.roles.common import RoleArgs
from chaos.roles.processor import ProcessorRole
from chaos.truth import decode_value
from tests.integration.consumer.conftest import fill, make_topic, wait_until
from txnstream.types import TopicPartition

pytestmark = pytest.mark.integration

N = 5


def events(path: Path, kind: str) -> list[dict]:
    if not path.exists():
        return []
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["e"] == kind]


def outputs(client, topic: str, n: int, timeout_s: float) -> list[dict]:
    """Every committed output of ``topic`` (a fresh subscription from its start)."""
    c = client.subscribe(topic, subscription=f"check-{uuid.uuid4().hex[:6]}",
                         initial_position="earliest")
    try:
        out = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(out) < n:
            if (m := c.receive(timeout_s=0.5)) is not None:
                out.append(decode_value(m.value))
        while (m := c.receive(timeout_s=1.0)) is not None:  # and nothing more
            out.append(decode_value(m.value))
        return out
    finally:
        c.close()


def test_inputs_given_back_by_an_outside_abort_within_a_checkpoint_are_processed(
        config, worker, client, tmp_path):
    src, out = make_topic(config, 1), make_topic(config, 1)
    fill(client, src, N)
    truth = tmp_path / "processor.jsonl"
    args = RoleArgs("processor", config.bootstrap_servers, config.topics.prefix,
                    "processor-t", 0, truth, 1, {
                        "ack_mode": "individual", "input": src, "output": out,
                        "subscription": f"eo-{uuid.uuid4().hex[:6]}", "txn_timeout_s": 60.0,
                        "session_timeout_ms": 10_000, "batch_max": N,
                        "batch_interval_s": 0.3, "checkpoint_s": 15.0,
                        # the work of a batch: the abort lands while the checkpoint waits
                        "process_s": (3.0, 3.0), "pipelined": False})
    stop = threading.Event()
    role = ProcessorRole(args, client, stop)
    loop = threading.Thread(target=role.loop, name="processor-role", daemon=True)
    loop.start()
    tp = TopicPartition(src, 0)
    try:
        wait_until(lambda: events(truth, "open"), 30, "the first checkpoint opened")
        first = events(truth, "open")[0]  # its batches take all N before it is due

        def acked_pending() -> bool:
            try:
                return role.consumer.pending_ack_stats(tp).pending_offsets == N
            except Exception:  # noqa: BLE001 - not taken yet
                return False

        wait_until(acked_pending, 15, "every input acked in the checkpoint's txn")
        client.admin.abort_transaction(first["txn"])  # as the chaos monitor does

        got = outputs(client, out, N, timeout_s=60)
        ins = sorted(v["in"] for v in got)
        assert ins == sorted(f"{src}-0@{i}" for i in range(N)), (
            f"each input once in a committed output; got {ins}, "
            f"dropped as doubles: {events(truth, 'dup_in_batch')}")
        wait_until(lambda: role.consumer.pending_ack_stats(tp).cursor == N, 15,
                   "the subscription's cursor past every input")
    finally:
        stop.set()
        loop.join(30)
        role.close()
