"""Issue 37: how soon a ``latest`` reader of a wide topic delivers, against Kafka's own.

``TXNSTREAM_BOOTSTRAP=host:port python -m bench.wide_start [--partitions 4 256] [--rounds 3]``

Per width: a transactional topic served by one real ``txnstream worker`` (one txn
registered every partition first), and a plain topic of the same width for the anchor.
Each round starts a ticker (a one-record txn every ~50 ms to a random partition; the
anchor: one record with Kafka's idempotent producer, flushed), subscribes at "latest"
right after, and times from just before ``subscribe``: when the first delivered record
was written (everything written before it was skipped), and when it was delivered. The
anchor is a confluent-kafka ``Consumer`` (``read_committed``, group subscribe,
``auto.offset.reset=latest``). Not part of ``python -m bench``: run it on its own.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer
from rich.console import Console
from rich.table import Table

from bench.common import fresh_config, machine, make_topic, workers
from txnstream import Client, Config, TopicPartition

console = Console()

TICK_S = 0.05
FIRST_TIMEOUT_S = 120.0


def tick(send: Callable[[bytes, int], None], partitions: int, stop: threading.Event,
         written: list[float], t0: float) -> None:
    """Write ``seq`` (its value) to a random partition every ``TICK_S``; note when it began."""
    rng = random.Random(7)
    seq = 0
    while not stop.is_set():
        written.append(time.monotonic() - t0)  # before: a reader may have it at once
        send(str(seq).encode(), rng.randrange(partitions))
        seq += 1
        stop.wait(TICK_S)


Reader = tuple[Callable[[], list[bytes]], Callable[[], None]]
"""(receive what has arrived, close)."""


def one_round(subscribe: Callable[[], Reader], send: Callable[[bytes, int], None],
              partitions: int) -> tuple[float, float]:
    """(first delivered record's write time, its delivery time), seconds from subscribe."""
    stop, written = threading.Event(), list[float]()
    t0 = time.monotonic()
    receive, close = subscribe()
    ticker = threading.Thread(target=tick, args=(send, partitions, stop, written, t0),
                              daemon=True)
    ticker.start()
    try:
        while time.monotonic() - t0 < FIRST_TIMEOUT_S:
            got = receive()
            if got:
                at = time.monotonic() - t0
                return written[min(int(v) for v in got)], at
        raise RuntimeError(f"nothing delivered in {FIRST_TIMEOUT_S:.0f}s")
    finally:
        stop.set()
        ticker.join(30)
        close()


def registered_topic(client: Client, cfg: Config, width: int, stem: str) -> str:
    """A new ``width``-partition topic whose every partition one committed txn registered
    (the worker serves them all from the start)."""
    topic = make_topic(cfg, width, f"{stem}-{uuid.uuid4().hex[:6]}")
    txn = client.new_transaction()
    txn.register_partitions([TopicPartition(topic, p) for p in range(width)])
    txn.commit()
    return topic


def txnstream_rounds(cfg: Config, width: int, rounds: int) -> list[tuple[float, float]]:
    with Client(config=cfg) as client:
        topic = registered_topic(client, cfg, width, f"wide{width}")
        producer = client.create_producer(topic)

        def send(value: bytes, partition: int) -> None:
            with client.transaction() as t:
                producer.send(value, partition=partition, txn=t)

        def subscribe() -> Reader:
            c = client.subscribe(topic, subscription=f"wide-{uuid.uuid4().hex[:6]}",
                                 initial_position="latest")
            return (lambda: [m.value or b"" for m in c.receive_batch(1000, timeout_s=0.02)],
                    c.close)

        # the first round pays one-off costs: not reported
        return [one_round(subscribe, send, width) for _ in range(rounds + 1)][1:]


def kafka_rounds(cfg: Config, width: int, rounds: int) -> list[tuple[float, float]]:
    topic = make_topic(cfg, width, f"plain{width}-{uuid.uuid4().hex[:6]}")
    p = KafkaProducer(cfg.producer(**{"linger.ms": 0}))

    def send(value: bytes, partition: int) -> None:
        p.produce(topic, value, partition=partition)
        p.flush(10)

    def subscribe() -> Reader:
        c = KafkaConsumer(cfg.consumer(f"plain-{uuid.uuid4().hex[:6]}", **{
            "isolation.level": "read_committed", "auto.offset.reset": "latest"}))
        c.subscribe([topic])
        return (lambda: [m.value() or b"" for m in c.consume(1000, 0.02) if m.error() is None],
                c.close)

    return [one_round(subscribe, send, width) for _ in range(rounds + 1)][1:]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.wide_start")
    ap.add_argument("--partitions", type=int, nargs="+", default=[4, 256])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    bootstrap = os.environ.get("TXNSTREAM_BOOTSTRAP")
    if not bootstrap:
        console.print("set TXNSTREAM_BOOTSTRAP=host:port (a running broker)")
        return 2
    cfg = fresh_config(bootstrap)
    t = Table(title="subscribe at latest, a 1-record txn every ~50 ms to a random partition: "
                    "seconds from subscribe (median of rounds; each round)")
    for c in ("partitions", "reader", "first delivered was written", "delivered at", "rounds"):
        t.add_column(c)
    with workers(cfg, 1):
        for width in args.partitions:
            for name, fn in (("txnstream", txnstream_rounds), ("Kafka read_committed",
                                                                kafka_rounds)):
                with console.status(f"{name}, {width} partitions ..."):
                    rs = fn(cfg, width, args.rounds)
                t.add_row(str(width), name, f"{statistics.median(w for w, _ in rs):.2f}",
                          f"{statistics.median(d for _, d in rs):.2f}",
                          ", ".join(f"{w:.2f}/{d:.2f}" for w, d in rs))
    console.print(t)
    console.print(machine())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
