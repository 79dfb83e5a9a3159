"""Truncation of the transaction log: bounded under a long-lived owner, never losing a
record still needed (DESIGN.md section 5, point 4).

A record is valid only under the EPOCH it names, so a truncation must keep the EPOCH that
governs the first record it keeps. Before epoch renewal, the takeover EPOCH of the current
owner was the furthest truncation could go: a TC served by one worker for a day kept the
whole day's log and every txn of it in memory.
"""

from __future__ import annotations

from tests.unit.coordinator.test_store_rules import TP, Log, owner
from txnstream.coordinator.log_entry import LogEntryKind
from txnstream.coordinator.metadata_store import TransactionMetadataStore
from txnstream.types import TxnStatus

S = TxnStatus


def replay_from(log: Log, point: int, name: str = "reader") -> TransactionMetadataStore:
    """What a new owner rebuilds after the log was truncated below ``point``."""
    s = TransactionMetadataStore(0, name)
    for off, e in log.records:
        if off >= point:
            s.replay(off, e)
    return s


def view(store: TransactionMetadataStore, seqs) -> dict:
    return {q: (store.txns[q].status, frozenset(store.txns[q].partitions)) if q in store.txns
            else None for q in seqs}


def write(s: TransactionMetadataStore, log: Log) -> None:
    """Append what the store queued and read it back, as the worker does."""
    for e in s.unlogged():
        s.replay(log.append(e), e)


def renew_and_checkpoint(s: TransactionMetadataStore, log: Log) -> None:
    """The worker's checkpoint step: a renewal EPOCH, read back, then a CHECKPOINT."""
    r = s.renewal_entry()
    s.replay(log.append(r), r)
    cp = s.checkpoint_entry()
    s.replay(log.append(cp), cp)


def test_truncation_keeps_the_epoch_under_which_a_live_txn_opened():
    """Failover after failover: a txn opened under owner A is still open when B truncates.
    The record that opened it is valid only under A's EPOCH, so that EPOCH must stay."""
    log = Log()
    a = owner(log, "a")
    live, e = a.new_txn("live", 600_000, 0)
    log.append(e)
    log.append(a.add_partitions(live.txn_id.least_bits, [TP], 0))
    b = owner(log, "b")                     # takes over: replays, appends its EPOCH
    cp = b.checkpoint_entry()
    b.replay(log.append(cp), cp)
    point = b.truncation_point(now_ms=10**9, retention_ms=0)
    assert point >= 0
    c = replay_from(log, point, "c")        # a third owner, after the truncation
    seq = live.txn_id.least_bits
    assert view(c, [seq]) == {seq: (S.OPEN, frozenset({TP}))}
    assert c.invalid_records == 0


def test_a_long_lived_owner_truncates_past_its_takeover_epoch_and_forgets_ended_txns():
    log = Log()
    s = owner(log)
    takeover = s.epoch_offset
    keep_open, _ = s.new_txn("keeps-running", 10**9, 0)
    write(s, log)
    for i in range(2_000):
        m, _ = s.new_txn(f"t{i}", 60_000, 0)
        s.add_partitions(m.txn_id.least_bits, [TP], 0)
        s.end_txn(m.txn_id.least_bits, i % 2 == 0, 0)
        s.finalize(m.txn_id.least_bits, 0)
        write(s, log)
        if i % 500 == 499:
            renew_and_checkpoint(s, log)
            point = s.truncation_point(now_ms=10**9, retention_ms=0)
            s.forget_before(point)
    # the one long-running txn holds truncation at the EPOCH it opened under...
    assert s.truncation_point(now_ms=10**9, retention_ms=0) == takeover
    s.end_txn(keep_open.txn_id.least_bits, False, 0)
    s.finalize(keep_open.txn_id.least_bits, 0)
    write(s, log)
    late, _ = s.new_txn("late", 60_000, 0)
    s.add_partitions(late.txn_id.least_bits, [TP], 0)
    write(s, log)
    renew_and_checkpoint(s, log)
    # ... and once it ended, truncation passes the takeover EPOCH
    point = s.truncation_point(now_ms=10**9, retention_ms=0)
    assert point > takeover
    assert log.records[point][1].kind is LogEntryKind.EPOCH
    s.forget_before(point)
    assert len(s.txns) <= 2, f"{len(s.txns)} txns still in memory"
    assert len(log.records) - point < 10, "the log kept more than the last checkpoint"
    # a new owner replays the truncated log: same live txns, nothing invalid, no id reused
    n = replay_from(log, point, "new")
    assert n.invalid_records == 0
    assert view(n, [late.txn_id.least_bits]) == view(s, [late.txn_id.least_bits])
    assert n.next_sequence == s.next_sequence


def test_the_owners_renewal_moves_its_epoch_and_fences_nobody():
    log = Log()
    s = owner(log)
    first = s.epoch_offset
    r = s.renewal_entry()
    assert r.kind is LogEntryKind.EPOCH and r.epoch_offset == first
    off = log.append(r)
    s.replay(off, r)
    assert not s.fenced and s.own_epoch == off and s.epoch_offset == off
    m, e = s.new_txn("after", 60_000, 0)
    assert e is not None and e.epoch_offset == off
    log.append(e)
    full = replay_from(log, 0)
    assert full.invalid_records == 0 and m.txn_id.least_bits in full.txns


def test_a_zombies_renewal_is_invalid_and_fences_nobody():
    """Owner A was paused; B took over. A, not yet fenced, renews its epoch: the renewal
    names A's epoch, which is no longer current, so it is ignored; B keeps serving and its
    records stay valid."""
    log = Log()
    a = owner(log, "a")
    b = owner(log, "b")
    zr = a.renewal_entry()                     # A still believes it owns the log
    off = log.append(zr)
    b.replay(off, zr)
    assert not b.fenced and b.invalid_records == 1
    m, e = b.new_txn("b-txn", 60_000, 0)
    log.append(e)
    full = replay_from(log, 0)
    assert m.txn_id.least_bits in full.txns and full.epoch_owner == "b"
    a.replay(1, log.records[1][1])             # A reads B's takeover: fenced at once
    assert a.fenced


def test_an_own_record_read_back_invalid_marks_the_store_diverged():
    """Never expected (records are not written between a renewal and its read-back), but
    if one of the owner's records lands invalid, its memory holds what the log does not:
    the store says so, and the worker replays the TC instead of replying."""
    log = Log()
    s = owner(log)
    m, stale = s.new_txn("planned-before-renewal", 60_000, 0)
    r = s.renewal_entry()
    s.replay(log.append(r), r)
    assert not s.diverged
    s.replay(log.append(stale), stale)     # lands after the renewal, under the old epoch
    assert s.diverged and not s.fenced
    assert m.txn_id.least_bits not in replay_from(log, 0).txns
