"""A client used after ``close()``: a clear error at once, as Kafka's and Pulsar's clients
give (``IllegalStateException``, ``AlreadyClosedException``).

Old: ``Client`` made a new coordinator client on the next use after ``close()`` (its
connections and threads then closed by nobody), and a coordinator client's request after
its ``close()`` reached the closed connection loop: ``RuntimeError: Event loop is
closed``, with two coroutines never awaited (the ``RuntimeWarning``s a full run showed).
"""

from __future__ import annotations

import gc
import time
import warnings

import pytest

from tests.integration.coordinator.conftest import make_topic
from txnstream import Client
from txnstream.coordinator.protocol import TcOp
from txnstream.errors import TxnStreamError

pytestmark = pytest.mark.integration


def test_a_client_used_after_close_refuses_at_once_and_makes_nothing(config, worker):
    topic = make_topic(config, 1)
    c = Client(config=config)
    with c.transaction() as txn:
        c.create_producer(topic).send(b"v", txn=txn)
    c.close()
    c.close()  # again: harmless
    for use in (c.new_transaction, lambda: c.create_producer(topic),
                lambda: c.subscribe(topic, subscription="after-close"),
                lambda: c.admin.list_transactions()):
        with pytest.raises(TxnStreamError, match="closed"):
            use()
    assert c._tc is None, "a coordinator client was made after close()"


def test_a_coordinator_clients_request_after_close_fails_at_once_naming_it(config, worker):
    c = Client(config=config)
    tc = c.tc
    tc.request(TcOp.STATS, 0)           # a connection to the worker is open
    c.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.monotonic()
        for tc_id in (0, 1):            # one with a connection made, one without
            with pytest.raises(TxnStreamError, match="is closed"):
                tc.request(TcOp.STATS, tc_id)
        took = time.monotonic() - t0
        gc.collect()
    assert took < 2, f"a closed client's requests took {took:.1f}s to fail"
    unawaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert not unawaited, unawaited
