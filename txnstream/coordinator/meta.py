"""``TxnMeta``: what a coordinator knows about one transaction (Pulsar's ``TxnMeta``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from txnstream.coordinator.log_entry import SubscriptionRef
from txnstream.errors import InvalidTxnStatusError
from txnstream.types import ANONYMOUS, TopicPartition, TxnID, TxnStatus

__all__ = ["TxnMeta"]


@dataclass(slots=True)
class TxnMeta:
    """Mutable metadata of one transaction, owned by its coordinator's metadata store.

    Changes go through :meth:`update_status` and :meth:`add_partitions` /
    :meth:`add_subscriptions`, which enforce Pulsar's rules: the status table of
    :meth:`TxnStatus.can_transition_to`, and partitions/subscriptions join only while OPEN.
    """

    txn_id: TxnID
    status: TxnStatus
    open_time_ms: int
    timeout_ms: int
    partitions: set[TopicPartition] = field(default_factory=set)
    subscriptions: set[SubscriptionRef] = field(default_factory=set)
    abort_reason: str | None = None
    group_key: str | None = None
    end_time_ms: int | None = None
    first_offset: int | None = None
    """Offset of this txn's first log record (bookkeeping for truncation)."""
    last_offset: int | None = None
    owner: str = ANONYMOUS
    """The principal that opened it; only it (or an admin) may add to or end it."""
    reserved: bool = False
    """Opened by RESERVE and not handed out yet: no writer holds it (not an open txn to
    stats, LIST or ``top``)."""
    decided_by: str | None = None
    """The request id of the END that moved it to COMMITTING or ABORTING (None: another
    way, or not known): an END of another request finds it decided elsewhere, and its
    writer checks where its records landed (:mod:`txnstream.fate`)."""
    prepared_at_ms: int | None = None
    """When it was PREPARED (None: never)."""
    max_prepared_ms: int = 0
    """How long it may stay PREPARED: the coordinator aborts it after."""

    @property
    def prepared_deadline_ms(self) -> int | None:
        """When the coordinator aborts it if still PREPARED (None: not prepared)."""
        if self.prepared_at_ms is None:
            return None
        return self.prepared_at_ms + self.max_prepared_ms

    @property
    def deadline_ms(self) -> int:
        """When the coordinator aborts the txn if it is still OPEN."""
        return self.open_time_ms + self.timeout_ms

    def update_status(self, new: TxnStatus, expected: TxnStatus | None = None) -> None:
        """Move to ``new``; refuse an unexpected current status or a forbidden transition."""
        if expected is not None and self.status is not expected:
            raise InvalidTxnStatusError(self.txn_id, expected, self.status)
        if not self.status.can_transition_to(new):
            raise InvalidTxnStatusError(
                self.txn_id, new, self.status,
                f"transaction {self.txn_id} cannot go from {self.status.value} to {new.value}",
            )
        self.status = new

    def check_open(self, operation: str) -> None:
        """Raise unless OPEN: partitions and subscriptions join only an open txn."""
        if self.status is not TxnStatus.OPEN:
            raise InvalidTxnStatusError(
                self.txn_id, TxnStatus.OPEN, self.status,
                f"cannot {operation}: transaction {self.txn_id} is {self.status.value}",
            )

    def add_partitions(self, tps: set[TopicPartition] | frozenset[TopicPartition]) -> None:
        """Register produced partitions (OPEN only)."""
        self.check_open("add a produced partition")
        self.partitions |= tps

    def add_subscriptions(self, subs: set[SubscriptionRef] | frozenset[SubscriptionRef]) -> None:
        """Register acked subscriptions (OPEN only)."""
        self.check_open("add an acked subscription")
        self.subscriptions |= subs
