"""The CHECKPOINT record stays under its bound however many group outcomes (real broker).

Before the bound, a TC remembered 10,000 group outcomes; with 16 sink tasks per Spark
micro-batch that is over 1 MB, which librdkafka refuses at ``produce()``: every TC of the
worker restarted at each checkpoint and truncation stopped.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTP

from tests.integration.coordinator.conftest import (
    FAST_FAILOVER_MS,
    log_records,
    restarts,
    wait_until,
)
from txnstream import Client, Config, TxnStatus
from txnstream.coordinator.group_outcomes import MAX_CHECKPOINT_BYTES
from txnstream.coordinator.log_entry import GroupOutcome, LogEntryKind, TransactionLogEntry
from txnstream.coordinator.protocol import TcOp
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker

pytestmark = pytest.mark.integration

FIRST_SEQ = 10**7
"""A TC that has served a while: sequences of four varint bytes, as in production."""


def _seed_log(config: Config, tc: int, n_groups: int) -> list[str]:
    """The log of a TC that remembers ``n_groups`` outcomes of 16-task micro-batches (as
    the coordinator did before the bound): an EPOCH and checkpoints, over 1 MB in all."""
    query = str(uuid.uuid4())
    outcomes = [GroupOutcome(f"{query}/{b}", TxnStatus.COMMITTING,
                             tuple(range(FIRST_SEQ + 16 * b, FIRST_SEQ + 16 * b + 16)))
                for b in range(n_groups)]
    p = Producer(config.producer())
    offsets: list[int] = []

    def append(entry: TransactionLogEntry) -> int:
        p.produce(config.topics.log, entry.encode(), partition=tc,
                  on_delivery=lambda err, m: offsets.append(m.offset()))
        p.flush(30)
        return offsets[-1]

    floor = FIRST_SEQ + 16 * n_groups
    epoch = append(TransactionLogEntry(kind=LogEntryKind.EPOCH, epoch_offset=-1, owner_id="old",
                                       next_sequence=floor))
    total = 0
    for i in range(0, n_groups, 2_500):
        cp = TransactionLogEntry(kind=LogEntryKind.CHECKPOINT, epoch_offset=epoch,
                                 owner_id="old", next_sequence=floor,
                                 group_keys=tuple(outcomes[i:i + 2_500]))
        total += len(cp.encode())
        append(cp)
    assert total > 1_000_000, total
    return [g.key for g in outcomes]


def _log_start(config: Config, tc: int) -> int:
    c = Consumer(config.consumer(f"probe-{uuid.uuid4().hex[:6]}"))
    try:
        return c.get_watermark_offsets(KafkaTP(config.topics.log, tc), timeout=10)[0]
    finally:
        c.close()


def test_checkpoint_stays_bounded_past_a_megabyte_of_group_outcomes(own_config):
    cfg = own_config
    tc = 0
    old_keys = _seed_log(cfg, tc, 10_000)
    settings = WorkerSettings(session_timeout_ms=FAST_FAILOVER_MS, checkpoint_interval_s=1.0)
    w = CoordinatorWorker(cfg, settings=settings).start()
    client = Client(config=cfg)
    try:
        wait_until(lambda: tc in w.serving(), 60, "worker serving")
        # Live group commits on top, as a Spark sink makes them.
        live_query = str(uuid.uuid4())
        live_keys = []
        for b in range(3):
            key = f"{live_query}/{b}"
            seqs = tuple(client.tc.request(TcOp.NEW, tc, timeout_ms=60_000,
                                           group_key=key).txn_seq for _ in range(16))
            r = client.tc.request(TcOp.END_GROUP, tc, group_key=key, group_seqs=seqs,
                                  commit=True)
            assert not r.already
            live_keys.append(key)
        time.sleep(5)  # several checkpoint intervals
        mine = [m for m in log_records(cfg, tc)
                if (e := TransactionLogEntry.decode(m.value())).kind is LogEntryKind.CHECKPOINT
                and e.owner_id == w.worker_id]
        assert len(mine) >= 3, f"{len(mine)} checkpoints appended in 5 s at one per second"
        sizes = [len(m.value()) for m in mine]
        assert max(sizes) <= MAX_CHECKPOINT_BYTES, sizes
        # The TC kept serving all along: one takeover (no restart), still answering.
        assert restarts(client, tc) == 0
        assert tc in w.serving()
        client.tc.request(TcOp.NEW, tc, timeout_ms=60_000)
        # Truncation works: the oversized records of the old owner are gone.
        wait_until(lambda: _log_start(cfg, tc) > 0, 15, "log truncated")
    finally:
        w.stop()
    # A new owner, replaying the truncated log, recognises recent batches when replayed.
    w2 = CoordinatorWorker(cfg, settings=settings).start()
    try:
        wait_until(lambda: tc in w2.serving(), 60, "new owner serving")
        for key in (live_keys[-1], live_keys[0], old_keys[-1], old_keys[-500]):
            late = client.tc.request(TcOp.NEW, tc, timeout_ms=60_000, group_key=key).txn_seq
            r = client.tc.request(TcOp.END_GROUP, tc, group_key=key, group_seqs=(late,),
                                  commit=True)
            assert r.already, f"replay of {key} not recognised"
    finally:
        w2.stop()
        client.close()


def test_checkpoint_refused_by_a_small_log_costs_no_restart_and_shrinks_until_it_fits(
        own_config, caplog):
    """A log topic configured below the bound (``max.message.bytes`` of 64 KiB) refuses
    the checkpoint: the TC must keep serving (no restart loop), carry fewer outcomes
    next time, and truncate again once one fits."""
    cfg = own_config
    tc = 1
    limit = 64 * 1024
    keys = _seed_log(cfg, tc, 10_000)
    from tests.integration.coordinator.conftest import set_topic_config

    set_topic_config(cfg, cfg.topics.log, {"max.message.bytes": str(limit)})
    settings = WorkerSettings(session_timeout_ms=FAST_FAILOVER_MS, checkpoint_interval_s=1.0)
    w = CoordinatorWorker(cfg, settings=settings).start()
    client = Client(config=cfg)
    try:
        wait_until(lambda: tc in w.serving(), 60, "worker serving")

        def mine() -> list:
            return [m for m in log_records(cfg, tc)
                    if (e := TransactionLogEntry.decode(m.value())).kind
                    is LogEntryKind.CHECKPOINT and e.owner_id == w.worker_id]

        wait_until(lambda: mine(), 20, "a checkpoint that fits")
        assert "checkpoint not appended" in caplog.text
        assert all(len(m.value()) <= limit for m in mine())
        assert restarts(client, tc) == 0, "the TC restarted"
        client.tc.request(TcOp.NEW, tc, timeout_ms=60_000)
        wait_until(lambda: _log_start(cfg, tc) > 0, 15, "log truncated")
        late = client.tc.request(TcOp.NEW, tc, timeout_ms=60_000, group_key=keys[-1]).txn_seq
        r = client.tc.request(TcOp.END_GROUP, tc, group_key=keys[-1], group_seqs=(late,),
                              commit=True)
        assert r.already
    finally:
        w.stop()
        client.close()
