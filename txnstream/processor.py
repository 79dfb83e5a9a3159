"""``ExactlyOnceProcessor``: consume-transform-produce, exactly once (Pulsar Functions' case).

One transaction per **checkpoint**, not per batch (as Kafka Streams commits every
``commit.interval.ms`` and quix-streams every ``commit_interval``): a checkpoint opens
with its first input and commits ``commit_interval_s`` later, once it holds
``commit_every`` inputs, or once the input pauses (``IDLE_COMMIT_S``), whichever comes
first. Inside it, inputs are taken in batches
of up to ``batch_size``; per batch:

1. partitions new to the checkpoint are registered with its txn in the background
   (``Consumer.prepare_acks``), while:
2. ``fn`` is called on each input, and its outputs go out with one ``send_batch``;
3. the batch is acked in the txn (``Consumer.acknowledge_batch``: one pending-ack
   record per partition, cumulative where that acks exactly the batch), written while
   the next batch is transformed.

The commit then waits for the outputs and the ack records to be durable, reads the
acks back (the fencing check) and ends the txn. What a checkpoint costs (a txn's begin,
registrations, flush, read-back and END: about 20 ms) is paid once per checkpoint, not
per batch. An input's output is visible at most ``commit_interval_s`` plus one commit
after the input was taken.

:meth:`ExactlyOnceProcessor.run` pipelines checkpoints, as Kafka Streams overlaps a
commit's flush with processing only through its producer: checkpoint N's commit runs in
the background (``commit_async``) while N+1 takes, transforms and acks inputs, and N+1
commits only after N committed. If N did not, N+1 is aborted too, so both give their
inputs back and they come again in offset order. While N's cumulative acks are pending,
N+1's ack records list their offsets (a cumulative ack above another txn's pending one
is not exact). :meth:`~ExactlyOnceProcessor.run_checkpoint` commits before it returns.

Crash semantics:

1. a crash before the commit request: the txn stays open, the coordinator aborts it at
   its timeout (at once, when another member takes the partitions over:
   ``abort_predecessor_txns``), its outputs are never delivered and its acks are undone
   (ABORT marks), so the inputs are redelivered to whoever owns their partitions then;
2. a crash after the commit request: the coordinator finishes the commit (it is logged);
   the outputs become visible and the acks apply, so the inputs are not seen again;
3. in both cases each input's output is visible exactly once.

A checkpoint that aborts while the process lives (its function's error, a send or an
ack refused, a conflict, the txn's timeout) gives every input it took back: those its
txn acked come back by the abort, those not acked yet by ``redeliver_unacknowledged``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from txnstream.client import Client
from txnstream.errors import ConfigError, TransactionOutcomeUnknownError, TxnStreamError
from txnstream.message import Message
from txnstream.pipeline import end_in_background
from txnstream.types import TxnStatus

if TYPE_CHECKING:
    from txnstream.transaction import Transaction

__all__ = ["ExactlyOnceProcessor", "ProcessorStats"]

log = logging.getLogger(__name__)

Output = bytes | tuple[bytes | str | None, bytes]
Function = Callable[[Message], Iterable[Output] | Output | None]

_PARTITION = attrgetter("topic", "partition")
"""A message's (topic, partition), in C: ``Message.tp`` builds an object per call."""

DEFAULT_BATCH_SIZE = 500
"""Inputs per transform turn: one ``receive_batch``, one ack record per partition and
one ``send_batch``."""
DEFAULT_COMMIT_INTERVAL_S = 1.0
"""A checkpoint commits at most this long after its first input (BENCHMARKS.md, issue
36: throughput against the interval)."""
DEFAULT_COMMIT_EVERY = 10_000
"""... or once it holds this many inputs."""
IDLE_COMMIT_S = 0.05
"""... or once no input came for this long: a pause in the input commits what the
checkpoint holds at once, rather than at the interval (a fast stream never pauses this
long; a slow one pays a txn per pause, at its slow rate)."""


@dataclass
class ProcessorStats:
    """What a run did."""

    batches: int = 0
    """Transform turns whose inputs were committed."""
    inputs: int = 0
    outputs: int = 0
    checkpoints: int = 0
    """Txns committed."""
    aborted_checkpoints: int = 0

    @property
    def aborted_batches(self) -> int:
        """Kept from when every batch was a txn of its own: :attr:`aborted_checkpoints`."""
        return self.aborted_checkpoints


@dataclass
class _Checkpoint:
    """One checkpoint's txn, the inputs it took, and its commit once started."""

    txn: Transaction
    taken: list[Message]
    outputs: int = 0
    batches: int = 0
    done: Future[None] | None = None


class ExactlyOnceProcessor:
    """Reads ``inputs`` as ``subscription``, writes ``fn``'s results to ``output``.

    ``fn`` maps one input to ``None``, a value, a ``(key, value)`` pair, or an iterable
    of those. ``batch_interval_s`` is the interval's old name (each batch was its own
    txn): it sets ``commit_interval_s`` when that is not given.
    """

    def __init__(self, client: Client, inputs: str | Sequence[str], subscription: str,
                 output: str, fn: Function, batch_size: int = DEFAULT_BATCH_SIZE,
                 batch_interval_s: float | None = None, txn_timeout_s: float = 30.0,
                 cumulative: bool = True, *, commit_interval_s: float | None = None,
                 commit_every: int = DEFAULT_COMMIT_EVERY, **consumer_options: Any) -> None:
        interval = commit_interval_s if commit_interval_s is not None else (
            batch_interval_s if batch_interval_s is not None else DEFAULT_COMMIT_INTERVAL_S)
        _check_settings(batch_size, interval, commit_every, txn_timeout_s)
        self.client = client
        self.fn = fn
        self.batch_size = batch_size
        self.commit_interval_s = float(interval)
        self.commit_every = commit_every
        self.txn_timeout_s = txn_timeout_s
        self.cumulative = cumulative
        """Kept for compatibility (``txnstream process --cumulative``): every batch acks
        with one record per partition, cumulative wherever that acks exactly the
        batch's inputs (``Consumer.acknowledge_batch``)."""
        # Its txns live and die with its member: a takeover aborts a predecessor's at
        # once, so inputs come back in order after a crash (Kafka's initTransactions).
        consumer_options.setdefault("abort_predecessor_txns", True)
        self.producer = client.create_producer(output)
        # ready while the consumer joins its group: a new handle's producer id can take
        # librdkafka's 500 ms retry (none of its brokers is up when it first asks)
        self.producer.prepare_batches()
        self.consumer = client.subscribe(inputs, subscription=subscription,
                                         **consumer_options)
        self.stats = ProcessorStats()
        self._committing: _Checkpoint | None = None
        """The checkpoint :meth:`run` left committing in the background."""

    def _transform(self, batch: list[Message], txn: Transaction) -> int:
        """``fn`` on each input of ``batch``; its outputs sent with one ``send_batch``."""
        values: list[bytes | None] = []
        keys: list[bytes | None] = []
        fn = self.fn
        for msg in batch:
            result = fn(msg)
            if result is None:
                continue
            for item in ((result,) if isinstance(result, (bytes, tuple)) else result):
                key, value = item if isinstance(item, tuple) else (None, item)
                if isinstance(key, str):
                    key = key.encode()
                if not (value is None or isinstance(value, bytes)) or not (
                        key is None or isinstance(key, bytes)):
                    raise TypeError(
                        f"the function's output for {msg.tp}@{msg.offset} is "
                        f"{type(item).__name__} {item!r:.80}: expected bytes or a (key, "
                        "bytes) pair")
                keys.append(key)
                values.append(value)
        if values:
            self.producer.send_batch(values, self.producer.partitions_for(keys), txn, keys)
        return len(values)

    @property
    def committing(self) -> int:
        """Inputs of the checkpoint :meth:`run` is committing in the background (0: none)."""
        cp = self._committing
        return len(cp.taken) if cp is not None else 0

    def run_checkpoint(self) -> int:
        """Process inputs in one transaction until its checkpoint is due, and commit it.

        Returns the inputs it committed: 0 if none came within half a second, or it
        aborted (they come back). A checkpoint :meth:`run` left committing is settled
        first (its inputs are not counted here).
        """
        self._settle_previous()
        cp = self._collect()
        if cp is None:
            return 0
        cp.done = end_in_background(None, cp.txn.commit)  # here, as a future
        return self._settle(cp)

    run_batch = run_checkpoint
    """Its old name, from when every batch was a txn of its own."""

    def _collect(self) -> _Checkpoint | None:
        """Take inputs into a new txn until its checkpoint is due; transform and ack them.

        None if none came within half a second, or the checkpoint failed (its txn
        aborted, its inputs given back).
        """
        cp: _Checkpoint | None = None
        taken: list[Message] = []
        due = 0.0
        seen: set[tuple[str, int]] = set()
        receive, ack = self.consumer.receive_batch, self.consumer.acknowledge_batch
        try:
            while len(taken) < self.commit_every:
                if cp is None:
                    wait = 0.5
                else:
                    wait = min(due - time.monotonic(), IDLE_COMMIT_S)
                    if wait <= 0:
                        break
                batch = receive(min(self.batch_size, self.commit_every - len(taken)), wait)
                if not batch:
                    break  # none came, or the input paused: what it holds is committed now
                taken.extend(batch)  # from here on they are acked or given back
                if cp is None:
                    cp = _Checkpoint(self.client.new_transaction(timeout_s=self.txn_timeout_s),
                                     taken)
                    due = time.monotonic() + self.commit_interval_s
                txn = cp.txn
                if new := set(map(_PARTITION, batch)) - seen:  # registered while fn runs
                    seen.update(new)
                    self.consumer.prepare_acks(
                        [next(m for m in batch if _PARTITION(m) == p) for p in new], txn)
                cp.outputs += self._transform(batch, txn)
                ack(batch, txn=txn)
                cp.batches += 1
        except TxnStreamError as exc:
            log.warning("checkpoint of %d inputs aborted: %s", len(taken), exc)
            self.stats.aborted_checkpoints += 1
            self._give_back(cp.txn if cp else None, taken)
            return None
        except BaseException:
            self._give_back(cp.txn if cp else None, taken)
            raise
        return cp

    def _settle(self, cp: _Checkpoint) -> int:
        """Wait for ``cp``'s commit; its inputs if it committed, else 0 (given back)."""
        assert cp.done is not None
        try:
            cp.done.result()
        except TransactionOutcomeUnknownError as exc:
            # Not aborted: its acks hold the inputs until the coordinator's outcome
            # reaches the consumer (redelivered only if it aborted), so nothing is redone.
            log.warning("checkpoint of %d inputs: commit outcome unknown (%s)",
                        len(cp.taken), exc)
            self.consumer.redeliver_unacknowledged(cp.taken)  # none, unless not acked yet
            return 0
        except TxnStreamError as exc:
            log.warning("checkpoint of %d inputs aborted: %s", len(cp.taken), exc)
            self.stats.aborted_checkpoints += 1
            self._give_back(cp.txn, cp.taken)
            return 0
        except BaseException:
            self._give_back(cp.txn, cp.taken)
            raise
        self.stats.checkpoints += 1
        self.stats.batches += cp.batches
        self.stats.inputs += len(cp.taken)
        self.stats.outputs += cp.outputs
        return len(cp.taken)

    def _settle_previous(self) -> bool:
        """Settle the checkpoint :meth:`run` left committing; whether it committed."""
        cp, self._committing = self._committing, None
        return cp is None or self._settle(cp) > 0

    def _give_back(self, txn: Transaction | None, taken: list[Message]) -> None:
        """An aborted checkpoint: end its txn, then every input it took comes back.

        1. abort the txn (if still OPEN): its acks are undone and the inputs it acked
           are redelivered (if the abort gets no answer, or the txn timed out, the
           coordinator's ABORT mark does that later);
        2. the inputs it took and never acked are redelivered now, in offset order.
        """
        if txn is not None and txn.status is TxnStatus.OPEN:
            try:
                txn.abort()
            except TxnStreamError:
                pass  # it times out at the coordinator anyway
        self.consumer.redeliver_unacknowledged(taken)

    def run(self, max_idle_s: float | None = None, stop: Callable[[], bool] | None = None
            ) -> ProcessorStats:
        """Checkpoints until ``stop()`` or ``max_idle_s`` without input.

        Pipelined: a checkpoint's commit runs in the background while the next one takes
        and transforms inputs, and the next commits only once it committed (if it did
        not, the next aborts too and gives its inputs back, so they come again after the
        first's, in order). Every checkpoint is settled before this returns.
        """
        idle_since = time.monotonic()
        try:
            while not (stop and stop()):
                cp = self._collect()
                if not self._settle_previous() and cp is not None:
                    self.stats.aborted_checkpoints += 1  # chained: it may not commit
                    self._give_back(cp.txn, cp.taken)
                    cp = None
                if cp is not None:
                    cp.done = cp.txn.commit_async()
                    self._committing = cp
                    idle_since = time.monotonic()
                elif max_idle_s is not None and time.monotonic() - idle_since > max_idle_s:
                    break
        finally:
            self._settle_previous()
        return self.stats

    def close(self) -> None:
        """Settle a checkpoint still committing, leave the group and flush."""
        try:
            self._settle_previous()
        finally:
            self.consumer.close()
        self.producer.flush()


def _check_settings(batch_size: int, commit_interval_s: float, commit_every: int,
                    txn_timeout_s: float) -> None:
    """Refuse settings a checkpoint cannot keep, naming the one at fault."""
    for name, count in (("batch_size", batch_size), ("commit_every", commit_every)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"{name} must be a positive int, got {count!r}")
    for name, secs in (("commit_interval_s", commit_interval_s),
                       ("txn_timeout_s", txn_timeout_s)):
        if isinstance(secs, bool) or not isinstance(secs, (int, float)) or not secs > 0:
            raise ConfigError(f"{name} must be a positive number of seconds, got {secs!r}")
    if commit_interval_s > txn_timeout_s / 2:
        raise ConfigError(
            f"commit_interval_s ({commit_interval_s}) must be at most half of txn_timeout_s "
            f"({txn_timeout_s}): a checkpoint's txn stays open that long, and its commit "
            "needs the rest")
