"""``python -m bench.producer_spin``: librdkafka's idempotent producer busy-polls (issue 35).

A reproducer with plain confluent-kafka, nothing of txnstream: one thread produces 1 KB
records without pause (as a txn's ``send_batch`` does) and flushes every 1,000 records,
into one partition, with and without ``enable.idempotence``; a table shows the CPU the
producer's broker thread (``rdk:broker*``) spent per record, and the rate.

What it shows, and why (librdkafka ``rd_kafka_toppar_producer_serve``): the batch-ready
wakeup is set (``rd_kafka_msgq_allow_wakeup_at``: at once once ``linger.ms`` passed, or
while ``flush()`` runs) *before* the idempotent per-partition limit
``RD_KAFKA_IDEMP_MAX_INFLIGHT - rktp_msgs_inflight`` is applied, and
``rktp_msgs_inflight`` counts messages, not requests. With 5 or more messages in flight
on the partition no request can be made, and the broker thread polls its socket with a
zero timeout until the response comes (no other request waiting in its output queue).
The same count is what confluentinc/librdkafka#4989 ("sends only one produce request
at a time") is about.

Usage: ``python -m bench.producer_spin --bootstrap HOST:PORT [--seconds 5]``.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.table import Table

TICKS = os.sysconf("SC_CLK_TCK")
VALUE = b"x" * 1024
PER_FLUSH = 1_000


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads, summed by thread name."""
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS
    return out


def measure(bootstrap: str, topic: str, settings: dict[str, object], seconds: float
            ) -> tuple[float, float]:
    """(records/s, broker-thread µs per record) for ``settings``."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **settings})
    for _ in range(PER_FLUSH):  # connected and warm
        p.produce(topic, VALUE, partition=0)
    p.flush(30)
    before = thread_cpu()
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(PER_FLUSH):
            while True:
                try:
                    p.produce(topic, VALUE, partition=0)
                    break
                except BufferError:
                    p.poll(0.01)
        p.flush(30)
        n += PER_FLUSH
    took = time.monotonic() - t0
    after = thread_cpu()
    broker = sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith("rdk:broker"))
    return n / took, broker / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.producer_spin")
    ap.add_argument("--bootstrap", default=os.environ.get("TXNSTREAM_BOOTSTRAP"),
                    required=os.environ.get("TXNSTREAM_BOOTSTRAP") is None)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    topic = f"spin-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    time.sleep(1)
    table = Table(title=f"1 KB records, one partition, flush every {PER_FLUSH}, "
                        f"{args.seconds:g} s each")
    for col in ("producer", "rec/s", "broker thread µs/rec"):
        table.add_column(col)
    plain: dict[str, object] = {"enable.idempotence": False, "acks": "all"}
    idempotent: dict[str, object] = {"enable.idempotence": True}
    for name, settings in [("plain (no idempotence)", plain), ("idempotent", idempotent),
                           ("plain (no idempotence)", plain), ("idempotent", idempotent)]:
        rate, us = measure(args.bootstrap, topic, settings, args.seconds)
        table.add_row(name, f"{rate:,.0f}", f"{us:.2f}")
    Console().print(table)
    admin.delete_topics([topic])


if __name__ == "__main__":
    main()
