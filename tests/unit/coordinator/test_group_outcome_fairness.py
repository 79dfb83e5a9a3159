"""Group outcomes are a budget no principal can take from another (issue 34 item 1).

A group end is idempotent by its key only while its outcome is remembered; a Spark
batch replayed after its outcome is forgotten commits again. Outcomes are bounded (they
ride in every CHECKPOINT record), and used to be one LRU shared by every principal: a
stranger ending enough groups of her own made an honest query's outcome forgotten.
"""

from __future__ import annotations

from txnstream.coordinator.group_outcomes import (
    MAX_REMEMBERED_GROUPS,
    GroupOutcomes,
)
from txnstream.coordinator.log_entry import GroupOutcome
from txnstream.coordinator.protocol import scoped_group_key
from txnstream.types import TxnStatus


def outcome(principal: str, key: str, seqs: tuple[int, ...] = ()) -> GroupOutcome:
    return GroupOutcome(scoped_group_key(principal, key), TxnStatus.COMMITTING, seqs)


def test_a_stranger_flooding_by_bytes_forgets_only_her_own_outcomes():
    o = GroupOutcomes(0)
    honest = [outcome("alice", f"query-a/{i}", tuple(range(16))) for i in range(20)]
    for g in honest:
        o.remember(g)
    big = "k" * 400
    for i in range(3_000):  # 1.2 MB of keys: far past the checkpoint's budget
        o.remember(outcome("mallory", f"{big}/{i}"))
    assert all(g.key in o.by_key for g in honest)
    assert o.bytes <= o.budget
    assert outcome("mallory", f"{big}/2999").key in o.by_key  # her newest is kept


def test_a_stranger_flooding_by_count_forgets_only_her_own_outcomes():
    o = GroupOutcomes(0)
    honest = [outcome("alice", f"q/{i}") for i in range(50)]
    for g in honest:
        o.remember(g)
    for i in range(MAX_REMEMBERED_GROUPS * 2):
        o.remember(outcome("mallory", str(i)))
    assert all(g.key in o.by_key for g in honest)
    assert len(o.by_key) <= MAX_REMEMBERED_GROUPS


def test_a_principal_over_its_fair_share_loses_its_oldest_first():
    """Past the bound, the principal holding the most gives back, oldest first."""
    o = GroupOutcomes(0)
    for i in range(MAX_REMEMBERED_GROUPS):
        o.remember(outcome("alice", f"q/{i}"))
    o.remember(outcome("bob", "q/0"))
    assert outcome("bob", "q/0").key in o.by_key
    assert outcome("alice", "q/0").key not in o.by_key  # alice held them all: hers went
    assert outcome("alice", f"q/{MAX_REMEMBERED_GROUPS - 1}").key in o.by_key


def test_replaying_the_remembered_outcomes_in_order_gives_the_same_state():
    """A new owner replays the checkpoint (oldest first) and the log after it: the same
    evictions happen, so it recognises exactly the keys the old owner did."""
    a, b = GroupOutcomes(0), GroupOutcomes(0)
    seq = [outcome(p, f"{'x' * (i % 300)}/{i}", tuple(range(i % 20)))
           for i in range(6_000) for p in ("alice", "bob", "carol")[i % 3:i % 3 + 1]]
    for g in seq[:4_000]:
        a.remember(g)
    for g in a.by_key.values():  # the checkpoint
        b.remember(g)
    for g in seq[4_000:]:
        a.remember(g)
        b.remember(g)
    assert list(a.by_key) == list(b.by_key)
