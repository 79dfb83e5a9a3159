"""Topic ids asked natively through a consumer's handle are the ids confluent-kafka gives.

A buffer owner checks its served topics' ids once a second (a recreated topic: a new
id). :class:`~txnstream.buffer.recreation.TopicIds` asks through an idle consumer of its
own (never the owner's data consumer, whose parked fetch a request waits behind:
``test_wide_serving.py``) with ``txnstream._native.topic_ids`` where the module loads,
and through an ``AdminClient`` otherwise. Both ask a real broker here, about topics that
exist, one that does not, and one deleted and created again: the answers must be the
same, and a consumer the native call refuses (closed, not the one named) leaves the ids
to the admin client, never to "not known". The consumer is TopicIds' to close.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from tests.integration.buffer.conftest import make_topic
from tests.integration.coordinator.conftest import create_topic_again, delete_topic
from txnstream.buffer.recreation import TopicIds
from txnstream.buffer.scan import native_scan
from txnstream.config import Config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(native_scan() is None,
                       reason="txnstream._native did not build or load over librdkafka"),
]


@pytest.fixture
def consumer(config: Config) -> Iterator[tuple[Consumer, str]]:
    client_id = f"ids-{uuid.uuid4().hex[:6]}"
    c = Consumer({"bootstrap.servers": config.bootstrap_servers,
                  "group.id": f"g-{client_id}", "client.id": client_id})
    try:
        yield c, client_id
    finally:
        c.close()


def _both(config: Config, through: tuple[Consumer, str]) -> tuple[TopicIds, TopicIds]:
    native = TopicIds(lambda: AdminClient(config.admin()), 10.0, lambda: through)
    plain = TopicIds(lambda: AdminClient(config.admin()), 10.0)
    assert native.native and not plain.native
    return native, plain


def test_native_and_admin_ids_agree_on_topics_that_exist_and_one_that_does_not(
        config: Config, consumer: tuple[Consumer, str]) -> None:
    wide, narrow = make_topic(config, 64, "ids"), make_topic(config, 1, "ids")
    missing = f"ids-missing-{uuid.uuid4().hex[:8]}"
    native, plain = _both(config, consumer)
    asked = [wide, narrow, missing]
    got, want = native.get(asked), plain.get(asked)
    assert set(want) == {wide, narrow}, f"the admin client's answer: {want}"
    assert got == want, "the native ids differ from confluent-kafka's"
    assert got[wide] != got[narrow]
    assert native.get([missing]) == plain.get([missing]) == {}
    assert native.get([]) == {}
    native.close()
    with pytest.raises(RuntimeError):
        consumer[0].poll(0)  # closed with the TopicIds that asked through it
    assert native.get([wide]) == {}, "a closed TopicIds knows no id"


def test_a_topic_created_again_has_a_new_id_by_both(
        config: Config, consumer: tuple[Consumer, str]) -> None:
    topic = make_topic(config, 4, "ids")
    native, plain = _both(config, consumer)
    before = native.get([topic])
    assert before == plain.get([topic]) and topic in before
    delete_topic(config, topic)
    assert native.get([topic]) == plain.get([topic]) == {}, "a deleted topic has no id"
    create_topic_again(config, topic, 4)
    after = native.get([topic])
    assert after == plain.get([topic]) and topic in after
    assert after[topic] != before[topic], "the topic created again kept its old id"


def test_a_consumer_the_native_call_refuses_leaves_the_ids_to_the_admin_client(
        config: Config, consumer: tuple[Consumer, str]) -> None:
    topic = make_topic(config, 2, "ids")
    c, client_id = consumer
    want = TopicIds(lambda: AdminClient(config.admin()), 10.0).get([topic])
    assert topic in want
    wrong = TopicIds(lambda: AdminClient(config.admin()), 10.0,
                     lambda: (c, f"not-{client_id}-{os.getpid()}"))
    assert wrong.get([topic]) == want and not wrong.native
    other = Consumer({"bootstrap.servers": config.bootstrap_servers,
                      "group.id": f"g-closed-{client_id}", "client.id": f"c-{client_id}"})
    closed = TopicIds(lambda: AdminClient(config.admin()), 10.0,
                      lambda: (other, f"c-{client_id}"))
    other.close()
    assert closed.get([topic]) == want and not closed.native
