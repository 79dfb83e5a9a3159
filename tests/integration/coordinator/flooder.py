"""A principal pipelining one kind of request at a worker, never reading the replies.

Run as its own process by the fairness tests (so its work does not share the test's
interpreter with the worker): ``python -m tests.integration.coordinator.flooder HOST PORT
PRINCIPAL SECRET OP SECONDS``. Prints how many requests it sent.
"""

from __future__ import annotations

import sys
import time

from txnstream.coordinator.client_connection import ClientConnection
from txnstream.coordinator.protocol import TcOp, TcRequest
from txnstream.coordinator.transport import Endpoint, IoLoop


def main(host: str, port: str, principal: str, secret: str, op: str, seconds: str) -> None:
    io = IoLoop("flooder")
    conn = ClientConnection.open(io, Endpoint(host, int(port)), secret, None, lambda _r: None,
                                 lambda _c: None, 10, principal=principal)
    n = 0
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end and not conn.closed.is_set():
        conn.send(TcRequest(f"flood-{n}", "flooder", 0, TcOp(op), 0,
                            int(time.time() * 1000) + 120_000).encode())
        n += 1
        if n % 200 == 0:
            time.sleep(0.01)  # thousands a second, as the flooder
    conn.close()
    conn.closed.wait(5)
    io.close()
    print(n)


if __name__ == "__main__":
    main(*sys.argv[1:])
