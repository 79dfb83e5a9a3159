"""What the buffer owner does with a txn that stays ongoing: ask its coordinator.

A ``txn.id`` header is a claim anyone with write access to the topic can make. A txn
record holds its partition back until the txn ends here, so the owner does not leave
that to the record's word: every ``lwm_check_interval_s`` it asks the coordinator
named by each txn still ongoing here (once its fold has read past what it asked
about) for that txn's status and registered partitions (a GET, as an admin), and
writes the marker the coordinator's answer calls for:

=====================================  ===========  ==================================
the coordinator says                    marker here  why
=====================================  ===========  ==================================
OPEN, COMMITTING, ABORTING              none         a live txn: it ends by its END or
                                                     its timeout, and its markers come
ABORTED                                 ABORT        its ABORT marker here was lost
COMMITTED, registered here              COMMIT       its COMMIT marker here was lost
COMMITTED, not registered here          ABORT        no marker of it will ever come:
                                                     records copied or forged here
not found, never issued (sequence at    ABORT        forged: no coordinator issued it
or past its next sequence)
no such coordinator (its TC id is      ABORT        forged: no coordinator can issue it
outside 0..num_coordinators-1)
not found, issued                       ABORT        ended and forgotten (kept 5 min
                                                     after its end) with no marker
                                                     here: it never registered here
=====================================  ===========  ==================================

An ABORT here after a COMMIT marker changes nothing (the fold keeps the first marker),
so each answer is safe even if the fold is behind; the owner still asks only about
txns its fold has read past. It replaces the older rule that aborted whatever sat below
the coordinator's low watermark: that took one number from a reply on its word (a
relay rewriting it made an owner abort an open txn), where this takes the txn's own
status over the authenticated line.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from txnstream.types import TopicPartition, TxnID, TxnStatus

__all__ = ["Action", "TxnAnswer", "judge"]


class Action(enum.Enum):
    """The marker the owner writes for an ongoing txn."""

    KEEP = "keep"
    ABORT = "abort"
    COMMIT = "commit"


@dataclass(frozen=True, slots=True)
class TxnAnswer:
    """What the coordinator said of one txn.

    Its status and registered partitions, or not found (``status`` None) with the
    coordinator's next sequence; ``no_coordinator``: the TxnID names a coordinator the
    cluster does not have (nobody to ask, and nobody could have issued it).
    """

    status: TxnStatus | None
    partitions: frozenset[TopicPartition] = frozenset()
    next_sequence: int | None = None
    no_coordinator: bool = False


def judge(tp: TopicPartition, txn_id: TxnID, answer: TxnAnswer) -> tuple[Action, str]:
    """The marker to write at ``tp`` for ``txn_id`` ongoing there, and why (for the log)."""
    st = answer.status
    if answer.no_coordinator:
        return Action.ABORT, (f"coordinator {txn_id.tc_id} does not exist, so nobody issued "
                              "it: forged")
    if st is None:
        if answer.next_sequence is not None and txn_id.least_bits >= answer.next_sequence:
            return Action.ABORT, (f"coordinator {txn_id.tc_id} never issued it (its next "
                                  f"sequence is {answer.next_sequence}): forged")
        return Action.ABORT, (f"coordinator {txn_id.tc_id} does not know it (ended and "
                              "forgotten) and no marker of it is here: it never "
                              "registered here")
    if st is TxnStatus.ABORTED:
        return Action.ABORT, "it aborted at its coordinator; its ABORT marker is not here"
    if st is TxnStatus.COMMITTED:
        if tp in answer.partitions:
            return Action.COMMIT, ("it committed at its coordinator, registered here; its "
                                   "COMMIT marker is not here")
        return Action.ABORT, ("it committed at its coordinator without registering this "
                              "partition: records here were copied or forged")
    return Action.KEEP, f"{st.value} at its coordinator"
