"""Ending the txns of a partition's fenced or dead owners at once, after a claim."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from txnstream.errors import NotAuthorizedError, TransactionNotFoundError, TxnStreamError
from txnstream.pendingack.handle import PendingAckHandle
from txnstream.types import TopicPartition, TxnStatus

if TYPE_CHECKING:
    from txnstream.admin import Admin

__all__ = ["end_predecessors"]

log = logging.getLogger("txnstream.consumer_group")


def end_predecessors(admin: Admin, member_id: str, abort_open: bool, tp: TopicPartition,
                     handle: PendingAckHandle) -> None:
    """After a claim, end at once the txns of fenced owners that hold acks on ``tp``.

    (Step 1, the abort of an OPEN txn, only with ``abort_predecessor_txns``: the
    exactly-once processor's setting.)

    Every txn pending in ``handle`` now acked under an older generation than this
    claim's OWNER: its member is fenced (it can only abort: its read-back meets this
    OWNER) or dead. Waiting for its timeout would hold those inputs back while later
    ones are processed (input order broken, a stall of the txn timeout); Kafka's
    ``initTransactions`` aborts a predecessor's txn at once, and so does this. Per
    txn, before anything of ``tp`` is delivered:

    1. an OPEN txn is aborted through its coordinator (``admin.abort_transaction``;
       the reply comes once its ABORT marks are written) and its acks are dropped
       here, so its inputs are delivered first, in offset order;
    2. an ended txn (a late ack of it outlived ``CHECKPOINT_ENDED_MAX``, or its mark
       is still on the way) gets its outcome applied; one the coordinator no longer
       knows ended long ago: its acks here are late ones and are dropped;
    3. a COMMITTING/ABORTING txn is left to its mark (the coordinator is ending it).

    The abort is authorized like any other: the principal that opened the txn or an
    admin. A member whose principal differs (and is no admin) gets
    ``NotAuthorizedError``: it logs a warning and the txn ends at its timeout, as
    before. Any other failure (a coordinator not answering) falls back the same way;
    nothing here raises.
    """
    for txn_id in sorted(handle.pending_txns()):
        try:
            info = admin.get_transaction(txn_id)
            if info.status is TxnStatus.OPEN and not abort_open:
                continue  # its client may still commit it: its acks stay pending
            if info.status is TxnStatus.OPEN:
                log.warning("%s: %s is held by %s of a fenced or dead owner; aborting it",
                            member_id, tp, txn_id)
                info = admin.abort_transaction(txn_id)
        except TransactionNotFoundError:
            handle.abort(txn_id)
            continue
        except NotAuthorizedError as exc:
            log.warning("%s: %s holds acks on %s but this member may not abort it (%s); "
                        "its inputs wait for its timeout", member_id, txn_id, tp, exc)
            continue
        except TxnStreamError as exc:
            log.warning("%s: could not end %s, which holds acks on %s (%s); its inputs "
                        "wait for its end", member_id, txn_id, tp, exc)
            continue
        if info.status is TxnStatus.ABORTED:
            handle.abort(txn_id)
        elif info.status is TxnStatus.COMMITTED:
            handle.commit(txn_id)
