"""Issue 12: how fast a ``initial_position="latest"`` reader starts on a long partition.

``TXNSTREAM_BOOTSTRAP=host:port python -m bench.start_latest [--records 5000000]``

Two one-partition transactional topics, served by one real ``txnstream worker``:

* empty: a txn registered the partition and wrote nothing (it holds one COMMIT marker);
* long: a committed and an aborted txnstream txn, ``--records`` small plain records
  written fast with a raw confluent-kafka producer, then a committed and an aborted txn
  again (so the partition is transactional from its first record).

Once the buffer owner has folded the long partition to its end (``admin.buffer_stats``),
each round subscribes a new subscription at "latest" and times, from just before
``client.subscribe``: the reader taking the partition (its start position decided) and
the first delivered record of a txn committed after subscribing (a ticker thread
commits a one-record txn every ~50 ms from right after ``subscribe``). A round also
checks it delivered nothing older than the subscription. A first, unreported round on
the empty partition pays the one-off costs; then the rounds alternate empty / long.

Not part of ``python -m bench``: run it on its own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaException
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.table import Table

from bench.common import fresh_config, machine, make_topic, workers
from txnstream import Client, Config, TopicPartition
from txnstream.errors import TxnStreamError

console = Console()

TICK_S = 0.05
FIRST_RECORD_TIMEOUT_S = 120.0
FOLD_TIMEOUT_S = 1800.0


@dataclass
class Round:
    partition: str
    taken_s: float
    """subscribe -> the reader took the partition (its start position is decided)."""
    first_s: float
    """subscribe -> first record of a txn committed after subscribing."""
    delivered: int


def write_plain_fast(cfg: Config, topic: str, n: int) -> None:
    """``n`` small plain records to partition 0, raw confluent-kafka, batched."""
    p = KafkaProducer(cfg.producer(**{"linger.ms": 50, "batch.size": 1_000_000,
                                      "queue.buffering.max.messages": 500_000,
                                      "compression.type": "lz4"}))
    produce = p.produce
    for i in range(n):
        while True:
            try:
                produce(topic, b"x%d" % i, partition=0)
                break
            except BufferError:
                p.poll(0.05)
        if i % 50_000 == 0:
            p.poll(0)
    left = p.flush(300)
    if left:
        raise RuntimeError(f"{left} plain records not written")


def high_watermark(cfg: Config, topic: str) -> int:
    c = KafkaConsumer(cfg.consumer(f"hw-{uuid.uuid4().hex[:6]}"))
    try:
        return c.get_watermark_offsets(KafkaTP(topic, 0), timeout=10)[1]
    finally:
        c.close()


def wait_folded(client: Client, tp: TopicPartition, high: int, timeout_s: float) -> float:
    """Until the owner's served state covers ``tp`` to ``high``; seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            s = client.admin.buffer_stats(tp)
            if s.last_offset >= high - 1 and s.max_read_position >= high - 1:
                return time.monotonic() - t0
        except (TxnStreamError, KafkaException):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{tp} not folded to {high} within {timeout_s:.0f}s")


def ticker(client: Client, producer, tag: str, stop: threading.Event,  # type: ignore[no-untyped-def]
           committed: list[int], errors: list) -> None:
    """Commit a one-record txn (value ``tag:seq``) every ``TICK_S`` until stopped."""
    seq = 0
    try:
        while not stop.is_set():
            with client.transaction() as txn:
                producer.send(f"{tag}:{seq}".encode(), partition=0, txn=txn)
            committed.append(seq)
            seq += 1
            stop.wait(TICK_S)
    except BaseException as exc:
        errors.append(exc)


def start_latest(client: Client, topic: str, tag: str) -> Round:
    """One round: subscribe at "latest", time the take and the first new record."""
    producer = client.create_producer(topic)
    stop = threading.Event()
    committed: list[int] = []
    errors: list = []
    t0 = time.monotonic()
    consumer = client.subscribe(topic, subscription=f"latest-{tag}-{uuid.uuid4().hex[:6]}",
                                initial_position="latest")
    tick = threading.Thread(target=ticker, args=(client, producer, tag, stop, committed,
                                                  errors), daemon=True)
    tick.start()
    got: list[bytes] = []
    taken_s = None
    try:
        while not got and time.monotonic() - t0 < FIRST_RECORD_TIMEOUT_S and not errors:
            got.extend(m.value for m in consumer.receive_batch(1000, timeout_s=0.02))
            if taken_s is None and consumer.buffer_status():
                taken_s = time.monotonic() - t0
        first_s = time.monotonic() - t0
        if not got:
            raise RuntimeError(f"{tag}: nothing delivered in {FIRST_RECORD_TIMEOUT_S:.0f}s "
                               f"({errors!r})")
        stop.set()
        tick.join(30)
        if errors:
            raise RuntimeError(f"{tag}: ticker failed: {errors!r}")
        last = f"{tag}:{committed[-1]}".encode()
        deadline = time.monotonic() + 30
        while last not in got and time.monotonic() < deadline:
            got.extend(m.value for m in consumer.receive_batch(1000, timeout_s=0.5))
    finally:
        stop.set()
        tick.join(30)
        consumer.close()
        producer.flush()
    prefix = f"{tag}:".encode()
    older = [v for v in got if not v.startswith(prefix)]
    if older:
        raise RuntimeError(f"{tag}: {len(older)} records older than the subscription "
                           f"delivered, e.g. {older[:3]}")
    seqs = [int(v[len(prefix):]) for v in got]
    if seqs != list(range(seqs[0], committed[-1] + 1)):
        raise RuntimeError(f"{tag}: ticks delivered {seqs}, committed up to {committed[-1]}")
    return Round(tag.rstrip("0123456789"), taken_s if taken_s is not None else first_s,
                 first_s, len(got))


def run(cfg: Config, records: int, rounds: int) -> tuple[list[Round], dict[str, float]]:
    info: dict[str, float] = {}
    empty_topic, long_topic = make_topic(cfg, 1, f"empty-{uuid.uuid4().hex[:6]}"), \
        make_topic(cfg, 1, f"long-{uuid.uuid4().hex[:6]}")
    try:
        with workers(cfg, 1), Client(config=cfg) as client:
            empty_tp, long_tp = TopicPartition(empty_topic, 0), TopicPartition(long_topic, 0)
            txn = client.new_transaction()
            txn.register_partitions([empty_tp])
            txn.commit()
            with console.status(f"writing {records:,} records ..."):
                t0 = time.monotonic()
                p = client.create_producer(long_topic)
                for where in ("start", "end"):
                    if where == "end":
                        write_plain_fast(cfg, long_topic, records)
                    with client.transaction() as txn:
                        p.send(f"old-committed-{where}".encode(), partition=0, txn=txn)
                    aborted = client.new_transaction()
                    p.send(f"old-aborted-{where}".encode(), partition=0, txn=aborted)
                    aborted.abort()
                p.flush()
                info["write_s"] = time.monotonic() - t0
            high = high_watermark(cfg, long_topic)
            info["records"] = high
            with console.status("waiting for the buffer owner to fold it ..."):
                info["fold_wait_s"] = wait_folded(client, long_tp, high, FOLD_TIMEOUT_S)
                info["empty_records"] = high_watermark(cfg, empty_topic)
                wait_folded(client, empty_tp, int(info["empty_records"]), 60)
            out: list[Round] = []
            with console.status("measuring ..."):
                start_latest(client, empty_topic, "warm")
                for i in range(rounds):
                    out.append(start_latest(client, empty_topic, f"empty{i}"))
                    out.append(start_latest(client, long_topic, f"long{i}"))
            return out, info
    finally:
        admin = AdminClient(cfg.admin())
        for f in admin.delete_topics([empty_topic, long_topic, *cfg.topics.all()],
                                     operation_timeout=30).values():
            try:
                f.result(30)
            except Exception:  # noqa: BLE001 - best effort
                pass


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.start_latest")
    ap.add_argument("--records", type=int, default=5_000_000,
                    help="plain records in the long partition")
    ap.add_argument("--rounds", type=int, default=3, help="measurements per partition")
    args = ap.parse_args(argv)
    bootstrap = os.environ.get("TXNSTREAM_BOOTSTRAP")
    if not bootstrap:
        console.print("set TXNSTREAM_BOOTSTRAP=host:port (a running broker)")
        return 2
    rounds, info = run(fresh_config(bootstrap), args.records, args.rounds)
    t = Table(title=f"latest start: subscribe -> first record of a txn committed after it "
                    f"({args.rounds} rounds each)")
    for c in ("partition", "records (incl. markers)", "take, median ms", "first record, median ms",
              "first record, each round ms"):
        t.add_column(c)
    for name, records in (("empty", int(info["empty_records"])),
                          ("long", int(info["records"]))):
        rs = [r for r in rounds if r.partition == name]
        t.add_row(name, f"{records:,}",
                  f"{statistics.median(r.taken_s for r in rs) * 1000:.0f}",
                  f"{statistics.median(r.first_s for r in rs) * 1000:.0f}",
                  ", ".join(f"{r.first_s * 1000:.0f}" for r in rs))
    console.print(t)
    console.print(f"long partition written in {info['write_s']:.1f}s, folded to its end "
                  f"{info['fold_wait_s']:.1f}s after the last write; {machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
