"""Buffer-slot failover with real ``txnstream worker`` processes (issue 12).

Two workers share the buffer slots (and the coordinators). Producer threads commit and
abort transactions continuously on a 4-partition topic, with plain records in between,
while a committed-only consumer reads and acks. The worker that owns the buffer slot of
one data partition is killed with SIGKILL mid-stream; the survivor claims the slot
(after about the session timeout) and serves the partition from the last snapshot and
the log. Once the producers stopped and every transaction ended, the consumer must have
delivered every committed and every plain record exactly once, no record of an aborted
transaction, each partition in offset order, and it must have kept delivering records
written after the kill.

Ground truth is the data topic itself, read raw at the end (which values are in the log,
at which offsets, in which txn) and the coordinators' final status of every txn (so a
commit whose answer was lost in the failover is judged by what the coordinator decided).
"""

from __future__ import annotations

import random
import re
import signal
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from confluent_kafka import KafkaException

from tests.integration.coordinator.conftest import (
    FAST_FAILOVER_MS,
    make_topic,
    read_all,
    wait_until,
)
from txnstream import Client, TopicPartition, TxnID, TxnStatus
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.errors import TxnStreamError
from txnstream.markers import RecordKind, classify_headers

pytestmark = [pytest.mark.integration, pytest.mark.fault]

PARTITIONS = 4
PRODUCERS = 3
RUN_BEFORE_KILL_S = 6.0
RUN_AFTER_TAKEOVER_S = 6.0
"""Producers keep going this long after the survivor claimed the slot."""
MIN_TXNS = 100
"""Txns ended, before and after the kill together, for the run to mean anything."""
TXN_TIMEOUT_S = 8.0
"""Txns left open on the killed worker's coordinators are aborted this soon."""
TAKEOVER_BOUND_S = FAST_FAILOVER_MS / 1000 + 14
"""Session timeout, then a rebalance and the claim; generous for a loaded 2-core box."""
FINAL = (TxnStatus.COMMITTED, TxnStatus.ABORTED)
OWNS = re.compile(r"buffer worker (\S+): owns slot (\d+) \(generation (\d+)\)")


def slot_owners(logs: dict[str, str]) -> dict[int, tuple[int, str]]:
    """Slot -> (generation, member) of its latest claim, from the workers' logs.

    A claim's generation is the offset of its OWNER record in the slot's state
    partition, so the highest one is the current owner's.
    """
    best: dict[int, tuple[int, str]] = {}
    for text in logs.values():
        for m in OWNS.finditer(text):
            slot, gen = int(m.group(2)), int(m.group(3))
            if slot not in best or gen > best[slot][0]:
                best[slot] = (gen, m.group(1))
    return best


@dataclass
class Ledger:
    """What the producer threads did, as their clients were told."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    told: dict[TxnID, TxnStatus] = field(default_factory=dict)
    unknown: set[TxnID] = field(default_factory=set)
    plain_sent: int = 0
    txn_errors: int = 0

    def ended(self) -> int:
        with self.lock:
            return len(self.told) + len(self.unknown)

    def end(self, txn_id: TxnID, status: TxnStatus | None) -> None:
        with self.lock:
            assert txn_id not in self.told and txn_id not in self.unknown, f"{txn_id} twice"
            if status is None:
                self.unknown.add(txn_id)
                self.txn_errors += 1
            else:
                self.told[txn_id] = status


def produce(client: Client, topic: str, ledger: Ledger, stop: threading.Event,
            tid: int, errors: list) -> None:
    """Txns of 1-4 records on random partitions, 60% committed, and a plain record per txn."""
    try:
        rng = random.Random(tid)
        producer = client.create_producer(topic)
        n = 0
        while not stop.is_set():
            n += 1
            producer.send(f"p:{tid}:{n}".encode(), partition=rng.randrange(PARTITIONS))
            with ledger.lock:
                ledger.plain_sent += 1
            try:
                txn = client.new_transaction(timeout_s=TXN_TIMEOUT_S)
            except TxnStreamError:
                time.sleep(0.1)  # never opened as far as this client knows
                continue
            commit = rng.random() < 0.6
            try:
                for j in range(rng.randint(1, 4)):
                    producer.send(f"t:{tid}:{n}:{j}".encode(),
                                  partition=rng.randrange(PARTITIONS), txn=txn)
                (txn.commit if commit else txn.abort)()
            except TxnStreamError:
                ledger.end(txn.id, None)  # the coordinators' final status decides
                continue
            ledger.end(txn.id, TxnStatus.COMMITTED if commit else TxnStatus.ABORTED)
        producer.flush()
    except BaseException as exc:  # surfaces in the test thread
        errors.append(exc)


def consume(consumer, got: list, stop: threading.Event, errors: list) -> None:
    """Receive in batches, ack every record; (monotonic time, Message) per delivery."""
    try:
        while not stop.is_set():
            batch = consumer.receive_batch(500, timeout_s=0.5)
            now = time.monotonic()
            for m in batch:
                got.append((now, m))
                consumer.acknowledge(m)
    except BaseException as exc:
        errors.append(exc)


@pytest.mark.slow
def test_kill9_buffer_slot_owner_midstream_reader_exactly_once(config, worker_procs, client,
                                                               proc_reaper):
    names = ("bw1", "bw2")
    for name in names:
        proc_reaper.track(worker_procs.start(name))
    logs = lambda: {n: worker_procs.log(n) for n in names}  # noqa: E731

    def stable() -> bool:
        owned = slot_owners(logs())
        return (set(owned) == set(range(config.num_buffer_slots))
                and {m for _, m in owned.values()} == set(names))

    wait_until(lambda: _tcs_served(client, config.num_coordinators), 90, "coordinators served")
    wait_until(stable, 90, "both workers owning buffer slots")

    topic = make_topic(config, PARTITIONS, "bfail")
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    # Register every partition (a txn on each), so the buffer owners serve them all.
    warm = client.create_producer(topic)
    with client.transaction() as warm_txn:
        for p in range(PARTITIONS):
            warm.send(f"warm:{p}".encode(), partition=p, txn=warm_txn)
    wait_until(lambda: all(_folded_to_end(client, tp) for tp in tps), 60,
               "every partition served")

    store = TransactionBufferSnapshotStore(config)
    slot_of = {tp: store.partition_of(tp) for tp in tps}
    owned = slot_owners(logs())
    target = tps[0]
    victim_slot = slot_of[target]
    victim_gen, victim = owned[victim_slot]
    survivor = next(n for n in names if n != victim)
    victim_slots = {s for s, (_, m) in owned.items() if m == victim}
    victim_tps = [tp for tp in tps if slot_of[tp] in victim_slots]
    print(f"slots of partitions: { {tp.partition: s for tp, s in slot_of.items()} }; "
          f"owners: {owned}; killing {victim} (partitions {[tp.partition for tp in victim_tps]})")

    ledger = Ledger()
    ledger.told[warm_txn.id] = TxnStatus.COMMITTED
    errors: list = []
    got: list = []
    stop_producing, stop_reading = threading.Event(), threading.Event()
    consumer = client.subscribe(topic, subscription=f"bfail-{uuid.uuid4().hex[:6]}")
    reader = threading.Thread(target=consume, args=(consumer, got, stop_reading, errors),
                              name="reader")
    producers = [threading.Thread(target=produce, name=f"producer-{i}",
                                  args=(client, topic, ledger, stop_producing, i, errors))
                 for i in range(PRODUCERS)]
    try:
        reader.start()
        for t in producers:
            t.start()
        time.sleep(RUN_BEFORE_KILL_S)
        # A loaded machine ends fewer txns in the same seconds: run until there is enough
        # traffic on both sides of the kill to mean anything, not for a fixed time only.
        wait_until(lambda: ledger.ended() >= MIN_TXNS // 2, 60, "traffic before the kill")
        wait_until(lambda: len(got) > 0, 30, "the reader delivering before the kill")
        hw_at_kill = _high_watermarks(config, topic)
        delivered_before = len(got)
        worker_procs.signal(victim, signal.SIGKILL)
        t_kill = time.monotonic()
        worker_procs.procs[victim].wait(10)

        def taken_over() -> bool:
            gen, member = slot_owners({survivor: worker_procs.log(survivor)}).get(
                victim_slot, (-1, ""))
            return member == survivor and gen > victim_gen

        wait_until(taken_over, TAKEOVER_BOUND_S, f"{survivor} claiming slot {victim_slot}",
                   every=0.1)
        takeover_s = time.monotonic() - t_kill
        t_takeover = time.monotonic()
        time.sleep(RUN_AFTER_TAKEOVER_S)
        ended_at_takeover = ledger.ended()
        wait_until(lambda: ledger.ended() >= max(MIN_TXNS, ended_at_takeover + 10), 60,
                   "traffic after the takeover")
    finally:
        stop_producing.set()
        for t in producers:
            t.join(120)
    try:
        assert not errors, f"a producer failed: {errors!r}"
        assert all(not t.is_alive() for t in producers), "a producer thread hung"
        # Every txn ends: those open on the killed coordinators at their timeout.
        status = _final_statuses(client, set(ledger.told) | ledger.unknown)
        wrong = {t: (s, status[t]) for t, s in ledger.told.items() if status[t] is not s}
        assert not wrong, f"txns ended other than their clients were told: {wrong}"

        # Ground truth: what the log holds.
        values: dict[bytes, tuple[int, int, TxnID | None]] = {}
        for m in read_all(config, topic):
            kind, txn_id = classify_headers(m.headers())
            if kind is RecordKind.MARKER:
                continue
            assert m.value() not in values, f"value {m.value()!r} written twice"
            values[m.value()] = (m.partition(), m.offset(), txn_id)
        for v, (_, _, txn_id) in values.items():
            assert txn_id is None or txn_id in status, f"{v!r} of an unknown txn {txn_id}"
        committed = {v for v, (_, _, t) in values.items()
                     if t is None or status.get(t) is TxnStatus.COMMITTED}
        aborted = {v for v, (_, _, t) in values.items()
                   if t is not None and status.get(t) is TxnStatus.ABORTED}
        assert len(committed) + len(aborted) == len(values)

        # The reader catches up with everything committed, then a little longer: a
        # duplicate or an aborted record delivered late would show.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not errors:
            if committed <= {m.value for _, m in got}:
                break
            time.sleep(0.5)
        time.sleep(3)
    finally:
        stop_reading.set()
        reader.join(30)
        consumer.close()
    assert not errors, f"the reader failed: {errors!r}"

    delivered = [m.value for _, m in got]
    counts: dict[bytes, int] = defaultdict(int)
    for v in delivered:
        counts[v] += 1
    dupes = {v: c for v, c in counts.items() if c > 1}
    missing = committed - set(counts)
    leaked = aborted & set(counts)
    unknown_values = set(counts) - set(values)
    order_breaks = []
    last: dict[int, int] = {}
    for _, m in got:
        if m.offset <= last.get(m.partition, -1):
            order_breaks.append((m.partition, last[m.partition], m.offset))
        last[m.partition] = max(last.get(m.partition, -1), m.offset)
    wrong_offset = [(m.value, m.offset) for _, m in got
                    if m.value in values and values[m.value][:2] != (m.partition, m.offset)]
    after_kill = [m for t, m in got[delivered_before:]
                  if m.tp in victim_tps and m.offset >= hw_at_kill[m.partition]]
    after_takeover = [m for t, m in got if t >= t_takeover and m.tp in victim_tps]
    gaps = [b[0] - a[0] for a, b in zip(got, got[1:], strict=False)]
    n_told_commit = sum(s is TxnStatus.COMMITTED for s in ledger.told.values())
    print(f"takeover of slot {victim_slot} by {survivor}: {takeover_s:.1f}s after the kill; "
          f"txns told committed {n_told_commit}, told aborted "
          f"{len(ledger.told) - n_told_commit}, outcome unknown {len(ledger.unknown)}; "
          f"plain sent {ledger.plain_sent}; values in log {len(values)}, committed+plain "
          f"{len(committed)}, aborted {len(aborted)}; delivered {len(delivered)} "
          f"({len(got) - delivered_before} after the kill, {len(after_kill)} of the "
          f"victim's partitions written after it); longest delivery gap "
          f"{max(gaps, default=0):.1f}s")

    assert not unknown_values, f"delivered values not in the log: {sorted(unknown_values)[:5]}"
    assert not dupes, (f"{len(dupes)} values delivered more than once, e.g. "
                       f"{list(dupes.items())[:5]}")
    assert not leaked, f"{len(leaked)} aborted values delivered, e.g. {sorted(leaked)[:5]}"
    assert not missing, (f"{len(missing)} committed/plain values never delivered, e.g. "
                         f"{sorted((values[v][:2], v) for v in missing)[:5]}")
    assert not order_breaks, f"offset order broken (partition, previous, next): {order_breaks[:5]}"
    assert not wrong_offset, f"values delivered at other offsets: {wrong_offset[:5]}"
    assert ledger.ended() >= MIN_TXNS, "too little traffic to mean anything"
    assert aborted, "no aborted txn to check"
    assert after_kill, "nothing written after the kill was delivered from the killed " \
                       "owner's partitions"
    assert after_takeover, "the reader delivered nothing of those partitions after the takeover"


def _tcs_served(client: Client, n: int) -> bool:
    try:
        return len(client.admin.coordinator_stats()) == n
    except (TxnStreamError, KafkaException):  # topics just created: no leader yet
        return False


def _folded_to_end(client: Client, tp: TopicPartition) -> bool:
    try:
        stats = client.admin.buffer_stats(tp)
    except TxnStreamError:
        return False
    return stats.ongoing == 0 and stats.max_read_position >= 1


def _high_watermarks(config, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTP

    c = Consumer(config.consumer(f"hw-{uuid.uuid4().hex[:6]}"))
    try:
        return {p: c.get_watermark_offsets(KafkaTP(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)}
    finally:
        c.close()


def _final_statuses(client: Client, txns: set[TxnID], wait_s: float = 60) -> dict:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            view = {t.txn_id: t.status for t in client.admin.list_transactions()}
        except TxnStreamError:
            view = {}
        pending = [t for t in txns if view.get(t) not in FINAL]
        if not pending:
            return view
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(pending)} txns never ended, e.g. "
                                 f"{[(t, view.get(t)) for t in pending[:3]]}")
        time.sleep(1)
