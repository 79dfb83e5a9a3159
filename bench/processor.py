"""Issue 5 and 13 benchmark: consume-transform-produce records/s.

* txnstream: :class:`ExactlyOnceProcessor`, batches of 500 in one transaction each;
* at-least-once: the same loop on txnstream's consumer/producer without transactions
  (plain acks, plain sends);
* Kafka EOS: confluent-kafka's transactional loop, ``send_offsets_to_transaction`` and
  ``read_committed``, batches of 500.
Each reads its own copy of the same input (plain records, 4 partitions) and is timed the
same way: from its first input record received (the group join is out of the window) to
its last commit (at-least-once: its last ``flush()``). Goals (issue 13): exactly-once at
least 0.8x the at-least-once loop and 1.2x Kafka's EOS loop.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer

from bench.common import goal_row, make_topic, ratio, workers
from txnstream import Client, Config
from txnstream.processor import ExactlyOnceProcessor

BATCH = 500
ALO_GOAL = 0.8
KAFKA_EOS_GOAL = 1.2


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
        first: list[float] = []
        receive = proc.consumer.receive

        def timed_receive(*args: object, **kwargs: object) -> object:
            m = receive(*args, **kwargs)  # type: ignore[arg-type]
            if m is not None and not first:
                first.append(time.perf_counter())
            return m

        proc.consumer.receive = timed_receive  # type: ignore[method-assign]
        deadline = time.perf_counter() + 180
        while proc.stats.inputs < n:
            if not proc.run_batch() and time.perf_counter() > deadline:
                break
        secs = time.perf_counter() - (first[0] if first else time.perf_counter())
        proc.close()
    return proc.stats.inputs / secs if secs > 0 else 0.0


def _txnstream_alo(cfg: Config, src: str, dst: str, n: int) -> float:
    with Client(config=cfg) as client:
        c = client.subscribe(src, subscription=f"b-{uuid.uuid4().hex[:6]}")
        p = client.create_producer(dst)
        done = 0
        t0 = None
        while done < n:
            m = c.receive(timeout_s=10 if t0 else 60)  # the first waits for the group join
            if m is None:
                break
            if t0 is None:
                t0 = time.perf_counter()
            p.send((m.value or b"").upper(), key=m.key)
            c.acknowledge(m)
            done += 1
        p.flush()
        secs = time.perf_counter() - (t0 or time.perf_counter())
        c.close()
    return done / secs if secs > 0 else 0.0


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
        goal_row("consume-transform-produce, exactly-once processor", f"{eo:.0f} rec/s",
                 "same loop, at-least-once", f"{alo:.0f} rec/s", ratio(eo, alo), ">=",
                 ALO_GOAL),
        goal_row("consume-transform-produce, exactly-once processor", f"{eo:.0f} rec/s",
                 "Kafka EOS (send_offsets_to_transaction)", f"{eos:.0f} rec/s",
                 ratio(eo, eos), ">=", KAFKA_EOS_GOAL),
    ]
    for r in rows:
        r["measure"] += f", {records} records, batches of {BATCH}"
    if progress:
        for r in rows:
            progress(r)
    return rows
