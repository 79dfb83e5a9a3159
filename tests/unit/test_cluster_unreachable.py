"""A client whose cluster does not answer gets txnstream's error, not librdkafka's.

Seed 66's hostile soak: a processor restarted while a broker was down, and its
``subscribe()`` (dead-letter policy on) died of a bare ``cimpl.KafkaException``
(``_TIMED_OUT``, "Failed to get metadata") raised from the topic listing. Every entry
point that asks the cluster for metadata before it does anything else raised the same
bare exception, which code that handles ``TxnStreamError`` (the soak's roles, a user's
retry loop) does not catch. No broker here: the bootstrap address is a closed port, so
librdkafka's metadata request fails for real, after ``admin_timeout_s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaException

from txnstream import Client, Config
from txnstream.errors import KafkaClientError, KafkaErrorKind, TxnStreamError
from txnstream.lifecycle import DeadLetterPolicy

NOWHERE = "127.0.0.1:1"
TIMEOUT_S = 1.0


@pytest.fixture
def client() -> Iterator[Client]:
    c = Client(config=Config(bootstrap_servers=NOWHERE, admin_timeout_s=TIMEOUT_S,
                             kafka={"log_level": 0}))
    try:
        yield c
    finally:
        c.close()


CALLS: dict[str, Callable[[Client], Any]] = {
    "subscribe": lambda c: c.subscribe("orders", subscription="billing"),
    "subscribe with a dead-letter policy": lambda c: c.subscribe(
        "orders", subscription="billing", dead_letter_policy=DeadLetterPolicy(3)),
    "create_producer": lambda c: c.create_producer("orders"),
    "new_transaction": lambda c: c.new_transaction(),
    "admin.coordinator_stats": lambda c: c.admin.coordinator_stats(),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_a_cluster_that_does_not_answer_raises_a_retriable_txnstream_error(client, call):
    t0 = time.monotonic()
    with pytest.raises(TxnStreamError) as caught:
        CALLS[call](client)
    took = time.monotonic() - t0
    err = caught.value
    assert not isinstance(err, KafkaException), f"{call} leaked librdkafka's exception"
    assert isinstance(err, KafkaClientError), f"{call} raised {type(err).__name__}: {err}"
    assert err.kind is KafkaErrorKind.RETRIABLE, f"{call}: {err.kind} for a cluster down"
    assert NOWHERE in str(err), f"{call}: the message does not name the cluster: {err}"
    assert "metadata" in str(err), f"{call}: the message does not say what failed: {err}"
    assert took < 10 * TIMEOUT_S + 5, f"{call} took {took:.1f}s, past admin_timeout_s"
