"""A transactional topic deleted and recreated with the same name while the buffer role
serves it: readers see exactly the new log's committed records.

Old code (before the owner restarted a recreated partition): the owner kept the old
log's fold state (its data consumer went back to offset 0 and skipped every record as
already folded), so readers kept the old ``max_read_position`` and the old hidden
offsets and applied them to the new log: aborted and still-open records of the new log
showed as committed, and committed ones hid behind old markers' offsets.
"""

from __future__ import annotations

import logging
import time

import pytest

from tests.integration.buffer.conftest import make_topic, read_all, wait_until
from tests.integration.coordinator.conftest import create_topic_again as create
from tests.integration.coordinator.conftest import delete_topic as delete
from txnstream import Client, TopicPartition
from txnstream.buffer.follower import BufferStateFollower
from txnstream.buffer.recreation import TopicIds
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.buffer.worker import BufferWorker
from txnstream.delivery import Verdict, verdict
from txnstream.markers import split_headers

pytestmark = pytest.mark.integration


def committed(config, follower: BufferStateFollower, tp: TopicPartition) -> list[bytes] | None:
    """What a committed-only reader of ``tp`` following ``follower`` delivers now, from
    the log start (the consumer's and the Spark source's filter: ``delivery.verdict``)."""
    follower.poll(0.05)
    view = follower.views.get(tp)
    if view is None:
        return None
    out = []
    for m in read_all(config, tp.topic):
        if m.partition() != tp.partition:
            continue
        txn_raw, marker, _, _ = split_headers(m.headers())
        if verdict(view, m.offset(), txn_raw, marker) is Verdict.DELIVER:
            out.append(m.value())
    return out


def wait_reads(config, follower, tp, want: list[bytes], what: str, timeout_s: float = 45):
    seen: list = []

    def ok() -> bool:
        seen[:] = [committed(config, follower, tp)]
        return seen[0] == want

    try:
        wait_until(ok, timeout_s, what, every=0.3)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: a reader sees {seen[0]}, expected {want}") from None


def write(client: Client, topic: str, txns: list[tuple[str, list[bytes]]]) -> None:
    """Txns in order to partition 0: ("commit"|"abort", values)."""
    producer = client.create_producer(topic)
    for fate, values in txns:
        txn = client.new_transaction(timeout_s=60)
        for v in values:
            producer.send(v, txn=txn, partition=0)
        txn.commit() if fate == "commit" else txn.abort()
    producer.close()


@pytest.mark.parametrize("found_by", ["topic id", "offsets"])
def test_a_recreated_topic_is_served_from_its_new_log(config, worker, client, caplog,
                                                      monkeypatch, found_by):
    """``offsets``: no topic ids (an admin client refused): the new log ending below
    the fold position finds it."""
    caplog.set_level(logging.WARNING, logger="txnstream.buffer")
    if found_by == "offsets":
        monkeypatch.setattr(TopicIds, "get", lambda self, topics: {})
    topic = make_topic(config, 1, "recreated")
    other = make_topic(config, 1, "other")
    tp, otp = TopicPartition(topic, 0), TopicPartition(other, 0)
    old_c = [[f"old-c{t}-{i}".encode() for i in range(8)] for t in range(3)]
    old_a = [[f"old-a{t}-{i}".encode() for i in range(8)] for t in range(2)]
    # the old log: 40 txn records and 5 markers
    write(client, topic, [("commit", old_c[0]), ("abort", old_a[0]), ("commit", old_c[1]),
                          ("abort", old_a[1]), ("commit", old_c[2])])
    write(client, other, [("commit", [b"o1"])])
    before = BufferStateFollower(config, "before")
    try:
        before.catch_up([tp, otp])
        wait_reads(config, before, tp, old_c[0] + old_c[1] + old_c[2], "the old log read")
        old_view = before.views[tp]
        assert old_view.log_epoch == 0 and old_view.restarts == 0

        delete(config, topic)
        # meanwhile the owner goes on serving its other topic
        write(client, other, [("commit", [b"o2"]), ("abort", [b"o-aborted"])])
        wait_reads(config, before, otp, [b"o1", b"o2"], "the other topic while deleted")
        create(config, topic)
        # the new log: shorter than the old one, so every offset of it is one the old
        # state had an opinion about
        new_c0, new_a0, new_c1 = [b"new-c0-0", b"new-c0-1"], [b"new-a0-0", b"new-a0-1",
                                                             b"new-a0-2"], [b"new-c1-0"]
        write(client, topic, [("commit", new_c0), ("abort", new_a0), ("commit", new_c1)])
        # a txn left open on the new log holds back what follows it
        with Client(config=config) as writer:
            producer = writer.create_producer(topic)
            open_txn = writer.new_transaction(timeout_s=60)
            producer.send(b"new-open-0", txn=open_txn, partition=0)
            producer.send(b"new-plain-after-open", partition=0)
            producer.flush()
            want = new_c0 + new_c1
            wait_reads(config, before, tp, want, "the new log read by a reader kept running")
            after = BufferStateFollower(config, "after")
            try:
                after.catch_up([tp])
                wait_reads(config, after, tp, want, "the new log read by a reader started after")
                for f in (before, after):
                    view = f.views[tp]
                    assert view.log_epoch == 1, view
                    assert view.max_read_position < 10, view  # the old log's was 44
                assert before.views[tp].restarts == 1  # it saw the position move back
                assert after.views[tp].restarts == 0  # it started on the new log
                open_txn.commit()
                want = new_c0 + new_c1 + [b"new-open-0", b"new-plain-after-open"]
                wait_reads(config, before, tp, want, "the new open txn committed (kept)")
                wait_reads(config, after, tp, want, "the new open txn committed (after)")
            finally:
                after.close()
            producer.close()
        write(client, other, [("commit", [b"o3"])])
        wait_reads(config, before, otp, [b"o1", b"o2", b"o3"], "the other topic after")
    finally:
        before.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and r.name == "txnstream.buffer.recreation" and f"{tp}" in r.getMessage()
              and "recreated" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "folded to offset 44" in warned[0], warned  # names the old fold position
    assert ("topic id changed" in warned[0]) == (found_by == "topic id"), warned
    assert worker.buffers is not None
    assert worker.buffers.consumers_renewed == 0
    assert len(worker.buffers.owned_slots()) == config.num_buffer_slots


def test_a_topic_recreated_with_fewer_partitions_is_served_from_its_new_log(config, worker,
                                                                           client, caplog):
    """Kafka never takes a partition away, but a topic deleted and created again may have
    fewer. Old code: the owner's recreation check asked the cached log end of a
    partition the topic no longer has, which raised, so the whole check failed every
    turn (an ERROR each 10 s): no partition on that owner was ever restarted on its new
    log, and readers of them went on with the old log's state (Spark: an AvailableNow
    query over such a topic ran on)."""
    caplog.set_level(logging.WARNING, logger="txnstream.buffer")
    topic = make_topic(config, 3, "fewer")
    tp = TopicPartition(topic, 0)
    producer = client.create_producer(topic)
    for p in range(3):
        with client.transaction() as t:
            producer.send(f"old-{p}".encode(), txn=t, partition=p)
    producer.close()
    follower = BufferStateFollower(config, "fewer")
    try:
        follower.catch_up([tp])
        wait_reads(config, follower, tp, [b"old-0"], "the old log read")
        delete(config, topic)
        create(config, topic, partitions=1)
        # the owner restarts partition 0 on its new log (the old state would also read
        # these values at these offsets: wait for the epoch, not for the reads alone)
        wait_until(lambda: (s := worker.buffers.served.get(tp)) is not None
                   and s.buf.log_epoch == 1, 45, "the owner serving the new log")
        write(client, topic, [("commit", [b"new-0"]), ("abort", [b"new-aborted"]),
                              ("commit", [b"new-1"])])
        wait_reads(config, follower, tp, [b"new-0", b"new-1"], "the new log read")
        assert follower.views[tp].log_epoch == 1
    finally:
        follower.close()
    failed = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
              and r.name.startswith("txnstream.buffer")]
    assert not failed, failed[:2]


def test_a_deleted_topic_that_stays_deleted_leaves_the_others_served(config, worker, client,
                                                                        caplog):
    caplog.set_level(logging.WARNING, logger="txnstream.buffer")
    gone = make_topic(config, 1, "gone")
    kept = make_topic(config, 1, "kept")
    write(client, gone, [("commit", [b"g1"])])
    write(client, kept, [("commit", [b"k1"])])
    follower = BufferStateFollower(config, "kept")
    try:
        follower.catch_up([TopicPartition(kept, 0)])
        wait_reads(config, follower, TopicPartition(kept, 0), [b"k1"], "kept read")
        delete(config, gone)
        time.sleep(3)  # the owner meets the missing topic for some turns
        write(client, kept, [("abort", [b"k-aborted"]), ("commit", [b"k2"])])
        wait_reads(config, follower, TopicPartition(kept, 0), [b"k1", b"k2"],
                   "kept read after the other topic was deleted")
    finally:
        follower.close()
    # (the session's state topics are shared: an earlier test's recreated topic may be
    # restored and restarted by this worker; only these two topics are this test's)
    assert not [m for r in caplog.records if "recreated" in (m := r.getMessage())
                and (gone in m or kept in m)]
    assert worker.buffers is not None
    assert TopicPartition(gone, 0) in worker.buffers.served  # still served: it may return
    assert worker.buffers.served[TopicPartition(gone, 0)].buf.log_epoch == 0


def test_a_topic_recreated_while_no_owner_ran_is_served_from_its_new_log(config, tc_worker,
                                                                         client, caplog):
    """The owner that claims the partition next finds its snapshot of another topic id."""
    caplog.set_level(logging.WARNING, logger="txnstream.buffer")
    topic = make_topic(config, 1, "down")
    tp = TopicPartition(topic, 0)
    old_c, old_a = [f"old-c{i}".encode() for i in range(8)], [b"old-a0", b"old-a1"]
    before = BufferStateFollower(config, "before")
    try:
        first = BufferWorker(config, [topic], snapshot_interval_s=1).start()
        try:
            write(client, topic, [("commit", old_c), ("abort", old_a), ("commit", [b"old"])])
            before.catch_up([tp])
            wait_reads(config, before, tp, old_c + [b"old"], "the old log read")
            store = TransactionBufferSnapshotStore(config)
            wait_until(lambda: (s := store.latest(tp)) is not None and s.position == 13
                       and s.topic_id != "", 30, "a snapshot of the whole old log")
        finally:
            first.stop()
        delete(config, topic)
        create(config, topic)
        new_c0, new_a0, new_c1 = [b"new-c0"], [b"new-a0-0", b"new-a0-1"], [b"new-c1"]
        write(client, topic, [("commit", new_c0), ("abort", new_a0), ("commit", new_c1)])
        second = BufferWorker(config, [topic], snapshot_interval_s=1).start()
        try:
            want = new_c0 + new_c1  # new_a0 aborted
            wait_reads(config, before, tp, want, "the new log read by a reader kept running")
            after = BufferStateFollower(config, "after")
            try:
                after.catch_up([tp])
                wait_reads(config, after, tp, want, "the new log read by a reader started after")
                assert (after.views[tp].log_epoch, after.views[tp].restarts) == (1, 0)
            finally:
                after.close()
            assert (before.views[tp].log_epoch, before.views[tp].restarts) == (1, 1)
        finally:
            second.stop()
    finally:
        before.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and r.name == "txnstream.buffer.recreation" and str(tp) in r.getMessage()]
    assert len(warned) == 1 and "topic id changed" in warned[0], warned
    assert "folded to offset 13" in warned[0], warned


def test_a_follower_that_saw_a_newer_log_never_follows_an_older_snapshot_again(
        config, worker, client):
    """A DELTA of a newer log epoch drops the view until that epoch's snapshot is read
    (the follower's rule: never a view of an older log again). Old code: a ``catch_up``
    meanwhile (a Spark planner's refresh does one) followed the partition again from the
    newest snapshot it found, the deleted log's, and its ranges were planned with that
    log's skip info over the new log's offsets."""
    from txnstream.buffer.follower import ServeStatus
    from txnstream.buffer.served import BufferStateKind, BufferStateRecord

    topic = make_topic(config, 1, "epochs")
    tp = TopicPartition(topic, 0)
    write(client, topic, [("commit", [b"a", b"b"])])
    f = BufferStateFollower(config, "epochs")
    try:
        f.catch_up([tp])
        wait_reads(config, f, tp, [b"a", b"b"], "the first log read")
        view = f.views[tp]
        assert view.log_epoch == 0
        f._restart(tp, view, BufferStateRecord(  # noqa: SLF001 - as its owner's DELTA does
            BufferStateKind.DELTA, "owner", view.generation, topic, 0, log_epoch=1))
        for again in (lambda: f.catch_up([tp]), lambda: f.follow_many([tp]),
                      lambda: f.follow(tp), lambda: f.poll(0.3)):
            again()
            assert tp not in f.views, f"a view of log epoch {f.views[tp].log_epoch} again"
            assert f.status[tp] is ServeStatus.WAITING and f.log_epoch(tp) == 1
    finally:
        f.close()
