"""TxnIDs in logged blocks: reserved txns are ordinary OPEN txns until handed out.

``new_transaction()`` takes a TxnID from a block (``RESERVE``) and activates it in the
background (``ACTIVATE``): no round trip of its own. What must still hold: a TxnID is
never reused, the low watermark waits for every txn that may still write, deadlines run
from the moment the client handed the txn out, and a new owner replaying the log agrees
on all of it.
"""

from __future__ import annotations

import pytest

from tests.unit.coordinator.test_store_rules import TP, Log, owner, replayed
from txnstream.errors import TransactionTimeoutError
from txnstream.types import TxnStatus

LEASE = 30_000


def log_all(store, log: Log) -> None:
    for e in store.unlogged():
        log.append(e)


def test_a_reserved_block_is_never_reused_and_holds_the_low_watermark():
    log = Log()
    s = owner(log)
    block = s.reserve("r1", 8, LEASE, now_ms=1_000)
    log_all(s, log)
    assert block == list(range(8))
    assert s.reserve("r1", 8, LEASE, now_ms=1_100) == block, "a resent RESERVE is the same block"
    assert s.unlogged() == []
    nxt, _ = s.new_txn("n1", 10_000, 1_200)
    log_all(s, log)
    assert nxt.txn_id.least_bits == 8, "a TxnID after a block is never one of the block's"
    assert s.low_watermark == 0, "unused reserved txns may still write: the LWM waits"
    for seq in block:
        s.end_txn(seq, False, 1_300)
    log_all(s, log)
    assert s.low_watermark == 0  # ABORTING until finalized
    for seq in block:
        s.finalize(seq, 1_400)
    log_all(s, log)
    assert s.low_watermark == 8
    again = replayed(log)
    assert again.next_sequence == 9 and again.low_watermark == 8


def test_an_activated_txn_times_out_from_its_hand_out_not_its_reservation():
    log = Log()
    s = owner(log)
    [seq] = s.reserve("r1", 1, LEASE, now_ms=0)
    s.activate(seq, 5_000, open_time_ms=20_000, now_ms=20_010)
    log_all(s, log)
    meta = s.txns[seq]
    assert (meta.open_time_ms, meta.deadline_ms) == (20_000, 25_000)
    assert s.expire(24_999) == []
    s.add_partitions(seq, [TP], 24_000)
    assert [e.txn_seq for e in s.expire(25_000)] == [seq]
    assert meta.status is TxnStatus.ABORTING and meta.abort_reason == "timeout"
    log_all(s, log)
    again = replayed(log).txns[seq]
    assert (again.status, again.open_time_ms, again.timeout_ms) == (
        TxnStatus.ABORTING, 20_000, 5_000)


def test_an_open_time_outside_reservation_and_now_is_clamped():
    s = owner(Log())
    a, b = s.reserve("r1", 2, LEASE, now_ms=10_000)
    s.activate(a, 5_000, open_time_ms=1, now_ms=12_000)  # a clock far behind
    s.activate(b, 5_000, open_time_ms=99_000, now_ms=12_000)  # a clock far ahead
    assert s.txns[a].open_time_ms == 10_000, "never older than its reservation"
    assert s.txns[b].open_time_ms == 12_000, "never later than the coordinator's now"


def test_an_unused_reserved_txn_ends_at_its_lease_and_cannot_be_activated_after():
    log = Log()
    s = owner(log)
    [seq] = s.reserve("r1", 1, LEASE, now_ms=0)
    assert [e.txn_seq for e in s.expire(LEASE)] == [seq]
    log_all(s, log)
    with pytest.raises(TransactionTimeoutError):
        s.activate(seq, 5_000, open_time_ms=LEASE + 1, now_ms=LEASE + 1)
    assert replayed(log).txns[seq].status is TxnStatus.ABORTING


def test_activation_is_idempotent():
    s = owner(Log())
    [seq] = s.reserve("r1", 1, LEASE, now_ms=0)
    assert s.activate(seq, 5_000, 100, 200, "a1") is not None
    assert s.activate(seq, 5_000, 100, 300, "a1") is None


def test_the_lwm_and_ending_indexes_agree_with_a_scan_of_every_txn():
    """The store keeps the live and ending txns indexed (a scan of every txn remembered
    cost a tenth of a busy worker's turn); random opens, blocks and ends must leave the
    indexes equal to the scan they replace, also after a replay."""
    import random

    rng = random.Random(11)
    log = Log()
    s = owner(log)
    now = 0
    for _ in range(400):
        now += rng.randint(1, 50)
        op = rng.random()
        live = [q for q, m in s.txns.items() if not m.status.is_final]
        if op < 0.2:
            s.new_txn(f"n{now}", 10_000, now)
        elif op < 0.3:
            s.reserve(f"r{now}", rng.randint(1, 6), 2_000, now)
        elif live and op < 0.7:
            q = rng.choice(live)
            if s.txns[q].status is TxnStatus.OPEN:
                try:
                    s.end_txn(q, rng.random() < 0.5, now)
                except TransactionTimeoutError:
                    pass
            else:
                s.finalize(q, now)
        else:
            s.expire(now)
        log_all(s, log)
        scan_live = [q for q, m in s.txns.items() if not m.status.is_final]
        assert s.low_watermark == (min(scan_live) if scan_live else s.next_sequence)
        assert [m.txn_id.least_bits for m in s.ending()] == sorted(
            q for q, m in s.txns.items() if m.status.is_ending)
    again = replayed(log)
    assert again.low_watermark == s.low_watermark
    assert [m.txn_id for m in again.ending()] == [m.txn_id for m in s.ending()]


def test_a_resent_reserve_whose_block_was_only_partly_logged_returns_only_what_was_logged():
    """Chaos (hostile profile, broker kills) found it: a RESERVE's entries are one record
    per TxnID, and an append that failed midway left the first three of four in the log.
    The client resent the RESERVE to the next owner, which answered the whole block
    (range(first, first + count)): it handed out (1,19), which no owner knew, and the
    TC issued (1,19) again 24 s later."""
    log = Log()
    s = owner(log)
    s.reserve("r1", 4, LEASE, now_ms=0)
    entries = s.unlogged()
    for e in entries[:3]:  # the fourth record was lost with the failed append
        log.append(e)
    again = replayed(log)
    assert again.next_sequence == 3
    assert again.reserve("r1", 4, LEASE, now_ms=100) == [0, 1, 2]
    assert again.unlogged() == []
    nxt, _ = again.new_txn("n1", 10_000, 200)
    assert nxt.txn_id.least_bits == 3, "the lost TxnID is issued once, to its next taker"
    # a block right after another request's txn stops at that txn
    log2 = Log()
    s2 = owner(log2)
    s2.reserve("r1", 2, LEASE, now_ms=0)
    first = s2.unlogged()
    log2.append(first[0])
    again2 = replayed(log2)
    again2.new_txn("n2", 10_000, 50)
    log_all(again2, log2)
    assert replayed(log2).reserve("r1", 2, LEASE, now_ms=100) == [0]
