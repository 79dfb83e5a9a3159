"""Guarantees among strangers on the line (DESIGN.md section 10), against a real worker.

The worker authenticates three principals: ``alice`` and ``bob`` (ordinary users, from a
users file) and its own principal ``txnstream`` (the admin). Every client below talks to
it over real sockets with its own secret.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTP

from txnstream import Client
from txnstream.config import Config
from txnstream.coordinator import handlers
from txnstream.coordinator.protocol import TcOp
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.errors import (
    ConfigError,
    CoordinatorAuthError,
    InvalidRequestError,
    InvalidTxnStatusError,
    NotAuthorizedError,
    TooManyRequestsError,
    TransactionTimeoutError,
    TxnStreamError,
)
from txnstream.markers import RecordKind, classify_headers
from txnstream.types import TxnID

from .conftest import FAST_FAILOVER_MS, make_topic, restarts, wait_until

ADMIN_SECRET = "admin-secret-9f2c"
SECRETS = {"alice": "alice-secret-1d7e", "bob": "bob-secret-55aa"}
OPEN_LIMIT = 300


@pytest.fixture
def secured(own_config: Config, tmp_path: Path) -> Iterator[tuple[Config, CoordinatorWorker]]:
    config = own_config
    users = tmp_path / "tc-users"
    users.write_text("".join(f"{who}={secret}\n" for who, secret in SECRETS.items()))
    users.chmod(0o600)
    worker_cfg = config.with_(tc_secret=ADMIN_SECRET, tc_users_file=str(users))
    w = CoordinatorWorker(worker_cfg, settings=WorkerSettings(
        session_timeout_ms=FAST_FAILOVER_MS, max_open_txns_per_principal=OPEN_LIMIT))
    w.start()
    try:
        wait_until(lambda: len(w.serving()) == config.num_coordinators, 60, "worker serving")
        assert w.buffers is not None
        wait_until(lambda: len(w.buffers.owned_slots()) == config.num_buffer_slots, 60,
                   "buffer slots served")
        yield config, w
    finally:
        w.stop()


@pytest.fixture
def clients(secured: tuple[Config, CoordinatorWorker]) -> Iterator[Callable[[str], Client]]:
    config, _ = secured
    made: list[Client] = []

    def make(who: str) -> Client:
        secret = ADMIN_SECRET if who == "txnstream" else SECRETS.get(who, "not-a-secret")
        c = Client(config=config.with_(tc_principal=who, tc_secret=secret))
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_a_second_principal_cannot_end_extend_add_to_or_read_the_first_ones_txn(clients):
    """Old: any client that reached the port committed, aborted, activated or extended
    any txn (a foreign COMMIT made the opener's later sends land after the marker)."""
    alice, bob, admin = clients("alice"), clients("bob"), clients("txnstream")
    txn = alice.new_transaction(timeout_s=60, tc_id=0)
    seq = txn.id.least_bits
    for op, fields in ((TcOp.END, {"commit": True}), (TcOp.END, {"commit": False}),
                       (TcOp.ACTIVATE, {"timeout_ms": 600_000, "open_time_ms": 0}),
                       (TcOp.ADD_PARTITIONS, {"partitions": ()}), (TcOp.GET, {})):
        with pytest.raises(NotAuthorizedError, match="principal 'bob' may not"):
            bob.tc.request(op, 0, txn_seq=seq, **fields)
    with pytest.raises(NotAuthorizedError):
        bob.attach_transaction(txn.id).flush()
    assert txn.id not in {t.txn_id for t in bob.admin.list_transactions()}
    listed = {t.txn_id: t for t in admin.admin.list_transactions()}
    assert listed[txn.id].owner == "alice"
    # an admin may abort it, never commit it
    with pytest.raises(NotAuthorizedError, match="may not commit"):
        admin.tc.request(TcOp.END, 0, txn_seq=seq, commit=True)
    assert alice.admin.get_transaction(txn.id).status.value == "OPEN"
    txn.commit()
    assert alice.admin.get_transaction(txn.id).status.value == "COMMITTED"


def test_another_principal_naming_a_group_key_ends_nothing_of_that_group(clients):
    """Old: a foreign END_GROUP with a Spark sink's key (shown by LIST) aborted the whole
    micro-batch and the driver was told the batch was already committed."""
    alice, bob = clients("alice"), clients("bob")
    key = f"query-{uuid.uuid4().hex[:6]}:7"
    txns = [alice.new_transaction(timeout_s=60, tc_id=1, group_key=key) for _ in range(2)]
    hostile = bob.tc.request(TcOp.END_GROUP, 1, group_key=key, group_seqs=(), commit=True)
    assert hostile.already is False
    with pytest.raises(NotAuthorizedError):
        bob.tc.request(TcOp.END_GROUP, 1, group_key=key,
                       group_seqs=tuple(t.id.least_bits for t in txns), commit=False)
    for t in txns:
        assert alice.admin.get_transaction(t.id).status.value == "OPEN"
    reply = alice.tc.request(TcOp.END_GROUP, 1, group_key=key,
                             group_seqs=tuple(t.id.least_bits for t in txns), commit=True)
    assert reply.already is False and reply.error_kind is None
    wait_until(lambda: all(alice.admin.get_transaction(t.id).status.value == "COMMITTED"
                           for t in txns), 15, "the group committed")


def _raw_after_marker(config: Config, topic: str, txn_id: TxnID) -> tuple[int, int]:
    """(records of ``txn_id`` in partition 0 after its marker, markers of it)."""
    c = Consumer(config.consumer(f"raw-{uuid.uuid4().hex[:6]}"))
    try:
        c.assign([KafkaTP(topic, 0, 0)])
        _, end = c.get_watermark_offsets(KafkaTP(topic, 0), timeout=10)
        after = markers = 0
        seen = 0
        while seen < end:
            m = c.poll(5)
            if m is None:
                break
            seen = m.offset() + 1
            if m.error() is not None:
                continue
            kind, tid = classify_headers(m.headers())
            if kind is RecordKind.MARKER and tid == txn_id:
                markers += 1
            elif tid == txn_id and markers:
                after += 1
        return after, markers
    finally:
        c.close()


def test_a_send_after_an_abort_by_an_admin_raises_and_writes_nothing(clients, secured):
    """Old: after a foreign abort, send() and flush() returned normally and the record
    landed after the ABORT marker; the writer learned of it only at commit()."""
    config, _ = secured
    alice, admin = clients("alice"), clients("txnstream")
    topic = make_topic(config, 1, "trust")
    producer = alice.create_producer(topic)
    txn = alice.new_transaction(timeout_s=60, tc_id=2)
    producer.send(b"before", partition=0, txn=txn)
    txn.flush()
    admin.admin.abort_transaction(txn.id)

    def refused() -> bool:
        try:
            producer.send(b"late", partition=0, txn=txn)
        except InvalidTxnStatusError:
            return True
        return False
    # The notice reaches the writer within a turn of the markers; until then a send may
    # still go out (it lands after the ABORT marker, a straggler no reader waits on).
    wait_until(refused, 10, "the writer refuses sends of the aborted txn")
    with pytest.raises(InvalidTxnStatusError):
        txn.flush()
    with pytest.raises(TxnStreamError):
        txn.commit()
    producer.flush()
    after, markers = _raw_after_marker(config, topic, txn.id)
    assert markers >= 1
    assert after <= 1, "sends after the notice wrote nothing"


def test_a_send_after_the_txn_timed_out_raises_at_once_and_writes_nothing(clients, secured):
    config, _ = secured
    alice = clients("alice")
    topic = make_topic(config, 1, "trust")
    producer = alice.create_producer(topic)
    # 3 s: the first send (NEW, then the topic's first registration, both awaited) must
    # land inside the timeout also on a loaded machine (1 s did not, once, under xdist).
    txn = alice.new_transaction(timeout_s=3.0, tc_id=3)
    producer.send(b"in time", partition=0, txn=txn)
    time.sleep(3.3)
    with pytest.raises(TransactionTimeoutError, match="timed out|timeout"):
        producer.send(b"too late", partition=0, txn=txn)
    producer.flush()
    wait_until(lambda: _raw_after_marker(config, topic, txn.id)[1] >= 1, 20,
               "the timeout's ABORT marker")
    assert _raw_after_marker(config, topic, txn.id)[0] == 0


def test_bad_and_big_requests_get_clear_errors_and_restart_no_coordinator(clients):
    """Old: NEW with timeout_ms=-1 raised inside the worker and restarted every
    coordinator of it, on each resend; a 1.5 MB group key restarted one 33 times."""
    alice = clients("alice")
    before = {tc: restarts(alice, tc) for tc in range(alice.tc.num_coordinators)}
    with pytest.raises(InvalidRequestError, match="timeout_ms"):
        alice.tc.request(TcOp.NEW, 0, timeout_ms=-1)
    with pytest.raises(InvalidRequestError, match="timeout_ms"):
        alice.tc.request(TcOp.NEW, 0, timeout_ms=7_200_000)
    with pytest.raises(InvalidRequestError, match="group_key"):
        alice.tc.request(TcOp.NEW, 0, group_key="k" * 100_000)  # over 16 KiB
    with pytest.raises(InvalidRequestError, match="bytes is over the line's"):
        alice.tc.request(TcOp.NEW, 0, group_key="k" * 1_500_000)
    with pytest.raises(InvalidRequestError, match="count"):
        alice.tc.request(TcOp.RESERVE, 0, count=100_000, timeout_ms=30_000)
    with pytest.raises(InvalidRequestError, match="partitions"):
        alice.tc.request(TcOp.ADD_PARTITIONS, 0, txn_seq=0, partitions=(
            __import__("txnstream").TopicPartition("no such/topic!", 0),))
    assert {tc: restarts(alice, tc) for tc in before} == before
    txn = alice.new_transaction(timeout_s=30, tc_id=0)  # still serving
    txn.abort()


def test_one_principal_cannot_hold_more_open_txns_than_its_limit(clients):
    """Old: one client held 409,600 OPEN txns (+447 MB in the worker)."""
    alice, bob = clients("alice"), clients("bob")
    alice.tc.request(TcOp.RESERVE, 0, count=256, timeout_ms=30_000)
    with pytest.raises(TooManyRequestsError, match="max_open_txns_per_principal"):
        alice.tc.request(TcOp.RESERVE, 0, count=OPEN_LIMIT - 256 + 1, timeout_ms=30_000)
    bob.new_transaction(timeout_s=30, tc_id=0).abort()  # another principal is not held up


def test_list_comes_in_pages_and_is_never_silently_short(clients, monkeypatch):
    """Old: past 8 MiB the LIST reply failed and list_transactions() returned []."""
    monkeypatch.setattr(handlers, "LIST_PAGE", 7)
    alice = clients("alice")
    txns = [alice.new_transaction(timeout_s=60, tc_id=1) for _ in range(25)]
    first = alice.tc.request(TcOp.LIST, 1)
    assert first.more and len(first.txns) == 7
    mine = {t.txn_id for t in alice.admin.list_transactions()}
    assert {t.id for t in txns} <= mine
    for t in txns:
        t.abort()


def test_a_client_with_the_wrong_secret_is_refused_naming_the_worker(clients, secured):
    _, worker = secured
    mallory = clients("mallory")
    with pytest.raises(CoordinatorAuthError) as err:
        mallory.new_transaction(timeout_s=10, tc_id=0)
    assert str(worker.address) in str(err.value) and "unknown principal" in str(err.value)
    assert "not-a-secret" not in str(err.value)


def test_a_worker_will_not_serve_the_line_beyond_loopback_unauthenticated(config):
    with pytest.raises(ConfigError, match="no authentication"):
        CoordinatorWorker(config, settings=WorkerSettings(listen="0.0.0.0:0",
                                                          buffer_role=False))


def test_another_principals_group_ends_do_not_make_a_batch_commit_twice(clients):
    """Old: outcomes were one LRU shared by all principals. Bob ended 1,000 empty groups
    under 400-byte keys (within his rights); Alice's batch outcome was forgotten, and the
    replay of her batch after a driver restart committed its rows a second time."""
    alice, bob = clients("alice"), clients("bob")
    key = f"query-{uuid.uuid4().hex[:6]}/41"
    first = alice.new_transaction(timeout_s=60, tc_id=2, group_key=key)
    reply = alice.tc.request(TcOp.END_GROUP, 2, group_key=key,
                             group_seqs=(first.id.least_bits,), commit=True)
    assert reply.already is False and reply.error_kind is None
    filler = "f" * 400
    for i in range(1_000):  # ~410 KB of outcomes: past what one checkpoint carries
        bob.tc.request(TcOp.END_GROUP, 2, group_key=f"{filler}/{i}", group_seqs=(),
                       commit=True)
    replay = alice.new_transaction(timeout_s=60, tc_id=2, group_key=key)
    again = alice.tc.request(TcOp.END_GROUP, 2, group_key=key,
                             group_seqs=(replay.id.least_bits,), commit=True)
    assert again.already is True, "the replayed batch committed a second time"
    wait_until(lambda: alice.admin.get_transaction(replay.id).status.value == "ABORTED", 15,
               "the replay's txn aborted")
    assert alice.admin.get_transaction(first.id).status.value == "COMMITTED"
