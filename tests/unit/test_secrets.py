"""No secret of a Config reaches a repr, a str, a formatted log line or an error."""

from __future__ import annotations

import logging
import pickle

import pytest

from txnstream.config import Config, load_kafka_properties
from txnstream.errors import ConfigError

SECRETS = {
    "sasl.password": "pw-Sasl-9f1c",
    "ssl.key.password": "pw-Key-77a0",
    "ssl.keystore.password": "pw-Keystore-5b2e",
    "ssl.truststore.password": "pw-Trust-0c3d",
    "sasl.oauthbearer.client.secret": "pw-Oauth-41aa",
    "ssl.key.pem": "-----BEGIN PRIVATE KEY-----pw-Pem-c0de",
    "sasl.jaas.config": 'ScramLoginModule required username="u" password="pw-Jaas-1234";',
}


def _config() -> Config:
    return Config(bootstrap_servers="127.0.0.1:1",
                  kafka={"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-512",
                         "sasl.username": "alice", **SECRETS},
                  tc_secret="pw-Tc-8e8e", tc_tls_keyfile="/keys/pw-Keyfile")


def assert_no_secret(text: str) -> None:
    for value in [*SECRETS.values(), "pw-Tc-8e8e", "pw-Keyfile"]:
        assert value not in text, f"a secret leaked into: {text[:300]}"


def test_repr_and_str_hide_every_secret() -> None:
    cfg = _config()
    for text in (repr(cfg), str(cfg), repr(cfg.kafka), str(cfg.kafka), f"{cfg}",
                 f"{cfg.kafka!r}", repr(cfg.redacted()), repr(cfg.with_(num_coordinators=2))):
        assert_no_secret(text)
    assert "alice" in repr(cfg), "non-secret settings stay readable"
    assert "SCRAM-SHA-512" in repr(cfg)


def test_clients_still_get_the_secrets() -> None:
    cfg = _config()
    for conf in (cfg.producer(), cfg.consumer("g"), cfg.admin(), cfg.common()):
        assert conf["sasl.password"] == SECRETS["sasl.password"]
        assert conf["sasl.username"] == "alice"
    again = pickle.loads(pickle.dumps(cfg))  # the worker's buffer child gets it pickled
    assert again.common()["sasl.password"] == SECRETS["sasl.password"]
    assert_no_secret(repr(again))


def test_log_lines_formatting_a_config_hide_secrets(caplog: pytest.LogCaptureFixture) -> None:
    cfg = _config()
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("txnstream.test").info("config %s / %r / kafka %s", cfg, cfg, cfg.kafka)
    assert caplog.records
    assert_no_secret(caplog.text)


def test_bad_properties_file_error_names_the_line_not_the_value(tmp_path) -> None:
    path = tmp_path / "client.properties"
    path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.password pw-Sasl-9f1c\n")
    with pytest.raises(ConfigError) as err:
        load_kafka_properties(path)
    assert "line 2" in str(err.value) and str(path) in str(err.value)
    assert_no_secret(str(err.value))


def test_properties_file_loads_librdkafka_settings(tmp_path) -> None:
    path = tmp_path / "client.properties"
    path.write_text("# SASL\nsecurity.protocol = SASL_PLAINTEXT\n\nsasl.password=a=b\n")
    assert load_kafka_properties(path) == {"security.protocol": "SASL_PLAINTEXT",
                                           "sasl.password": "a=b"}


def test_from_env_reads_the_properties_file(tmp_path, monkeypatch) -> None:
    path = tmp_path / "client.properties"
    path.write_text("sasl.username=bob\nsasl.password=pw-Sasl-9f1c\n")
    monkeypatch.setenv("TXNSTREAM_KAFKA_CONFIG", str(path))
    cfg = Config.from_env("127.0.0.1:1")
    assert cfg.common()["sasl.username"] == "bob"
    assert_no_secret(repr(cfg))
