"""Producers that write into txns refuse settings that break durability (issue 33, item 9).

With ``acks`` other than all (``0``: no answer waited for; ``1``: the leader alone) a
record the broker refused, or lost with its leader, counts as delivered: ``commit()``
says OK and readers see part of the txn. With ``enable.idempotence`` off a retried send
may be written twice or out of order inside its txn. Kafka's Java producer refuses both
for a transactional producer at construction; so does every txnstream producer, naming
the setting, its value and where it came from, before any Kafka client is made (no
broker involved: a refused producer never connects).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from txnstream import producer as producer_module
from txnstream.cli import main
from txnstream.client import Client
from txnstream.config import KAFKA_LOG, Config
from txnstream.coordinator.kafka_clients import worker_clients
from txnstream.coordinator.settings import WorkerSettings
from txnstream.errors import ConfigError
from txnstream_spark.options import SinkOptions, SourceOptions

BOOT = "127.0.0.1:1"
"""Nothing listens there: every refusal must come before a connection."""

ENV = ("TXNSTREAM_BOOTSTRAP", "TXNSTREAM_KAFKA_CONFIG", "TXNSTREAM_TOPIC_PREFIX",
       "TXNSTREAM_TC_SECRET", "TXNSTREAM_TC_SECRET_FILE", "TXNSTREAM_TC_PRINCIPAL")

NOT_DURABLE: list[tuple[dict[str, Any], str]] = [
    ({"acks": 0}, "acks=0"),
    ({"acks": "0"}, "acks=0"),
    ({"acks": 1}, "acks=1"),
    ({"acks": "1"}, "acks=1"),
    ({"acks": 2}, "acks=2"),
    ({"request.required.acks": 0}, "request.required.acks=0"),
    ({"request.required.acks": "1"}, "request.required.acks=1"),
    ({"topic.acks": 0}, "topic.acks=0"),
    ({"topic.request.required.acks": "0"}, "topic.request.required.acks=0"),
    ({"default.topic.config": {"acks": 0}}, "default.topic.config.acks=0"),
    ({"acks": 0, "enable.idempotence": False}, "acks=0"),
    ({"enable.idempotence": False}, "enable.idempotence=false"),
    ({"enable.idempotence": "false"}, "enable.idempotence=false"),
    ({"enable.idempotence": "FALSE"}, "enable.idempotence=FALSE"),
    ({"enable.idempotence": 0}, "enable.idempotence=0"),
    ({"enable.idempotence": "0"}, "enable.idempotence=0"),
]
"""Settings (as Python or as text from a properties file) and what the error names."""

DURABLE: list[dict[str, Any]] = [
    {},
    {"acks": "all"},
    {"acks": "ALL"},
    {"acks": -1},
    {"acks": "-1"},
    {"request.required.acks": "all"},
    {"topic.acks": -1},
    {"default.topic.config": {"acks": "all"}},
    {"enable.idempotence": True},
    {"enable.idempotence": "true"},
    {"enable.idempotence": "True"},
    {"acks": "all", "enable.idempotence": "true"},
]
"""Equivalent spellings of acks=all and idempotence on that Kafka/librdkafka accept."""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ENV:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(autouse=True)
def _kafka_log_level() -> Iterator[None]:
    """``main()`` quiets librdkafka's logger for the command's user: undone after."""
    level = KAFKA_LOG.level
    yield
    KAFKA_LOG.setLevel(level)


@pytest.fixture
def no_kafka_producer(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Fail if a confluent-kafka producer is built: a refused producer never is."""
    built: list[dict[str, Any]] = []

    def kafka_producer(conf: dict[str, Any]) -> None:
        built.append(conf)
        raise AssertionError(f"a Kafka producer was built with {conf}")

    monkeypatch.setattr(producer_module, "KafkaProducer", kafka_producer)
    return built


# ------------------------------------------------------------------ Config


@pytest.mark.parametrize("kafka, says", NOT_DURABLE)
def test_config_producer_refuses_settings_that_break_txn_durability(kafka, says):
    # Config.producer() renders every producer txnstream makes: the client's, the
    # consumer's pending-ack log, the workers' log, markers and buffer state.
    with pytest.raises(ConfigError) as e:
        Config(kafka=kafka).producer()
    assert says in str(e.value)
    assert "Config.kafka" in str(e.value)  # where it came from


@pytest.mark.parametrize("kafka", DURABLE)
def test_config_producer_accepts_the_spellings_of_acks_all_and_idempotence(kafka):
    conf = Config(kafka=kafka).producer()
    assert conf["enable.idempotence"] in (True, "true", "True")


def test_the_acks_error_says_why_and_what_to_use():
    with pytest.raises(ConfigError, match="acks=0") as e:
        Config(kafka={"acks": 0}).producer()
    assert "every in-sync replica" in str(e.value)
    assert "acks=all" in str(e.value)


def test_the_idempotence_error_says_why_and_what_to_use():
    with pytest.raises(ConfigError, match="enable.idempotence=false") as e:
        Config(kafka={"enable.idempotence": "false"}).producer()
    assert "twice" in str(e.value)
    assert "enable.idempotence=true" in str(e.value)


def test_a_producer_setting_overrides_config_kafka_and_is_named_as_such():
    with pytest.raises(ConfigError, match=r"acks=1 \(given to Config.producer\(\)\)"):
        Config().producer(acks=1)
    # a durable value for this producer replaces a bad shared one
    assert Config(kafka={"acks": 0}).producer(acks="all")["acks"] == "all"


def test_a_consumer_and_an_admin_client_are_not_refused():
    # acks and idempotence are producer settings: librdkafka ignores them elsewhere.
    # (A txnstream consumer's pending-ack producer is refused when it is made.)
    config = Config(kafka={"acks": 0})
    assert config.consumer("g")["acks"] == 0
    assert config.admin()["acks"] == 0


def test_config_keeps_where_its_kafka_settings_came_from_across_copies():
    import pickle

    # Spark ships the Config to executors pickled; the CLI's worker hands it to a child
    shipped = pickle.loads(pickle.dumps(Config(kafka={"acks": "1"}).with_(num_coordinators=2)))
    with pytest.raises(ConfigError, match=r"acks=1 \(in Config.kafka\)"):
        shipped.producer()


def test_the_kafka_config_file_of_the_environment_is_named(tmp_path, monkeypatch):
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=PLAINTEXT\nacks=1\n")
    monkeypatch.setenv("TXNSTREAM_KAFKA_CONFIG", str(props))
    with pytest.raises(ConfigError) as e:
        Config.from_env(BOOT).producer()
    assert "acks=1" in str(e.value)
    assert str(props) in str(e.value) and "TXNSTREAM_KAFKA_CONFIG" in str(e.value)


# ------------------------------------------------------------------ Client


def test_client_settings_acks_0_refused_at_create_producer(no_kafka_producer):
    with Client(BOOT, acks=0) as client, pytest.raises(ConfigError) as e:
        client.create_producer("out")
    assert "acks=0" in str(e.value) and "Client()" in str(e.value)
    assert not no_kafka_producer


def test_client_settings_idempotence_off_refused_at_create_producer(no_kafka_producer):
    with Client(BOOT, acks=0, **{"enable.idempotence": False}) as client, \
            pytest.raises(ConfigError, match=r"acks=0 \(given to Client\(\)\)"):
        client.create_producer("out")
    with Client(BOOT, **{"enable.idempotence": "false"}) as client, \
            pytest.raises(ConfigError, match=r"enable.idempotence=false \(given to Client\(\)\)"):
        client.create_producer("out")
    assert not no_kafka_producer


@pytest.mark.parametrize("kafka, says", NOT_DURABLE)
def test_create_producer_refuses_its_own_settings_naming_them(kafka, says, no_kafka_producer):
    with Client(BOOT) as client, pytest.raises(ConfigError) as e:
        client.create_producer("out", **kafka)
    assert says in str(e.value)
    assert "create_producer('out')" in str(e.value)
    assert not no_kafka_producer


def test_create_producer_with_acks_all_gets_to_the_kafka_producer(no_kafka_producer):
    with Client(BOOT) as client, pytest.raises(AssertionError, match="Kafka producer was built"):
        client.create_producer("out", acks="all", **{"enable.idempotence": "true"})
    assert no_kafka_producer[0]["acks"] == "all"


# ------------------------------------------------------------------ workers


class FakeFactory:
    """Kafka clients of a worker: recorded, never real."""

    def __init__(self) -> None:
        self.made: list[dict[str, Any]] = []

    def consumer(self, conf: dict[str, Any]) -> object:
        self.made.append(conf)
        return object()

    def producer(self, conf: dict[str, Any]) -> object:
        self.made.append(conf)
        return object()

    def admin(self, conf: dict[str, Any]) -> object:
        self.made.append(conf)
        return object()


def test_a_coordinator_worker_refuses_to_write_its_log_with_acks_1():
    factory = FakeFactory()
    with pytest.raises(ConfigError, match=r"acks=1 \(in Config.kafka\)"):
        worker_clients(Config(kafka={"acks": "1"}), "w1", WorkerSettings(), factory)  # type: ignore[arg-type]
    assert not factory.made  # refused before any of its clients is made


# ------------------------------------------------------------------ CLI


def test_cli_produce_refuses_a_kafka_config_file_with_acks_1(tmp_path, capsys,
                                                            no_kafka_producer):
    props = tmp_path / "client.properties"
    props.write_text("acks=1\n")
    code = main(["--bootstrap", BOOT, "--kafka-config", str(props), "produce", "out",
                 "--count", "1", "--txn-size", "1"])
    err = "".join(capsys.readouterr().err.split())  # rich wraps long lines, even a path
    assert code == 2
    assert "acks=1" in err and str(props) in err and "--kafka-config" in err
    assert not no_kafka_producer


def test_cli_produce_refuses_a_kafka_config_file_with_idempotence_off(tmp_path, capsys,
                                                                     no_kafka_producer):
    props = tmp_path / "client.properties"
    props.write_text("enable.idempotence=false\n")
    code = main(["--bootstrap", BOOT, "--kafka-config", str(props), "produce", "out"])
    err = "".join(capsys.readouterr().err.split())  # rich wraps long lines, even a path
    assert code == 2
    assert "enable.idempotence=false" in err and str(props) in err
    assert not no_kafka_producer


# ------------------------------------------------------------------ Spark sink


def sink(**options: str) -> SinkOptions:
    return SinkOptions.parse({"kafka.bootstrap.servers": BOOT, "topic": "out", **options})


@pytest.mark.parametrize("option, value", [
    ("kafka.acks", "0"),
    ("kafka.acks", "1"),
    ("kafka.request.required.acks", "0"),
    ("kafka.topic.acks", "1"),
    ("kafka.enable.idempotence", "false"),
    ("KAFKA.ACKS", "0"),  # Spark hands keys over lower-cased; the sink looks them up so
])
def test_the_sink_refuses_options_that_break_txn_durability(option, value):
    # Checked when the writer is made on the driver (SinkOptions.parse), before any job.
    with pytest.raises(ConfigError) as e:
        sink(**{option: value})
    assert f"option '{option.lower()}'" in str(e.value)
    assert repr(value) in str(e.value)


@pytest.mark.parametrize("options", [
    {}, {"kafka.acks": "all"}, {"kafka.acks": "-1"}, {"kafka.enable.idempotence": "true"},
])
def test_the_sink_accepts_acks_all_and_idempotence_on(options):
    assert sink(**options).config.producer()


def test_the_source_writes_nothing_and_takes_kafka_acks_as_given():
    # The source makes no producer: a shared options map with kafka.acks is not refused.
    opts = SourceOptions.parse({"kafka.bootstrap.servers": BOOT, "subscribe": "in",
                                "kafka.acks": "1"})
    assert opts.config.kafka["acks"] == "1"
