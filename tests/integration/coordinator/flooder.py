"""A principal pipelining one kind of request at a worker, never reading the replies.

Run as its own process by the fairness tests (so its work does not share the test's
interpreter with the worker): ``python -m tests.integration.coordinator.flooder HOST PORT
CLUSTER PRINCIPAL SECRET OP SECONDS [WINDOW]`` (CLUSTER: the worker's, as its hello names
it; SECRET ``-``: none). Prints how many requests
it sent. With ``WINDOW``
it reads the replies and keeps that many requests unanswered, as fast as they come back
(the hostile soak's lister); without, it never reads them.
"""

from __future__ import annotations

import sys
import threading
import time

from txnstream.coordinator.client_connection import ClientConnection
from txnstream.coordinator.protocol import TcOp, TcRequest
from txnstream.coordinator.transport import Endpoint, IoLoop


def main(host: str, port: str, cluster: str, principal: str, secret: str, op: str,
         seconds: str, window: str = "0") -> None:
    io = IoLoop("flooder")
    unanswered = threading.Semaphore(int(window)) if int(window) else None
    conn = ClientConnection.open(
        io, Endpoint(host, int(port)), None if secret == "-" else secret, None,
        (lambda _r: None) if unanswered is None else (lambda _r: unanswered.release()),
        lambda _c: None, 10, principal=principal, cluster=cluster.encode())
    n = 0
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end and not conn.closed.is_set():
        if unanswered is not None:
            if not unanswered.acquire(timeout=0.5):
                continue
        conn.send(TcRequest(f"flood-{n}", "flooder", 0, TcOp(op), 0,
                            int(time.time() * 1000) + 120_000).encode())
        n += 1
        if unanswered is None and n % 200 == 0:
            time.sleep(0.01)  # thousands a second, as the flooder
    conn.close()
    conn.closed.wait(5)
    io.close()
    print(n)


if __name__ == "__main__":
    main(*sys.argv[1:])
