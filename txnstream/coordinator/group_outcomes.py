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

Past the bound a replay fails loudly, never commits twice. A key of the form
``<stream>/<n>`` (a Spark query's ``<query id>/<batch id>``; batches of one query
commit in order) is a version of its stream: when such an outcome is forgotten, the
stream's **mark** keeps the highest version forgotten, and a commit of a version at or
below it is refused (:meth:`GroupOutcomes.forgotten_through`): it may have committed
already, and nothing tells a replay from a new commit. A mark is carried in checkpoints
as an outcome of its own (:func:`mark_key`: a key no client can name; the version as its
one sequence), so a new owner, and a worker of the previous release, read it as any
other. Marks are forgotten last (a principal's outcomes first), at most
:data:`MAX_STREAM_MARKS` per TC; past that a stream whose mark was forgotten has no
protection left, which needs that many streams of one principal with forgotten outcomes.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Mapping

from txnstream.coordinator.log_entry import GroupOutcome
from txnstream.coordinator.protocol import GROUP_SCOPE
from txnstream.types import ANONYMOUS, TxnStatus

__all__ = [
    "CHECKPOINT_FIXED_BYTES",
    "MAX_CHECKPOINT_BYTES",
    "MAX_REMEMBERED_GROUPS",
    "MAX_STREAM_MARKS",
    "GroupOutcomes",
    "mark_key",
]

log = logging.getLogger(__name__)

MAX_REMEMBERED_GROUPS = 10_000
"""Committed group keys carried in checkpoints; Spark replays only its last batches."""
MAX_STREAM_MARKS = 10_000
"""Streams a TC keeps a mark for (module docstring): each a few dozen bytes of its
checkpoint, inside the same byte budget as the outcomes."""
MAX_VERSION_DIGITS = 18
"""Digits of a stream version (a ``long``'s range)."""
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
        """Per principal, its outcomes' keys and encoded sizes, oldest first (no marks)."""
        self._bytes_of: Counter[str] = Counter()
        self._marks_of: dict[str, OrderedDict[str, int]] = {}
        """Per principal, its marks' keys and encoded sizes, least recently raised first."""
        self._mark_bytes_of: Counter[str] = Counter()
        self._marks = 0
        self.mark_bytes = 0
        """Encoded size of the marks (part of :attr:`bytes`, at most a quarter of it)."""
        self.bytes = 0
        """Encoded size of the outcomes in a checkpoint (kept under :attr:`budget`)."""
        self.budget = MAX_CHECKPOINT_BYTES - CHECKPOINT_FIXED_BYTES
        """Bytes of group outcomes a checkpoint may carry (see :meth:`shrink`)."""

    @property
    def by_key(self) -> Mapping[str, GroupOutcome]:
        """Every outcome remembered, by group key, oldest first."""
        return self._by_key

    def forgotten_through(self, key: str) -> int | None:
        """The highest forgotten version of ``key``'s stream if ``key`` is at or below it.

        None: ``key`` is not a stream version, or no version of it as high is forgotten.
        """
        parsed = _version_of(key)
        if parsed is None:
            return None
        mark = self._by_key.get(parsed[0])
        return mark.seqs[0] if mark is not None and parsed[1] <= mark.seqs[0] else None

    def remember(self, outcome: GroupOutcome) -> None:
        """Keep ``outcome`` as the newest; forget the oldest past the count or byte bound.

        What is remembered is exactly what the next checkpoint carries, so a new owner
        that replays the checkpoint recognises the same keys as this one (a mark, read
        back from a checkpoint, is kept as a mark).
        """
        if _is_mark(outcome.key):
            self._mark(outcome.key, outcome.seqs[0] if outcome.seqs else 0)
            self._trim()
            return
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
        self._add(outcome)
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
        # Past a bound, the principal holding the most (of equals, the lexically first
        # name) gives back its oldest. An outcome forgotten leaves its stream's mark;
        # marks have a quarter of the bytes, so they never crowd recent outcomes out.
        while True:
            if len(self._by_key) - self._marks > MAX_REMEMBERED_GROUPS:
                self._evict(min(self._of, key=lambda p: (-len(self._of[p]), p)))
            elif self._marks > MAX_STREAM_MARKS or self.mark_bytes > self.budget // 4 or (
                    self.bytes > self.budget and not self._of):
                who = min(self._marks_of, key=lambda p: (-self._mark_bytes_of[p], p))
                self._forget(next(iter(self._marks_of[who])))
            elif self.bytes > self.budget:
                self._evict(min(self._of, key=lambda p: (-self._bytes_of[p], p)))
            else:
                return

    def _evict(self, principal: str) -> None:
        """Forget ``principal``'s oldest outcome; a stream version leaves its mark."""
        key = next(iter(self._of[principal]))
        self._forget(key)
        if (parsed := _version_of(key)) is not None:
            self._mark(*parsed)

    def _mark(self, key: str, version: int) -> None:
        """Raise the mark ``key`` to ``version`` (at least) and make it the newest."""
        old = self._by_key.get(key)
        top = max(version, old.seqs[0]) if old is not None and old.seqs else version
        self._forget(key)
        self._add(GroupOutcome(key, TxnStatus.COMMITTED, (top,)))

    def _add(self, outcome: GroupOutcome) -> None:
        """Keep ``outcome`` (an outcome or a mark) as its principal's newest."""
        who, size, mark = _principal_of(outcome.key), outcome.encoded_size(), \
            _is_mark(outcome.key)
        self._by_key[outcome.key] = outcome
        (self._marks_of if mark else self._of).setdefault(who, OrderedDict())[outcome.key] \
            = size
        (self._mark_bytes_of if mark else self._bytes_of)[who] += size
        self._marks += mark
        self.mark_bytes += size * mark
        self.bytes += size

    def _forget(self, key: str) -> None:
        if self._by_key.pop(key, None) is None:
            return
        who, mark = _principal_of(key), _is_mark(key)
        table, sizes = (self._marks_of, self._mark_bytes_of) if mark else \
            (self._of, self._bytes_of)
        keys = table[who]
        size = keys.pop(key)
        sizes[who] -= size
        self._marks -= mark
        self.mark_bytes -= size * mark
        self.bytes -= size
        if not keys:
            del table[who]
            del sizes[who]


def mark_key(principal: str, stream: str) -> str:
    """The key of ``stream``'s mark.

    Scoped always and ending in the scope separator, so no key a client names (one
    separator at most, after its principal) is ever one.
    """
    return f"{principal}{GROUP_SCOPE}{stream}/{GROUP_SCOPE}"


def _is_mark(key: str) -> bool:
    return key.endswith(GROUP_SCOPE) and key.count(GROUP_SCOPE) == 2


def _version_of(key: str) -> tuple[str, int] | None:
    """(its stream's mark key, version) of a scoped key ``<stream>/<n>``; else None."""
    if _is_mark(key):
        return None
    who, sep, own = key.partition(GROUP_SCOPE)
    stream, slash, n = (own if sep else key).rpartition("/")
    if not slash or not n.isascii() or not n.isdigit() or len(n) > MAX_VERSION_DIGITS:
        return None
    return mark_key(who if sep else ANONYMOUS, stream), int(n)


def _principal_of(key: str) -> str:
    """The principal a scoped group key belongs to (unscoped: ``anonymous``'s)."""
    who, sep, _ = key.partition(GROUP_SCOPE)
    return who if sep else ANONYMOUS
