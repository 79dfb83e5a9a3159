"""Issue 4 and issue 12 benchmarks: transactional produce, committed-only consume,
produce-to-visible latency.

(1) produce: 1 KB records, 1,000 per transaction; txnstream vs plain confluent-kafka
    produce vs Kafka's own transactional producer.
(2) committed-only consume, symmetric (issue 12): both sides read the SAME topic, the one
    (1) wrote once with txnstream transactions, with the same batch size
    (``CONSUME_BATCH``), and both are timed from their first record. txnstream:
    ``client.subscribe(topic, subscription, initial_position="earliest")`` and
    ``receive_batch``. Anchor: a confluent-kafka ``read_committed`` consumer that builds,
    per record, the object a txnstream user gets (:class:`txnstream.consumer.Message`:
    user headers only, ``txn_id`` parsed from the ``txn.id`` header) and skips the
    ``txn.marker`` records. txnstream does not use Kafka transactions, so a
    ``read_committed`` consumer sees every record of that topic: the second anchor row is
    the same consumer on the same volume written by Kafka's own transactional producer.
(3) produce-to-visible latency of transactions of 10 records, txnstream beside Kafka's
    own transactions, measured the same way: from just before the first send to the
    moment a consumer thread has all 10 records of that transaction.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Message as KafkaMessage
from confluent_kafka import Producer as KafkaProducer

from bench.common import make_topic, pct, workers
from txnstream import Client, Config
from txnstream.markers import TXN_ID_HEADER, TXN_MARKER_HEADER
from txnstream.message import Message, make_message
from txnstream.types import TxnID

VALUE = b"v" * 1024
CONSUME_BATCH = 5000
"""Records per batch call, both sides of the consume benchmark."""
CONSUME_DEADLINE_S = 120.0
"""Give up a consume measurement after this long (then it reports what it read)."""
STALL_S = 10.0
"""... or after this long without a record once the first came."""
LATENCY_RECORDS = 10
LATENCY_VALUE = VALUE[:100]
LATENCY_POLL_S = 0.1
"""Batch-call timeout of both latency consumer threads (a call returns once it has records)."""
LATENCY_WARMUP = 5
"""Unmeasured transactions first: the consumer has joined and every path is warm."""
VISIBLE_TIMEOUT_S = 30.0


def _produce(p: KafkaProducer, topic: str, key: bytes, value: bytes = VALUE,
             partition: int = -1) -> None:
    """Produce one record, waiting for queue space when the local queue is full."""
    while True:
        try:
            p.produce(topic, value, key, partition=partition)  # -1: the partitioner's
            return
        except BufferError:
            p.poll(0.01)


def _produce_txnstream(cfg: Config, topic: str, records: int, per_txn: int) -> float:
    with Client(config=cfg) as client:
        producer = client.create_producer(topic)
        t0 = time.perf_counter()
        for start in range(0, records, per_txn):
            with client.transaction() as txn:
                for i in range(start, min(records, start + per_txn)):
                    producer.send(VALUE, key=str(i).encode(), txn=txn)
        secs = time.perf_counter() - t0
        producer.flush()
    return records / secs


def _produce_plain(cfg: Config, topic: str, records: int) -> float:
    p = KafkaProducer(cfg.producer())
    t0 = time.perf_counter()
    for i in range(records):
        _produce(p, topic, str(i).encode())
        p.poll(0)
    p.flush(60)
    return records / (time.perf_counter() - t0)


def _produce_kafka_txn(cfg: Config, topic: str, records: int, per_txn: int) -> float:
    p = KafkaProducer(cfg.common() | {"transactional.id": f"bench-{uuid.uuid4().hex[:6]}",
                                      "linger.ms": 5})
    p.init_transactions(30)
    t0 = time.perf_counter()
    for start in range(0, records, per_txn):
        p.begin_transaction()
        for i in range(start, min(records, start + per_txn)):
            _produce(p, topic, str(i).encode())
            p.poll(0)
        p.commit_transaction(60)
    return records / (time.perf_counter() - t0)


# ------------------------------------------------------------------ batch calls


def receive_batch(consumer: object, max_records: int, timeout_s: float) -> list[Message]:
    """``consumer.receive_batch``; until the consumer rewrite lands, the same contract
    from ``receive``: up to ``max_records`` committed records, [] on timeout."""
    rb = getattr(consumer, "receive_batch", None)
    if rb is not None:
        return rb(max_records, timeout_s)
    first = consumer.receive(timeout_s=timeout_s)  # type: ignore[attr-defined]
    if first is None:
        return []
    out = [first]
    while len(out) < max_records:
        m = consumer.receive(timeout_s=0)  # type: ignore[attr-defined]
        if m is None:
            break
        out.append(m)
    return out


def kafka_batch(c: KafkaConsumer, max_records: int, timeout_s: float) -> list[KafkaMessage]:
    """The anchor's batch call, with ``receive_batch``'s contract: up to ``max_records``
    records, as soon as one is there (``consume(n, t)`` would wait to fill all n), [] on
    timeout."""
    first = c.poll(timeout_s)
    if first is None:
        return []
    return [first, *c.consume(max_records - 1, 0)] if max_records > 1 else [first]


def to_message(m: KafkaMessage) -> Message | None:
    """What a txnstream user gets for a record, built by hand from a Kafka record: user
    headers only, ``txn_id`` from the ``txn.id`` header; None for a ``txn.marker``."""
    txn_id = None
    user = []
    for k, v in m.headers() or ():
        if k == TXN_ID_HEADER:
            txn_id = TxnID.from_bytes(v)
        elif k == TXN_MARKER_HEADER:
            return None
        else:
            user.append((k, v))
    # made as the consumer makes its own (make_message: in C where it is built), so
    # both sides pay the same for the object handed to the user
    return make_message(m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                        tuple(user), m.timestamp()[1], txn_id, 0)


# ------------------------------------------------------------------ consume


class _Clock:
    """Rate from the first record: records after the first batch / time since it came."""

    def __init__(self) -> None:
        self.t_first: float | None = None
        self.t_last = 0.0
        self.n = 0
        self.n_first = 0

    def batch(self, count: int) -> None:
        now = time.perf_counter()
        if self.t_first is None:
            self.t_first, self.n_first = now, count
        self.t_last = now
        self.n += count

    def stalled(self) -> bool:
        return self.t_first is not None and time.perf_counter() - self.t_last > STALL_S

    def rate(self) -> float:
        if self.t_first is None or self.t_last <= self.t_first:
            return 0.0
        return (self.n - self.n_first) / (self.t_last - self.t_first)


def _consume_txnstream(cfg: Config, topic: str, records: int) -> tuple[float, int]:
    """rec/s and records read: subscribe from earliest, ``receive_batch`` to the end."""
    clock = _Clock()
    with Client(config=cfg) as client:
        c = client.subscribe(topic, f"bench-{uuid.uuid4().hex[:6]}",
                             initial_position="earliest")
        deadline = time.monotonic() + CONSUME_DEADLINE_S
        while clock.n < records and time.monotonic() < deadline and not clock.stalled():
            # never more than what is left: a call that waits to fill returns at once
            batch = receive_batch(c, min(CONSUME_BATCH, records - clock.n), 1.0)
            if batch:
                clock.batch(len(batch))
        c.close()
    return clock.rate(), clock.n


def _consume_read_committed(cfg: Config, topic: str, records: int) -> tuple[float, int]:
    """rec/s and records read by the anchor: ``read_committed``, a Message per record."""
    c = KafkaConsumer(cfg.consumer(f"bench-{uuid.uuid4().hex[:6]}",
                                   **{"isolation.level": "read_committed",
                                      "auto.offset.reset": "earliest"}))
    c.subscribe([topic])
    clock = _Clock()
    deadline = time.monotonic() + CONSUME_DEADLINE_S
    while clock.n < records and time.monotonic() < deadline and not clock.stalled():
        out = []
        for m in kafka_batch(c, CONSUME_BATCH, 1.0):
            if m.error():
                continue
            msg = to_message(m)
            if msg is not None:
                out.append(msg)
        if out:
            clock.batch(len(out))
    c.close()
    return clock.rate(), clock.n


# ------------------------------------------------------------------ produce-to-visible


def _visible_waiter(got: dict[int, int], done: queue.Queue, keys: list[bytes | None]) -> None:
    """Count records per txn (key ``j:i``); report a txn once all of its records came."""
    now = time.perf_counter()
    for k in keys:
        j = int((k or b"-1:").split(b":")[0])
        got[j] = got.get(j, 0) + 1
        if got[j] == LATENCY_RECORDS:
            done.put((j, now))


def _latencies(send_txn: Callable[[int], float], done: queue.Queue, txns: int,
               failed: threading.Event) -> list[float]:
    """Run ``LATENCY_WARMUP`` + ``txns`` txns one after another; ms from ``send_txn``'s
    t0 (just before its first send) to when the consumer thread had all its records."""
    lats = []
    for j in range(-LATENCY_WARMUP, txns):
        t0 = send_txn(j)
        wait_until = time.monotonic() + (60 if j < 0 else VISIBLE_TIMEOUT_S)
        while not failed.is_set():
            try:
                k, t_vis = done.get(timeout=max(0.0, wait_until - time.monotonic()))
            except queue.Empty:
                break  # never visible: not counted
            if k == j:
                if j >= 0:
                    lats.append((t_vis - t0) * 1000)
                break
    return lats


def _visible_latency_txnstream(cfg: Config, topic: str, txns: int) -> list[float]:
    done: queue.Queue = queue.Queue()
    ready, stop, failed = threading.Event(), threading.Event(), threading.Event()

    def consume() -> None:
        try:
            with Client(config=cfg) as client:
                c = client.subscribe(topic, f"bench-{uuid.uuid4().hex[:6]}",
                                     initial_position="earliest")
                ready.set()
                got: dict[int, int] = {}
                while not stop.is_set():
                    batch = receive_batch(c, CONSUME_BATCH, LATENCY_POLL_S)
                    if batch:
                        _visible_waiter(got, done, [m.key for m in batch])
                c.close()
        except Exception:
            failed.set()
            raise

    t = threading.Thread(target=consume, name="visible-consumer", daemon=True)
    t.start()
    ready.wait(30)
    try:
        with Client(config=cfg) as client:
            producer = client.create_producer(topic)

            def send_txn(j: int) -> float:
                with client.transaction() as txn:
                    t0 = time.perf_counter()
                    for i in range(LATENCY_RECORDS):
                        producer.send(LATENCY_VALUE, key=f"{j}:{i}".encode(), txn=txn,
                                      partition=0)
                return t0

            return _latencies(send_txn, done, txns, failed)
    finally:
        stop.set()
        t.join(30)


def _visible_latency_kafka(cfg: Config, topic: str, txns: int) -> list[float]:
    done: queue.Queue = queue.Queue()
    stop, failed = threading.Event(), threading.Event()

    def consume() -> None:
        try:
            c = KafkaConsumer(cfg.consumer(f"bench-{uuid.uuid4().hex[:6]}",
                                           **{"isolation.level": "read_committed",
                                              "auto.offset.reset": "earliest"}))
            c.subscribe([topic])
            got: dict[int, int] = {}
            while not stop.is_set():
                batch = kafka_batch(c, CONSUME_BATCH, LATENCY_POLL_S)
                keys = [m.key() for m in batch if not m.error()]
                if keys:
                    _visible_waiter(got, done, keys)
            c.close()
        except Exception:
            failed.set()
            raise

    t = threading.Thread(target=consume, name="visible-consumer-kafka", daemon=True)
    t.start()
    p = KafkaProducer(cfg.common() | {"transactional.id": f"bench-{uuid.uuid4().hex[:6]}",
                                      "linger.ms": 5})
    p.init_transactions(30)

    def send_txn(j: int) -> float:
        p.begin_transaction()
        t0 = time.perf_counter()
        for i in range(LATENCY_RECORDS):
            _produce(p, topic, f"{j}:{i}".encode(), LATENCY_VALUE, partition=0)
        p.commit_transaction(30)
        return t0

    try:
        return _latencies(send_txn, done, txns, failed)
    finally:
        stop.set()
        t.join(30)


# ------------------------------------------------------------------ run


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def run(cfg: Config, records: int = 100_000, txns: int = 300,
        progress: Callable[[dict], object] | None = None) -> list[dict]:
    """All measurements; rows for the report."""
    rows: list[dict] = []

    def add(row: dict) -> None:
        rows.append(row)
        if progress:
            progress(row)

    with workers(cfg, 1):
        t_tx, t_plain, t_ktx = (make_topic(cfg, 4) for _ in range(3))
        r_tx = _produce_txnstream(cfg, t_tx, records, 1000)
        r_plain = _produce_plain(cfg, t_plain, records)
        r_ktx = _produce_kafka_txn(cfg, t_ktx, records, 1000)
        add({"bench": "produce 1KB, 1000/txn", "txnstream rec/s": round(r_tx),
             "anchor": "plain produce", "anchor rec/s": round(r_plain),
             "ratio": _ratio(r_tx, r_plain), "goal": ">= 0.9"})
        add({"bench": "produce 1KB, 1000/txn", "txnstream rec/s": round(r_tx),
             "anchor": "Kafka txn producer", "anchor rec/s": round(r_ktx),
             "ratio": _ratio(r_tx, r_ktx), "goal": "-"})

        # consume: both read t_tx (txnstream-written); the second anchor reads t_ktx
        c_tx, n_tx = _consume_txnstream(cfg, t_tx, records)
        c_rc, n_rc = _consume_read_committed(cfg, t_tx, records)
        c_krc, n_krc = _consume_read_committed(cfg, t_ktx, records)

        def short(n: int) -> str:
            return "" if n >= records else f" (read {n} of {records})"

        name = f"committed-only consume, {records} x 1KB, batch {CONSUME_BATCH}"
        anchor = "read_committed consumer + Message per record"
        add({"bench": f"{name}, topic written by txnstream txns{short(n_tx)}",
             "txnstream rec/s": round(c_tx),
             "anchor": f"{anchor}, same topic{short(n_rc)}",
             "anchor rec/s": round(c_rc), "ratio": _ratio(c_tx, c_rc), "goal": ">= 0.8"})
        add({"bench": f"{name}, topic written by txnstream txns{short(n_tx)}",
             "txnstream rec/s": round(c_tx),
             "anchor": f"{anchor}, topic written by Kafka txns{short(n_krc)}",
             "anchor rec/s": round(c_krc), "ratio": _ratio(c_tx, c_krc), "goal": "-"})

        lat_tx = _visible_latency_txnstream(cfg, make_topic(cfg, 1), txns)
        lat_k = _visible_latency_kafka(cfg, make_topic(cfg, 1), txns)
        for q in (50, 99):
            a, b = pct(lat_tx, q), pct(lat_k, q)
            miss = [f"{s} {len(v)} of {txns} visible" for s, v in
                    (("txnstream", lat_tx), ("kafka", lat_k)) if len(v) < txns]
            add({"bench": f"produce-to-visible p{q}, {txns} txns of {LATENCY_RECORDS} x "
                          f"{len(LATENCY_VALUE)} B" + (f" ({', '.join(miss)})" if miss else ""),
                 "txnstream rec/s": f"{a:.1f} ms",
                 "anchor": "Kafka txn producer + read_committed consumer",
                 "anchor rec/s": f"{b:.1f} ms",
                 "ratio": _ratio(a, b), "goal": "<= 1.5" if q == 99 else "report",
                 "_ratio": a / b if b else None})
    return rows
