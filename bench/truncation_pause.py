"""Commit latency while the TC log is truncated often, on a log of 3 replicas (stop 65).

Kafka answers a ``delete_records`` once every replica has moved its log start, at the
followers' next fetch (about ``replica.fetch.wait.max.ms``, 500 ms). A worker that waited
for that answer stood still for every TC it serves. This runs one in-process worker
that checkpoints and truncates every 2 s (ended txns kept 2 s) and commits 1-record txns
back to back for ``--seconds``, then prints the commit latency.

    txnstream cluster up --brokers 3 --port 19092 --state-dir /tmp/trunc
    python -m bench.truncation_pause --bootstrap 127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094

Run it on two checkouts (``PYTHONPATH=<checkout>``) to compare them.
"""

from __future__ import annotations

import argparse
import time
import uuid

from confluent_kafka.admin import AdminClient, NewTopic

from txnstream import Client, Config
from txnstream.admin_topics import ensure_topics
from txnstream.config import TopicNames
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker


def run(bootstrap: str, seconds: float, replication: int = 3) -> dict[str, float]:
    """Commit latency (ms) of back-to-back 1-record txns while truncations come every 2 s."""
    cfg = Config(bootstrap_servers=bootstrap, topics=TopicNames(f"__b{uuid.uuid4().hex[:6]}"),
                 num_coordinators=4, replication_factor=replication)
    ensure_topics(cfg)
    topic = f"trunc-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, 4, replication)]).values():
        f.result()
    w = CoordinatorWorker(cfg, settings=WorkerSettings(checkpoint_interval_s=2.0,
                                                       end_retention_ms=2000))
    w.start()
    client = Client(config=cfg)
    try:
        deadline = time.monotonic() + 60
        while len(w.serving()) < cfg.num_coordinators and time.monotonic() < deadline:
            time.sleep(0.2)
        producer = client.create_producer(topic)
        lat: list[float] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            txn = client.new_transaction(timeout_s=30)
            producer.send(b"v", txn=txn, partition=len(lat) % 4)
            t = time.perf_counter()
            txn.commit()
            lat.append(time.perf_counter() - t)
    finally:
        client.close()
        w.stop()
    lat.sort()
    n = len(lat)
    return {"commits": n, "p50 ms": round(lat[n // 2] * 1000, 1),
            "p99 ms": round(lat[min(n - 1, int(n * 0.99))] * 1000, 1),
            "max ms": round(lat[-1] * 1000, 1), "over 300 ms": sum(x > 0.3 for x in lat)}


def main(argv: list[str] | None = None) -> int:
    from txnstream.cli import console
    from txnstream.cli._common import table

    ap = argparse.ArgumentParser(prog="python -m bench.truncation_pause")
    ap.add_argument("--bootstrap", required=True, help="a cluster of 3 brokers")
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--replication", type=int, default=3)
    args = ap.parse_args(argv)
    row = run(args.bootstrap, args.seconds, args.replication)
    console.print(table("commit latency, truncations every 2 s", list(row),
                        [list(row.values())]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
