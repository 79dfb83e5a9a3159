"""Log truncation on a real broker: bounded under a long-lived owner, lossless across
owners (DESIGN.md section 5, point 4)."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTP

from tests.integration.coordinator.conftest import (
    FAST_FAILOVER_MS,
    make_topic,
    read_all,
    replay_log,
    wait_until,
)
from txnstream import Client, Config, TopicPartition, TxnID, TxnStatus
from txnstream.coordinator.protocol import TcOp
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.markers import MarkerKind, RecordKind, TxnMarker, classify_headers

pytestmark = pytest.mark.integration

FAST_CHECKPOINTS = WorkerSettings(session_timeout_ms=FAST_FAILOVER_MS, checkpoint_interval_s=1.0,
                                  end_retention_ms=0)
"""A checkpoint (and a truncation) every second, ended txns cut at once: what a day of
30 s checkpoints and 5 min retention does, in a few seconds."""


def _log_start(config: Config, tc: int) -> int:
    c = Consumer(config.consumer(f"probe-{uuid.uuid4().hex[:6]}"))
    try:
        return c.get_watermark_offsets(KafkaTP(config.topics.log, tc), timeout=10)[0]
    finally:
        c.close()


def _epoch(client: Client, tc: int) -> int:
    return {s.tc_id: s.stats for s in client.admin.coordinator_stats()}[tc]["epoch_offset"]


def _serve(config: Config, tc: int) -> CoordinatorWorker:
    w = CoordinatorWorker(config, settings=FAST_CHECKPOINTS).start()
    wait_until(lambda: tc in w.serving(), 60, "worker serving")
    return w


def _commit_some(client: Client, tc: int, topic: str, n: int) -> list[int]:
    seqs = []
    for _ in range(n):
        s = client.tc.request(TcOp.NEW, tc, timeout_ms=60_000).txn_seq
        client.tc.request(TcOp.ADD_PARTITIONS, tc, txn_seq=s,
                          partitions=(TopicPartition(topic, 0),))
        client.tc.request(TcOp.END, tc, txn_seq=s, commit=True)
        seqs.append(s)
    return seqs


def test_a_long_lived_owner_truncates_past_its_takeover_epoch(own_config):
    cfg = own_config
    tc = 0
    topic = make_topic(cfg, 1)
    client = Client(config=cfg)
    w = _serve(cfg, tc)
    try:
        takeover = _epoch(client, tc)
        done = _commit_some(client, tc, topic, 20)
        # Truncation passes the EPOCH this owner wrote when it took over.
        wait_until(lambda: _log_start(cfg, tc) > takeover, 20, "log truncated past the takeover")
        live = client.tc.request(TcOp.NEW, tc, timeout_ms=600_000).txn_seq
        client.tc.request(TcOp.ADD_PARTITIONS, tc, txn_seq=live,
                          partitions=(TopicPartition(topic, 0),))
        done += _commit_some(client, tc, topic, 20)
        time.sleep(3)  # more checkpoints and truncations while `live` is open
    finally:
        w.stop()
    # A new owner replays the truncated log: the live txn is intact and commits; no TxnID
    # comes back; the log is valid from its first record on.
    w2 = _serve(cfg, tc)
    try:
        assert replay_log(cfg, tc).invalid_records == 0
        client.tc.request(TcOp.END, tc, txn_seq=live, commit=True)
        wait_until(lambda: client.admin.get_transaction(TxnID(tc, live)).status
                   is TxnStatus.COMMITTED, 15, "the live txn committed by the new owner")
        fresh = client.tc.request(TcOp.NEW, tc, timeout_ms=60_000).txn_seq
        assert fresh > max(done + [live])
        kinds = {TxnMarker.decode(m.value()).kind for m in read_all(cfg, topic)
                 if classify_headers(m.headers()) == (RecordKind.MARKER, TxnID(tc, live))}
        assert kinds == {MarkerKind.COMMIT}
    finally:
        w2.stop()
        client.close()


def test_a_txn_opened_under_an_earlier_owner_survives_the_next_owners_truncation(own_config):
    """Owner A opens a txn; B takes over and truncates; C takes over. The record that
    opened the txn is valid only under A's EPOCH: B must not cut between them, or C
    loses the txn (and its registered partition never gets a marker)."""
    cfg = own_config
    tc = 1
    topic = make_topic(cfg, 1)
    client = Client(config=cfg)
    a = _serve(cfg, tc)
    try:
        seq = client.tc.request(TcOp.NEW, tc, timeout_ms=600_000).txn_seq
        client.tc.request(TcOp.ADD_PARTITIONS, tc, txn_seq=seq,
                          partitions=(TopicPartition(topic, 0),))
    finally:
        a.stop()
    b = _serve(cfg, tc)
    try:
        _commit_some(client, tc, topic, 5)
        time.sleep(3)  # B checkpoints and truncates every second
        # B cut at an EPOCH at or before the txn's first record: the log replays whole.
        assert replay_log(cfg, tc).invalid_records == 0
        assert seq in replay_log(cfg, tc).txns
    finally:
        b.stop()
    c = _serve(cfg, tc)
    try:
        info = client.admin.get_transaction(TxnID(tc, seq))
        assert info.status is TxnStatus.OPEN and info.partitions == (f"{topic}-0",), info
        client.tc.request(TcOp.END, tc, txn_seq=seq, commit=True)
        kinds = {TxnMarker.decode(m.value()).kind for m in read_all(cfg, topic)
                 if classify_headers(m.headers()) == (RecordKind.MARKER, TxnID(tc, seq))}
        assert kinds == {MarkerKind.COMMIT}
    finally:
        c.stop()
        client.close()
