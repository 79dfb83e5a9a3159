"""Bounded coordinator state: the CHECKPOINT record must always fit in one Kafka message.

The checkpoint carries the recent group outcomes (Spark's idempotency keys). A sink with
16 tasks per micro-batch makes one outcome of 16 txns per batch; before the bound, about
10,000 of them made a checkpoint over 1 MB, which the broker (or librdkafka, at
``message.max.bytes``) refuses: the TC restarted at every checkpoint and truncation
stopped.
"""

from __future__ import annotations

import uuid

from tests.unit.coordinator.test_store_rules import Log, owner
from txnstream.coordinator.log_entry import LogEntryKind, TransactionLogEntry
from txnstream.coordinator.metadata_store import TransactionMetadataStore
from txnstream.types import TxnStatus

BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
"""Kafka's default ``message.max.bytes`` / topic ``max.message.bytes``."""


def run_micro_batches(s: TransactionMetadataStore, log: Log, batches: int, tasks: int,
                      query: str) -> list[str]:
    """What a Spark sink does to its TC: per batch, one txn per task, one group commit,
    finalization; the log is read back and truncated now and then, as the worker does."""
    keys = []
    for b in range(batches):
        seqs = []
        for t in range(tasks):
            m, e = s.new_txn(f"{query}-{b}-{t}", 60_000, 0, group_key=f"{query}/{b}")
            s.replay(log.append(e), e)
            seqs.append(m.txn_id.least_bits)
        g = s.end_group(f"{query}/{b}", seqs, True, 0)
        assert not g.already and not g.error
        for e in g.entries:
            s.replay(log.append(e), e)
        for q in seqs:
            e = s.finalize(q, 0)
            s.replay(log.append(e), e)
        keys.append(f"{query}/{b}")
        if b % 500 == 499:
            cp = s.checkpoint_entry()
            s.replay(log.append(cp), cp)
            s.forget_before(s.truncation_point(now_ms=10**9, retention_ms=0))
    return keys


def test_checkpoint_of_16_task_micro_batches_stays_under_its_bound_and_keeps_recent_keys():
    log = Log()
    # a TC that has served a while: sequences past ten million (4-byte varints)
    log.append(TransactionLogEntry(kind=LogEntryKind.EPOCH, epoch_offset=-1, owner_id="w0",
                                   next_sequence=10**7))
    s = owner(log)
    query = str(uuid.UUID(int=7))  # a Spark query id: 36 characters
    keys = run_micro_batches(s, log, batches=11_000, tasks=16, query=query)
    cp = s.checkpoint_entry()
    size = len(cp.encode())
    assert size < BROKER_DEFAULT_MAX_MESSAGE_BYTES, f"checkpoint of {size} bytes"
    from txnstream.coordinator.group_outcomes import MAX_CHECKPOINT_BYTES

    assert size <= MAX_CHECKPOINT_BYTES < BROKER_DEFAULT_MAX_MESSAGE_BYTES // 2
    # A replay of a recent batch finds its key, also after truncation down to the EPOCH
    # and this checkpoint (what a new owner replays then).
    off = log.append(cp)
    s.replay(off, cp)
    fresh = TransactionMetadataStore(0, "w2")
    fresh.replay(s.epoch_offset, log.records[s.epoch_offset][1])
    fresh.replay(off, cp)
    for store in (s, fresh):
        for key in keys[-1_000:]:
            assert key in store.groups, key
        late, _ = store.new_txn("replayed-task", 60_000, 0, group_key=keys[-1])
        again = store.end_group(keys[-1], [late.txn_id.least_bits], True, 0)
        assert again.already and again.status is TxnStatus.COMMITTING
        assert late.status is TxnStatus.ABORTING
    assert fresh.groups == s.groups, "the new owner must remember what the old one did"


def test_replaying_an_old_oversized_checkpoint_is_bounded_too():
    """A checkpoint written before the bound (10,000 outcomes, over 1 MB in total) is cut
    down on replay, so the next checkpoint fits, keeping the most recent outcomes."""
    from txnstream.coordinator.group_outcomes import MAX_CHECKPOINT_BYTES
    from txnstream.coordinator.log_entry import GroupOutcome

    outcomes = [GroupOutcome(f"{uuid.UUID(int=i)}/{i}", TxnStatus.COMMITTING,
                             tuple(range(10**7 + 16 * i, 10**7 + 16 * i + 16)))
                for i in range(10_000)]
    s = TransactionMetadataStore(0, "w")
    s.replay(0, TransactionLogEntry(kind=LogEntryKind.EPOCH, epoch_offset=-1, owner_id="old"))
    for i in range(0, 10_000, 2_500):  # the old checkpoint, as several records
        part = tuple(outcomes[i:i + 2_500])
        s.replay(1 + i, TransactionLogEntry(kind=LogEntryKind.CHECKPOINT, epoch_offset=0,
                                            owner_id="old", group_keys=part))
    assert len(s.checkpoint_entry().encode()) <= MAX_CHECKPOINT_BYTES
    assert outcomes[-1].key in s.groups and outcomes[-100].key in s.groups
    assert outcomes[0].key not in s.groups


def test_group_outcome_size_accounting_matches_the_encoding():
    """The store bounds checkpoints by adding up outcome sizes; they must be exact."""
    from txnstream.coordinator.log_entry import GroupOutcome

    for seqs in [(), (0,), (1, 63, 64, 8191, 8192, 10**9, 2**62), tuple(range(300))]:
        for key in ["", "k", "q/1", "é" * 70, "x" * 5_000]:
            g = GroupOutcome(key, TxnStatus.COMMITTING, seqs)
            for n in (1, 2, 64, 65):
                base = TransactionLogEntry(kind=LogEntryKind.CHECKPOINT, epoch_offset=5,
                                           owner_id="w", next_sequence=10**6)
                full = TransactionLogEntry(kind=LogEntryKind.CHECKPOINT, epoch_offset=5,
                                           owner_id="w", next_sequence=10**6,
                                           group_keys=(g,) * n)
                # the array's item count is a varint: one byte up to 63 items, two up to 8191
                count = 1 if n < 64 else 2
                assert len(full.encode()) - len(base.encode()) == count + n * g.encoded_size()
