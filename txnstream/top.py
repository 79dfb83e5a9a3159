"""``txnstream top``: a live view of the coordinators and of the partitions open txns block.

Three parts, kept apart so the middle one is pure and tested alone:

1. :class:`Sampler` reads a :class:`Sample`: each coordinator's STATS (open txns, the
   txns it finalized since its owner took it), every txn still known (LIST), and the
   served buffer state of every partition an unfinished txn wrote to, from one
   long-lived :class:`~txnstream.buffer.follower.BufferStateFollower`.
2. :func:`build_view` turns the previous and the current sample into rows: per
   coordinator the open txns, commit and abort rates, the oldest open txn; per partition
   how far committed readers lag (folded but not readable) and the txn blocking them.
With ``subscriptions`` (``--subscription TOPIC:SUB``) the sample also replays those
subscriptions' pending-ack logs: per partition the cursor, the acks above it and the
redelivery counts (issue 38: a poison record shows as a high count before it is
dead-lettered).

3. :func:`render` draws a view as rich tables; :class:`TopApp` refreshes it in a
   ``rich.live.Live`` and reads keys: ``j``/``k`` (or the arrows) select a blocking txn,
   ``a`` asks to abort it, ``y`` confirms, ``q`` quits.
"""

from __future__ import annotations

import select
import sys
import termios
import threading
import time
import tty
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from txnstream.admin import CoordinatorStats
from txnstream.buffer.transaction_buffer import BufferStats
from txnstream.client import Client
from txnstream.coordinator.protocol import TxnInfo
from txnstream.pendingack.handle import PendingAckStats
from txnstream.pendingack.store import PendingAckStore
from txnstream.types import TopicPartition, TxnID, TxnStatus

__all__ = ["AckRow", "Sample", "TcRow", "PartitionRow", "View", "build_view", "render",
           "Sampler", "TopApp", "abort_selected"]

COMMITTED_KEY = f"ended.{TxnStatus.COMMITTED.value}"
ABORTED_KEY = f"ended.{TxnStatus.ABORTED.value}"
UNFINISHED = (TxnStatus.OPEN, TxnStatus.PREPARED, TxnStatus.COMMITTING, TxnStatus.ABORTING)


@dataclass(frozen=True, slots=True)
class AckRow:
    """One partition of a watched subscription: its pending-ack state, or why none."""

    subscription: str
    tp: TopicPartition
    stats: PendingAckStats | None
    note: str = ""


@dataclass(frozen=True, slots=True)
class Sample:
    """What one refresh read, at ``at_s`` (``time.monotonic``) and ``now_ms`` (wall)."""

    at_s: float
    now_ms: int
    coordinators: list[CoordinatorStats]
    txns: list[TxnInfo]
    buffers: dict[TopicPartition, BufferStats | str]
    """Served state per partition of an unfinished txn, or why there is none."""
    acks: list[AckRow] = field(default_factory=list)
    """The watched subscriptions' partitions."""


@dataclass(frozen=True, slots=True)
class TcRow:
    """One coordinator."""

    tc_id: int
    owner: str | None
    open_txns: int
    commit_rate: float | None
    abort_rate: float | None
    oldest_txn: TxnID | None
    oldest_age_s: float | None
    prepared_txns: int = 0
    """Prepared txns waiting for their completion (each blocks its partitions)."""


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """One partition an unfinished txn wrote to."""

    tp: TopicPartition
    lag: int | None
    """Offsets folded but not readable committed-only (None: not served)."""
    blocking_txn: TxnID | None
    blocked_for_s: float | None
    note: str = ""


@dataclass(frozen=True, slots=True)
class View:
    """Everything the screen shows, computed from two samples."""

    coordinators: list[TcRow]
    partitions: list[PartitionRow]
    blocking: list[TxnID] = field(default_factory=list)
    """The txns a key may select, in screen order (partitions' blocking txns, deduped)."""
    acks: list[AckRow] = field(default_factory=list)
    """Watched subscriptions' partitions, the highest redelivery count first."""


def _rate(prev: CoordinatorStats | None, cur: CoordinatorStats, key: str,
          dt: float) -> float | None:
    """Per-second rate of a counter.

    None without a previous sample, or after a reset (a new owner starts at 0).
    """
    if prev is None or dt <= 0 or prev.owner_id != cur.owner_id:
        return None
    delta = cur.stats.get(key, 0) - prev.stats.get(key, 0)
    return delta / dt if delta >= 0 else None


def build_view(prev: Sample | None, cur: Sample) -> View:
    """Rows of the screen: pure, so tested without a cluster."""
    dt = cur.at_s - prev.at_s if prev is not None else 0.0
    before = {c.tc_id: c for c in prev.coordinators} if prev is not None else {}
    open_by_tc: dict[int, list[TxnInfo]] = {}
    for t in cur.txns:
        if t.status is TxnStatus.OPEN:
            open_by_tc.setdefault(t.txn_id.tc_id, []).append(t)
    tcs = []
    for c in sorted(cur.coordinators, key=lambda c: c.tc_id):
        opened = open_by_tc.get(c.tc_id, [])
        oldest = min(opened, key=lambda t: (t.open_time_ms, t.txn_id.least_bits),
                     default=None)
        tcs.append(TcRow(
            c.tc_id, c.owner_id, c.stats.get(f"status.{TxnStatus.OPEN.value}", len(opened)),
            _rate(before.get(c.tc_id), c, COMMITTED_KEY, dt),
            _rate(before.get(c.tc_id), c, ABORTED_KEY, dt),
            oldest.txn_id if oldest else None,
            max(0.0, (cur.now_ms - oldest.open_time_ms) / 1000) if oldest else None,
            c.stats.get(f"status.{TxnStatus.PREPARED.value}", 0)))
    parts = []
    for tp in sorted(cur.buffers, key=lambda tp: (tp.topic, tp.partition)):
        st = cur.buffers[tp]
        if isinstance(st, str):
            parts.append(PartitionRow(tp, None, None, None, st))
        else:
            parts.append(PartitionRow(tp, st.last_offset - st.max_read_position,
                                      st.blocking_txn, st.blocked_for_s))
    # blocked partitions first, the longest blocked on top
    parts.sort(key=lambda r: (r.blocking_txn is None, -(r.blocked_for_s or 0.0)))
    blocking: list[TxnID] = []
    for r in parts:
        if r.blocking_txn is not None and r.blocking_txn not in blocking:
            blocking.append(r.blocking_txn)
    acks = sorted(cur.acks, key=lambda r: (-(r.stats.max_redelivery_count if r.stats else 0),
                                           r.subscription, r.tp.topic, r.tp.partition))
    return View(tcs, parts, blocking, acks)


def _fmt(v: float | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:.1f}{unit}"


def render(view: View, selected: int | None = None, footer: str = "") -> RenderableType:
    """The screen: a coordinator table, a partition table, and the key line."""
    tcs = Table(title="coordinators", expand=True)
    for col in ("tc", "owner", "open", "prepared", "commits/s", "aborts/s", "oldest open txn",
                "age"):
        tcs.add_column(col)
    for c in view.coordinators:
        tcs.add_row(str(c.tc_id), c.owner or "(none)", str(c.open_txns), str(c.prepared_txns),
                    _fmt(c.commit_rate), _fmt(c.abort_rate),
                    str(c.oldest_txn) if c.oldest_txn else "-", _fmt(c.oldest_age_s, "s"))
    parts = Table(title="partitions of unfinished txns", expand=True)
    for col in ("", "partition", "unreadable lag", "blocked by", "for"):
        parts.add_column(col)
    chosen = view.blocking[selected] if selected is not None and view.blocking else None
    for r in view.partitions:
        mark = ">" if chosen is not None and r.blocking_txn == chosen else ""
        style = "reverse" if mark else ("bold red" if r.blocking_txn else "")
        parts.add_row(mark, str(r.tp), "-" if r.lag is None else str(r.lag),
                      str(r.blocking_txn) if r.blocking_txn else (r.note or "-"),
                      _fmt(r.blocked_for_s, "s"), style=style)
    keys = Text(footer or "j/k: select a blocking txn   a: abort it   q: quit", style="dim")
    if not view.acks:
        return Group(tcs, parts, keys)
    subs = Table(title="subscriptions (pending acks, redeliveries)", expand=True)
    for col in ("subscription", "partition", "cursor", "acked above", "pending txns",
                "redelivered", "highest count"):
        subs.add_column(col)
    for a in view.acks:
        st = a.stats
        if st is None:
            subs.add_row(a.subscription, str(a.tp), a.note or "-", "", "", "", "")
            continue
        subs.add_row(a.subscription, str(a.tp), str(st.cursor), str(st.acked_above_cursor),
                     str(st.pending_txns), str(st.redelivered_offsets),
                     str(st.max_redelivery_count),
                     style="yellow" if st.max_redelivery_count else "")
    return Group(tcs, parts, subs, keys)


class Sampler:
    """Reads samples; keeps one buffer-state follower across refreshes."""

    def __init__(self, client: Client, subscriptions: Sequence[tuple[str, str]] = ()) -> None:
        """``subscriptions``: ``(topic, subscription)`` pairs whose acks to show."""
        from txnstream.buffer.follower import BufferStateFollower

        self.client = client
        self.follower = BufferStateFollower(client.config, name="top")
        self._followed: set[TopicPartition] = set()
        self.subscriptions = list(subscriptions)
        self._stores: dict[str, PendingAckStore] = {}

    def sample(self) -> Sample:
        """One refresh: STATS, LIST, and the served state of the txns' partitions."""
        from txnstream.buffer.follower import ServeStatus

        admin = self.client.admin
        coordinators = admin.coordinator_stats()
        txns = admin.list_transactions()
        wanted = {TopicPartition.parse(p) for t in txns if t.status in UNFINISHED
                  for p in t.partitions}
        self.follower.follow_many(sorted(wanted - self._followed))
        for tp in self._followed - wanted:
            self.follower.unfollow(tp)
        self._followed = wanted
        if wanted:
            self.follower.catch_up(wanted, timeout_s=5.0)
        now_ms = int(time.time() * 1000)
        buffers: dict[TopicPartition, BufferStats | str] = {}
        for tp in wanted:
            view = self.follower.views.get(tp)
            if view is not None:
                buffers[tp] = view.stats(now_ms)
            elif self.follower.status.get(tp) is ServeStatus.PLAIN:
                buffers[tp] = "no txn record yet"
            else:
                buffers[tp] = "not served yet"
        return Sample(time.monotonic(), now_ms, coordinators, txns, buffers, self._acks())

    def _acks(self) -> list[AckRow]:
        """The watched subscriptions' partitions, replayed from their pending-ack logs."""
        rows: list[AckRow] = []
        for topic, sub in self.subscriptions:
            tps = self.follower.log_queries().partitions_of(topic)
            if not tps:
                rows.append(AckRow(sub, TopicPartition(topic, 0), None, "no such topic"))
                continue
            try:
                store = self._stores.get(sub)
                if store is None:
                    store = self._stores[sub] = PendingAckStore(self.client.config, sub, "top")
                handles = store.replay_many(dict.fromkeys(tps))
            except Exception as exc:  # noqa: BLE001 - shown, and tried at the next refresh
                rows += [AckRow(sub, tp, None, f"not read: {exc}") for tp in tps]
                continue
            rows += [AckRow(sub, tp, handles[tp].stats()) for tp in tps]
        return rows

    def close(self) -> None:
        """Release the follower's consumer and the pending-ack readers."""
        self.follower.close()
        for store in self._stores.values():
            store.close()


def abort_selected(client: Client, view: View, selected: int) -> TxnID:
    """The ``a`` then ``y`` keys: abort the selected blocking txn; returns its id."""
    txn_id = view.blocking[selected]
    client.abort_transaction(txn_id)
    return txn_id


@contextmanager
def _cbreak() -> Iterator[bool]:
    """Keys without Enter while the view runs; yields False when stdin is no terminal."""
    if not sys.stdin.isatty():
        yield False
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


class TopApp:
    """The live screen: refresh every ``interval_s``, keys in between."""

    def __init__(self, client: Client, interval_s: float = 2.0,
                 subscriptions: Sequence[tuple[str, str]] = ()) -> None:
        self.client = client
        self.interval_s = interval_s
        self.subscriptions = list(subscriptions)
        self.selected: int | None = None
        self.confirm: TxnID | None = None
        self.message = ""
        self._stop = threading.Event()

    def _key(self, key: str, view: View) -> None:
        if self.confirm is not None:
            txn, self.confirm = self.confirm, None
            if key.lower() == "y":
                try:
                    self.client.abort_transaction(txn)
                    self.message = f"aborted {txn}"
                except Exception as exc:  # noqa: BLE001 - shown, the view keeps running
                    self.message = f"abort of {txn} failed: {exc}"
            else:
                self.message = f"kept {txn}"
            return
        if key == "q":
            self._stop.set()
        elif key in ("j", "\x1b[B") and view.blocking:
            self.selected = 0 if self.selected is None else min(self.selected + 1,
                                                                len(view.blocking) - 1)
        elif key in ("k", "\x1b[A") and view.blocking:
            self.selected = 0 if self.selected is None else max(self.selected - 1, 0)
        elif key == "a" and view.blocking:
            self.confirm = view.blocking[min(self.selected or 0, len(view.blocking) - 1)]

    def _footer(self) -> str:
        if self.confirm is not None:
            return f"abort {self.confirm}? y/N"
        keys = "j/k: select a blocking txn   a: abort it   q: quit"
        return f"{self.message}   ({keys})" if self.message else keys

    def run(self) -> None:
        """Until ``q`` or Ctrl-C."""
        sampler = Sampler(self.client, self.subscriptions)
        prev: Sample | None = None
        try:
            with _cbreak() as keys, Live(Text("reading the first sample..."),
                                         refresh_per_second=4, screen=False) as live:
                while not self._stop.is_set():
                    cur = sampler.sample()
                    view = build_view(prev, cur)
                    prev = cur
                    if self.selected is not None and view.blocking:
                        self.selected = min(self.selected, len(view.blocking) - 1)
                    live.update(render(view, self.selected, self._footer()))
                    due = time.monotonic() + self.interval_s
                    while not self._stop.is_set() and time.monotonic() < due:
                        key = _read_key(0.1) if keys else None
                        if key is None:
                            if not keys:
                                time.sleep(0.1)
                            continue
                        self._key(key, view)
                        live.update(render(view, self.selected, self._footer()))
        finally:
            sampler.close()


def _read_key(timeout_s: float) -> str | None:
    """One key (an arrow key's escape sequence whole), or None after ``timeout_s``."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
    if not ready:
        return None
    ch = sys.stdin.read(1)
    if ch == "\x1b":
        more, _, _ = select.select([sys.stdin], [], [], 0.01)
        if more:
            ch += sys.stdin.read(2)
    return ch
