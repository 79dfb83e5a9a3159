"""Driver side of the ``txnstream`` source: what each read covers and what it must skip.

The driver follows the transaction buffer state that the buffer owners (``txnstream
worker``) serve and never folds: a partition's committed end is its served
``max_read_position + 1`` (a partition no txn ever registered: its high watermark), so
every transactional record in a range has already ended. Each input partition carries
what its range must skip (hidden offsets, aborted txns' spans): executors compare
positions, without reading ahead. Offsets are JSON dicts ``{topic: {"partition": next}}``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException

from txnstream.errors import ConfigError
from txnstream.types import TopicPartition

from .deferred import released_partitions
from .log_epochs import gone_since_planned, replaced, split
from .options import EARLIEST, LATEST, Offsets, SourceOptions, Timestamps, named_offsets
from .partition import TxnStreamPartition

__all__ = ["CATCH_UP_S", "COVER_WAIT_S", "FRESH_WAIT_S", "Planner", "TxnStreamPartition"]

log = logging.getLogger(__name__)

FRESH_WAIT_S = 10.0
"""How long a plan that must hold everything committed before it (a batch read, the
target of ``Trigger.AvailableNow``, ``startingOffsets=latest``) waits for the buffer
owners to serve each partition up to its end as read when planning began."""
CATCH_UP_S = 0.5
"""Bound on one ``catch_up`` of the served state, so planning a micro-batch stays short
when the state is far behind (a view starting from an old snapshot): an end found short
is safe, a later micro-batch (or the fresh and cover waits, which poll on) goes on."""
LOST_HINT = (
    "Some data may have been lost because they are not available in Kafka any more; either "
    "the data was aged out by Kafka or the topic may have been deleted before all the data "
    "in the topic was processed. If you don't want your streaming query to fail on such "
    "cases, set the source option \"failOnDataLoss\" to \"false\".")
"""Kafka's source's words for a loss under ``failOnDataLoss=true``."""

_LOG_NOT_SERVED = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
                             KafkaError._UNKNOWN_TOPIC, KafkaError.LEADER_NOT_AVAILABLE,
                             KafkaError.NOT_LEADER_FOR_PARTITION})
"""Watermark errors of a partition whose log is not served right now (a topic being
deleted or created again, a leader moving): the partition is held that round."""
COVER_WAIT_S = 30.0
"""How long a micro-batch's plan waits for the served state to cover its range (a
restarted driver plans ranges its predecessor found committed: the state it follows
may still be behind, e.g. reloading from a snapshot)."""


class Planner:
    """Driver side: partitions, their committed ends, and each range's skip info.

    Reads the served buffer state (:class:`BufferStateFollower`); never folds. Per
    partition, the committed end is:

    * SERVED: the view's ``max_read_position + 1``;
    * PLAIN (no txn ever registered it): its high watermark, read *before* checking
      again that it is still not registered (a registration precedes every txn record,
      so nothing transactional lies below that end). A txn record its task meets there
      anyway is junk, skipped, unless the topic is registered by then (the task fails:
      :meth:`txnstream_spark.source._Rows._unregistered`);
    * WAITING (registered, no buffer owner serves it yet): it does not move, and nothing
      of it is delivered meanwhile (never unfiltered data).

    The ends never move back (a view reloaded from an older snapshot is waited for).
    """

    def __init__(self, opts: SourceOptions, tps: Sequence[TopicPartition] | None = None
                 ) -> None:
        """Plan the partitions of ``opts.topics`` (or just ``tps``, a task re-planning)."""
        from txnstream.buffer.follower import BufferStateFollower

        self.opts = opts
        self.follower = BufferStateFollower(opts.config, name="spark")
        self.queries = self.follower.log_queries()  # never asked behind a parked fetch
        self.tps: list[TopicPartition] = list(tps or ())
        self._discovers = tps is None
        """Whether :meth:`discover` looks for partitions added to ``opts.topics``."""
        self.gone: set[TopicPartition] = set()  # of subscribed topics deleted since
        try:
            for t in opts.topics if tps is None else ():
                found = self.queries.partitions_of(t)
                if found is None:
                    raise ConfigError(f"option 'subscribe': topic {t!r} does not exist on "
                                      f"{opts.config.bootstrap_servers}")
                self.tps += found
        except BaseException:
            self.follower.close()
            raise
        self.committed: dict[TopicPartition, int] = {}
        """Each partition's committed end as last found: never moves back."""
        self._plain_end: dict[TopicPartition, int] = {}
        """The furthest end up to which a partition was found PLAIN: nothing below is
        transactional (a partition registered later keeps it)."""
        self._warned: set[TopicPartition] = set()
        self._epoch: dict[TopicPartition, int] = {}
        """The log epoch of each served view as last seen (it grows when the buffer owner
        restarts a partition's state on a new log: a topic deleted and recreated)."""
        self._restart_from: dict[TopicPartition, int] = {}
        """Partitions whose log was replaced under the query (``failOnDataLoss=false``):
        the new log's start, where the next range starts."""
        self.marks: dict[TopicPartition, tuple[int, int]] = {}
        """Each partition's log start and high watermark as the last refresh read them."""
        self._unanswered: set[TopicPartition] = set()
        """Partitions whose watermarks the broker did not give at the last refresh."""

    def close(self) -> None:
        self.follower.close()

    def _topic_ids(self) -> dict[str, str]:
        """The topics' ids now (none where unknown); a view naming another is of a deleted log."""
        from confluent_kafka.admin import AdminClient

        from txnstream.buffer.recreation import TopicIds

        cfg = self.opts.config
        return TopicIds(lambda: AdminClient(cfg.admin()), cfg.admin_timeout_s).get(
            {tp.topic for tp in self.tps})

    def _covered_end(self, tp: TopicPartition) -> int:
        """Up to where the state at hand says what to skip: the plain prefix, or the view."""
        end = self._plain_end.get(tp, 0)
        view = self.follower.views.get(tp)
        if view is not None:
            end = max(end, view.max_read_position + 1)
        return end

    def refresh(self, fresh_s: float = 0.0) -> dict[TopicPartition, int]:
        """Bring the committed ends up to date (``catch_up`` of the served state).

        ``fresh_s > 0``: the ends hold everything committed before this call: wait up to
        that long for each partition's owner to have served it up to the end read now.
        """
        from txnstream.buffer.follower import ServeStatus

        self.discover()
        f = self.follower
        marks = self._watermarks([tp for tp in self.tps if tp not in self.gone])  # first
        live = list(marks)
        self.marks = {**self.marks, **marks}
        # New partitions, and plain ones that grew (a txn may have registered them since
        # their ends were read), are looked up at once: one scan per state partition.
        again = [tp for tp in live if f.status.get(tp) is ServeStatus.PLAIN
                 and marks[tp][1] > self._plain_end.get(tp, 0)]
        for tp in again:
            f.unfollow(tp)
        looked = f.follow_many([tp for tp in live if f.status.get(tp) is None])
        for tp in (tp for tp, st in looked.items() if st is ServeStatus.PLAIN):
            self._plain_end[tp] = max(self._plain_end.get(tp, 0), marks[tp][1])
        txnl = [tp for tp in live if f.status.get(tp) is not ServeStatus.PLAIN]
        if txnl:
            f.catch_up(txnl, timeout_s=CATCH_UP_S)
        ids = self._topic_ids() if fresh_s > 0 and txnl else {}

        def behind() -> list[TopicPartition]:  # short of the end, or of a log gone since
            return [tp for tp in txnl if (v := f.views.get(tp)) is not None and (
                v.position < marks[tp][1] - 1
                or (v.topic_id and ids.get(tp.topic, v.topic_id) != v.topic_id))]

        deadline = time.monotonic() + fresh_s
        while fresh_s > 0 and time.monotonic() < deadline and (
                behind() or any(f.status.get(tp) is ServeStatus.WAITING for tp in txnl)):
            f.poll(0.1)
        if fresh_s > 0 and (late := behind()):
            log.warning("the buffer owners of %s have not served them up to their ends yet "
                        "after %.0f s: the plan ends where they are (records committed just "
                        "before it may be left to a later read)", late, fresh_s)
        for tp in live:
            view = f.views.get(tp)
            if view is not None:
                if view.log_epoch > self._epoch.get(tp, view.log_epoch):
                    # a new log: the old one's ends say nothing of it (see moved_back)
                    log.info("%s: its buffer state restarted on a new log (epoch %d)", tp,
                             view.log_epoch)
                    self.committed.pop(tp, None)
                    self._plain_end.pop(tp, None)
                self._epoch[tp] = view.log_epoch
            low = marks[tp][0]
            if f.status.get(tp) is ServeStatus.WAITING:
                if tp not in self._warned:
                    self._warned.add(tp)
                    log.warning("%s is transactional but no buffer owner serves it (is a "
                                "`txnstream worker` with the buffer role running, and do its "
                                "--buffer-topics include %r?): nothing of it past offset %d "
                                "is read until one does", tp, tp.topic,
                                max(self.committed.get(tp, low), self._covered_end(tp)))
            else:
                self._warned.discard(tp)
            self.committed[tp] = max(self.committed.get(tp, low), self._covered_end(tp))
        return dict(self.committed)

    def _watermarks(self, tps: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        """Each partition's log start and end now; one not answered for is held.

        Held: left out of this round (no new range until a later round). The metadata
        can list a partition whose log the broker no longer or not yet serves (a topic
        being deleted or just created again: ``UNKNOWN_TOPIC_OR_PART``, no leader yet) or
        a leader that is moving. Kafka's source retries such a fetch; here the next
        trigger asks again. An error that is not transient (not authorized, say) fails
        the query, naming it.
        """
        out: dict[TopicPartition, tuple[int, int]] = {}
        for tp, b in self.follower.bounds(tps).items():  # one round for all
            if isinstance(b, KafkaException):
                err = b.args[0] if b.args else None
                if not isinstance(err, KafkaError) or not (
                        err.retriable() or err.code() in _LOG_NOT_SERVED):
                    raise b
                if tp not in self._unanswered:
                    self._unanswered.add(tp)
                    log.warning("%s: its log start and end are not known now (%s); held "
                                "until the broker answers for it", tp, err.str())
                continue
            out[tp] = b
            self._unanswered.discard(tp)
        return out

    def discover(self) -> None:
        """Partitions added to the subscribed topics, and topics deleted, since last time.

        A new partition is planned from its log start (Kafka: "newly discovered
        partitions during a query will start at earliest"). A deleted topic, or partitions
        a topic no longer has (created again with fewer), fail the query under
        ``failOnDataLoss``; else they are left out (a warning says so) until they exist.
        """
        if not self._discovers:
            return
        known = set(self.tps)
        gone: set[TopicPartition] = set()
        fewer: list[TopicPartition] = []  # Kafka never takes a partition away: recreated
        for t in self.opts.topics:
            found = self.queries.partitions_of(t)
            if found is None:
                gone.update(tp for tp in self.tps if tp.topic == t)
                continue
            fewer += [tp for tp in self.tps if tp.topic == t and tp not in found]
            new = [tp for tp in found if tp not in known]
            if new:
                log.info("%s: new partitions %s, read from their start", t, new)
                self.tps += new
        if fewer and self.opts.fail_on_data_loss:
            raise RuntimeError(f"{', '.join(map(str, fewer))}: these partitions no longer "
                               f"exist (the topic deleted and created with fewer?). {LOST_HINT}")
        gone.update(fewer)
        if gone and self.opts.fail_on_data_loss:
            raise RuntimeError(f"{sorted({tp.topic for tp in gone})}: the subscribed topic no "
                               f"longer exists (deleted?). {LOST_HINT}")
        if gone - self.gone:
            log.warning("%s no longer exist (topic deleted?): left out until they do, as "
                        "failOnDataLoss=false asks", sorted(gone - self.gone))
        self.gone = gone

    def moved_back(self, start: Offsets) -> set[TopicPartition]:
        """Partitions whose log now ends below where the query is, as Kafka's source sees them.

        That is a topic deleted and recreated (or records deleted past the query's
        position). Under ``failOnDataLoss`` this fails the query naming the partition and
        both offsets, as Kafka's does. With ``false`` the query goes on over the new log
        from its start (Kafka's: from its end at that moment): once the state served for
        the partition is the new log's (its view ends within the new log), the next
        range starts at the new log's start (see :meth:`partitions`) and a warning names
        what was skipped. Until then the partition is held: the returned ones get no
        new range (the ends given for them stay at ``start``).
        """
        from txnstream.buffer.follower import ServeStatus

        back = {tp: self.marks[tp][1] for tp in self.tps
                if tp in self.marks and str(tp.partition) in start.get(tp.topic, {})
                and self.marks[tp][1] < int(start[tp.topic][str(tp.partition)])}
        held: set[TopicPartition] = set()
        for tp, high in sorted(back.items()):
            at = start[tp.topic][str(tp.partition)]
            if self.opts.fail_on_data_loss:
                raise RuntimeError(f"{tp}'s offset was changed from {at} to {high}: its log "
                                   "now ends below where this query is (the topic was "
                                   f"deleted and recreated?); some data may have been "
                                   f"missed. {LOST_HINT}")
            view = self.follower.views.get(tp)
            if self.follower.status.get(tp) is not ServeStatus.PLAIN and (
                    view is None or view.max_read_position + 1 > high):
                held.add(tp)  # the served state is still the old log's
                continue
            low = self.marks[tp][0]
            if self._restart_from.get(tp) != low:
                log.warning("%s's offset was changed from %s to %d (the topic was deleted "
                            "and recreated?): records of the old log from offset %s on were "
                            "not read; reading the new log from its start, offset %d, as "
                            "failOnDataLoss=false asks", tp, at, high, at, low)
            self._restart_from[tp] = low
            if view is None:  # plain: its committed end is its high watermark
                self._plain_end[tp] = high
            else:
                self._plain_end.pop(tp, None)
            self.committed[tp] = max(low, self._covered_end(tp))
        return held

    def log_epochs(self) -> dict[TopicPartition, int]:
        """Each served partition's log epoch now (:mod:`txnstream_spark.log_epochs`)."""
        return {tp: v.log_epoch for tp in self.tps if (v := self.follower.views.get(tp))}

    def new_logs(self, noted: dict[TopicPartition, int], start: Offsets) -> None:
        """Partitions now on a newer log than ``start`` noted (the topic was recreated).

        The query fails under ``failOnDataLoss``; else their next range starts at the
        new log's start.
        """
        for tp, (was, now) in replaced(noted, self.log_epochs()).items():
            at = start.get(tp.topic, {}).get(str(tp.partition))
            if self.opts.fail_on_data_loss:
                raise RuntimeError(
                    f"{tp} was deleted and created again since offset {at} of this query "
                    f"(log epoch {was}, now {now}): records of the old log after it may not "
                    f"have been read, and the new log's below it would be skipped. "
                    f"{LOST_HINT}")
            low = self.marks.get(tp, (0, 0))[0]
            if self._restart_from.get(tp) != low:
                log.warning("%s was deleted and created again since offset %s (log epoch %d, "
                            "now %d): reading the new log from its start, offset %d, as "
                            "failOnDataLoss=false asks", tp, at, was, now, low)
            self._restart_from[tp], self.committed[tp] = low, max(low, self._covered_end(tp))

    def restarted(self, tp: TopicPartition) -> bool:
        """Whether ``tp``'s next range starts over on a new log (see :meth:`moved_back`)."""
        return tp in self._restart_from

    def range_start(self, tp: TopicPartition, start: int) -> int:
        """Where ``tp``'s next range starts: ``start``, or its new log's start."""
        return self._restart_from.get(tp, start)

    @staticmethod
    def _json(ends: dict[TopicPartition, int]) -> Offsets:
        out: Offsets = {}
        for tp, e in ends.items():
            out.setdefault(tp.topic, {})[str(tp.partition)] = e
        return out

    def ends(self, fresh_s: float = 0.0) -> Offsets:
        """The committed ends now (JSON offsets); see :meth:`refresh`."""
        return self._json(self.refresh(fresh_s))

    def committed_ends(self) -> Offsets:
        """The committed ends as last found (JSON offsets), without asking again."""
        return self._json(self.committed)

    def offsets(self, spec: str | Offsets | Timestamps, name: str) -> dict[TopicPartition, int]:
        """Option ``name``'s offsets per partition (:data:`EARLIEST`, :data:`LATEST` or one).

        Offsets JSON must name every partition of the subscribed topics and no other, as
        Kafka's source requires; the ``ConfigError`` names the option and the partitions.
        Times are looked up now (:meth:`Timestamps.resolve`).
        """
        if isinstance(spec, str):
            return dict.fromkeys(self.tps, LATEST if spec == "latest" else EARLIEST)
        if isinstance(spec, Timestamps):
            return spec.resolve(self.opts.topics, self.tps, self.queries.offsets_for_times)
        return named_offsets(spec, name, self.opts.topics, self.tps)

    def starts(self, spec: str | Offsets | Timestamps) -> Offsets:
        """Where a stream starts (JSON offsets): -2 the log start, -1 the committed end."""
        want = self.offsets(spec, "startingOffsets")
        ends = self.refresh(FRESH_WAIT_S) if LATEST in want.values() else {}
        bounds = self.follower.bounds([tp for tp, o in want.items() if o == EARLIEST])
        out: dict[TopicPartition, int] = {}
        for tp, o in want.items():
            if o == LATEST:
                out[tp] = ends[tp]
            elif o == EARLIEST:
                if isinstance(b := bounds[tp], KafkaException):
                    raise b
                out[tp] = b[0]
            else:
                out[tp] = o
        return self._json(out)

    def plan_batch(self, fresh_s: float = FRESH_WAIT_S) -> list[TxnStreamPartition]:
        """A batch read's input partitions, their ends resolved now.

        Kafka resolves them when the read is planned. A partition whose end is ``latest``
        is planned even if empty, with its high watermark, so that its task can take what
        was committed since (Spark plans a DataFrame's read once and reuses the plan for
        every action on it).
        """
        starting = self.offsets(self.opts.starting, "startingOffsets")
        ending = self.offsets(self.opts.ending, "endingOffsets")
        committed = self.refresh(fresh_s)
        start: dict[TopicPartition, int] = {}
        end: dict[TopicPartition, int] = {}
        by_time = isinstance(self.opts.starting, Timestamps)
        for tp in self.tps:
            s = {EARLIEST: self.marks[tp][0], LATEST: committed[tp]}.get(starting[tp],
                                                                         starting[tp])
            e = committed[tp] if ending[tp] == LATEST else ending[tp]
            if by_time and s > e:
                s = e  # the first record that late is not committed yet: none to read
            if s > e:  # Kafka fails such a batch query too
                why = " (its committed end: endingOffsets latest)" if ending[tp] == LATEST else ""
                raise ConfigError(f"options 'startingOffsets' and 'endingOffsets': {tp} starts "
                                  f"at offset {s}, after its ending offset {e}{why}")
            start[tp], end[tp] = s, e
        latest = {tp: self.marks[tp][1] for tp in self.tps if ending[tp] == LATEST}
        now = int(time.time() * 1000)  # what is not due now is not read (deferred)
        defer = {tp: v.delays_in(start[tp], end[tp], now) for tp in self.tps
                 if (v := self.follower.views.get(tp)) is not None}
        return self.partitions(self._json(start), self._json(end), clamp=True, latest=latest,
                               defer=defer)

    def trim(self, below: Offsets) -> None:
        """Forget served state below ``below`` (JSON offsets): no batch starts there again."""
        for tp in self.tps:
            view = self.follower.views.get(tp)
            at = below.get(tp.topic, {}).get(str(tp.partition))
            # offsets of a log since replaced (moved_back: Spark commits a batch's end
            # when it plans the next one) say nothing of the new log's view
            if view is not None and at is not None and tp not in self._restart_from \
                    and int(at) <= view.max_read_position + 1:
                view.trim(int(at))

    def partitions(self, start: Offsets, end: Offsets, clamp: bool,
                   latest: dict[TopicPartition, int] | None = None,
                   defer: dict[TopicPartition, list[tuple[int, int, int]]] | None = None,
                   released: dict[TopicPartition, list[tuple[int, int]]] | None = None
                   ) -> list[TxnStreamPartition]:
        """The input partitions of ``[start, end)``, each with its skip info.

        ``defer``: runs not delivered (not due: :mod:`txnstream_spark.deferred`);
        ``released``: spans deferred before, read by tasks of their own (not on a
        replaced log). ``latest``: partitions whose end is ``latest`` -> their high
        watermark when planned, each planned even if empty (:meth:`plan_batch`).
        ``clamp``: a range past the committed end is cut there (it would hold records
        of txns not ended); else (a micro-batch) the state is waited for until it
        covers the range (``RuntimeError`` after ``COVER_WAIT_S``). A range of a log
        replaced since it was planned is not read (``gone_since_planned``).
        """
        ranges: dict[TopicPartition, tuple[int, int]] = {}
        (start, began), (end, ends_on) = split(start), split(end)
        for tp in self.tps:
            if tp in self.gone:
                continue
            # a partition the start does not name is new: from its log start
            s = int(start.get(tp.topic, {}).get(str(tp.partition),
                                                self.marks.get(tp, (0, 0))[0]))
            e = int(end.get(tp.topic, {}).get(str(tp.partition), s))
            if tp in began and ends_on.get(tp, -1) > began[tp]:  # a new log (new_logs)
                s = self._restart_from.pop(tp, self.marks.get(tp, (0, 0))[0])
                released = {k: v for k, v in (released or {}).items() if k != tp}
            elif e < s and tp in self._restart_from:  # a new log (moved_back)
                s = self._restart_from[tp]
                released = {k: v for k, v in (released or {}).items() if k != tp}
            elif e >= s:
                self._restart_from.pop(tp, None)
            if why := gone_since_planned(tp, s, e, ends_on.get(tp, began.get(tp)),
                                         self.follower.log_epoch(tp)):
                if self.opts.fail_on_data_loss:
                    raise RuntimeError(f"{why}. {LOST_HINT}")
                log.warning("%s: not read, as failOnDataLoss=false asks", why)
                e = s
            ranges[tp] = s, max(s, e)

        def short() -> list[TopicPartition]:
            return [tp for tp, (s, e) in ranges.items() if e > max(s, self._covered_end(tp))]

        if short():
            self.refresh()
            deadline = time.monotonic() + (0 if clamp else COVER_WAIT_S)
            while short() and time.monotonic() < deadline:
                time.sleep(0.2)
                self.refresh()
        parts: list[TxnStreamPartition] = []
        for tp, (s, e) in ranges.items():
            covered = self._covered_end(tp)
            if e > max(s, covered):  # an empty range needs no state (a view dropped)
                if not clamp:
                    raise RuntimeError(
                        f"{tp}: the served buffer state does not reach offset {e} of this "
                        f"micro-batch (it is at {covered}) after {COVER_WAIT_S:g} s: is a "
                        "`txnstream worker` with the buffer role running? Restarting the "
                        "query replays the batch.")
                e = covered
            high = (latest or {}).get(tp)
            if e > s or high is not None:
                view = self.follower.views.get(tp)
                hidden, aborted = view.skip_in(s, e) if view is not None and e > s \
                    else ([], [])
                skip = [(f, la) for f, la, _ in (defer or {}).get(tp, ()) if la >= s and f < e]
                parts.append(TxnStreamPartition(self.opts.config, tp.topic, tp.partition, s,
                                                max(s, e), hidden, aborted,
                                                self.opts.value_schema, plain=view is None,
                                                latest_high=high,
                                                fail_on_data_loss=self.opts.fail_on_data_loss,
                                                exclude=skip))
        return parts + released_partitions(self.opts, self.follower.views, released or {})


