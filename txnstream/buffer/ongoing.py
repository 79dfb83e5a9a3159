"""``OngoingTxnCheck``: a buffer owner asks the coordinators about txns that stay ongoing.

Every ``lwm_check_interval_s`` the owner asks the coordinator of each txn still ongoing
at a partition it serves about that txn and writes the marker its answer calls for
(:mod:`txnstream.buffer.vouch` has the table): a txn that ended without a marker here,
or that no coordinator issued or registered here (a forged or copied ``txn.id``), stops
holding the partition back.

Why writing ABORT there is safe: a coordinator's txn that registered here gets its
markers here before it is COMMITTED or ABORTED; if it *did* commit here, its COMMIT
marker is at a lower offset than the ABORT the owner appends, and the fold keeps the
first marker. A partition is judged once its fold has reached the end read after the
answers, so a marker the coordinator wrote before answering is already folded; until
then it waits (judged at a later turn). It was skipped instead, and a partition written
to without pause is never at its end at the moment its end is read: a copied record
there was never ended (``test_buffer_worker.py``, ~900 records a second).

The owner's serving thread only starts a round and, at a later turn, judges its answers
(writes the markers): the questions go out :data:`ASK_THREADS` at a time on threads of
the check's own, so however slow the coordinators are (a storm of commits in their
queues) the fold goes on meanwhile, and the stuck partitions' ends are asked at once of
a consumer that fetches nothing (on the data consumer each waited behind its parked
fetch). Asked in line, one question at a time, 200 txns open over 16 partitions held the
fold 1.7-1.9 s a check (``tests/integration/buffer/test_ongoing_check_cost.py``), and
1,000 open held every reader of their topic back about 2 s while they committed.

A question names a page of txns of one coordinator (a GET of ``group_seqs``), not one
txn: at one GET a txn, 10,000 txns held open cost the worker 0.16 of a core at rest,
now 0.05 (10 open: 0.025; ``bench.open_txns``). A coordinator that refuses it (an
earlier version) is asked a txn at a time. When more txns are ongoing than a round
asks (:data:`MAX_TXNS_ASKED`), those asked longest ago go first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Protocol

from confluent_kafka import KafkaException

from txnstream.buffer.marker_writer import MarkerWriter
from txnstream.buffer.transaction_buffer import TransactionBuffer
from txnstream.buffer.vouch import Action, TxnAnswer, judge
from txnstream.config import Config
from txnstream.coordinator.protocol import TcOp
from txnstream.coordinator.request_checks import GET_PAGE
from txnstream.coordinator.tc_client import TransactionCoordinatorClient
from txnstream.errors import InvalidRequestError, TransactionNotFoundError, TxnStreamError
from txnstream.kafka.offsets import LogBounds
from txnstream.kafka.topics import PartitionCatalog, says_gone
from txnstream.markers import MarkerKind, TxnMarker
from txnstream.ratelog import RateLimitedLog
from txnstream.types import TopicPartition, TxnID

__all__ = ["ASK_THREADS", "ASK_TIMEOUT_S", "DUE_MAX_S", "MAX_TXNS_ASKED", "OngoingTxnCheck"]

log = logging.getLogger(__name__)
_rate_limited = RateLimitedLog(log)

MAX_TXNS_ASKED = 2_000
"""Ongoing txns one round asks coordinators about (a GET a page of
``request_checks.GET_PAGE``); the rest are asked first at the next round. Bounds a
round's time when many txns are open."""
ASK_THREADS = 16
"""Questions to coordinators in flight at once during a round (threads made at the first
round, for the owner's life). One round at a time."""
DUE_MAX_S = 5.0
"""How long an answered partition may wait for its fold to reach the end read after the
answers; then its answers are dropped (the next round asks again). Bounds how old an
answer a marker may rest on: "never issued" can turn false once the coordinator issues
that sequence (it matters only to a worker without a membership key, where a record's
``txn.id`` is its word alone)."""
ASK_TIMEOUT_S = 5.0
"""How long one question to a coordinator may take (a GET of a page, or of one txn and
the STATS after a not found); one not answered in time is asked again at the next check."""


class Served(Protocol):
    """A partition the owner serves, as the check sees it: its fold."""

    @property
    def buf(self) -> TransactionBuffer:
        """The partition's transaction buffer."""


class OngoingTxnCheck:
    """Asks coordinators about the ongoing txns of the partitions an owner serves."""

    def __init__(self, config: Config, bounds: LogBounds, partitions: PartitionCatalog,
                 markers: MarkerWriter) -> None:
        """``bounds``: partitions' ends, at once (it fetches nothing); ``markers`` writes."""
        self.config = config
        self._bounds = bounds
        self._partitions = partitions
        self._markers = markers
        self._tc: TransactionCoordinatorClient | None = None
        """Asks coordinators about txns that stay ongoing (made at the first check)."""
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._stuck: dict[TopicPartition, dict[TxnID, int]] | None = None
        """The round in flight: each partition's ongoing txns when it started."""
        self._answers: dict[TxnID, TxnAnswer] = {}
        self._due: dict[TopicPartition, tuple[int, dict[TxnID, int],
                                              dict[TxnID, TxnAnswer], float]] = {}
        """Answered partitions whose fold has not reached the end read after the answers:
        that end, the partition's txns asked, the round's answers and when they were
        all in (a later round's replace them: one entry a served partition at most;
        dropped after :data:`DUE_MAX_S`)."""
        self._round = 0
        self._asked: dict[TxnID, int] = {}
        """Each ongoing txn's round it was last asked at (bounded by the ongoing ones)."""
        self._left = 0
        self._done = threading.Event()

    @property
    def answered(self) -> bool:
        """Whether :meth:`run` has judging to do.

        A round's questions are all answered (or given up), or partitions of an answered
        round wait for their fold.
        """
        return (self._stuck is not None and self._done.is_set()) or bool(self._due)

    def close(self) -> None:
        """Close the coordinator client and the question threads, if made."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._tc is not None:
            self._tc.close()
            self._tc = None

    def run(self, served: Mapping[TopicPartition, Served], ask: bool = True) -> None:
        """Judge what is answered; start a round if ``ask`` and none is in flight.

        Never waits for a coordinator (on the owner's serving thread). Only partitions
        whose fold reached the end read after the answers are judged: a marker the
        coordinator wrote before answering is then already folded.
        """
        if self._stuck is not None and self._done.is_set():
            self._judge(served)
        elif self._due:
            self._judge_due(served)
        if ask and self._stuck is None:
            self._start(served)

    def _start(self, served: Mapping[TopicPartition, Served]) -> None:
        stuck = {tp: s.buf.ongoing_txns() for tp, s in served.items() if s.buf.ongoing}
        if not stuck:
            return
        if self._tc is None:
            self._tc = TransactionCoordinatorClient(self.config, signer=self._markers.signer)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(ASK_THREADS, thread_name_prefix="tb-ongoing")
        ongoing = dict.fromkeys(t for txns in stuck.values() for t in txns)
        # those asked longest ago first (never asked: first of all), so txns past the
        # bound that stay open cannot keep the same ones from ever being asked
        asked = sorted(ongoing, key=lambda t: self._asked.get(t, -1))[:MAX_TXNS_ASKED]
        self._round += 1
        self._asked = {t: r for t in ongoing if (r := self._asked.get(t)) is not None}
        self._asked.update((t, self._round) for t in asked)
        by_tc: dict[int, list[TxnID]] = {}
        for txn_id in asked:
            by_tc.setdefault(txn_id.tc_id, []).append(txn_id)
        pages = [(tc_id, txns[i:i + GET_PAGE]) for tc_id, txns in by_tc.items()
                 for i in range(0, len(txns), GET_PAGE)]
        self._stuck, self._answers, self._left = stuck, {}, len(pages)
        self._done.clear()
        for tc_id, page in pages:
            self._pool.submit(self._ask_page, tc_id, page).add_done_callback(
                partial(self._answered, page))

    def _answered(self, page: list[TxnID], f: Future[dict[TxnID, TxnAnswer]]) -> None:
        answers: dict[TxnID, TxnAnswer] = {}
        if not f.cancelled():
            if (exc := f.exception()) is not None:
                _rate_limited.warning(f"ask {type(exc).__name__}", "cannot ask about ongoing "
                                      "txns %s..: %r", page[0], exc)
            else:
                answers = f.result()
        with self._lock:
            self._answers.update(answers)
            self._left -= 1
            if self._left == 0:
                self._done.set()

    def _judge(self, served: Mapping[TopicPartition, Served]) -> None:
        """A round is answered: each partition's end now, then judge those folded to it."""
        stuck, self._stuck = self._stuck or {}, None
        now = time.monotonic()
        ends = self._bounds.get(stuck, retry=False)  # after the answers (module docstring)
        for tp, txns in stuck.items():  # each partition alone: one gone stops no other
            if isinstance(end := ends.get(tp), tuple):
                self._due[tp] = (end[1], txns, self._answers, now)
                continue
            exc = end or KafkaException(f"no end of {tp}")
            gone = says_gone(exc) and self._partitions.gone(tp)
            _rate_limited.warning(f"check {tp}", "%s: end unknown (%s): its ongoing txns "
                                  "are not checked%s", tp, exc,
                                  " (the partition no longer exists)" if gone else "")
        self._judge_due(served)

    def _judge_due(self, served: Mapping[TopicPartition, Served]) -> None:
        """Judge each partition whose fold reached the end read after its answers.

        The others wait for their fold: a partition written to without pause is never
        at its end at the moment it is read, only past it later.
        """
        wrote = False
        now = time.monotonic()
        for tp, (high, txns, answers, at) in list(self._due.items()):
            s = served.get(tp)
            if s is not None and s.buf.last_offset < high - 1 and now - at < DUE_MAX_S:
                continue
            del self._due[tp]
            if s is None or s.buf.last_offset < high - 1:  # not served; or waited too long
                continue
            for txn_id in txns:
                answer = answers.get(txn_id)
                if answer is None or txn_id not in s.buf.ongoing:
                    continue
                action, why = judge(tp, txn_id, answer)
                if action is Action.KEEP:
                    continue
                kind = MarkerKind.COMMIT if action is Action.COMMIT else MarkerKind.ABORT
                self._markers.write(tp, TxnMarker(txn_id, kind, 0))
                wrote = True
                _rate_limited.warning(f"ended {tp}", "%s: txn %s is ongoing here but %s: "
                                      "wrote its %s marker", tp, txn_id, why, kind.value)
        if wrote:
            self._markers.flush(10)

    def _ask_page(self, tc_id: int, page: list[TxnID]) -> dict[TxnID, TxnAnswer]:
        """Coordinator ``tc_id``'s answers about ``page``, in one GET.

        A txn it did not answer is left out. A coordinator that refuses a GET of many
        (an earlier version) is asked one txn at a time.
        """
        assert self._tc is not None
        if not 0 <= tc_id < self._tc.num_coordinators:
            return {t: TxnAnswer(None, no_coordinator=True) for t in page}
        seqs = {t.least_bits: t for t in page}
        try:
            reply = self._tc.request(TcOp.GET, tc_id, group_seqs=tuple(seqs),
                                     timeout_s=ASK_TIMEOUT_S)
        except InvalidRequestError:
            next_seq: dict[int, int | None] = {}
            return {t: a for t in page if (a := self._ask(t, next_seq)) is not None}
        except TxnStreamError as exc:  # not served now, not an admin, ...: next check
            _rate_limited.warning(f"ask {tc_id} {type(exc).__name__}", "coordinator %d: "
                                  "cannot ask about ongoing txns: %s", tc_id, exc)
            return {}
        out: dict[TxnID, TxnAnswer] = {}
        for info in reply.txns:  # only what was asked counts
            if info.txn_id.tc_id == tc_id and (t := seqs.get(info.txn_id.least_bits)) is not None:
                out[t] = TxnAnswer(info.status, frozenset(
                    TopicPartition.parse(p) for p in info.partitions))
        next_sequence = reply.stats.get("next_sequence")
        for seq in reply.group_seqs:
            if (t := seqs.get(seq)) is not None and t not in out:
                out[t] = TxnAnswer(None, next_sequence=next_sequence)
        return out

    def _ask(self, txn_id: TxnID, next_seq: dict[int, int | None]) -> TxnAnswer | None:
        """The coordinator's answer about ``txn_id``; None if it cannot be had now."""
        assert self._tc is not None
        tc_id = txn_id.tc_id
        if not 0 <= tc_id < self._tc.num_coordinators:
            return TxnAnswer(None, no_coordinator=True)
        try:
            reply = self._tc.request(TcOp.GET, tc_id, txn_seq=txn_id.least_bits,
                                     timeout_s=ASK_TIMEOUT_S)
            info = reply.txns[0]
            return TxnAnswer(info.status,
                             frozenset(TopicPartition.parse(p) for p in info.partitions))
        except TransactionNotFoundError:
            if tc_id not in next_seq:
                try:
                    stats = self._tc.request(TcOp.STATS, tc_id, timeout_s=ASK_TIMEOUT_S).stats
                    next_seq[tc_id] = int(stats["next_sequence"])
                except (TxnStreamError, KeyError, ValueError) as exc:
                    _rate_limited.warning(f"stats {tc_id}", "coordinator %d: no STATS for the "
                                          "ongoing-txn check: %s", tc_id, exc)
                    next_seq[tc_id] = None
            if next_seq[tc_id] is None:
                return None
            return TxnAnswer(None, next_sequence=next_seq[tc_id])
        except TxnStreamError as exc:  # not served now, not an admin, ...: next check
            _rate_limited.warning(f"ask {tc_id} {type(exc).__name__}", "coordinator %d: "
                                  "cannot ask about ongoing txn %s: %s", tc_id, txn_id, exc)
            return None
