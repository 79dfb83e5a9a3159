"""The consumer role: committed-only reads with plain acks, logged before they are acked.

Reads every data topic as one subscription; open txns make it pause partitions at
their max read position and resume them, all the time.
Each batch of received records is written to the truth file (fsynced) before it is
acked (``acknowledge`` each, or ``acknowledge_cumulative`` per partition), so a kill -9
can only cause redelivery, never a record acked but not logged: at least once.
"""

from __future__ import annotations

import threading
import time

from chaos.roles.common import RoleArgs, run_role
from chaos.truth import TruthLog, decode_value
from txnstream import Client
from txnstream.errors import TxnStreamError
from txnstream.message import Message

FLUSH_EVERY = 50
FLUSH_INTERVAL_S = 0.2


class ConsumerRole:
    """One committed-only consumer of the chaos topics."""

    def __init__(self, args: RoleArgs, client: Client, stop: threading.Event) -> None:
        sp = args.spec
        self.stop = stop
        self.mode: str = sp["ack_mode"]
        self.consumer = client.subscribe(
            sp["topics"], subscription=sp["subscription"],
            **{"session.timeout.ms": sp["session_timeout_ms"], "heartbeat.interval.ms": 1000})
        self.truth = TruthLog(args.truth)
        self.writer = args.writer

    def loop(self) -> None:
        """Receive, log, ack, until stopped."""
        pending: list[Message] = []
        last_flush = time.monotonic()
        while not self.stop.is_set():
            msg = self.consumer.receive(timeout_s=0.3)
            if msg is not None:
                pending.append(msg)
            if pending and (len(pending) >= FLUSH_EVERY or msg is None
                            or time.monotonic() - last_flush > FLUSH_INTERVAL_S):
                self._flush(pending)
                pending = []
                last_flush = time.monotonic()
        if pending:
            self._flush(pending)

    def _flush(self, msgs: list[Message]) -> None:
        recs = []
        for m in msgs:
            v = decode_value(m.value)
            recs.append([v["id"] if v else None, m.topic, m.partition, m.offset,
                         None if m.txn_id is None else str(m.txn_id)])
        self.truth.write({"e": "recv", "by": self.writer, "recs": recs})
        if self.mode == "cumulative":
            last: dict[object, Message] = {}
            for m in msgs:
                cur = last.get(m.tp)
                if cur is None or m.offset > cur.offset:
                    last[m.tp] = m
            todo = list(last.values())
        else:
            todo = msgs
        for m in todo:
            try:
                if self.mode == "cumulative":
                    self.consumer.acknowledge_cumulative(m)
                else:
                    self.consumer.acknowledge(m)
            except TxnStreamError:
                pass  # rebalanced away: the new owner redelivers it (at least once)

    def close(self) -> None:
        """Commit the cursor and leave the group."""
        self.consumer.close()
        self.truth.close()


def run(args: RoleArgs) -> int:
    """Consume until SIGTERM."""
    return run_role(ConsumerRole, args)
