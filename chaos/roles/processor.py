"""The processor role: consume-transform-produce exactly once, with its own loop.

Per checkpoint, one txn (as ``ExactlyOnceProcessor`` commits: its interval by default,
``checkpoint_s``, or when the input pauses): for each batch in it, one output per input
(value names the input's id), written with the txn, and the inputs acked with the same
txn (``acknowledge`` each, or ``acknowledge_cumulative`` on the last of each partition,
by ``ack_mode``); then ``flush`` and ``commit``. An individually-acking processor commits
in the background while its next checkpoint fills, that one committing only once the
first did (aborted if it did not), as ``ExactlyOnceProcessor.run`` does. The ``open``
record lists the first batch's inputs. A batch that fails is aborted (its acked inputs come back
through the abort); with individual acks its inputs not yet acked are negatively
acknowledged, with cumulative acks the processor rewinds (leaves the group and joins
again, so delivery restarts at the committed cursor). Every input is processed again:
exactly once is the consumer's and coordinator's job; past its redelivery count an input
goes to the dead-letter topic with its ack instead (the consumer's dead-letter policy).
An individually-acking processor retries a share of its inputs later instead
(``reconsume_later`` in the checkpoint's txn: a retry letter with a delay, and the ack);
the letter comes back through the retry topic and is processed (or retried again, or
dead-lettered past the count) as its input.
A message delivered twice within one batch is processed once (and noted); one the
checkpoint took in an earlier batch comes again only after its txn's acks were undone,
and is processed again (:meth:`ProcessorRole._collect`).

A ``KafkaException`` out of ``receive()`` is not caught: the process exits and the
harness reports it (a member paused past its session timeout must carry on, item 3).
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections import defaultdict
from typing import Any

from tenacity import Retrying, retry_if_exception, wait_fixed

from chaos.roles.common import RoleArgs, commit_outcome, run_role
from chaos.truth import TruthLog, decode_value, encode_value
from txnstream import Client, DeadLetterPolicy
from txnstream.consumer import Consumer
from txnstream.errors import KafkaClientError, KafkaErrorKind, TxnStreamError
from txnstream.message import Message
from txnstream.processor import DEFAULT_COMMIT_INTERVAL_S

log = logging.getLogger("chaos.processor")


class ProcessorRole:
    """Reads ``input`` as ``subscription``, writes one output per input to ``output``."""

    def __init__(self, args: RoleArgs, client: Client, stop: threading.Event) -> None:
        sp = args.spec
        self.args = args
        self.client = client
        self.stop = stop
        self.mode: str = sp["ack_mode"]
        self.batch_max: int = sp.get("batch_max", 20)
        self.batch_interval_s: float = sp.get("batch_interval_s", 0.3)
        self.checkpoint_s: float = sp.get("checkpoint_s", DEFAULT_COMMIT_INTERVAL_S)
        """A txn takes batches until this long after it opened, or the input pauses (the
        exactly-once processor's checkpoints); 0: one batch per txn, as before."""
        self.txn_timeout_s: float = sp["txn_timeout_s"]
        self.output: str = sp["output"]
        self.consumer = self._subscribe()
        self.producer = client.create_producer(self.output)
        self.out_partitions = self.producer.num_partitions
        self.truth = TruthLog(args.truth)
        self.writer = args.writer
        self.seq: defaultdict[int, int] = defaultdict(int)
        self.ids = itertools.count()
        self.last_offset: dict[tuple[str, int], int] = {}
        lo, hi = sp.get("process_s", (0.0, 0.0))
        self.process_s = (float(lo), float(hi))
        self.retry_ratio: float = sp.get("retry_ratio", 0.0) if self.mode == "individual" \
            and sp.get("retry_topic") else 0.0
        lo, hi = sp.get("retry_delay_s", (0.2, 3.0))
        self.retry_delay_s = (float(lo), float(hi))
        self.rng = random.Random(f"{args.seed}/{args.writer}")
        self.pipelined: bool = sp.get("pipelined", self.mode == "individual")
        """Checkpoints committed in the background while the next one fills, the next
        committing only once it did (``ExactlyOnceProcessor.run``'s default). Individual
        acks only: an explicit cumulative ack above another txn's pending one conflicts,
        as Pulsar's does, so a cumulative-acking processor commits each before the next."""
        self._committing: tuple[Any, str, list[Message], set[int], Any] | None = None

    def _subscribe(self) -> Consumer:
        sp = self.args.spec
        policy = {"dead_letter_policy": DeadLetterPolicy(
            sp["max_redeliver_count"], sp["dead_letter_topic"],
            retry_letter_topic=sp.get("retry_topic") if sp["ack_mode"] == "individual" else None)
        } if sp.get("dead_letter_topic") else {}
        return self.client.subscribe(sp["input"], subscription=sp["subscription"], **{
            "session.timeout.ms": sp["session_timeout_ms"], "heartbeat.interval.ms": 1000},
            **policy)

    def _rewind(self) -> None:
        """Leave the group and join again: delivery restarts at the committed cursor.

        What a cumulative-acking processor must do after a failed batch (Kafka Streams
        does the same: abort, then rewind to the committed position). Negatively acking
        the batch instead would be wrong: the next batch's cumulative ack covers every
        earlier delivered message, the nacked ones too, and they would never be
        processed.
        """
        try:
            self.consumer.close()
        except Exception as exc:  # noqa: BLE001 - the new member starts from the cursor anyway
            log.warning("closing the consumer to rewind: %s", exc)
        self.last_offset.clear()
        # A rewind often follows a fault (a broker down, a cluster slow to answer): a
        # subscribe the cluster did not answer is retriable, so it is tried again, as an
        # application would, until it is answered or the role stops (seed 66).
        for attempt in Retrying(retry=retry_if_exception(_unanswered), wait=wait_fixed(1.0),
                                stop=lambda _s: self.stop.is_set(), reraise=True):
            with attempt:
                self.consumer = self._subscribe()

    def loop(self) -> None:
        """Batch after batch until stopped."""
        try:
            while not self.stop.is_set():
                batch = self._collect()
                if batch:
                    self._process(batch)
        finally:
            self._settle()

    def _collect(self, until: float | None = None) -> list[Message]:
        """The next batch.

        Inside an open checkpoint (``until``: when it is due): what comes before it is
        due or the input pauses. An input the checkpoint took before may come again: its
        txn's acks were undone (aborted from outside; the marks gave the inputs back).
        It is processed again like any other: dropped, it would stay delivered and
        unacked for good (the consumer gives it back no more), its ack in the txn
        fails or the commit does, and the abort gives everything back once more.
        """
        batch: list[Message] = []
        deadline = time.monotonic() + self.batch_interval_s
        if until is not None:
            deadline = min(deadline, until)
        while len(batch) < self.batch_max and not self.stop.is_set():
            left = deadline - time.monotonic()
            waiting = bool(batch) or until is not None
            if waiting and left <= 0:
                break
            msg = self.consumer.receive(timeout_s=max(left, 0.05) if waiting else 0.5)
            if msg is None:
                if waiting:
                    break
                deadline = time.monotonic() + self.batch_interval_s
                continue
            key = (msg.topic, msg.partition)
            if any(m.offset == msg.offset and m.tp == msg.tp for m in batch):
                # Delivered twice before it was acked: process it once (noted).
                self.truth.write({"e": "dup_in_batch", "at": f"{msg.topic}-{msg.partition}@"
                                  f"{msg.offset}"}, sync=False)
                continue
            prev = self.last_offset.get(key, -1)
            if msg.offset <= prev:  # redelivery (after an abort or a rebalance): noted
                self.truth.write({"e": "regress", "tp": f"{msg.topic}-{msg.partition}",
                                  "offset": msg.offset, "after": prev}, sync=False)
            self.last_offset[key] = msg.offset
            batch.append(msg)
        return batch

    def _process(self, batch: list[Message]) -> None:
        try:
            txn = self.client.new_transaction(timeout_s=self.txn_timeout_s)
        except TxnStreamError as exc:
            log.warning("new_transaction: %s", exc)
            self._failed(batch, set())
            self.stop.wait(0.5)
            return
        tid = str(txn.id)
        self.truth.write({"e": "open", "txn": tid, "by": self.writer, "role": "processor",
                          "timeout": self.txn_timeout_s, "t": time.time(),
                          "inputs": [f"{m.topic}-{m.partition}@{m.offset}" for m in batch]})
        acked: set[int] = set()
        recs: list[list[Any]] = []
        pairs: list[list[str]] = []
        taken: list[Message] = []
        committing = False
        exc: BaseException | None = None
        due = time.monotonic() + self.checkpoint_s
        try:
            while batch:  # one checkpoint: batches until it is due or the input pauses
                taken.extend(batch)
                self._into_txn(batch, txn, tid, acked, recs, pairs)
                self.stop.wait(self.rng.uniform(*self.process_s))  # the work of the batch
                if self.stop.is_set() or time.monotonic() >= due:
                    break
                batch = self._collect(until=due)
            txn.flush()
            self.truth.write({"e": "sent", "txn": tid, "recs": recs, "pairs": pairs})
            if self.pipelined and not self._settle():
                raise TxnStreamError(f"{tid} not committed: the checkpoint before it did not "
                                     "commit (chained, as ExactlyOnceProcessor.run)")
            committing = True
            if self.pipelined:  # committed in the background while the next one fills
                self._committing = (txn, tid, taken, acked, txn.commit_async())
                return
            txn.commit()
        except Exception as e:  # noqa: BLE001 - every failure is an outcome to record
            exc = e
        self._end(txn, tid, committing, exc, taken or batch, acked)

    def _settle(self) -> bool:
        """Wait for the checkpoint committing in the background; whether it committed."""
        pending, self._committing = self._committing, None
        if pending is None:
            return True
        txn, tid, taken, acked, future = pending
        try:
            future.result()
            exc = None
        except Exception as e:  # noqa: BLE001 - every failure is an outcome to record
            exc = e
        return self._end(txn, tid, True, exc, taken, acked) == "committed"

    def _end(self, txn: Any, tid: str, committing: bool, exc: BaseException | None,
             taken: list[Message], acked: set[int]) -> str:
        """Record a checkpoint's outcome; after an abort, its inputs come back."""
        if committing:
            outcome = commit_outcome(txn, exc)
        else:
            try:
                txn.abort()
            except Exception as e:  # noqa: BLE001 - it times out at the coordinator anyway
                log.warning("abort %s: %s", tid, e)
            outcome = "aborted"
        self.truth.write({"e": "end", "txn": tid, "by": self.writer,
                          "want": "commit" if committing else "abort", "outcome": outcome,
                          "status": txn.status.value, "t": time.time(),
                          "error": None if exc is None else f"{type(exc).__name__}: {exc}"})
        if outcome == "aborted":
            self._failed(taken, acked)
        if exc is not None and not isinstance(exc, TxnStreamError):
            raise exc  # a Kafka error out of the client: let the process die, reported
        return outcome

    def _into_txn(self, batch: list[Message], txn: Any, tid: str, acked: set[int],
                  recs: list[list[Any]], pairs: list[list[str]]) -> None:
        """One output per input of ``batch``, written with ``txn``; the inputs acked in it.

        Or, for a share of them, a retry letter in ``txn`` instead (:attr:`retry_ratio`).
        """
        retried: set[int] = set()
        for m in batch:
            if self.retry_ratio and self.rng.random() < (
                    0.5 if dict(m.headers).get("RECONSUMETIMES") else self.retry_ratio):
                self.consumer.reconsume_later(m, self.rng.uniform(*self.retry_delay_s), txn)
                acked.add(id(m))
                retried.add(id(m))
                continue
            v = decode_value(m.value)
            in_id = v["id"] if v else f"{m.topic}-{m.partition}@{m.offset}"
            p = m.partition % self.out_partitions
            s = self.seq[p]
            self.seq[p] += 1
            oid = f"{self.writer}-{next(self.ids)}"
            self.producer.send(encode_value({
                "id": oid, "txn": tid, "w": self.writer, "p": p, "s": s, "in": in_id,
                "in_pos": f"{m.topic}-{m.partition}@{m.offset}"}), txn=txn, partition=p)
            recs.append([oid, self.output, p, self.writer, s])
            pairs.append([oid, in_id])
        if self.mode == "cumulative":
            last: dict[object, Message] = {}
            for m in batch:
                cur = last.get(m.tp)
                if cur is None or m.offset > cur.offset:
                    last[m.tp] = m
            for m in last.values():
                self.consumer.acknowledge_cumulative(m, txn=txn)
                acked.update(id(x) for x in batch if x.tp == m.tp and x.offset <= m.offset)
        else:
            for m in batch:
                if id(m) not in retried:
                    self.consumer.acknowledge(m, txn=txn)
                    acked.add(id(m))

    def _failed(self, batch: list[Message], acked: set[int]) -> None:
        """After an aborted batch: every input of it must come back.

        Those acked in the txn come back through the abort. With individual acks the
        rest are negatively acknowledged; with cumulative acks the processor rewinds.
        """
        if self.mode == "cumulative":
            self._rewind()
            return
        for m in batch:
            if id(m) in acked:
                continue
            try:
                self.consumer.negative_acknowledge(m)
            except TxnStreamError:
                pass  # the partition moved: its new owner delivers it

    def close(self) -> None:
        """Leave the group, flush, close the truth file."""
        self.consumer.close()
        self.producer.flush()
        self.truth.close()


def run(args: RoleArgs) -> int:
    """Process batches until SIGTERM."""
    return run_role(ProcessorRole, args)


def _unanswered(exc: BaseException) -> bool:
    """A call the cluster did not answer (retriable): worth trying again."""
    if isinstance(exc, KafkaClientError) and exc.kind is KafkaErrorKind.RETRIABLE:
        log.warning("the cluster did not answer (%s): trying again in 1 s", exc)
        return True
    return False
