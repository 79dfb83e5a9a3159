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


def test_a_replay_whose_outcome_was_forgotten_is_refused_never_committed_twice():
    """Past the bound, a principal's own later groups made an earlier batch's outcome
    forgotten: its replay used to commit again (every row twice). The stream's mark now
    refuses it, aborting the replay's txns, while the stream's next batch commits."""
    from txnstream.coordinator.metadata_store import TransactionMetadataStore

    store = TransactionMetadataStore(0, "w")
    requests = iter(range(1_000))

    def batch(key: str) -> tuple[int, ...]:
        meta, _ = store.new_txn(f"r-{next(requests)}", 60_000, 0, group_key=key)
        return (meta.txn_id.least_bits,)

    first = scoped_group_key("alice", "query-a/7")
    done = store.end_group(first, batch(first), True, 0)
    assert not done.error and not done.already
    for i in range(MAX_REMEMBERED_GROUPS + 10):  # her other queries, one batch each
        other = scoped_group_key("alice", f"query-{i}/0")
        store.outcomes.remember(GroupOutcome(other, TxnStatus.COMMITTING, ()))
    assert first not in store.groups
    assert store.outcomes.forgotten_through(first) == 7

    replay = batch(first)
    res = store.end_group(first, replay, True, 0)
    assert res.error and "refused rather than committed twice" in res.error
    assert not res.already and res.status is TxnStatus.ABORTING
    assert store.txns[replay[0]].status is TxnStatus.ABORTING
    assert store.outcomes.forgotten_through(scoped_group_key("bob", "query-a/7")) is None
    later = scoped_group_key("alice", "query-a/8")
    nxt = store.end_group(later, batch(later), True, 0)
    assert not nxt.error and nxt.status is TxnStatus.COMMITTING


def test_marks_ride_in_the_checkpoint_and_keep_to_their_share_of_it():
    """A new owner replaying the checkpoint refuses the same forgotten versions; marks
    take at most a quarter of the checkpoint's bytes, so recent outcomes stay."""
    from txnstream.coordinator.group_outcomes import MAX_STREAM_MARKS

    o = GroupOutcomes(0)
    for i in range(30_000):  # many streams, one version each: a mark per stream
        o.remember(outcome("alice", f"stream-{i:05d}/{i}", tuple(range(8))))
    assert o.bytes <= o.budget and o.mark_bytes <= o.budget // 4
    marks = [k for k in o.by_key if k.endswith("\x1f") and k.count("\x1f") == 2]
    assert 0 < len(marks) <= MAX_STREAM_MARKS
    assert outcome("alice", "stream-29999/29999").key in o.by_key  # recent: answered
    newest_marked = max(int(o.by_key[k].seqs[0]) for k in marks)
    assert o.forgotten_through(outcome("alice", f"stream-{newest_marked:05d}/"
                                                f"{newest_marked}").key) == newest_marked
    replayed = GroupOutcomes(0)
    for g in o.by_key.values():  # what a checkpoint carries, oldest first
        replayed.remember(g)
    assert list(replayed.by_key) == list(o.by_key)
    assert replayed.forgotten_through(outcome("alice", f"stream-{newest_marked:05d}/"
                                                       f"{newest_marked}").key) == newest_marked


def test_only_keys_of_the_form_stream_slash_number_are_versions():
    """ASCII digits, a long's range: others leave no mark when forgotten."""
    o = GroupOutcomes(0)
    for key in ("batch-1f2e", "abort/3", "q/-1", "q/１", "q/7x", "q/" + "9" * 19):
        o.remember(outcome("alice", key))
    for i in range(MAX_REMEMBERED_GROUPS + 1):
        o.remember(outcome("alice", f"filler{i}"))
    assert [k for k in o.by_key if k.count("\x1f") == 2] == ["alice\x1fabort/\x1f"]
    assert o.forgotten_through(outcome("alice", "abort/2").key) == 3
    assert o.forgotten_through(outcome("alice", "q/1").key) is None
