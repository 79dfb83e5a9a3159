"""``CoordinatorWorker.serving()`` is asked from other threads (tests, the gauges) while the
worker's loop adds and drops TC incarnations: the answer must not iterate a dict that
changes under it (CI on f94c06d: ``RuntimeError: dictionary changed size during
iteration`` in ``TcOwnership.serving_ids``, from a test fixture's wait)."""

from __future__ import annotations

from types import SimpleNamespace

from txnstream.coordinator.ownership import TcOwnership, TcPhase


class _Serving:
    """A TC whose phase is read while the loop's thread replaces another TC meanwhile
    (what a thread switch between two items of the iteration does)."""

    def __init__(self, tc_id: int, tcs: dict) -> None:
        self.tc_id, self._tcs = tc_id, tcs

    @property
    def phase(self) -> TcPhase:
        self._tcs[100 + self.tc_id] = SimpleNamespace(tc_id=100 + self.tc_id,
                                                      phase=TcPhase.SERVING)
        return TcPhase.SERVING


def test_serving_ids_while_the_loop_changes_the_tcs():
    tcs: dict = {}
    tcs.update({i: _Serving(i, tcs) for i in range(4)})
    got = TcOwnership.serving_ids(SimpleNamespace(tcs=tcs))  # type: ignore[arg-type]
    assert got == [0, 1, 2, 3]  # those there when it was asked
