"""``GroupOutcomes``: the group commits a TC remembers, bounded to fit one CHECKPOINT.

A group end (Spark's ``(query id, batch id)`` commit of many txns at once) is idempotent
by its key: a replayed batch must find the outcome of its first commit. The TC keeps the
recent outcomes in memory and carries exactly them in every CHECKPOINT record, so a new
owner that replays the checkpoint recognises the same keys as the old one. That record
must fit in one Kafka message, so the outcomes are bounded by count and by encoded bytes
(:data:`MAX_CHECKPOINT_BYTES`).

Fair among principals (a group key is scoped to the principal that ends it): past a
bound, the principal holding the most outcomes (by count) or bytes (by bytes) forgets
its oldest one, never another principal. So a principal's outcomes are forgotten by
what others do only while it holds more than an equal share: each of ``n`` principals
with outcomes on a TC keeps about its ``1/n`` of :data:`MAX_REMEMBERED_GROUPS` and of
the byte budget (or all of its own, if less). Ties are broken by principal name, so a
new owner replaying the same outcomes forgets the same ones.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Mapping

from txnstream.coordinator.log_entry import GroupOutcome
from txnstream.coordinator.protocol import GROUP_SCOPE
from txnstream.types import ANONYMOUS

__all__ = [
    "CHECKPOINT_FIXED_BYTES",
    "MAX_CHECKPOINT_BYTES",
    "MAX_REMEMBERED_GROUPS",
    "GroupOutcomes",
]

log = logging.getLogger(__name__)

MAX_REMEMBERED_GROUPS = 10_000
"""Committed group keys carried in checkpoints; Spark replays only its last batches."""
MAX_CHECKPOINT_BYTES = 256 * 1024
"""Upper bound of one encoded CHECKPOINT record. It must fit in one Kafka message: the
broker's default ``max.message.bytes`` is 1 MiB and librdkafka refuses a message over
``message.max.bytes`` (1,000,000) at ``produce()``. A quarter of that leaves room for a
cluster configured below the default and for batch overhead, and still carries about
2,300 outcomes of 16-txn groups (~110 bytes each): Spark replays only the last batch of a
query after a driver restart, so a TC would need that many queries committing between a
batch and its replay to forget the batch. Before this bound, 10,000 such outcomes made a
1.1 MB checkpoint: refused, the TC restarted at every checkpoint and truncation stopped."""
CHECKPOINT_FIXED_BYTES = 4 * 1024
"""Share of :data:`MAX_CHECKPOINT_BYTES` kept for the fields other than group outcomes
(owner id, offsets, sequence floor, framing: about 100 bytes with a usual owner id)."""


class GroupOutcomes:
    """The outcomes of TC ``tc_id``'s recent group ends, oldest first, within the bounds."""

    def __init__(self, tc_id: int) -> None:
        self.tc_id = tc_id
        """Named in the log lines about an outcome too big to keep."""
        self._by_key: OrderedDict[str, GroupOutcome] = OrderedDict()
        self._of: dict[str, OrderedDict[str, int]] = {}
        """Per principal, its outcomes' keys and encoded sizes, oldest first."""
        self._bytes_of: Counter[str] = Counter()
        self.bytes = 0
        """Encoded size of the outcomes in a checkpoint (kept under :attr:`budget`)."""
        self.budget = MAX_CHECKPOINT_BYTES - CHECKPOINT_FIXED_BYTES
        """Bytes of group outcomes a checkpoint may carry (see :meth:`shrink`)."""

    @property
    def by_key(self) -> Mapping[str, GroupOutcome]:
        """Every outcome remembered, by group key, oldest first."""
        return self._by_key

    def remember(self, outcome: GroupOutcome) -> None:
        """Keep ``outcome`` as the newest; forget the oldest past the count or byte bound.

        What is remembered is exactly what the next checkpoint carries, so a new owner
        that replays the checkpoint recognises the same keys as this one.
        """
        size = outcome.encoded_size()
        if size > self.budget:
            # Idempotency needs the key and the status; the txns of the first commit are
            # only reported back. A group too big to carry whole is kept without them.
            log.warning("tc %d: group %r ends %d txns, too many to carry in a checkpoint; "
                        "remembering its key and outcome only", self.tc_id,
                        outcome.key[:100], len(outcome.seqs))
            outcome = GroupOutcome(outcome.key, outcome.status, ())
            size = outcome.encoded_size()
            if size > self.budget:
                log.error("tc %d: group key of %d bytes is too long to remember; a replay "
                          "of it will not be recognised", self.tc_id, size)
                return
        self._forget(outcome.key)
        who = _principal_of(outcome.key)
        self._by_key[outcome.key] = outcome
        self._of.setdefault(who, OrderedDict())[outcome.key] = size
        self._bytes_of[who] += size
        self.bytes += size
        self._trim()

    def shrink(self) -> None:
        """Halve the checkpoint's group budget, forgetting the oldest outcomes.

        For a log that refused a checkpoint as too large (its topic's
        ``max.message.bytes`` is below :data:`MAX_CHECKPOINT_BYTES`): the next checkpoint
        fits instead of failing forever.
        """
        self.budget = max(1024, self.budget // 2)
        self._trim()

    def _trim(self) -> None:
        # the principal holding the most; of equals, the lexically first name
        while len(self._by_key) > MAX_REMEMBERED_GROUPS:
            self._forget_oldest_of(min(self._of, key=lambda p: (-len(self._of[p]), p)))
        while self._by_key and self.bytes > self.budget:
            self._forget_oldest_of(min(self._of, key=lambda p: (-self._bytes_of[p], p)))

    def _forget_oldest_of(self, principal: str) -> None:
        self._forget(next(iter(self._of[principal])))

    def _forget(self, key: str) -> None:
        if self._by_key.pop(key, None) is None:
            return
        who = _principal_of(key)
        keys = self._of[who]
        size = keys.pop(key)
        self._bytes_of[who] -= size
        self.bytes -= size
        if not keys:
            del self._of[who]
            del self._bytes_of[who]


def _principal_of(key: str) -> str:
    """The principal a scoped group key belongs to (unscoped: ``anonymous``'s)."""
    who, sep, _ = key.partition(GROUP_SCOPE)
    return who if sep else ANONYMOUS
