"""Where a writer's records landed: in their txn or not, by the readers' own rule.

A record of a txn is in it iff it precedes the txn's first marker in its partition
(DESIGN.md section 10): every committed-only reader delivers it then, and drops it as a
straggler after. A writer that ended its txn itself (its ``commit()`` sent the END that
decided it) flushed every send first, and no marker is written before the decision, so
all its records are in. A writer whose txn another handle ended (another process
committed it while this one still wrote; an attached handle whose txn was committed by
its opener) cannot know that from the txn's status, so it asks the partitions:

1. :class:`DeliveredOffsets` keeps the offset of every record of the txn the broker
   acknowledged to this handle (8 bytes a record while the handle lives);
2. :func:`excluded` follows the partitions' served state (what every reader follows:
   :class:`~txnstream.buffer.follower.BufferStateFollower`) until the buffer owner's fold
   has passed each partition's last such offset; a record the fold hid is out (it
   follows the first marker: a straggler), any other is in (before the marker, or the
   marker is still to come).

So "in" is said of a record exactly when readers deliver it, whoever ended the txn.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Mapping, Sequence

from txnstream.buffer.follower import BufferStateFollower
from txnstream.config import Config
from txnstream.errors import TransactionOutcomeUnknownError
from txnstream.types import TopicPartition, TxnID

__all__ = ["DeliveredOffsets", "excluded"]

POLL_S = 0.1
"""One wait for the owners' next deltas while a fold is behind the writer's records."""


class DeliveredOffsets:
    """The offsets the broker acknowledged for one txn's records, per partition.

    Bound: 8 bytes per acknowledged record of the txn, kept while its handle lives.
    Delivery callbacks (the producers' threads) append; :meth:`snapshot` reads.
    """

    def __init__(self) -> None:
        self._by_tp: dict[TopicPartition, array[int]] = {}
        self._lock = threading.Lock()
        self._unknown: dict[TopicPartition, int] = {}
        """Records acknowledged with no offset: a retried write the broker had taken."""

    def unknown(self, topic: str, partition: int) -> None:
        """A record of the txn was acknowledged without its offset."""
        with self._lock:
            tp = TopicPartition(topic, partition)
            self._unknown[tp] = self._unknown.get(tp, 0) + 1

    def offsets_of(self, topic: str, partition: int) -> array[int]:
        """Where the acknowledged offsets of ``topic``-``partition`` go.

        A sender takes it before its first record there, so a delivery report only appends.
        """
        with self._lock:
            return self._by_tp.setdefault(TopicPartition(topic, partition), array("q"))

    def snapshot(self, txn_id: TxnID | None = None) -> dict[TopicPartition, list[int]]:
        """Partition -> the offsets acknowledged so far, ascending.

        ``TransactionOutcomeUnknownError`` if a record's offset was not given: whether it
        is in the txn cannot be said.
        """
        with self._lock:
            items, unknown = list(self._by_tp.items()), dict(self._unknown)
        if unknown:
            raise TransactionOutcomeUnknownError(
                f"{sum(unknown.values())} records of {txn_id or 'the transaction'} in "
                f"{', '.join(map(str, sorted(unknown)))} were acknowledged without an offset "
                "(a retried write the broker had already taken): whether they are in the "
                "transaction cannot be said", txn_id)
        return {tp: sorted(a) for tp, a in items if len(a)}


def excluded(config: Config, txn_id: TxnID, delivered: Mapping[TopicPartition, Sequence[int]],
             timeout_s: float) -> dict[TopicPartition, list[int]]:
    """Which of ``delivered`` (ascending offsets per partition) no reader delivers.

    Waits until the buffer owner's fold of each partition has passed its last offset
    (``TransactionOutcomeUnknownError`` if that takes longer than ``timeout_s``).
    """
    wanted = {tp: offs for tp, offs in delivered.items() if offs}
    if not wanted:
        return {}
    follower = BufferStateFollower(config, name=f"fate-{txn_id}")
    try:
        follower.follow_many(list(wanted))
        deadline = time.monotonic() + timeout_s
        behind = dict(wanted)
        while True:
            for tp in list(behind):
                view = follower.views.get(tp)
                if view is not None and view.position >= behind[tp][-1]:
                    del behind[tp]
            if not behind:
                break
            if time.monotonic() >= deadline:
                raise TransactionOutcomeUnknownError(
                    f"transaction {txn_id} was ended by another handle, and the buffer "
                    f"owners did not fold this handle's records of {sorted(map(str, behind))} "
                    f"within {timeout_s:.0f}s: which of them are in it is not known yet",
                    txn_id)
            follower.poll(POLL_S)
        out = {}
        for tp, offs in wanted.items():
            hidden = follower.views[tp].hidden
            gone = [o for o in offs if o in hidden]
            if gone:
                out[tp] = gone
        return out
    finally:
        follower.close()
