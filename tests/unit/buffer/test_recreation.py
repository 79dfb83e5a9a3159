"""A recreated topic without a broker: when an owner restarts a partition's state
(:class:`LogIdentity`), and how log epochs order snapshots and views."""

from __future__ import annotations

import json
from types import SimpleNamespace

from confluent_kafka import KafkaError, KafkaException

from tests.unit.buffer.test_snapshot_store import seg_records
from txnstream.buffer import TransactionBuffer, recreation, take_snapshot
from txnstream.buffer.recreation import LogIdentity, Restart, TopicIds
from txnstream.buffer.served import BufferStateKind, BufferStateRecord, BufferView
from txnstream.buffer.snapshot import TransactionBufferSnapshot, restore
from txnstream.buffer.snapshot_store import LatestSnapshotFinder
from txnstream.codec import SCHEMA_DIR, AvroCodec
from txnstream.markers import TXN_ID_HEADER, MarkerKind, TxnMarker
from txnstream.types import TopicPartition, TxnID

TP = TopicPartition("t", 0)
OTHER = TopicPartition("t", 1)


# ------------------------------------------------------------------ LogIdentity


def test_a_changed_topic_id_restarts_at_once_whatever_the_offsets():
    ident = LogIdentity()
    # the new log already longer than the old fold: its offsets alone say nothing
    r = ident.check(TP, next_offset=45, high=900, folded_id="old", current_id="new")
    assert r == Restart("its topic id changed (old -> new)", 900)
    assert ident.check(TP, 45, -1, "old", "new") is not None  # no offsets needed


def test_a_log_ending_below_the_fold_restarts_at_the_second_check_in_a_row():
    ident = LogIdentity()
    assert ident.check(TP, 45, 11, "", "") is None  # once: maybe a stale answer
    assert ident.check(OTHER, 45, 11, "", "") is None  # counted per partition
    assert ident.check(TP, 45, 11, "", "") == Restart(
        "its log ends at 11, below the fold position 45", 11)
    # counted afresh after a restart
    assert ident.check(TP, 45, 11, "", "") is None


def test_a_healthy_answer_between_two_low_ones_resets_the_count():
    ident = LogIdentity()
    assert ident.check(TP, 45, 11, "id", "id") is None
    assert ident.check(TP, 45, 45, "id", "id") is None  # at its end: healthy
    assert ident.check(TP, 45, 11, "id", "id") is None
    assert ident.check(TP, 45, 12, "id", "id") is not None  # truncated: same id


def test_no_answer_decides_nothing_and_keeps_the_count():
    ident = LogIdentity()
    for _ in range(5):  # deleted, not back: no high watermark, no topic id
        assert ident.check(TP, 45, -1, "id", "") is None
        assert ident.check(TP, 45, -1001, "", "") is None
    assert ident.check(TP, 45, 3, "id", "") is None
    assert ident.check(TP, 45, -1, "id", "") is None  # a metadata error in between
    assert ident.check(TP, 45, 3, "id", "") is not None


def test_a_normal_partition_never_restarts():
    ident = LogIdentity()
    for next_offset, high in [(0, 0), (1, 1), (45, 45), (45, 60), (0, 7)]:
        for _ in range(3):
            assert ident.check(TP, next_offset, high, "id", "id") is None
            assert ident.check(TP, next_offset, high, "", "id") is None  # id first known
            assert ident.check(TP, next_offset, high, "id", "") is None  # id not answered


def test_forget_starts_the_count_over():
    ident = LogIdentity()
    assert ident.check(TP, 45, 3, "", "") is None
    ident.forget(TP)
    assert ident.check(TP, 45, 3, "", "") is None
    assert ident.check(TP, 45, 3, "", "") is not None


# ---------------------------------------------------------- epochs in snapshots


def _folded(epoch: int, n: int, topic_id: str = "") -> TransactionBuffer:
    buf = TransactionBuffer(TP, log_epoch=epoch, topic_id=topic_id)
    for o in range(n):
        buf.fold(o, None)
    return buf


def test_a_snapshot_carries_its_log_epoch_and_topic_id():
    snap = take_snapshot(_folded(2, 5, "abc"), generation=7, state_offset=9)
    back = TransactionBufferSnapshot.decode(snap.encode())
    assert back == snap and (back.log_epoch, back.topic_id) == (2, "abc")
    buf = restore(back)
    assert (buf.log_epoch, buf.topic_id, buf.last_offset) == (2, "abc", 4)


def test_a_version_2_snapshot_reads_as_epoch_0_topic_unknown():
    v2 = AvroCodec("txn_buffer_snapshot",
                   json.loads((SCHEMA_DIR / "txn_buffer_snapshot.v2.avsc").read_text()))
    assert v2.version == 1  # standalone; the real codec knows it as version 2
    rec = take_snapshot(_folded(0, 3), generation=1).to_avro()
    del rec["log_epoch"], rec["topic_id"]
    data = bytes([2]) + v2.encode(rec)[1:]
    snap = TransactionBufferSnapshot.decode(data)
    assert (snap.log_epoch, snap.topic_id, snap.position) == (0, "", 2)


def test_of_one_owner_a_newer_log_epochs_snapshot_wins_over_a_further_older_one():
    old = take_snapshot(_folded(0, 45), generation=5)
    new = take_snapshot(_folded(1, 3), generation=5)
    recs_old_first = seg_records(old, "a", 0) + seg_records(new, "b", 1)
    recs_new_first = seg_records(new, "b", 1) + seg_records(old, "a", 0)
    for recs in (recs_old_first, recs_new_first):
        finder = LatestSnapshotFinder(TP)
        for i, (k, v) in enumerate(recs):
            finder.add(k, v, f"@{i}")
        assert finder.best == new


def test_a_newer_owners_snapshot_still_wins_over_a_zombies_newer_epoch():
    zombie = take_snapshot(_folded(1, 3), generation=5)
    owner = take_snapshot(_folded(0, 45), generation=8)  # it restarts the epoch itself
    finder = LatestSnapshotFinder(TP)
    for i, (k, v) in enumerate(seg_records(owner, "a", 0) + seg_records(zombie, "b", 1)):
        finder.add(k, v, f"@{i}")
    assert finder.best == owner


# ------------------------------------------------------------- epochs in views


def _delta(epoch: int, frm: int, pos: int, mrp: int, gen: int = 5, hidden=(),
           aborted=()) -> BufferStateRecord:
    return BufferStateRecord(BufferStateKind.DELTA, "m", gen, TP.topic, TP.partition, frm,
                             pos, mrp, tuple(hidden), tuple(aborted), log_epoch=epoch)


def test_a_view_never_applies_another_log_epochs_delta():
    old_log = _folded(0, 45)
    view = BufferView.from_snapshot(take_snapshot(old_log, generation=5))
    assert (view.log_epoch, view.max_read_position, view.restarts) == (0, 44, 0)
    # the new log's first delta: contiguous by offsets, but of another log
    assert not view.apply(_delta(1, 0, 2, 2, hidden=[1]))
    assert view.max_read_position == 44 and 1 not in view.hidden
    # a view of the new log ignores the old log's deltas (read again after a reload)
    new = BufferView.from_snapshot(take_snapshot(_folded(1, 3), generation=5))
    t = TxnID(0, 9)
    assert new.apply(_delta(0, 45, 50, 50, hidden=[2], aborted=[(t, 0, 2)]))
    assert (new.max_read_position, new.position, new.hidden, new.aborted) == (2, 2, set(), {})
    assert new.apply(_delta(1, 3, 4, 4, hidden=[3]))
    assert (new.max_read_position, new.hidden) == (4, {3})
    assert new.visible(2, None) and not new.visible(3, None) and not new.visible(5, None)


def test_an_older_owners_delta_is_fenced_whatever_its_epoch():
    view = BufferView.from_snapshot(take_snapshot(_folded(0, 10), generation=8))
    assert not view.apply(_delta(1, 0, 2, 2, gen=5))
    assert view.fenced == 1 and view.log_epoch == 0


def test_a_new_log_folds_as_any_log_after_a_restart():
    """The fresh state a restart starts from folds the new log's txns as usual."""
    buf = TransactionBuffer(TP, log_epoch=1, topic_id="new")
    c, a = TxnID(0, 100), TxnID(0, 101)
    buf.fold(0, [(TXN_ID_HEADER, c.to_bytes())])
    buf.fold(1, [(TXN_ID_HEADER, a.to_bytes())])
    buf.fold(2, TxnMarker(c, MarkerKind.COMMIT, 0).headers(),
             TxnMarker(c, MarkerKind.COMMIT, 0).encode())
    buf.fold(3, TxnMarker(a, MarkerKind.ABORT, 0).headers(),
             TxnMarker(a, MarkerKind.ABORT, 0).encode())
    view = BufferView.from_snapshot(take_snapshot(buf, generation=5))
    assert view.log_epoch == 1
    assert view.max_read_position == 3 and view.hidden == {2, 3}
    assert view.visible(0, c.to_bytes()) and not view.visible(1, a.to_bytes())
    assert not view.visible(4, None)  # not folded yet


# ------------------------------------------------------------ a follower's view


class _Msg:
    def __init__(self, rec: BufferStateRecord, offset: int) -> None:
        self._value, self._offset = rec.encode(), offset

    def error(self):
        return None

    def topic(self):
        return "__unit_buffer_state"

    def partition(self):
        return 0

    def offset(self):
        return self._offset

    def value(self):
        return self._value


class _Store:
    """The snapshot topic as a list: the newest one a scan would find."""

    def __init__(self, *snaps) -> None:
        self.snaps = list(snaps)

    def partition_of(self, tp):
        return 0

    def find(self, tp, at_or_before=None):
        finder = LatestSnapshotFinder(tp)
        for i, s in enumerate(self.snaps):
            for k, v in seg_records(s, f"s{i}", i % 2):
                finder.add(k, v, f"@{i}")
        return finder

    def find_many(self, tps):  # the follower scans many at once
        return {tp: self.find(tp) for tp in tps}


def test_a_follower_restarts_a_view_on_a_newer_log_epoch_and_never_goes_back(caplog):
    from txnstream.buffer.follower import BufferStateFollower, ServeStatus
    from txnstream.config import Config, TopicNames

    config = Config(bootstrap_servers="127.0.0.1:1", topics=TopicNames("__unit"),
                    kafka={"log_level": 0})
    f = BufferStateFollower(config, "kept")
    try:
        old = take_snapshot(_folded(0, 45), generation=5, state_offset=10)
        f._store = _Store(old)
        assert f.follow(TP) is ServeStatus.SERVED
        assert (f.views[TP].log_epoch, f.views[TP].max_read_position) == (0, 44)
        # the owner restarted TP: its first delta of epoch 1 comes before the snapshot
        f._apply(_Msg(_delta(1, 0, -1, -1), 11))
        assert f.status[TP] is ServeStatus.WAITING and TP not in f.views  # judges nothing
        assert "log epoch 0 -> 1" in caplog.text
        f._next_rescan = 0
        f.poll(0)  # only the old log's snapshot so far: never taken again
        assert TP not in f.views
        new = take_snapshot(_folded(1, 3), generation=5, state_offset=12)
        f._store = _Store(old, new)
        f._next_rescan = 0
        assert TP in f.poll(0)  # moved (back)
        view = f.views[TP]
        assert (view.log_epoch, view.restarts, view.max_read_position) == (1, 1, 2)
        assert f.restarts == 1
        # an old-epoch delta read again after the reload changes nothing
        f._apply(_Msg(_delta(0, 45, 50, 50, hidden=[1]), 9))
        assert (view.max_read_position, view.hidden, f.views[TP] is view) == (2, set(), True)
        # and the new epoch goes on as usual
        f._apply(_Msg(_delta(1, 3, 4, 4, hidden=[3]), 13))
        assert (view.max_read_position, view.hidden, view.restarts) == (4, {3}, 1)
        # a follower that starts now starts on the new log: nothing moved back for it
        g = BufferStateFollower(config, "after")
        try:
            g._store = _Store(old, new)
            g.follow(TP)
            assert (g.views[TP].log_epoch, g.views[TP].restarts) == (1, 0)
        finally:
            g.close()
    finally:
        f.close()


# ------------------------------------------------------------------ TopicIds, unanswered


class _Future:
    def __init__(self, outcome: object) -> None:
        self._outcome = outcome

    def result(self, _timeout: float) -> object:
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome


class _Admin:
    """An admin client whose DescribeTopics times out while ``down``."""

    def __init__(self) -> None:
        self.down = True
        self.asked: list[str] = []
        self.timeouts: list[float] = []

    def describe_topics(self, topics: object, request_timeout: float) -> dict[str, _Future]:
        self.asked.append("describe")
        self.timeouts.append(request_timeout)
        if self.down:
            err = KafkaException(KafkaError(KafkaError._TIMED_OUT))
            return {"t": _Future(err)}
        return {"t": _Future(SimpleNamespace(topic_id="id-t"))}

    def list_topics(self, topic: str, timeout: float) -> object:
        self.asked.append(f"metadata {topic}")
        return SimpleNamespace(controller_id=1)


def test_topic_ids_unanswered_are_not_asked_again_until_a_pause_then_after_new_metadata(
        monkeypatch):
    """librdkafka retries a down controller in a loop for as long as a DescribeTopics
    waits (``tests/fault/test_topic_ids_spin.py``): each waits at most 1 s, and one with
    no answer is followed by a pause doubling from 3 s, then by a metadata request."""
    now = [100.0]
    monkeypatch.setattr(recreation.time, "monotonic", lambda: now[0])
    admin = _Admin()
    ids = TopicIds(lambda: admin, timeout_s=15.0)
    assert ids.get(["t"]) == {} and admin.asked == ["describe"]
    assert admin.timeouts == [recreation.IDS_TIMEOUT_S]
    for dt in (1.0, 2.9):  # within the first pause: nothing asked
        now[0] = 100.0 + dt
        assert ids.get(["t"]) == {}
    assert admin.asked == ["describe"]
    now[0] = 103.0  # the pause is over: metadata first, then the ids (still no answer)
    assert ids.get(["t"]) == {}
    assert admin.asked == ["describe", "metadata t", "describe"]
    now[0] = 108.9  # the second pause is 6 s
    assert ids.get(["t"]) == {} and len(admin.asked) == 3
    admin.down = False
    now[0] = 109.0
    assert ids.get(["t"]) == {"t": "id-t"}
    assert admin.asked[3:] == ["metadata t", "describe"]
    now[0] = 109.1  # answered: asked at once again, with no metadata first
    assert ids.get(["t"]) == {"t": "id-t"} and admin.asked[5:] == ["describe"]


def test_a_topic_kafka_answered_unknown_is_an_answer_not_a_pause(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(recreation.time, "monotonic", lambda: now[0])
    admin = _Admin()
    admin.down = False
    admin.describe_topics = lambda topics, request_timeout: {  # type: ignore[method-assign]
        "t": _Future(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))}
    ids = TopicIds(lambda: admin, timeout_s=15.0)
    assert ids.get(["t"]) == {}
    admin.describe_topics = lambda topics, request_timeout: {  # type: ignore[method-assign]
        "t": _Future(SimpleNamespace(topic_id="id-t"))}
    assert ids.get(["t"]) == {"t": "id-t"}, "no pause after an answer"
