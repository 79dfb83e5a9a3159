"""Run by the wheel's venv, outside the checkout: a transactional round trip.

``python roundtrip.py BOOTSTRAP PREFIX TOPIC``: against a coordinator worker the test
started as a separate process (``txnstream worker`` from the same venv), write three
transactions, abort the middle one, then read the topic committed-only and require exactly
the committed records, in order, once each. Prints ``ROUNDTRIP OK`` last.
"""

import sys
import time

from confluent_kafka.admin import AdminClient, NewTopic

from txnstream.client import Client
from txnstream.config import Config, TopicNames

bootstrap, prefix, topic = sys.argv[1:4]
config = Config.from_env(bootstrap, topics=TopicNames(prefix))
admin = AdminClient(config.admin())
for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
    f.result(30)
deadline = time.monotonic() + 30
while topic not in admin.list_topics(topic, timeout=10).topics:  # metadata catches up
    assert time.monotonic() < deadline, f"topic {topic} not visible 30 s after creation"
    time.sleep(0.2)

batches = [[f"{name}-{i}".encode() for i in range(5)] for name in ("a", "b", "c")]
with Client(config=config) as client:
    producer = client.create_producer(topic)
    for n, values in enumerate(batches):
        with client.transaction(timeout_s=60) as txn:
            for v in values:
                producer.send(v, key=v, txn=txn)
            if n == 1:
                txn.abort()
    expected = batches[0] + batches[2]
    consumer = client.subscribe(topic, subscription="smoke")
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < len(expected) and time.monotonic() < deadline:
        msg = consumer.receive(timeout_s=2)
        if msg is not None:
            consumer.acknowledge(msg)
            got.append(msg.value or b"")
    extra = consumer.receive(timeout_s=3)  # nothing after the committed records
    consumer.close()

assert got == expected, f"committed-only read: expected {expected}, got {got}"
assert extra is None, f"a record past the committed ones: {extra.value!r}"
print("ROUNDTRIP OK")
