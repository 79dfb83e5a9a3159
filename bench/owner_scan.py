"""Issue 35: the buffer owner's read and fold of a backlog, native scan vs Python.

One topic, one partition, filled once with ``records`` 1 KB records in txns of
``per_txn`` members (each with its ``txn.id`` and ``txn.tag``) and a signed COMMIT marker
after each, as txnstream's writers and workers write them. The same backlog is then read
from offset 0 to its end, in alternating rounds, three ways in this process:

* ``plain consume`` (the floor): confluent-kafka's ``consume()`` of every record, nothing
  else: what handing each record to Python costs before any fold;
* ``python``: the owner's read and fold (``DataScan`` with the native scan off:
  confluent-kafka's messages cut into runs in Python, ``fold_entries``);
* ``native``: the same with ``txnstream._native`` (librdkafka's messages cut into runs
  in C, the same ``fold_entries``).

CPU is the process's (every thread: librdkafka's fetch threads too), per record, median
of the rounds. Rows: each way's µs per record and records/s, and the ratios.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka import TopicPartition as KafkaTP

from bench.common import make_topic
from txnstream import Config
from txnstream.buffer import TransactionBuffer
from txnstream.buffer.scan import DataScan, native_scan
from txnstream.markers import MarkerKind, MarkerSigner, TxnMarker
from txnstream.membership import txn_headers
from txnstream.types import TopicPartition, TxnID

VALUE = b"x" * 1024
SIGNER = MarkerSigner.from_secret("bench owner scan", "bench")
WAYS = ("plain consume", "python", "native")


def fill(cfg: Config, topic: str, records: int, per_txn: int) -> int:
    """The backlog; returns its log end."""
    keys = SIGNER.membership
    assert keys is not None
    p = KafkaProducer({**cfg.producer(), "linger.ms": 20, "batch.size": 1 << 20})
    n = seq = 0
    while n < records:
        t = TxnID(0, seq)
        seq += 1
        headers = txn_headers(t, keys.txn_key(t), topic, 0)
        for _ in range(min(per_txn, records - n)):
            while True:
                try:
                    p.produce(topic, VALUE, partition=0, headers=headers)
                    break
                except BufferError:  # the local queue is full: let it drain
                    p.poll(0.1)
            n += 1
        m = TxnMarker(t, MarkerKind.COMMIT, 0)
        v = m.encode()
        p.produce(topic, v, partition=0, headers=list(SIGNER.headers(m, topic, 0, v)))
    assert p.flush(60) == 0
    return n + seq


def _consumer(cfg: Config, cid: str) -> Consumer:
    return Consumer(cfg.consumer(f"bench-scan-{uuid.uuid4().hex[:6]}",
                                 **{"client.id": cid, "fetch.wait.max.ms": 5}))


def read(cfg: Config, topic: str, end: int, way: str) -> tuple[float, float]:
    """(CPU s, wall s) to read the backlog ``way``."""
    cid = f"tb-data-bench-{uuid.uuid4().hex[:6]}"
    c = _consumer(cfg, cid)
    tp = TopicPartition(topic, 0)
    scan = None if way == "plain consume" else DataScan(c, cid, native=way == "native")
    if scan is not None:
        assert scan.native == (way == "native"), f"{way}: the native scan did not load"
        scan.attach(tp)
    c.incremental_assign([KafkaTP(topic, 0, 0)])
    buf = TransactionBuffer(tp, signer=SIGNER)
    step: Callable[[], int]
    if scan is None:
        last = [-1]

        def step() -> int:
            for m in c.consume(5000, 0.1):
                last[0] = m.offset()
            return last[0]
    else:
        def step() -> int:
            assert scan is not None
            for entries in scan.read(5000, 0.1).values():
                buf.fold_entries(entries)
            return buf.last_offset
    cpu0, wall0 = time.process_time(), time.monotonic()
    try:
        while step() < end - 1:
            if time.monotonic() - wall0 > 300:
                raise RuntimeError(f"{way}: the backlog was not read in 300 s")
        return time.process_time() - cpu0, time.monotonic() - wall0
    finally:
        if scan is not None:
            scan.close()
        c.close()


def run(cfg: Config, records: int = 200_000, per_txn: int = 1000, rounds: int = 3,
        progress: Callable[[str], None] = print) -> list[dict]:
    """Rows: per way, µs CPU per record and records/s (median of ``rounds``); ratios."""
    if native_scan() is None:
        return [{"measure": "owner read + fold", "note": "txnstream._native not built"}]
    topic = make_topic(cfg, 1, f"bench-scan-{uuid.uuid4().hex[:6]}")
    end = fill(cfg, topic, records, per_txn)
    got: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    for r in range(rounds):
        for way in WAYS if r % 2 == 0 else tuple(reversed(WAYS)):
            cpu, wall = read(cfg, topic, end, way)
            got[way].append((cpu, wall))
            progress(f"owner scan round {r + 1}: {way}: {cpu / end * 1e6:.2f} µs CPU/record, "
                     f"{end / wall:,.0f} rec/s")
    us = {w: statistics.median(c for c, _ in got[w]) / end * 1e6 for w in WAYS}
    rate = {w: end / statistics.median(x for _, x in got[w]) for w in WAYS}
    rows = [{"measure": f"owner read + fold: {w}", "µs CPU/record": f"{us[w]:.2f}",
             "rec/s": f"{rate[w]:,.0f}", "records": end, "record": "1 KB",
             "txn": f"{per_txn} + marker"} for w in WAYS]
    rows.append({"measure": "native / python (CPU per record)",
                 "µs CPU/record": f"{us['native'] / us['python']:.2f}x"})
    rows.append({"measure": "native / plain consume (CPU per record)",
                 "µs CPU/record": f"{us['native'] / us['plain consume']:.2f}x"})
    return rows
