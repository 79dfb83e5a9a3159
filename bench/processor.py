"""Issue 5 benchmark: consume-transform-produce records/s.

* txnstream: :class:`ExactlyOnceProcessor`, batches of 500 in one transaction each;
* at-least-once: the same loop on txnstream's consumer/producer without transactions
  (plain acks, plain sends);
* Kafka EOS: confluent-kafka's transactional loop, ``send_offsets_to_transaction`` and
  ``read_committed``, batches of 500.
Each reads its own copy of the same input (plain records, 4 partitions).
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer

from bench.common import make_topic, workers
from txnstream import Client, Config
from txnstream.processor import ExactlyOnceProcessor

BATCH = 500


def _fill(cfg: Config, topic: str, n: int) -> None:
    p = KafkaProducer(cfg.producer())
    for i in range(n):
        while True:
            try:
                p.produce(topic, f"value-{i}".encode() * 4, str(i).encode())
                break
            except BufferError:
                p.poll(0.01)
    p.flush(60)


def _txnstream_eo(cfg: Config, src: str, dst: str, n: int) -> float:
    with Client(config=cfg) as client:
        proc = ExactlyOnceProcessor(client, src, f"b-{uuid.uuid4().hex[:6]}", dst,
                                    lambda m: (m.key, (m.value or b"").upper()),
                                    batch_size=BATCH, batch_interval_s=1.0)
        t0 = time.perf_counter()
        while proc.stats.inputs < n:
            if not proc.run_batch() and time.perf_counter() - t0 > 120:
                break
        secs = time.perf_counter() - t0
        proc.close()
    return proc.stats.inputs / secs


def _txnstream_alo(cfg: Config, src: str, dst: str, n: int) -> float:
    with Client(config=cfg) as client:
        c = client.subscribe(src, subscription=f"b-{uuid.uuid4().hex[:6]}")
        p = client.create_producer(dst)
        done = 0
        t0 = time.perf_counter()
        while done < n:
            m = c.receive(timeout_s=10)
            if m is None:
                break
            p.send((m.value or b"").upper(), key=m.key)
            c.acknowledge(m)
            done += 1
        p.flush()
        secs = time.perf_counter() - t0
        c.close()
    return done / secs


def _kafka_eos(cfg: Config, src: str, dst: str, n: int) -> float:
    group = f"b-{uuid.uuid4().hex[:6]}"
    c = KafkaConsumer(cfg.consumer(group, **{"isolation.level": "read_committed"}))
    c.subscribe([src])
    p = KafkaProducer(cfg.common() | {"transactional.id": f"eos-{group}", "linger.ms": 5})
    p.init_transactions(30)
    done = 0
    t0 = None
    deadline = time.monotonic() + 180
    while done < n and time.monotonic() < deadline:
        msgs = [m for m in c.consume(BATCH, 1.0) if not m.error()]
        if not msgs:
            continue
        if t0 is None:
            t0 = time.perf_counter()
        p.begin_transaction()
        for m in msgs:
            p.produce(dst, (m.value() or b"").upper(), m.key())
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata())
        p.commit_transaction(30)
        done += len(msgs)
    secs = time.perf_counter() - (t0 or time.perf_counter())
    c.close()
    return done / secs if secs else 0.0


def run(cfg: Config, records: int = 20_000, progress=None) -> list[dict]:
    """Three loops over the same volume; rows for the report."""
    with workers(cfg, 1):
        srcs = [make_topic(cfg, 4) for _ in range(3)]
        for s in srcs:
            _fill(cfg, s, records)
        eo = _txnstream_eo(cfg, srcs[0], make_topic(cfg, 4), records)
        alo = _txnstream_alo(cfg, srcs[1], make_topic(cfg, 4), records)
        eos = _kafka_eos(cfg, srcs[2], make_topic(cfg, 4), records)
    rows = [
        {"bench": "consume-transform-produce", "txnstream EO rec/s": round(eo),
         "anchor": "same loop, at-least-once", "anchor rec/s": round(alo),
         "ratio": round(eo / alo, 2), "goal": ">= 0.8"},
        {"bench": "consume-transform-produce", "txnstream EO rec/s": round(eo),
         "anchor": "Kafka EOS (send_offsets_to_transaction)", "anchor rec/s": round(eos),
         "ratio": round(eo / eos, 2) if eos else None, "goal": ">= 1.0"},
    ]
    if progress:
        for r in rows:
            progress(r)
    return rows
