"""Issue 13 benchmark: transactional produce against plain produce, same producer.

Every variant sends the same records (1 KB values, keys ``"0"`` .. ``"n-1"``, so the same
partitions) through the same kind of producer: ``client.create_producer(topic)``, that is
txnstream's :class:`~txnstream.producer.Producer` with the same librdkafka settings
(``Config.producer()``: idempotent, ``linger.ms`` 5, the murmur2 partitioner), each to a
fresh topic of :data:`PARTITIONS` partitions. Each is timed from just before its first
send (the first ``new_transaction()`` for the transactional ones) to its last
acknowledgement: a commit returns only once every send of its transaction is acknowledged,
and the plain side ends with ``flush()``.

* transactional, ``send``: per :data:`PER_TXN` records, ``new_transaction()``,
  ``producer.send(value, key=key, txn=txn)`` for each, ``txn.commit()``;
* transactional, ``send_batch``: the same, the records of a transaction handed over in one
  ``producer.send_batch(values, partitions, txn, keys)`` call;
* transactional, ``send_batch`` + ``commit_async()``: the same, each transaction committed
  in the background while the next is written (a client keeps many transactions open;
  a Kafka producer one); timed to the last commit's end;
* plain: ``producer.send(value, key=key)`` without a transaction for each, ``flush()``.

Before timing, each producer sends one record (one transaction of one record for the
transactional ones: the topic's first registration, which the client awaits, is out of
the window). The variants take turns for ``rounds`` rounds; the median rate is reported.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from bench.common import goal_row, make_topic, ratio, workers
from txnstream import Client, Config
from txnstream.kafka.partitioning import murmur2_partition
from txnstream.producer import Producer

VALUE = b"v" * 1024
PER_TXN = 1000
PARTITIONS = 4
PLAIN_GOAL = 0.9
"""Transactional produce at least 0.9x plain produce (issue 4's goal, kept by issue 13)."""
QUEUE_FULL_WAIT_S = 0.05
"""The plain side's wait when librdkafka's local queue is full (the txn path does the same)."""


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


def _txn_batch_async(client: Client, producer: Producer, keys: list[bytes]) -> float:
    """``send_batch`` per txn, committed with ``commit_async()``: the next txn is written
    while the last one commits (txnstream keeps many txns open per producer)."""
    parts = [murmur2_partition(k, producer.num_partitions) for k in keys]
    values = [VALUE] * len(keys)
    t0 = time.perf_counter()
    commits = []
    for start in range(0, len(keys), PER_TXN):
        end = start + PER_TXN
        txn = client.new_transaction()
        producer.send_batch(values[start:end], parts[start:end], txn, keys[start:end])
        commits.append(txn.commit_async())
    for f in commits:
        f.result()
    return time.perf_counter() - t0


def run(cfg: Config, records: int = 20_000, rounds: int = 3,
        progress: Callable[[dict], object] | None = None) -> list[dict]:
    """The three variants, ``rounds`` times each in turn; one row per variant (median)."""
    keys = [str(i).encode() for i in range(records)]
    secs: dict[str, list[float]] = {"plain": [], "txn send": [], "txn send_batch": [],
                                    "txn send_batch async": []}
    with workers(cfg, 1), Client(config=cfg) as client:
        prods = {name: client.create_producer(make_topic(cfg, PARTITIONS)) for name in secs}
        prods["plain"].send(VALUE, key=b"warm-up")
        prods["plain"].flush()
        for name in ("txn send", "txn send_batch", "txn send_batch async"):
            with client.transaction() as txn:
                prods[name].send(VALUE, key=b"warm-up", txn=txn)
        for _ in range(rounds):
            secs["txn send"].append(_txn_send(client, prods["txn send"], keys))
            secs["plain"].append(_plain(prods["plain"], keys))
            secs["txn send_batch"].append(_txn_batch(client, prods["txn send_batch"], keys))
            secs["txn send_batch async"].append(
                _txn_batch_async(client, prods["txn send_batch async"], keys))
        for p in prods.values():
            p.close()
    rows = []
    for name, what in (("txn send", f"{PER_TXN} x send(txn=) + commit per txn"),
                       ("txn send_batch", f"send_batch({PER_TXN}) + commit per txn"),
                       ("txn send_batch async",
                        f"send_batch({PER_TXN}) + commit_async() per txn, the next txn "
                        "written while the last commits"),
                       ("plain", "send() without txn, flush() at the end")):
        s = statistics.median(secs[name])
        rows.append({"variant": name, "how": what, "records": records,
                     "records/txn": PER_TXN if name != "plain" else "-",
                     "rec/s (median)": round(records / s),
                     "rounds rec/s": " / ".join(f"{records / x:.0f}" for x in secs[name]),
                     "MB/s": round(records * len(VALUE) / s / 1e6, 1)})
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
