"""Which log of a partition a stream's offsets were taken on (issue 34 item 9).

A topic deleted and created again under the same name starts its partitions' logs over
at offset 0. Kafka's source keys its offsets by topic name alone, so it notices only a
log that now ends below the query (and fails under ``failOnDataLoss``); a new log that
has already passed the query's offset is read from there, and its first records are
never delivered. The buffer owners number each partition's logs (its **log epoch**, one
higher each time they restart its state on a new log:
:attr:`~txnstream.buffer.served.BufferView.log_epoch`), so the source notes the epoch
beside each offset it hands Spark and compares it with the served one:

* the same: the offset is of the log being served;
* higher now: the log the offset was taken on is gone. Under ``failOnDataLoss`` the
  query fails naming the partition (records of the old log after the offset may not have
  been read, and the new log's below it would be skipped); with ``false`` the next range
  starts at the new log's start;
* not noted (offsets written before epochs were, a partition read plain): nothing is
  decided, as before.

The epochs travel in the offsets JSON under :data:`EPOCHS_KEY`, which no Kafka topic can
be named (``@`` is not a legal topic character), so ``{"t": {"0": 12}, "@log_epochs":
{"t": {"0": 1}}}``. Pure: no I/O; ``tests/unit/spark/test_log_epochs.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from txnstream.types import TopicPartition

from .options import Offsets

__all__ = ["EPOCHS_KEY", "gone_since_planned", "join", "replaced", "split"]

EPOCHS_KEY = "@log_epochs"
"""Where the log epochs sit in a stream's offsets JSON (never a topic's name)."""


def split(offsets: Mapping[str, Any]) -> tuple[Offsets, dict[TopicPartition, int]]:
    """The plain offsets, and the log epoch noted for each partition (where noted).

    A malformed epochs entry (hand-edited checkpoint) raises ``ValueError`` naming it.
    """
    plain = {t: parts for t, parts in offsets.items() if t != EPOCHS_KEY}
    epochs: dict[TopicPartition, int] = {}
    noted = offsets.get(EPOCHS_KEY) or {}
    if not isinstance(noted, dict):
        raise ValueError(f"offsets: {EPOCHS_KEY!r} must map topics to partitions, not "
                         f"{type(noted).__name__}")
    for t, parts in noted.items():
        if not isinstance(parts, dict):
            raise ValueError(f"offsets: {EPOCHS_KEY!r} of topic {t!r} must map partitions "
                             "to log epochs")
        for p, e in parts.items():
            try:
                epochs[TopicPartition(t, int(p))] = int(e)
            except (TypeError, ValueError):
                raise ValueError(f"offsets: {EPOCHS_KEY!r} of {t}-{p} is {e!r}, not a log "
                                 "epoch") from None
    return plain, epochs


def join(offsets: Offsets, epochs: Mapping[TopicPartition, int]) -> dict[str, Any]:
    """``offsets`` with the epochs of the partitions it names noted beside them."""
    noted: dict[str, dict[str, int]] = {}
    for tp, e in sorted(epochs.items()):
        if str(tp.partition) in offsets.get(tp.topic, {}):
            noted.setdefault(tp.topic, {})[str(tp.partition)] = e
    return {**offsets, EPOCHS_KEY: noted} if noted else dict(offsets)


def replaced(noted: Mapping[TopicPartition, int], now: Mapping[TopicPartition, int]
             ) -> dict[TopicPartition, tuple[int, int]]:
    """Partitions whose log now is newer than the one noted: tp -> (noted, now)."""
    return {tp: (e, now[tp]) for tp, e in sorted(noted.items())
            if tp in now and now[tp] > e}


def gone_since_planned(tp: TopicPartition, first: int, end: int, planned_on: int | None,
                       now: int | None) -> str | None:
    """Why a range of ``tp`` planned on log epoch ``planned_on`` is of a log gone since.

    ``now``: the newest epoch seen (None: not known); None if the range is not. Spark
    plans a micro-batch's end, then its tasks: a topic recreated in between leaves a
    range of the deleted log, whose records went with it.
    """
    if end <= first or planned_on is None or now is None or now <= planned_on:
        return None
    return (f"{tp} was deleted and created again while offsets {first}..{end} of its log "
            f"(log epoch {planned_on}, now {now}) were being planned: they may not have "
            "been read")
