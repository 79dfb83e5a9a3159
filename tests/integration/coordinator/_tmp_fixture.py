# TEMPORARY until tests/conftest.py lands
import os
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from txnstream import Config, TopicNames


@pytest.fixture(scope="session")
def config():
    cfg = Config(bootstrap_servers=os.environ["TXNSTREAM_BOOTSTRAP"], topics=TopicNames("__t" + uuid.uuid4().hex[:6]), num_coordinators=4)
    a = AdminClient(cfg.admin())
    t = cfg.topics
    fs = a.create_topics([NewTopic(t.log, 4, 1), NewTopic(t.requests, 4, 1), NewTopic(t.replies, 8, 1), NewTopic(t.pending_ack, 8, 1), NewTopic(t.buffer_snapshots, 4, 1, config={"cleanup.policy": "compact"})])
    [f.result() for f in fs.values()]
    return cfg
