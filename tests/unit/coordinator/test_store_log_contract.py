"""The store's contract with its log: every change it applies in memory is handed over to
be logged, also when the request that caused it fails, so a new owner replaying the log
rebuilds exactly what the old owner acted on (DESIGN.md section 5)."""

from __future__ import annotations

import pytest

from tests.unit.coordinator.test_store_rules import TP, Log, owner, replayed
from txnstream.coordinator.log_entry import SubscriptionRef
from txnstream.errors import TransactionTimeoutError, TxnStreamError
from txnstream.types import TxnStatus

S = TxnStatus


def view(store):
    return {s: (m.status, m.abort_reason, frozenset(m.partitions), frozenset(m.subscriptions))
            for s, m in store.txns.items()}


def test_commit_after_deadline_hands_the_timeout_abort_to_the_log():
    """A commit that finds its txn expired aborts it (reason timeout) and fails. The abort
    must reach the log: the TC writes ABORT markers for it next, and a new owner that
    replayed the txn as OPEN could commit it (committed on some partitions, aborted on
    others)."""
    log = Log()
    s = owner(log)
    m, e = s.new_txn("a", 1_000, 0)
    log.append(e)
    seq = m.txn_id.least_bits
    log.append(s.add_partitions(seq, [TP], 10))
    with pytest.raises(TransactionTimeoutError):
        s.end_txn(seq, True, 1_500)
    for e in handed_over(s, []):
        log.append(e)
    assert m.status is S.ABORTING and m.abort_reason == "timeout"
    again = replayed(log)
    assert again.txns[seq].status is S.ABORTING
    assert again.txns[seq].abort_reason == "timeout"
    assert view(again) == view(s)


def handed_over(store, returned):
    """What the owner appends to the log after a request: what the store queued for it
    (:meth:`unlogged`), which includes what the call returned."""
    queued = store.unlogged()
    assert all(e in queued for e in returned if e is not None)
    return queued


def test_replaying_what_was_handed_over_rebuilds_the_memory_whatever_the_requests():
    """Random requests, some failing (late, wrong status, unknown txn): after each, the
    log (what the store handed over) replays to exactly the store's memory."""
    import random

    rng = random.Random(11)
    log = Log()
    s = owner(log)
    reader = replayed(log)  # a new owner would rebuild this from the log
    seqs: list[int] = []
    now = 0
    for i in range(3_000):
        now += rng.randrange(0, 400)
        op = rng.randrange(8)
        returned = []
        try:
            if op == 0 or not seqs:
                m, e = s.new_txn(f"r{i}", rng.choice([500, 2_000, 60_000]), now,
                                 rng.choice([None, "g/1", "g/2"]))
                returned = [e]
                seqs.append(m.txn_id.least_bits)
            elif op == 1:
                returned = [s.add_partitions(rng.choice(seqs), [TP], now)]
            elif op == 2:
                returned = [s.add_subscriptions(rng.choice(seqs),
                                                [SubscriptionRef("in", 0, "job")], now)]
            elif op in (3, 4):
                returned = [s.end_txn(rng.choice(seqs), op == 3, now).entry]
            elif op == 5:
                g = s.end_group(rng.choice(["g/1", "g/2", f"g/{i}"]),
                                rng.sample(seqs, min(3, len(seqs))), True, now)
                returned = list(g.entries)
            elif op == 6:
                returned = s.expire(now)
            else:
                returned = [s.finalize(q, now) for q in list(seqs[-20:])
                            if s.txns[q].status.is_ending]
        except TxnStreamError:
            pass
        for e in handed_over(s, returned):
            reader.replay(log.append(e), e)
        assert view(reader) == view(s), f"after request {i} (op {op})"
