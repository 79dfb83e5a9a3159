"""The demo: transactional writes (some aborted) read back committed-only, with a check.

1. Start a coordinator worker in this process (a real one, on the real broker).
2. Produce ``records`` records in transactions of ``txn_size`` to 3 partitions; abort
   about one transaction in five.
3. Consume with a fresh subscription and check: every committed record once, no aborted
   record, offset order per partition. Exit code 0 only if the check holds.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import defaultdict

from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from rich.console import Console
from rich.progress import Progress

from txnstream.client import Client
from txnstream.config import Config
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.errors import ClusterError, TxnStreamError

__all__ = ["run"]

TOPIC = "txnstream-demo"
IDLE_S = 45.0
"""The committed-only read gives up after this long with nothing new ..."""
CONSUME_S = 180.0
"""... or after this long in all. On a loaded machine a partition waited over 30 s for
its buffer owner while the demo's own worker joined and buffer slots moved."""


def _ensure_topic(config: Config, partitions: int = 3) -> None:
    admin = AdminClient(config.admin())
    if TOPIC not in admin.list_topics(timeout=10).topics:
        for f in admin.create_topics([NewTopic(TOPIC, partitions, 1)]).values():
            try:
                f.result(30)
            except Exception as exc:  # created concurrently is fine
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        time.sleep(1)


def _wait_all_served(client: Client, coordinators: int, timeout_s: float = 60) -> None:
    """Wait until every coordinator is served, by whichever worker.

    The demo's own worker, or workers already running (a compose stack's), among which
    the group shares the coordinators out.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if len(client.admin.coordinator_stats()) == coordinators:
                return
        except TxnStreamError:
            pass  # a coordinator moving between workers: ask again
        if time.monotonic() > deadline:
            raise ClusterError(f"not every coordinator is served after {timeout_s:.0f} s")
        time.sleep(0.2)


def run(config: Config, records: int, txn_size: int, console: Console) -> bool:
    """Run the demo; True if the check holds."""
    _ensure_topic(config)
    worker = CoordinatorWorker(config).start()
    rng = random.Random()
    committed: set[bytes] = set()
    aborted: set[bytes] = set()
    run_id = uuid.uuid4().hex[:6]
    try:
        with Client(config=config) as client, Progress(console=console) as progress:
            _wait_all_served(client, config.num_coordinators)
            producer = client.create_producer(TOPIC)
            task = progress.add_task("transactional produce", total=records)
            for start in range(0, records, txn_size):
                vals = [f"{run_id}-{i}".encode() for i in range(start, min(records,
                                                                          start + txn_size))]
                with client.transaction() as txn:
                    for v in vals:
                        producer.send(v, key=v, txn=txn)
                    if rng.random() < 0.2:
                        txn.abort()
                        aborted.update(vals)
                    else:
                        committed.update(vals)
                progress.advance(task, len(vals))
            consumer = client.subscribe(TOPIC, subscription=f"demo-{run_id}")
            task = progress.add_task("committed-only consume", total=len(committed))
            seen: list[bytes] = []
            last: dict[int, int] = defaultdict(lambda: -1)
            in_order = True
            # Gives up after IDLE_S with nothing new, or CONSUME_S in all: a partition may
            # wait for its buffer owner while this demo's own worker joins and slots move.
            end = time.monotonic() + CONSUME_S
            idle_deadline = min(end, time.monotonic() + IDLE_S)
            while len([v for v in seen if v.startswith(run_id.encode())]) < len(committed):
                msg = consumer.receive(timeout_s=2)
                if msg is None:
                    if time.monotonic() > idle_deadline:
                        break
                    continue
                idle_deadline = min(end, time.monotonic() + IDLE_S)
                consumer.acknowledge(msg)
                in_order &= msg.offset > last[msg.partition]
                last[msg.partition] = msg.offset
                if msg.value and msg.value.startswith(run_id.encode()):
                    seen.append(msg.value)
                    progress.advance(task)
            consumer.close()
    finally:
        worker.stop()
    got = set(seen)
    checks = [
        ("committed records delivered", f"{len(got & committed)} / {len(committed)}",
         got >= committed),
        ("aborted records delivered", f"{len(got & aborted)} (of {len(aborted)} aborted)",
         not (got & aborted)),
        ("duplicates", str(len(seen) - len(got)), len(seen) == len(got)),
        ("offset order per partition", "kept" if in_order else "broken", in_order),
    ]
    from txnstream.cli._common import table

    console.print(table(f"demo check on {config.bootstrap_servers} (topic {TOPIC})",
                        ("check", "result", "ok"),
                        [(n, r, "yes" if ok else "NO") for n, r, ok in checks]))
    return all(ok for _, _, ok in checks)
