"""Issue 13 and 22 benchmark: transactional produce against plain produce, same producer,
and against Kafka's own transactional producer; rate and CPU per record.

Every variant sends the same records (1 KB values, keys ``"0"`` .. ``"n-1"``, so the same
partitions) with the same librdkafka settings (a data producer's,
``txnstream.producer.data_producer_settings``: idempotent, ``linger.ms`` 5, the murmur2
partitioner, one request in flight per connection), each to a fresh topic of
:data:`PARTITIONS` partitions. The txnstream variants go through
``client.create_producer(topic)``, that is txnstream's
:class:`~txnstream.producer.Producer`. Each is timed from just before its first send (the
first ``new_transaction()`` / ``begin_transaction()`` for the transactional ones) to its
last acknowledgement: a commit returns only once every send of its transaction is
acknowledged, and the plain side ends with ``flush()``.

* transactional, ``send``: per :data:`PER_TXN` records, ``new_transaction()``,
  ``producer.send(value, key=key, txn=txn)`` for each, ``txn.commit()``;
* transactional, ``send_batch``: the same, the records of a transaction handed over in one
  ``producer.send_batch(values, partitions, txn, keys)`` call;
* transactional, ``send_batch`` + ``commit_async()``: the same, each transaction committed
  in the background while the next is written (a client keeps many transactions open;
  a Kafka producer one); timed to the last commit's end;
* the same at :data:`SMALL_TXN` records per transaction;
* plain: ``producer.send(value, key=key)`` without a transaction for each, ``flush()``;
* plain + a second read (a floor, issue 35): the same, while a plain confluent-kafka
  consumer in this process reads the same records once more (``consume()`` in batches, as
  the buffer owner's Python read does); timed to the last record read. A design that
  reads every record once more (txnstream's buffer owner does) cannot cost less;
* Kafka txn producer (the anchor of issue 22): a ``confluent_kafka.Producer`` with a
  ``transactional.id``, ``init_transactions()`` once, then per :data:`PER_TXN` (and, a
  second producer, per :data:`SMALL_TXN`) records ``begin_transaction()``, ``produce()``
  for each, ``commit_transaction()``.

Before timing, each producer sends one record (one transaction of one record for the
transactional ones, through the call the variant times: the topic's first registration,
which the client awaits, ``init_transactions()``, and the producer id of the handle
``send_batch`` drives, which a fresh idempotent librdkafka handle waits about 0.5 s for,
are out of the window). The variants take turns for ``rounds``
rounds; the median rate is reported.

CPU (issue 22): each variant's every round is a :meth:`bench.cpu.CpuMeter.window`, the
CPU of this client process, of the ``txnstream worker`` process and its buffer child, and
of the broker JVM (when the run started it: ``broker_pids``; else not measured), over the
timing window plus the work left behind (see :mod:`bench.cpu`); reported per record over
all rounds. The worker runs, idle or not, beside every variant, so its idle use counts for
the plain and the Kafka variants too.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka import TopicPartition as KafkaTP

from bench.common import goal_row, make_topic, ratio, workers
from bench.cpu import GROUPS, JIT, CpuMeter, CpuUse, cpu_text, jit_text
from txnstream import Client, Config
from txnstream.kafka.partitioning import murmur2_partition
from txnstream.producer import Producer, data_producer_settings

VALUE = b"v" * 1024
PER_TXN = 1000
SMALL_TXN = 100
"""Records per transaction of the small-transaction variants (issue 22)."""
PARTITIONS = 4
PLAIN_GOAL = 0.9
"""Transactional produce at least 0.9x plain produce (issue 4's goal, kept by issue 13)."""
QUEUE_FULL_WAIT_S = 0.05
"""The plain side's wait when librdkafka's local queue is full (the txn path does the same)."""
KAFKA_COMMIT_TIMEOUT_S = 60.0
KAFKA_INIT_TIMEOUT_S = 30.0


def _plain(producer: Producer, keys: list[bytes]) -> float:
    t0 = time.perf_counter()
    for k in keys:
        while True:
            try:
                producer.send(VALUE, key=k)
                break
            except BufferError:
                producer.flush(QUEUE_FULL_WAIT_S)
    producer.flush()
    return time.perf_counter() - t0


READ_TIMEOUT_S = 120.0


def _plain_read(producer: Producer, reader: KafkaConsumer, keys: list[bytes]) -> float:
    """:func:`_plain`, while ``reader`` reads the same records once more: timed to the
    later of the last acknowledgement and the last record read."""
    got = [0]

    def read() -> None:
        deadline = time.monotonic() + READ_TIMEOUT_S
        while got[0] < len(keys) and time.monotonic() < deadline:
            got[0] += sum(1 for m in reader.consume(5000, 0.1) if m.error() is None)

    t = threading.Thread(target=read, name="second-read")
    t0 = time.perf_counter()
    t.start()
    _plain(producer, keys)
    t.join()
    if got[0] != len(keys):
        raise RuntimeError(f"the second read got {got[0]} of {len(keys)} records")
    return time.perf_counter() - t0


def _second_reader(cfg: Config, topic: str) -> KafkaConsumer:
    """A plain consumer of ``topic``, assigned at its end (what is sent next, it reads)."""
    c = KafkaConsumer(cfg.consumer(f"bench-read-{uuid.uuid4().hex[:8]}"))
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    c.assign([KafkaTP(topic, p, c.get_watermark_offsets(KafkaTP(topic, p), timeout=10)[1])
              for p in parts])
    return c


def _txn_send(client: Client, producer: Producer, keys: list[bytes]) -> float:
    t0 = time.perf_counter()
    for start in range(0, len(keys), PER_TXN):
        txn = client.new_transaction()
        for k in keys[start:start + PER_TXN]:
            producer.send(VALUE, key=k, txn=txn)
        txn.commit()
    return time.perf_counter() - t0


def _txn_batch(client: Client, producer: Producer, keys: list[bytes]) -> float:
    parts = [murmur2_partition(k, producer.num_partitions) for k in keys]
    values = [VALUE] * len(keys)
    t0 = time.perf_counter()
    for start in range(0, len(keys), PER_TXN):
        end = start + PER_TXN
        txn = client.new_transaction()
        producer.send_batch(values[start:end], parts[start:end], txn, keys[start:end])
        txn.commit()
    return time.perf_counter() - t0


def _txn_batch_async(client: Client, producer: Producer, keys: list[bytes],
                     per_txn: int = PER_TXN) -> float:
    """``send_batch`` per txn, committed with ``commit_async()``: the next txn is written
    while the last one commits (txnstream keeps many txns open per producer)."""
    parts = [murmur2_partition(k, producer.num_partitions) for k in keys]
    values = [VALUE] * len(keys)
    t0 = time.perf_counter()
    commits = []
    for start in range(0, len(keys), per_txn):
        end = start + per_txn
        txn = client.new_transaction()
        producer.send_batch(values[start:end], parts[start:end], txn, keys[start:end])
        commits.append(txn.commit_async())
    for f in commits:
        f.result()
    return time.perf_counter() - t0


def _kafka_produce(p: KafkaProducer, topic: str, key: bytes) -> None:
    while True:
        try:
            p.produce(topic, VALUE, key)
            break
        except BufferError:
            p.poll(QUEUE_FULL_WAIT_S)
    p.poll(0)


def _kafka_txn(p: KafkaProducer, topic: str, keys: list[bytes], per_txn: int) -> float:
    """Kafka's own transactions: begin, ``produce()`` per record, commit, per txn."""
    t0 = time.perf_counter()
    for start in range(0, len(keys), per_txn):
        p.begin_transaction()
        for k in keys[start:start + per_txn]:
            _kafka_produce(p, topic, k)
        p.commit_transaction(KAFKA_COMMIT_TIMEOUT_S)
    return time.perf_counter() - t0


def _kafka_txn_producer(cfg: Config, topic: str) -> KafkaProducer:
    """A Kafka transactional producer, initialised, its first txn (one record) done."""
    p = KafkaProducer(data_producer_settings(
        cfg, **{"transactional.id": f"bench-{uuid.uuid4().hex[:8]}"}))
    p.init_transactions(KAFKA_INIT_TIMEOUT_S)
    p.begin_transaction()
    _kafka_produce(p, topic, b"warm-up")
    p.commit_transaction(KAFKA_COMMIT_TIMEOUT_S)
    return p


VARIANTS: dict[str, tuple[str, int | None]] = {
    "txn send": (f"{PER_TXN} x send(txn=) + commit per txn", PER_TXN),
    "txn send_batch": (f"send_batch({PER_TXN}) + commit per txn", PER_TXN),
    "txn send_batch async": (f"send_batch({PER_TXN}) + commit_async() per txn, the next "
                             "txn written while the last commits", PER_TXN),
    f"txn send_batch async {SMALL_TXN}": (
        f"send_batch({SMALL_TXN}) + commit_async() per txn, the next txn written while "
        "the last commits", SMALL_TXN),
    "plain": ("send() without txn, flush() at the end", None),
    "plain + read": ("send() without txn, flush() at the end, the same records read once "
                     "more by a plain consumer (the floor of one more read per record)", None),
    "kafka txn": (f"Kafka txn producer: begin, {PER_TXN} x produce(), commit per txn",
                  PER_TXN),
    f"kafka txn {SMALL_TXN}": (
        f"Kafka txn producer: begin, {SMALL_TXN} x produce(), commit per txn", SMALL_TXN),
}
"""Variant -> (what it does, records per txn or None); in the order they take turns."""


def run(cfg: Config, records: int = 20_000, rounds: int = 3,
        progress: Callable[[dict], object] | None = None,
        broker_pids: Sequence[int] | None = None) -> list[dict]:
    """The variants, ``rounds`` times each in turn; one row per variant (median rate, CPU
    per record over all rounds). ``broker_pids``: the broker JVMs to count (None: an
    external broker, its CPU not measured)."""
    keys = [str(i).encode() for i in range(records)]
    secs: dict[str, list[float]] = {name: [] for name in VARIANTS}
    cpu: dict[str, CpuUse] = {name: CpuUse() for name in VARIANTS}
    with workers(cfg, 1) as worker_pids, Client(config=cfg) as client:
        topics = {name: make_topic(cfg, PARTITIONS) for name in VARIANTS}
        prods = {name: client.create_producer(topics[name])
                 for name in VARIANTS if not name.startswith("kafka")}
        kafka = {name: _kafka_txn_producer(cfg, topics[name])
                 for name in VARIANTS if name.startswith("kafka")}
        for name in ("plain", "plain + read"):
            prods[name].send(VALUE, key=b"warm-up")
            prods[name].flush()
        reader = _second_reader(cfg, topics["plain + read"])
        for name, p in prods.items():
            if name.startswith("txn send_batch"):  # warms the native handle it times
                with client.transaction() as txn:
                    p.send_batch([VALUE], [murmur2_partition(b"warm-up", p.num_partitions)],
                                 txn, [b"warm-up"])
            elif not name.startswith("plain"):
                with client.transaction() as txn:
                    p.send(VALUE, key=b"warm-up", txn=txn)
        runs: dict[str, Callable[[], float]] = {
            "txn send": lambda: _txn_send(client, prods["txn send"], keys),
            "txn send_batch": lambda: _txn_batch(client, prods["txn send_batch"], keys),
            "txn send_batch async": lambda: _txn_batch_async(
                client, prods["txn send_batch async"], keys),
            f"txn send_batch async {SMALL_TXN}": lambda: _txn_batch_async(
                client, prods[f"txn send_batch async {SMALL_TXN}"], keys, SMALL_TXN),
            "plain": lambda: _plain(prods["plain"], keys),
            "plain + read": lambda: _plain_read(prods["plain + read"], reader, keys),
            "kafka txn": lambda: _kafka_txn(kafka["kafka txn"], topics["kafka txn"], keys,
                                            PER_TXN),
            f"kafka txn {SMALL_TXN}": lambda: _kafka_txn(
                kafka[f"kafka txn {SMALL_TXN}"], topics[f"kafka txn {SMALL_TXN}"], keys,
                SMALL_TXN),
        }
        meter = CpuMeter(worker_pids, broker_pids)
        meter.measure_idle()
        for _ in range(rounds):
            for name in VARIANTS:
                with meter.window() as use:
                    secs[name].append(runs[name]())
                cpu[name] += use
        for p in prods.values():
            p.close()
        for k in kafka.values():
            k.flush(KAFKA_COMMIT_TIMEOUT_S)
        reader.close()
    idle = meter.idle or {}
    rows = []
    for name, (what, per_txn) in VARIANTS.items():
        s = statistics.median(secs[name])
        per_rec = {g: cpu[name].seconds[g] / (records * rounds) * 1e6 for g in GROUPS}
        rows.append({"variant": name, "how": what, "records": records,
                     "records/txn": per_txn or "-",
                     "rec/s (median)": round(records / s),
                     "rounds rec/s": " / ".join(f"{records / x:.0f}" for x in secs[name]),
                     "MB/s": round(records * len(VALUE) / s / 1e6, 1),
                     "CPU µs/rec client / worker / broker": cpu_text(per_rec),
                     "CPU µs/rec total": round(sum(v for v in per_rec.values()
                                                   if not math.isnan(v)), 1),
                     "of the broker's, JIT µs/rec": jit_text(
                         cpu[name].seconds.get(JIT, math.nan), records * rounds),
                     "_cpu_us": per_rec,
                     "_idle_cores": idle, "_rest_timeouts": meter.timeouts})
        if progress:
            progress(rows[-1])
    return rows


def goals(rows: list[dict]) -> list[dict]:
    """Transactional against plain produce, both transactional variants."""
    by = {r["variant"]: r for r in rows}
    plain = by.get("plain")
    if plain is None:
        return []
    anchor = "plain produce: same txnstream Producer, no txn"
    return [goal_row(f"produce 1 KB, {PER_TXN}/txn, {by[v]['how']}",
                     f"{by[v]['rec/s (median)']} rec/s", anchor,
                     f"{plain['rec/s (median)']} rec/s",
                     ratio(by[v]["rec/s (median)"], plain["rec/s (median)"]), ">=", PLAIN_GOAL)
            for v in ("txn send", "txn send_batch", "txn send_batch async") if v in by]
