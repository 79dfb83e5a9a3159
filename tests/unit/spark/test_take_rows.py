"""The Spark source task's fast filter in C and in Python give the same rows (issue 35).

``txnstream._native.take_rows`` and its Python twin ``txnstream_spark.take._take_rows``
run on the same generated batches (plain and txn records, markers, user headers, errors,
skipped offsets, aborted spans, named, unnamed and undecodable txns, a range planned
plain, an end inside the batch): the same index, position and end flag, the same
columns. And the task's whole rule (``_Rows.add``) delivers the same rows with the C
filter, with the twin, and with every record by the full rule.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from txnstream import native  # noqa: E402
from txnstream.config import Config  # noqa: E402
from txnstream_spark import take, task  # noqa: E402
from txnstream_spark.partition import TxnStreamPartition  # noqa: E402

C_TAKE = getattr(native.native(), "take_rows", None)
needs_c = pytest.mark.skipif(C_TAKE is None, reason="txnstream._native not built "
                             "(or TXNSTREAM_NATIVE=0): the Python twin only")

RAWS = [b"\x00\x01", b"\x00\x02", b"\x00\x03", b"junk"]


class Msg:
    """A confluent-kafka Message's methods, as the task calls them."""

    def __init__(self, off: int, headers: list | None, err: Any = None) -> None:
        self._off, self._h, self._err = off, headers, err

    def error(self) -> Any:
        return self._err

    def offset(self) -> int:
        return self._off

    def headers(self) -> list | None:
        return None if self._h is None else list(self._h)

    def key(self) -> bytes:
        return b"k%d" % self._off

    def value(self) -> bytes | None:
        return None if self._off % 7 == 0 else b"v%d" % self._off

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000 + self._off)


raw = st.sampled_from(RAWS)
header_sets = st.one_of(
    st.none(), st.just([]),
    raw.map(lambda r: [("txn.id", r)]),
    raw.map(lambda r: [("txn.id", r), ("txn.tag", b"mac")]),
    st.just([("txn.marker", b"COMMIT")]),
    st.just([("user", b"u")]),
    raw.map(lambda r: [("txn.id", r), ("user", b"x")]),
    raw.map(lambda r: [("txn.id", r), ("txn.tag", b"mac"), ("txn.deliver.after", b"5")]),
    st.just([("txn.tag", b"mac")]),
)


@st.composite
def cases(draw):
    n = draw(st.integers(0, 40))
    offs, at = [], draw(st.integers(0, 5))
    for _ in range(n):
        at += draw(st.integers(1, 3))
        offs.append(at)
    batch = [Msg(o, draw(header_sets), "err" if draw(st.integers(0, 30)) == 0 else None)
             for o in offs]
    end = draw(st.integers(0, (offs[-1] + 2) if offs else 5))
    skip = set(draw(st.lists(st.sampled_from(offs), unique=True))) if offs else set()
    spans = {r: (draw(st.integers(0, 60)), draw(st.integers(0, 80)))
             for r in draw(st.lists(raw, unique=True, max_size=2))}
    names = {r: draw(st.sampled_from([str(r), None]))
             for r in draw(st.lists(raw, unique=True, max_size=3))}
    return batch, end, skip, spans or None, names, draw(st.booleans())


def _cols() -> tuple[list, list, list, list, list, list, list]:
    return ([], [], [], [], [], [], [])


@needs_c
@settings(max_examples=400, deadline=None)
@given(cases(), st.integers(0, 3))
def test_the_c_filter_and_its_python_twin_agree(case, start):
    batch, end, skip, spans, names, plain = case
    i = min(start, len(batch))
    got_c, got_py = _cols(), _cols()
    rc = C_TAKE(batch, i, 0, end, skip, spans, names, plain, got_c)
    rp = take._take_rows(batch, i, 0, end, skip, spans, names, plain, got_py)
    assert rc == rp
    assert got_c == got_py


def _delivered(batch, end, skip, spans, names, how, monkeypatch) -> tuple[list, int]:
    p = TxnStreamPartition(Config(bootstrap_servers="127.0.0.1:1"), "t", 0, 0, end,
                           sorted(skip), [(r, f, la) for r, (f, la) in (spans or {}).items()])
    rows = task._Rows(p, None)
    rows.txn_names.update(names)
    if how == "full":  # every record by the full rule
        monkeypatch.setattr(task, "take_rows", lambda b, i, pos, *a: (i, pos, False))
    else:
        monkeypatch.setattr(task, "take_rows", C_TAKE if how == "c" else take._take_rows)
    pos = rows.add(batch, 0)
    out = list(zip(rows.keys, rows.values, rows.offsets, rows.timestamps,
                   rows.timestamp_types, rows.headers, rows.txn_ids, strict=True))
    return out, pos


@settings(max_examples=200, deadline=None)
@given(cases())
def test_the_tasks_rule_delivers_the_same_rows_with_either_filter(case):
    batch, end, skip, spans, names, _ = case
    batch = [m for m in batch if m._err is None]  # an error is logged: tested elsewhere
    with pytest.MonkeyPatch.context() as mp:
        full = _delivered(batch, end, skip, spans, names, "full", mp)
        twin = _delivered(batch, end, skip, spans, names, "python", mp)
        assert twin == full
        if C_TAKE is not None:
            assert _delivered(batch, end, skip, spans, names, "c", mp) == full
