"""The coordinator's pure state machine: replay, fencing, ids, timeouts, LWM, group end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txnstream.coordinator.log_entry import (
    GroupOutcome,
    LogEntryKind,
    SubscriptionRef,
    TransactionLogEntry,
)
from txnstream.coordinator.metadata_store import TransactionMetadataStore
from txnstream.errors import (
    CorruptRecordError,
    InvalidTxnStatusError,
    TransactionNotFoundError,
    TransactionTimeoutError,
)
from txnstream.types import COORDINATOR_STATUSES, TopicPartition, TxnStatus

S = TxnStatus
TP = TopicPartition("data", 0)


class Log:
    """An in-memory log that an owner appends to (offsets assigned in order)."""

    def __init__(self) -> None:
        self.records: list[tuple[int, TransactionLogEntry]] = []

    def append(self, entry: TransactionLogEntry | None) -> int | None:
        if entry is None:
            return None
        off = len(self.records)
        self.records.append((off, entry))
        return off


def owner(log: Log, name: str = "w1") -> TransactionMetadataStore:
    """A store that replays ``log``, appends its EPOCH and serves (as the worker does)."""
    store = TransactionMetadataStore(0, name)
    for off, e in log.records:
        store.replay(off, e)
    off = log.append(store.epoch_entry())
    store.replay(off, log.records[off][1])
    store.own_epoch = off
    return store


def drive(store: TransactionMetadataStore, log: Log, now: int = 1_000) -> dict[int, S]:
    out = {}
    for i in range(6):
        meta, e = store.new_txn(f"r{i}", 10_000, now)
        log.append(e)
        seq = meta.txn_id.least_bits
        log.append(store.add_partitions(seq, [TP], now))
        log.append(store.add_subscriptions(seq, [SubscriptionRef("in", 0, "job")], now))
        if i % 3 == 0:
            log.append(store.end_txn(seq, True, now).entry)
            log.append(store.finalize(seq, now))
        elif i % 3 == 1:
            log.append(store.end_txn(seq, False, now).entry)
        out[seq] = meta.status
    return out


def replayed(log: Log) -> TransactionMetadataStore:
    s = TransactionMetadataStore(0, "reader")
    for off, e in log.records:
        s.replay(off, e)
    return s


def test_replay_rebuilds_every_txn():
    log = Log()
    live = owner(log)
    drive(live, log)
    again = replayed(log)
    assert {s: (m.status, m.partitions, m.subscriptions) for s, m in again.txns.items()} == {
        s: (m.status, m.partitions, m.subscriptions) for s, m in live.txns.items()}
    assert again.next_sequence == live.next_sequence == 6
    assert again.low_watermark == live.low_watermark == 1


def test_stale_epoch_record_is_ignored_but_burns_its_sequence():
    log = Log()
    a = owner(log, "a")
    meta, e = a.new_txn("x", 10_000, 0)
    log.append(e)
    b = owner(log, "b")                      # takes over: newer EPOCH
    zombie_new, ze = a.new_txn("y", 10_000, 0)  # a still thinks it owns the log
    log.append(ze)                            # written under a's stale epoch
    r = replayed(log)
    assert zombie_new.txn_id.least_bits not in r.txns
    assert r.invalid_records == 1
    assert r.next_sequence > zombie_new.txn_id.least_bits   # never handed out again
    b.replay(len(log.records) - 1, ze)
    assert b.invalid_records == 1 and zombie_new.txn_id.least_bits not in b.txns


def test_two_owners_racing_only_latest_epoch_counts_and_old_owner_is_fenced():
    log = Log()
    a = owner(log, "a")
    b = owner(log, "b")
    e_a = a.new_txn("ra", 10_000, 0)[1]
    e_b = b.new_txn("rb", 10_000, 0)[1]
    off_a = log.append(e_a)
    off_b = log.append(e_b)
    r = replayed(log)
    assert [m.txn_id.least_bits for m in r.txns.values()] == [e_b.txn_seq]
    assert r.invalid_records == 1
    # a reads its own log: it meets b's EPOCH after its own -> fenced
    a2 = TransactionMetadataStore(0, "a")
    a2.replay(0, log.records[0][1])
    a2.own_epoch = 0
    a2.replay(1, log.records[1][1])
    assert a2.fenced
    assert off_a < off_b


def test_new_txn_is_idempotent_by_request_id_and_sequences_never_repeat():
    log = Log()
    s = owner(log)
    m1, e1 = s.new_txn("req-1", 5_000, 0)
    log.append(e1)
    m2, e2 = s.new_txn("req-1", 5_000, 0)
    assert m2 is m1 and e2 is None
    # failover, then truncation down to the checkpoint: still no repeat
    s2 = owner(log, "w2")
    log.append(s2.end_txn(m1.txn_id.least_bits, False, 0).entry)
    log.append(s2.finalize(m1.txn_id.least_bits, 0))
    cp = log.append(s2.checkpoint_entry())
    s2.replay(cp, log.records[cp][1])
    point = s2.truncation_point(now_ms=10**9, retention_ms=0)
    assert point >= 0
    kept = Log()
    kept.records = [(o, e) for o, e in log.records if o >= point]
    s3 = TransactionMetadataStore(0, "w3")
    for o, e in kept.records:
        s3.replay(o, e)
    m3, _ = s3.new_txn("req-2", 5_000, 0)
    assert m3.txn_id.least_bits > m1.txn_id.least_bits


def test_timeouts_fire_in_deadline_order_once_and_commit_then_fails():
    log = Log()
    s = owner(log)
    a, _ = s.new_txn("a", 3_000, 0)
    b, _ = s.new_txn("b", 1_000, 0)
    c, _ = s.new_txn("c", 2_000, 0)
    s.end_txn(c.txn_id.least_bits, True, 0)            # c ends before its deadline
    fired = s.expire(5_000)
    assert [e.txn_seq for e in fired] == [b.txn_id.least_bits, a.txn_id.least_bits]
    assert all(e.status is S.ABORTING and e.reason == "timeout" for e in fired)
    assert s.expire(6_000) == []
    with pytest.raises(TransactionTimeoutError) as exc:
        s.end_txn(b.txn_id.least_bits, True, 6_000)
    assert str(b.txn_id) in str(exc.value)


def test_commit_after_deadline_aborts_even_before_the_tracker_fires():
    s = owner(Log())
    m, _ = s.new_txn("a", 1_000, 0)
    with pytest.raises(TransactionTimeoutError):
        s.end_txn(m.txn_id.least_bits, True, 1_500)
    assert m.status is S.ABORTING and m.abort_reason == "timeout"


def test_low_watermark_advances_only_when_the_oldest_txn_is_final():
    s = owner(Log())
    a, _ = s.new_txn("a", 9_000, 0)
    b, _ = s.new_txn("b", 9_000, 0)
    assert s.low_watermark == a.txn_id.least_bits
    s.end_txn(b.txn_id.least_bits, True, 0)
    s.finalize(b.txn_id.least_bits, 0)
    assert s.low_watermark == a.txn_id.least_bits
    s.end_txn(a.txn_id.least_bits, True, 0)
    assert s.low_watermark == a.txn_id.least_bits      # COMMITTING is not final
    s.finalize(a.txn_id.least_bits, 0)
    assert s.low_watermark == s.next_sequence == 2


def test_group_end_all_or_none_idempotent_and_survives_truncation():
    log = Log()
    s = owner(log)
    seqs = []
    for i in range(3):
        m, e = s.new_txn(f"g{i}", 9_000, 0)
        log.append(e)
        seqs.append(m.txn_id.least_bits)
    g = s.end_group("q/1", seqs, True, 0)
    for e in g.entries:
        log.append(e)
    assert not g.already and g.status is S.COMMITTING
    assert all(s.txns[q].status is S.COMMITTING for q in seqs)
    extra, e = s.new_txn("replay", 9_000, 0)
    log.append(e)
    again = s.end_group("q/1", [extra.txn_id.least_bits], True, 0)
    assert again.already and again.seqs == tuple(seqs)
    assert extra.status is S.ABORTING
    # one member not OPEN -> every OPEN member aborts
    x, _ = s.new_txn("x", 9_000, 0)
    y, _ = s.new_txn("y", 9_000, 0)
    s.end_txn(y.txn_id.least_bits, False, 0)
    bad = s.end_group("q/2", [x.txn_id.least_bits, y.txn_id.least_bits], True, 0)
    assert bad.error and x.status is S.ABORTING
    # the key survives a checkpoint + truncation + replay
    log.append(s.checkpoint_entry())
    fresh = TransactionMetadataStore(0, "w2")
    for off, e in log.records:       # what truncation keeps: the EPOCH and the checkpoint
        if off >= s.epoch_offset and e.kind in (LogEntryKind.EPOCH, LogEntryKind.CHECKPOINT):
            fresh.replay(off, e)
    assert fresh.invalid_records == 0
    assert fresh.groups["q/1"] == GroupOutcome("q/1", S.COMMITTING, tuple(seqs))


def test_group_end_aborts_orphans_of_its_key_and_nothing_else_even_after_replay():
    log = Log()
    s = owner(log)

    def new(rid, key):
        m, e = s.new_txn(rid, 9_000, 0, group_key=key)
        log.append(e)
        return m

    orphan = new("dead-attempt", "q/1")      # its driver died before reporting it
    members = [new(f"m{i}", "q/1") for i in range(2)]
    other_batch = new("next", "q/2")
    untagged = new("plain", None)
    # a new owner replays the log: the keys of OPEN txns come back with them
    fresh = TransactionMetadataStore(0, "w2")
    for off, e in log.records:
        fresh.replay(off, e)
    for store in (s, fresh):
        g = store.end_group("q/1", [m.txn_id.least_bits for m in members], True, 0)
        assert not g.already and g.status is S.COMMITTING
        assert store.txns[orphan.txn_id.least_bits].status is S.ABORTING
        assert store.txns[orphan.txn_id.least_bits].abort_reason == "group"
        assert all(store.txns[m.txn_id.least_bits].status is S.COMMITTING for m in members)
        assert store.txns[other_batch.txn_id.least_bits].status is S.OPEN
        assert store.txns[untagged.txn_id.least_bits].status is S.OPEN
        assert len(g.entries) == 2  # the GROUP_END and the orphan's abort
    # a replay of q/1 that finds it committed aborts its own txns and any new orphan
    late_orphan, replayed = new("late", "q/1"), new("replayed", "q/1")
    again = s.end_group("q/1", [replayed.txn_id.least_bits], True, 0)
    assert again.already
    assert late_orphan.status is S.ABORTING and replayed.status is S.ABORTING


def test_errors_for_unknown_and_ended_txns():
    s = owner(Log())
    with pytest.raises(TransactionNotFoundError, match=r"\(0,77\)"):
        s.add_partitions(77, [TP], 0)
    m, _ = s.new_txn("a", 9_000, 0)
    s.end_txn(m.txn_id.least_bits, True, 0)
    with pytest.raises(InvalidTxnStatusError):
        s.add_partitions(m.txn_id.least_bits, [TP], 0)
    with pytest.raises(InvalidTxnStatusError):
        s.end_txn(m.txn_id.least_bits, False, 0)
    assert s.end_txn(m.txn_id.least_bits, True, 0).entry is None   # repeat is a no-op


def test_truncation_point_keeps_epoch_checkpoint_and_live_txns():
    log = Log()
    s = owner(log)
    old, e = s.new_txn("old", 9_000, 0)
    s.replay(log.append(e), e)
    s.end_txn(old.txn_id.least_bits, True, 0)
    fin = s.finalize(old.txn_id.least_bits, 0)
    s.replay(log.append(fin), fin)
    live, e = s.new_txn("live", 9_000, 0)
    live_off = log.append(e)
    s.replay(live_off, e)
    cp = s.checkpoint_entry()
    s.replay(log.append(cp), cp)
    point = s.truncation_point(now_ms=10**9, retention_ms=1_000)
    assert point <= s.epoch_offset and point <= s.checkpoint_offset
    assert point <= live_off


txn_entries = st.builds(
    TransactionLogEntry,
    kind=st.sampled_from(list(LogEntryKind)), epoch_offset=st.integers(-1, 10**6),
    owner_id=st.text(max_size=8), request_id=st.one_of(st.none(), st.text(max_size=8)),
    txn_seq=st.integers(-1, 10**9),
    status=st.one_of(st.none(), st.sampled_from(COORDINATOR_STATUSES)),
    open_time_ms=st.integers(0, 2**40), timeout_ms=st.integers(0, 10**7),
    partitions=st.lists(st.builds(TopicPartition, st.text(min_size=1, max_size=5),
                                  st.integers(0, 100)), max_size=3).map(tuple),
    subscriptions=st.lists(st.builds(SubscriptionRef, st.text(min_size=1, max_size=5),
                                     st.integers(0, 9), st.text(max_size=5)),
                           max_size=2).map(tuple),
    group_seqs=st.lists(st.integers(0, 10**6), max_size=3).map(tuple),
    next_sequence=st.integers(0, 10**9),
)


@settings(max_examples=150, deadline=None)
@given(txn_entries)
def test_log_entry_round_trip(entry):
    assert TransactionLogEntry.decode(entry.encode()) == entry


@pytest.mark.parametrize("raw,why", [(b"", "empty"), (b"\x09abc", "version 9"),
                                     (b"\x01\xff\xff\xff", "does not parse")])
def test_garbage_log_records_raise_corrupt_record_error(raw, why):
    with pytest.raises(CorruptRecordError, match=why):
        TransactionLogEntry.decode(raw)


def test_group_end_says_timed_out_when_a_member_passed_its_deadline():
    """The Spark sink names txnstream.txnTimeoutSeconds only for a timeout: the reply's
    class says which (before, every failed group end was InvalidTxnStatusError)."""
    s = owner(Log())
    late, _ = s.new_txn("late", 1_000, 0)
    ok, _ = s.new_txn("ok", 9_000, 0)
    g = s.end_group("q/9", [late.txn_id.least_bits, ok.txn_id.least_bits], True, 5_000)
    assert g.error and g.timed_out
    other, _ = s.new_txn("o", 9_000, 0)
    s.end_txn(other.txn_id.least_bits, False, 0)
    g2 = s.end_group("q/10", [other.txn_id.least_bits], True, 0)
    assert g2.error and not g2.timed_out
