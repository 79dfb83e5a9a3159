"""Start a local broker for ``make demo`` unless one already answers at the address."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient


def answers(bootstrap: str) -> bool:
    """Whether a broker answers at ``bootstrap`` within a few seconds."""
    import logging

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "socket.timeout.ms": 3000,
                            "logger": logging.getLogger("txnstream.librdkafka")}
    admin = AdminClient(conf)
    try:
        admin.list_topics(timeout=4)
        return True
    except Exception:
        return False


def main(argv: list[str]) -> int:
    """``python -m txnstream.demo.ensure_broker HOST:PORT``."""
    bootstrap = argv[0] if argv else "127.0.0.1:9092"
    if answers(bootstrap):
        print(f"a broker answers at {bootstrap}")
        return 0
    host, _, port = bootstrap.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        print(f"no broker answers at {bootstrap}, and it is not local: start it first")
        return 2
    from txnstream.cli import main as cli

    return cli(["cluster", "up", "--port", port, "--state-dir",
                str(Path(".txnstream/cluster").resolve())])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
