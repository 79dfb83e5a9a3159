"""A GET of many txns (``group_seqs``): a buffer owner's ongoing-txn check asks a
coordinator a page of txns a request.

The reply says of each txn named: its info (``txns``, only if the caller may read it),
or not known (``group_seqs``); a txn in neither was not answered, and the asker must
not take it for unknown (it would abort it).
"""

from __future__ import annotations

import time

import pytest

from txnstream.config import Config, TopicNames
from txnstream.coordinator.handlers import Caller, TcRequestHandler
from txnstream.coordinator.metadata_store import TransactionMetadataStore
from txnstream.coordinator.ownership import TcIncarnation, TcPhase
from txnstream.coordinator.protocol import TcOp, TcRequest
from txnstream.coordinator.request_checks import GET_PAGE, check_request
from txnstream.errors import InvalidRequestError
from txnstream.types import TxnStatus

CONFIG = Config(bootstrap_servers="127.0.0.1:1", topics=TopicNames("__unit"))
NOW_MS = 1_000_000


def _get(seqs, txn_seq: int = -1) -> TcRequest:
    return TcRequest("r1", "c", 0, TcOp.GET, 0, int(time.time() * 1000) + 60_000,
                     txn_seq=txn_seq, group_seqs=tuple(seqs))


def _coordinator() -> tuple[TcIncarnation, list[int]]:
    tc = TcIncarnation(0, TransactionMetadataStore(0, "w"), 0, TcPhase.SERVING)
    seqs = []
    for i, who in enumerate(("alice", "alice", "bob")):
        meta, _ = tc.store.new_txn(f"n{i}", 60_000, NOW_MS, principal=who)
        seqs.append(meta.txn_id.least_bits)
    tc.store.end_txn(seqs[1], True, NOW_MS)
    tc.store.unlogged()
    return tc, seqs


def test_a_page_answers_known_txns_and_names_the_unknown_ones():
    tc, seqs = _coordinator()
    never = tc.store.next_sequence + 7
    reply = TcRequestHandler(CONFIG, "w", {}).handle(
        tc, _get([*seqs, never]), NOW_MS, Caller("admin", admin=True))
    assert reply is not None and reply.error_kind is None
    assert {t.txn_id.least_bits: t.status for t in reply.txns} == {
        seqs[0]: TxnStatus.OPEN, seqs[1]: TxnStatus.COMMITTING, seqs[2]: TxnStatus.OPEN}
    assert reply.group_seqs == (never,)
    assert reply.stats["next_sequence"] == tc.store.next_sequence
    assert reply.txn_keys == ()  # writing a txn is not what a page is for


def test_a_txn_the_caller_may_not_read_is_left_unanswered_not_called_unknown():
    tc, seqs = _coordinator()
    reply = TcRequestHandler(CONFIG, "w", {}).handle(
        tc, _get(seqs), NOW_MS, Caller("alice", admin=False))
    assert reply is not None and reply.error_kind is None
    assert {t.txn_id.least_bits for t in reply.txns} == {seqs[0], seqs[1]}
    assert seqs[2] not in reply.group_seqs  # bob's: neither answered nor unknown


def test_a_page_over_its_bound_is_refused_naming_group_seqs():
    with pytest.raises(InvalidRequestError, match="group_seqs"):
        check_request(_get(range(GET_PAGE + 1)), 60_000, 100)
    check_request(_get(range(GET_PAGE)), 60_000, 100)


def test_a_get_naming_no_txn_at_all_is_refused_naming_txn_seq():
    with pytest.raises(InvalidRequestError, match="txn_seq"):
        check_request(_get([]), 60_000, 100)
