"""``OffsetRuns``: a txn's offsets in one partition, stored as runs of consecutive offsets.

A txn's records in a partition are one run of consecutive offsets, broken only where
other producers' records interleave, so its size (in memory and in a snapshot) is the
number of runs, not of records: Kafka's aborted-transaction index keeps even less (one
span per aborted txn), and a reader with each record's ``txn.id`` needs no more. The
buffer keeps the runs so that it can answer for an offset alone (:meth:`__contains__`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

__all__ = ["OffsetRuns"]


class OffsetRuns(Sequence[int]):
    """Strictly increasing offsets, stored as runs ``[start, end]``.

    Equal to any sequence of the same offsets. Appends come in increasing order (the fold's).
    """

    __slots__ = ("_starts", "_ends", "_count")

    def __init__(self, offsets: Iterable[int] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._count = 0
        for o in offsets:
            self.append(o)

    @classmethod
    def from_runs(cls, runs: Iterable[tuple[int, int]]) -> OffsetRuns:
        """From ``(start, end)`` runs, increasing and not touching; ``ValueError`` else."""
        out = cls()
        for start, end in runs:
            if end < start or (out._ends and start <= out._ends[-1] + 1):
                raise ValueError(f"offset run [{start}, {end}] out of order")
            out._starts.append(start)
            out._ends.append(end)
            out._count += end - start + 1
        return out

    def append(self, offset: int) -> None:
        """Add ``offset``, above every offset held (O(1))."""
        ends = self._ends
        if ends and offset <= ends[-1]:
            raise ValueError(f"offset {offset} appended after {ends[-1]}")
        if ends and offset == ends[-1] + 1:
            ends[-1] = offset
        else:
            self._starts.append(offset)
            ends.append(offset)
        self._count += 1

    def append_range(self, start: int, end: int) -> None:
        """Add ``start..end``, above every offset held (O(1)): :meth:`append` of each."""
        if end < start:
            raise ValueError(f"offset range [{start}, {end}] is empty")
        self.append(start)
        self._ends[-1] = end
        self._count += end - start

    def runs(self) -> list[tuple[int, int]]:
        """The ``(start, end)`` runs, in order."""
        return list(zip(self._starts, self._ends, strict=True))

    @property
    def run_count(self) -> int:
        """How many runs: what the size of a snapshot entry grows with."""
        return len(self._starts)

    def at_or_above(self, floor: int) -> OffsetRuns:
        """A copy without the offsets below ``floor`` (O(runs))."""
        i = bisect.bisect_left(self._ends, floor)
        runs = self.runs()[i:]
        if runs and runs[0][0] < floor:
            runs[0] = (floor, runs[0][1])
        return OffsetRuns.from_runs(runs)

    def copy(self) -> OffsetRuns:
        """An independent copy (O(runs))."""
        return OffsetRuns.from_runs(self.runs())

    def intersects(self, start: int, end: int) -> bool:
        """Whether an offset in ``[start, end)`` is held (O(log runs))."""
        i = bisect.bisect_left(self._ends, start)
        return i < len(self._starts) and max(self._starts[i], start) < end

    # ------------------------------------------------------------ wire form

    def to_deltas(self) -> list[int]:
        """``[start0, len0, gap1, len1, ...]``, the wire form (Avro varints).

        Each gap counts the offsets between two runs (at least 1), so a partition's late
        offsets cost no more than its early ones.
        """
        out: list[int] = []
        prev_end = None
        for start, end in zip(self._starts, self._ends, strict=True):
            out += [start if prev_end is None else start - prev_end - 1, end - start + 1]
            prev_end = end
        return out

    @classmethod
    def from_deltas(cls, deltas: Sequence[int]) -> OffsetRuns:
        """Inverse of :meth:`to_deltas`; ``ValueError`` if it cannot be one."""
        if len(deltas) % 2:
            raise ValueError(f"offset runs of odd length {len(deltas)}")
        runs: list[tuple[int, int]] = []
        for i in range(0, len(deltas), 2):
            gap, n = deltas[i], deltas[i + 1]
            if n < 1 or gap < (1 if i else 0):
                raise ValueError(f"offset run {i // 2}: gap {gap}, length {n}")
            start = gap if not runs else runs[-1][1] + 1 + gap
            runs.append((start, start + n - 1))
        return cls.from_runs(runs)

    # ------------------------------------------------------------- sequence

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[int]:
        for start, end in zip(self._starts, self._ends, strict=True):
            yield from range(start, end + 1)

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int):
            return False
        i = bisect.bisect_right(self._starts, offset) - 1
        return i >= 0 and offset <= self._ends[i]

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return list(self)[index]
        if index == 0 and self._starts:
            return self._starts[0]
        if index == -1 and self._ends:
            return self._ends[-1]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError("offset index out of range")
        for start, end in zip(self._starts, self._ends, strict=True):
            if index <= end - start:
                return start + index
            index -= end - start + 1
        raise IndexError("offset index out of range")  # pragma: no cover

    def __eq__(self, other: object) -> bool:
        if isinstance(other, OffsetRuns):
            return self._starts == other._starts and self._ends == other._ends
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == self._count and all(
                a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"OffsetRuns({self.runs()!r})"
