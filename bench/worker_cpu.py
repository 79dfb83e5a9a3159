"""Issue 12: worker CPU for one partition read by 1 and by 4 subscriptions.

The buffer role of ``txnstream worker`` folds each data partition once and serves the
result to every reader, so the worker's CPU should not grow with the number of
subscriptions. Per count of subscriptions (1, then 4), on a fresh 1-partition topic and
a fresh worker process (``bench.common.workers``):

1. ``subs`` consumer threads subscribe from the earliest position, each with its own
   subscription name (its own ``Client``), and loop ``receive_batch``;
2. a producer thread writes transactions at a fixed rate (``TXNS_PER_S`` transactions of
   ``RECORDS_PER_TXN`` 1 KB records: a rate, not as fast as it can, so both runs ask the
   worker for the same work however busy the 2 cores are);
3. once every subscription has its first record, the CPU time of the worker process and
   its children (the buffer role runs in a child process; utime + stime of
   ``/proc/<pid>/stat``, every thread) is sampled at the start and the end of a
   ``window_s`` window.

Rows: CPU seconds per window with 4 subscriptions beside 1, and the ratio (goal: 1.0).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from bench.buffer import CONSUME_BATCH, VALUE, receive_batch
from bench.common import make_topic, workers
from bench.cpu import cpu_seconds, with_children
from txnstream import Client, Config

TXNS_PER_S = 10
RECORDS_PER_TXN = 100
FIRST_RECORD_TIMEOUT_S = 60.0


class _Load:
    """Fixed-rate transactional producer + ``subs`` subscriptions, in threads."""

    def __init__(self, cfg: Config, topic: str, subs: int) -> None:
        self.cfg, self.topic = cfg, topic
        self.stop = threading.Event()
        self.produced = 0
        self.behind_s = 0.0
        self.read = [0] * subs
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._consume, args=(i,), daemon=True,
                                         name=f"cpu-sub-{i}") for i in range(subs)]
        self.threads.append(threading.Thread(target=self._produce, daemon=True,
                                             name="cpu-producer"))

    def __enter__(self) -> _Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _consume(self, i: int) -> None:
        try:
            with Client(config=self.cfg) as client:
                c = client.subscribe(self.topic, f"cpu-{uuid.uuid4().hex[:6]}-{i}",
                                     initial_position="earliest")
                while not self.stop.is_set():
                    self.read[i] += len(receive_batch(c, CONSUME_BATCH, 0.5))
                c.close()
        except BaseException as e:  # reported in the row
            self.errors.append(e)

    def _produce(self) -> None:
        try:
            with Client(config=self.cfg) as client:
                producer = client.create_producer(self.topic)
                period = 1.0 / TXNS_PER_S
                next_at = time.monotonic()
                while not self.stop.is_set():
                    with client.transaction() as txn:
                        for i in range(RECORDS_PER_TXN):
                            producer.send(VALUE, key=str(i).encode(), txn=txn)
                    self.produced += RECORDS_PER_TXN
                    next_at += period
                    lag = next_at - time.monotonic()
                    if lag > 0:
                        self.stop.wait(lag)
                    else:
                        self.behind_s = max(self.behind_s, -lag)
                producer.flush()
        except BaseException as e:
            self.errors.append(e)


def _cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(p) for p in pids)


def measure(cfg: Config, subs: int, window_s: float) -> dict:
    """Worker CPU seconds over ``window_s`` with ``subs`` subscriptions on one partition."""
    topic = make_topic(cfg, 1)
    with workers(cfg, 1) as pids, _Load(cfg, topic, subs) as load:
        deadline = time.monotonic() + FIRST_RECORD_TIMEOUT_S
        while min(load.read) == 0 and time.monotonic() < deadline and not load.errors:
            time.sleep(0.1)
        started = min(load.read) > 0
        tree = with_children(pids)  # the worker and its buffer role's process
        cpu0, produced0, read0 = _cpu(tree), load.produced, list(load.read)
        t0 = time.monotonic()
        time.sleep(window_s)
        cpu1, produced1, read1 = _cpu(tree), load.produced, list(load.read)
        secs = time.monotonic() - t0
    return {"subs": subs, "cpu_s": (cpu1 - cpu0) * window_s / secs, "window_s": window_s,
            "produced": produced1 - produced0,
            "read": [b - a for a, b in zip(read0, read1, strict=True)],
            "started": started, "behind_s": load.behind_s,
            "errors": [repr(e) for e in load.errors]}


def run(cfg: Config, window_s: float = 20.0,
        progress: Callable[[dict], object] | None = None) -> list[dict]:
    """Rows for the buffer section: worker CPU with 4 subscriptions beside 1."""
    one = measure(cfg, 1, window_s)
    four = measure(cfg, 4, window_s)

    def note(m: dict) -> str:
        """What went wrong in a measurement, if anything (else "")."""
        bits = []
        if not m["started"]:
            bits.append("a subscription never got a record")
        if any(r < 0.9 * m["produced"] for r in m["read"]):
            bits.append(f"{m['produced']} records produced in the window, subscriptions "
                        f"read {'/'.join(map(str, m['read']))}")
        if m["behind_s"] > 1:
            bits.append(f"producer fell {m['behind_s']:.1f} s behind its rate")
        if m["errors"]:
            bits.append("errors: " + "; ".join(m["errors"])[:200])
        return f" ({m['subs']} subs: {', '.join(bits)})" if bits else ""

    row = {"bench": f"worker CPU per {window_s:g} s window, 1 partition, {TXNS_PER_S} "
                    f"txns/s x {RECORDS_PER_TXN} x 1KB{note(four)}{note(one)}",
           "txnstream rec/s": f"4 subscriptions: {four['cpu_s']:.2f} CPU s",
           "anchor": "1 subscription",
           "anchor rec/s": f"{one['cpu_s']:.2f} CPU s",
           "ratio": round(four["cpu_s"] / one["cpu_s"], 2) if one["cpu_s"] else None,
           "goal": "1.0 (the same)"}
    if progress:
        progress(row)
    return [row]
