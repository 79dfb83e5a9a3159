"""``TxnStreamPartition``: one task's read, as the driver ships it to an executor.

A picklable ``InputPartition`` (PySpark's data source contract): a topic partition's
range and what in it must not be delivered, the hidden offsets packed compactly
(:func:`_pack_offsets`). The planner (:mod:`txnstream_spark.planner`) makes them, the
reader (:mod:`txnstream_spark.source`) reads them.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate

from pyspark.sql.datasource import InputPartition

from txnstream.config import Config

__all__ = ["TxnStreamPartition"]


class TxnStreamPartition(InputPartition):
    """One topic partition's range ``[start, end)`` and what in it not to deliver.

    Planned on the driver from the served buffer state (``BufferView.skip_in``), so a
    task only compares positions: ``hidden`` offsets (markers, stragglers, undecodable
    records; packed, see :func:`_pack_offsets`) and ``aborted`` spans, raw ``txn.id``
    header -> ``(first, last)`` offset of an aborted txn: its records in the span are
    not delivered (Kafka's aborted-transaction index). ``exclude``: spans of records
    deferred for their time (:mod:`txnstream_spark.deferred`), not delivered here;
    ``only``: the range reads deferred records released since, and delivers nothing else.
    """

    def __init__(self, config: Config, topic: str, partition: int, start: int, end: int,
                 hidden: Sequence[int] = (), aborted: Iterable[tuple[bytes, int, int]] = (),
                 value_schema: str | None = None, plain: bool = False,
                 latest_high: int | None = None, fail_on_data_loss: bool = True,
                 exclude: Sequence[tuple[int, int]] = (),
                 only: Sequence[tuple[int, int]] | None = None) -> None:
        super().__init__((topic, partition, start, end))
        self.plain = plain
        """No txn ever registered the partition (planned without served state)."""
        self.fail_on_data_loss = fail_on_data_loss
        """Records of the range deleted before the task reads them fail it (Kafka's
        ``failOnDataLoss``); False: the task reads on from the log start, logging them."""
        self.latest_high = latest_high
        """A batch range whose end is ``latest``: the partition's high watermark when it
        was planned (the task plans the range again if it moved; see
        :func:`~txnstream_spark.source.replan_latest`). None: the end is fixed."""
        self.config = config
        self.value_schema = value_schema
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.hidden = _pack_offsets(hidden)
        self.aborted = {raw: (first, last) for raw, first, last in aborted}
        self.exclude = tuple(exclude)
        self.only = tuple(only) if only is not None else None


def _pack_offsets(offsets: Sequence[int]) -> tuple[int, str, bytes]:
    """Sorted offsets as ``(first, typecode, gaps)``, compact to ship to a task.

    The gaps go in the narrowest array type that holds them: a marker after each
    one-record txn costs one byte.
    """
    if not offsets:
        return -1, "B", b""
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    top = max(gaps, default=0)
    code = next(c for c in "BHIQ" if top < 1 << (8 * array(c).itemsize))
    return offsets[0], code, array(code, gaps).tobytes()


def _unpack_offsets(packed: tuple[int, str, bytes]) -> set[int]:
    """The offsets :func:`_pack_offsets` packed, as a set."""
    first, code, data = packed
    if first < 0:
        return set()
    gaps = array(code)
    gaps.frombytes(data)
    return set(accumulate(gaps, initial=first))
