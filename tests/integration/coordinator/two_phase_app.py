"""The database recipe as an application runs it, killed -9 after the step it is told.

``python -m tests.integration.coordinator.two_phase_app BOOTSTRAP PREFIX DSN IN OUT SUB
CRASH_AT``: consume one record of IN, write ``out-<value>`` to OUT and ack the input in
a txnstream txn, prepare it, insert a row and record the txn in one PostgreSQL
transaction, commit it, complete the txn. ``CRASH_AT`` (``before_prepare``,
``after_prepare``, ``after_db_commit``, ``after_complete`` or ``none``): the process
kills itself (SIGKILL) right after that step. Prints ``done`` if it got to the end.
"""

from __future__ import annotations

import os
import signal
import sys

import psycopg

from txnstream import Client
from txnstream.config import Config, TopicNames
from txnstream.two_phase import OutcomeTable

TXN_TIMEOUT_S = 5.0
MAX_PREPARED_S = 120.0


def main(bootstrap: str, prefix: str, dsn: str, topic_in: str, topic_out: str, sub: str,
         crash_at: str) -> None:
    def step(name: str) -> None:
        if crash_at == name:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    cfg = Config(bootstrap_servers=bootstrap, topics=TopicNames(prefix), num_coordinators=4)
    client = Client(config=cfg)
    conn = psycopg.connect(dsn)
    table = OutcomeTable(client)
    table.create(conn)
    consumer = client.subscribe(topic_in, subscription=sub, **{"session.timeout.ms": 6000})
    producer = client.create_producer(topic_out)
    msg = consumer.receive(timeout_s=60)
    assert msg is not None, "no input"
    txn = client.new_transaction(timeout_s=TXN_TIMEOUT_S, max_prepared_s=MAX_PREPARED_S)
    producer.send(b"out-" + msg.value, txn=txn)
    consumer.acknowledge(msg, txn=txn)
    step("before_prepare")
    txn.prepare()
    step("after_prepare")
    with conn.cursor() as cur:
        cur.execute("INSERT INTO rows (v) VALUES (%s)", (msg.value,))
        table.record(cur, txn)
    conn.commit()
    step("after_db_commit")
    table.complete(conn, txn.id)
    step("after_complete")
    print("done", flush=True)
    consumer.close()
    client.close()


if __name__ == "__main__":
    main(*sys.argv[1:8])
