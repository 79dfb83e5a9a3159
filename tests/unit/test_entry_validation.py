"""Every entry point validates its values before anything is taken (issue 19 item 5).

No broker: the client's coordinator client and the producer's librdkafka producer are
stand-ins that record what was taken or sent; a refused value leaves them untouched.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace
from typing import Any

import pytest

from txnstream import validate
from txnstream.client import Client
from txnstream.config import Config
from txnstream.errors import ConfigError, TxnStreamError
from txnstream.types import TxnID
from txnstream_spark.options import SinkOptions, SourceOptions, parse_offsets

NAN, INF = math.nan, math.inf
BOOT = {"kafka.bootstrap.servers": "127.0.0.1:1"}


def test_config_error_is_a_txnstream_error_and_a_value_error():
    # except ValueError keeps catching what used to surface as a raw ValueError
    assert issubclass(ConfigError, TxnStreamError)
    assert issubclass(ConfigError, ValueError)


# ------------------------------------------------------------------ validate.py


@pytest.mark.parametrize("value, says", [
    (NAN, "timeout_s must be a finite number of seconds, got nan"),
    (INF, "timeout_s must be a finite number of seconds, got inf"),
    (-INF, "finite"),
    (10**400, "finite"),
    (0, "timeout_s must be a number of seconds > 0, got 0"),
    (-1.5, "> 0"),
    (1e-4, "timeout_s=0.0001 is under the minimum 0.001 s (the coordinator counts whole "
           "milliseconds)"),
    (7200, "timeout_s=7200 is over the maximum 3600 s (Config.max_txn_timeout_s)"),
    (True, "timeout_s must be a number of seconds, got True"),
    (False, "got False"),
    ("30", "timeout_s must be a number of seconds, got '30'"),
    (None, "got None"),
])
def test_timeout_seconds_refuses_and_names_the_argument(value, says):
    with pytest.raises(ConfigError) as err:
        validate.timeout_seconds(value, "timeout_s", maximum=3600,
                                 cap="Config.max_txn_timeout_s")
    assert says in str(err.value)


@pytest.mark.parametrize("value, seconds", [(0.001, 0.001), (1, 1.0), (3600, 3600.0),
                                            (2.5, 2.5)])
def test_timeout_seconds_takes_1_ms_to_the_maximum(value, seconds):
    got = validate.timeout_seconds(value, "timeout_s", maximum=3600)
    assert got == seconds and type(got) is float
    assert int(got * 1000) >= 1  # never 0 ms, which a coordinator reads as its default


def test_timeout_seconds_without_a_cap():
    assert validate.timeout_seconds(1e6, "t", maximum=None) == 1e6


@pytest.mark.parametrize("text, says", [
    ("nan", "must be a number of seconds, got 'nan'"),
    ("inf", "got 'inf'"),
    ("Infinity", "got 'Infinity'"),
    ("1_0", "got '1_0'"),
    ("", "got ''"),
    ("abc", "got 'abc'"),
    ("0", "must be a number of seconds > 0, got '0'"),
    ("-5", "> 0, got '-5'"),
    ("0.0001", "='0.0001' is under the minimum 0.001 s"),
    ("7200", "='7200' is over the maximum 3600 s"),
    ("1e999", "finite"),
])
def test_seconds_text_refuses_and_names_the_option(text, says):
    with pytest.raises(ConfigError) as err:
        validate.seconds_text(text, "option 'x'", maximum=3600)
    assert str(err.value).startswith("option 'x'")
    assert says in str(err.value)


@pytest.mark.parametrize("text, seconds", [("120", 120.0), (" 7 ", 7.0), ("1e3", 1000.0),
                                           (".5", 0.5), ("0.001", 0.001)])
def test_seconds_text_takes_decimal_numbers(text, seconds):
    assert validate.seconds_text(text, "option 'x'", maximum=3600) == seconds


@pytest.mark.parametrize("value, says", [
    (True, "partition must be a whole number (an int, not a bool), got True"),
    (False, "not a bool"),
    (-1, "partition must be a whole number >= 0, got -1"),
    (2**31, "partition=2147483648 is over the maximum 2147483647"),
    (1.0, "partition must be a whole number (an int), got 1.0"),
    ("1", "got '1'"),
    (None, "got None"),
])
def test_partition_index_refuses(value, says):
    with pytest.raises(ConfigError) as err:
        validate.partition_index(value, "partition")
    assert says in str(err.value)


def test_partition_index_takes_ints_and_numpy_ints():
    np = pytest.importorskip("numpy")
    assert validate.partition_index(0, "p") == 0
    assert validate.partition_index(2**31 - 1, "p") == 2**31 - 1
    got = validate.partition_index(np.int64(3), "p")
    assert got == 3 and type(got) is int


@pytest.mark.parametrize("value, says", [
    (0, "n must be a whole number >= 1, got 0"), (-3, ">= 1"), (True, "not a bool"),
    (2.0, "(an int)"), (11, "n=11 is over the maximum 10"),
])
def test_positive_int_refuses(value, says):
    with pytest.raises(ConfigError) as err:
        validate.positive_int(value, "n", maximum=10)
    assert says in str(err.value)
    assert validate.positive_int(10, "n", maximum=10) == 10


@pytest.mark.parametrize("text", ["nan", "0", "-5", "1.5", "1e3", "1_000", "", "abc",
                                  "\u0663", "9" * 40, "9223372036854775808"])
def test_whole_number_text_refuses(text):
    with pytest.raises(ConfigError) as err:
        validate.whole_number_text(text, "option 'maxRecordsPerTrigger'")
    assert str(err.value) == (f"option 'maxRecordsPerTrigger' must be a whole number >= 1, "
                              f"got {text!r}")


@pytest.mark.parametrize("value, says", [
    ("abc", "txn_id='abc' is not a TxnID: expected its text form '(most,least)', e.g. "
            "'(0,42)'"),
    ("(70000,1)", "txn_id='(70000,1)' is not a TxnID: TxnID most_bits (TC id) must be in "
                  "0..65535: 70000"),
    ("(0,99999999999999999999)", "least_bits"),
    ("(0," + "9" * 40 + ")", "expected its text form"),
    ("(\u0661,2)", "expected its text form"),  # non-ASCII digits
    (42, "txn_id must be a TxnID or its text form like '(0,42)', got 42"),
    (None, "got None"),
])
def test_txn_id_refuses_and_names_the_argument(value, says):
    with pytest.raises(ConfigError) as err:
        validate.txn_id(value, "txn_id")
    assert says in str(err.value)


def test_txn_id_takes_both_text_forms_and_a_txn_id():
    assert validate.txn_id("(0,42)", "t") == TxnID(0, 42)
    assert validate.txn_id(" ( 3 , 7 ) ", "t") == TxnID(3, 7)
    assert validate.txn_id("3:7", "t") == TxnID(3, 7)
    assert validate.txn_id(TxnID(1, 2), "t") == TxnID(1, 2)


def test_flag_and_nonempty_text():
    assert validate.flag(False, "commit") is False
    with pytest.raises(ConfigError, match="commit must be True or False, got 'false'"):
        validate.flag("false", "commit")
    assert validate.nonempty_text("k", "group_key") == "k"
    for bad in ("", None, b"k"):
        with pytest.raises(ConfigError, match="group_key must be a non-empty string"):
            validate.nonempty_text(bad, "group_key")


def test_long_values_are_cut_short_in_messages():
    with pytest.raises(ConfigError) as err:
        validate.txn_id("x" * 10_000, "txn_id")
    assert len(str(err.value)) < 200


# ------------------------------------------------------------------ Client


class Taken(Exception):
    """The stand-in coordinator client was asked for something: validation had passed."""


class RecordingTc:
    """A coordinator client that records every TxnID taken and request sent, then stops."""

    num_coordinators = 4

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.txn_ids = SimpleNamespace(take=self._take)

    def _take(self) -> tuple[int, int]:
        self.calls.append(("take",))
        raise Taken("take")

    def request(self, op: Any, tc_id: int, **fields: Any) -> Any:
        self.calls.append((op, tc_id, fields))
        raise Taken(str(op))

    def pick_coordinator(self) -> int:
        return 0

    def close(self) -> None:
        pass


@pytest.fixture
def client():
    c = Client(config=Config(bootstrap_servers="127.0.0.1:1"))
    c._tc = RecordingTc()
    yield c
    c.close()


BAD_TXN_TIMEOUTS = [NAN, INF, -INF, 0, -1, 1e-4, 0.0009, 7200, 3600.5, True, False, "60",
                    10**400]


@pytest.mark.parametrize("timeout", BAD_TXN_TIMEOUTS)
def test_new_transaction_refuses_a_bad_timeout_before_a_txn_id_is_taken(client, timeout):
    with pytest.raises(ConfigError, match=r"^timeout_s"):
        client.new_transaction(timeout_s=timeout)
    assert client._tc.calls == []


@pytest.mark.parametrize("timeout", BAD_TXN_TIMEOUTS)
def test_transaction_refuses_a_bad_timeout_before_a_txn_id_is_taken(client, timeout):
    with pytest.raises(ConfigError, match=r"^timeout_s"):
        with client.transaction(timeout_s=timeout):
            pytest.fail("the body must not run")
    assert client._tc.calls == []


@pytest.mark.parametrize("kwargs", [{"tc_id": 1}, {"group_key": "q/1"}])
@pytest.mark.parametrize("timeout", [NAN, 1e-4, 7200, True])
def test_new_transaction_on_a_named_tc_refuses_a_bad_timeout_before_asking(client, kwargs,
                                                                           timeout):
    with pytest.raises(ConfigError, match=r"^timeout_s"):
        client.new_transaction(timeout_s=timeout, **kwargs)
    assert client._tc.calls == []


def test_the_timeout_cap_is_the_configs_and_named(client):
    with pytest.raises(ConfigError) as err:
        client.new_transaction(timeout_s=7200)
    assert str(err.value) == ("timeout_s=7200 is over the maximum 3600 s "
                              "(Config.max_txn_timeout_s)")
    client.config = client.config.with_(max_txn_timeout_s=7200.0)
    with pytest.raises(Taken):  # accepted: a TxnID is taken
        client.new_transaction(timeout_s=7200)


@pytest.mark.parametrize("timeout", [None, 0.001, 1, 30.5, 3600])
def test_new_transaction_takes_a_txn_id_for_a_good_timeout(client, timeout):
    with pytest.raises(Taken):
        client.new_transaction(timeout_s=timeout)
    assert client._tc.calls == [("take",)]


def test_new_transaction_sends_whole_ms_of_at_least_one(client):
    with pytest.raises(Taken):
        client.new_transaction(timeout_s=0.001, tc_id=2)
    (_, tc_id, fields), = client._tc.calls
    assert tc_id == 2 and fields["timeout_ms"] == 1


@pytest.mark.parametrize("kwargs, says", [
    ({"tc_id": True}, "tc_id must be a whole number (an int, not a bool)"),
    ({"tc_id": -1}, "tc_id must be a whole number >= 0"),
    ({"tc_id": 1.0}, "tc_id must be a whole number (an int)"),
    ({"group_key": ""}, "group_key must be a non-empty string"),
    ({"group_key": 7}, "group_key must be a non-empty string"),
])
def test_new_transaction_refuses_a_bad_tc_id_or_group_key(client, kwargs, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        client.new_transaction(timeout_s=10, **kwargs)
    assert client._tc.calls == []


@pytest.mark.parametrize("text", ["abc", "(0,42", "(70000,1)", "", 42])
def test_attach_and_abort_refuse_a_bad_txn_id_before_asking(client, text):
    with pytest.raises(ConfigError, match=r"^txn_id"):
        client.attach_transaction(text)
    with pytest.raises(ConfigError, match=r"^txn_id"):
        client.abort_transaction(text)
    assert client._tc.calls == []


@pytest.mark.parametrize("timeout", [NAN, INF, 0, -1, True, 1e9])
def test_abort_and_end_group_refuse_a_bad_request_timeout(client, timeout):
    with pytest.raises(ConfigError, match=r"^timeout_s"):
        client.abort_transaction("(0,1)", timeout_s=timeout)
    with pytest.raises(ConfigError, match=r"^timeout_s"):
        client.end_group(0, "q/1", [1, 2], timeout_s=timeout)
    assert client._tc.calls == []


@pytest.mark.parametrize("args, kwargs, says", [
    ((0, "q/1", [1, "2"]), {}, r"txn_seqs\[1\] must be a whole number"),
    ((0, "q/1", [1, True]), {}, r"txn_seqs\[1\] must be a whole number \(an int, not a bool"),
    ((0, "q/1", [-1]), {}, r"txn_seqs\[0\] must be a whole number >= 0"),
    ((0, "q/1", "12"), {}, "txn_seqs must be a sequence of ints"),
    ((0, "", [1]), {}, "group_key must be a non-empty string"),
    ((True, "q/1", [1]), {}, "tc_id must be a whole number"),
    ((0, "q/1", [1]), {"commit": "false"}, "commit must be True or False, got 'false'"),
])
def test_end_group_refuses_bad_values_before_asking(client, args, kwargs, says):
    with pytest.raises(ConfigError, match=says):
        client.end_group(*args, **kwargs)
    assert client._tc.calls == []


def test_good_values_reach_the_coordinator(client):
    with pytest.raises(Taken):
        client.attach_transaction("(1,5)")
    with pytest.raises(Taken):
        client.abort_transaction(TxnID(2, 6), timeout_s=5)
    with pytest.raises(Taken):
        client.end_group(3, "q/1", [7, 8], commit=False, timeout_s=5)
    assert [c[1] for c in client._tc.calls] == [1, 2, 3]
    assert client._tc.calls[2][2]["group_seqs"] == (7, 8)


# ------------------------------------------------------------------ Producer


class FakeKafkaProducer:
    """confluent-kafka's Producer, for a topic of 3 partitions; records produce calls."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.produced: list[dict[str, Any]] = []

    def list_topics(self, topic: str, timeout: float) -> Any:
        t = SimpleNamespace(error=None, partitions={0: None, 1: None, 2: None})
        return SimpleNamespace(topics={topic: t})

    def produce(self, topic: str, value: Any, key: Any = None, **kw: Any) -> None:
        self.produced.append({"value": value, **kw})

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0


class FakeTxn:
    """A transaction that records the partitions registered with it."""

    def __init__(self) -> None:
        self.id = TxnID(0, 1)
        self.key = None
        from txnstream.fate import DeliveredOffsets

        self.delivered = DeliveredOffsets()
        self.registered: list[Any] = []

    def register_partitions(self, tps: Any) -> None:
        self.registered.extend(tps)

    def sending(self, n: int = 1) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def add_flusher(self, fn: Any, key: Any = None) -> None:
        pass

    def mark_abort_only(self, exc: BaseException) -> None:
        pass


@pytest.fixture
def producer(monkeypatch):
    import txnstream.producer as prod

    monkeypatch.setattr(prod, "KafkaProducer", FakeKafkaProducer)
    return prod.Producer(Config(bootstrap_servers="127.0.0.1:1"), "out")


@pytest.mark.parametrize("partition, says", [
    (True, "partition must be a whole number (an int, not a bool), got True"),
    (False, "not a bool"),
    (-1, "partition must be a whole number >= 0, got -1"),
    (1.0, "partition must be a whole number (an int), got 1.0"),
    ("1", "got '1'"),
    (3, "partition 3 does not exist: out has 3 (0..2)"),
    (2**40, "over the maximum 2147483647"),
])
def test_send_refuses_a_bad_partition_before_anything_is_sent(producer, partition, says):
    txn = FakeTxn()
    for t in (None, txn):
        with pytest.raises(ConfigError) as err:
            producer.send(b"v", partition=partition, txn=t)
        assert says in str(err.value)
    assert producer._kafka.produced == [] and txn.registered == []


def test_send_takes_a_good_partition(producer):
    assert producer.send(b"v", partition=2) == 2
    assert producer._kafka.produced[0]["partition"] == 2


@pytest.mark.parametrize("partitions, says", [
    ([0, True], r"partitions\[1\] must be a whole number \(an int, not a bool\), got True"),
    ([0, -1], r"partitions\[1\] must be a whole number >= 0, got -1"),
    ([1.5], r"partitions\[0\] must be a whole number \(an int\), got 1.5"),
    ([0, None], r"partitions\[1\] must be a whole number \(an int\), got None"),
    ([0, 3], "partition 3 does not exist: out has 3"),
    (b"\x00\x01", "partitions must be a sequence of ints"),
])
def test_send_batch_refuses_bad_partitions_before_registering(producer, partitions, says):
    txn = FakeTxn()
    with pytest.raises(ConfigError, match=says):
        producer.send_batch([b"v"] * len(partitions), partitions, txn)
    assert txn.registered == [] and producer._kafka.produced == []


def test_send_batch_takes_ints_and_numpy_ints(producer):
    np = pytest.importorskip("numpy")
    txn = FakeTxn()
    producer.send_batch([b"a", b"b", b"c"], [0, 2, 2], txn)
    producer.send_batch([b"d"], [np.int64(1)], txn)
    assert [tp.partition for tp in txn.registered] == [0, 2, 1]
    assert all(type(tp.partition) is int for tp in txn.registered)
    assert [p["partition"] for p in producer._kafka.produced] == [0, 2, 2, 1]


# ------------------------------------------------------------------ Spark options


def sink(**options: str) -> SinkOptions:
    return SinkOptions.parse({**BOOT, "topic": "out", **options})


def source(**options: str) -> SourceOptions:
    return SourceOptions.parse({**BOOT, "subscribe": "in", **options})


@pytest.mark.parametrize("text, says", [
    ("nan", "must be a number of seconds, got 'nan'"),
    ("NaN", "got 'NaN'"),
    ("inf", "got 'inf'"),
    ("-inf", "got '-inf'"),
    ("0", "must be a number of seconds > 0, got '0'"),
    ("-30", "> 0, got '-30'"),
    ("0.0001", "is under the minimum 0.001 s"),
    ("7200", "='7200' is over the maximum 3600 s"),
    ("", "got ''"),
    ("2 minutes", "got '2 minutes'"),
])
def test_sink_timeout_option_is_validated_and_named(text, says):
    with pytest.raises(ConfigError) as err:
        sink(**{"txnstream.txnTimeoutSeconds": text})
    assert str(err.value).startswith("option 'txnstream.txnTimeoutSeconds'")
    assert says in str(err.value)


def test_sink_timeout_option_default_and_case():
    assert sink().txn_timeout_s == 120.0
    assert sink(**{"txnstream.txntimeoutseconds": "7"}).txn_timeout_s == 7.0
    assert sink(**{"txnstream.txnTimeoutSeconds": "3600"}).txn_timeout_s == 3600.0


@pytest.mark.parametrize("text", ["nan", "0", "-5", "1.5", "1e3", "1_000", "", "inf",
                                  "99999999999999999999"])
def test_max_records_per_trigger_is_a_whole_number_of_at_least_one(text):
    with pytest.raises(ConfigError) as err:
        source(maxRecordsPerTrigger=text)
    assert str(err.value) == (f"option 'maxRecordsPerTrigger' must be a whole number >= 1, "
                              f"got {text!r}")


def test_max_records_per_trigger_taken():
    assert source(maxRecordsPerTrigger="100").max_records_per_trigger == 100
    assert source(maxrecordspertrigger=" 5 ").max_records_per_trigger == 5
    assert source().max_records_per_trigger is None


@pytest.mark.parametrize("text, says", [
    ('{"t": {"-1": 0}}', "option 'startingOffsets': a partition of 't' must be a whole number "
                         "in 0..2147483647, got '-1'"),
    ('{"t": {"x": 0}}', "got 'x'"),
    ('{"t": {"1.5": 0}}', "got '1.5'"),
    ('{"t": {"2147483648": 0}}', "got '2147483648'"),
    ('{"t": {"0": -3}}', "option 'startingOffsets': the offset of t-0 must be a whole number "
                         ">= -2, got -3"),  # -2: earliest, -1: latest, as Kafka's
    ('{"t": {"0": 1.5}}', "the offset of t-0 must be a whole number (an int), got 1.5"),
    ('{"t": {"0": NaN}}', "got nan"),
    ('{"t": {"0": true}}', "not a bool"),
    ('{"t": {"0": "12"}}', "got '12'"),
    ('{"t": {"1": 0, "01": 5}}', "partition 1 of 't' is given twice"),
    ('{"t": [0]}', "topic 't' has [0], not an object of partition: offset"),
    ("[1]", "(not an object)"),
    ("{", "must be 'earliest', 'latest' or JSON"),
])
def test_offsets_json_is_validated_and_named(text, says):
    with pytest.raises(ConfigError) as err:
        parse_offsets("startingOffsets", text)
    assert says in str(err.value)
    with pytest.raises(ConfigError, match="option 'endingOffsets'"):
        source(endingOffsets=text)


def test_offsets_json_taken_with_canonical_partitions():
    assert parse_offsets("startingOffsets", '{"t": {"0": 12, "07": 0}, "u": {}}') == \
        {"t": {"0": 12, "7": 0}, "u": {}}
    assert parse_offsets("startingOffsets", None) == "earliest"
    assert parse_offsets("startingOffsets", "latest") == "latest"


# ------------------------------------------------------------------ the line's options


SECRET = "pw-Line-3c9d"


@pytest.mark.parametrize("parse", [sink, source])
def test_tc_options_reach_the_config(parse, tmp_path):
    opts = parse(**{"tc.principal": "spark-job", "tc.secret": SECRET,
                    "tc.tls.cafile": "/ca.pem", "tc.tls.certfile": "/c.pem",
                    "tc.tls.keyfile": "/k.pem"})
    c = opts.config
    assert (c.tc_principal, c.tc_secret, c.tc_tls_cafile, c.tc_tls_certfile,
            c.tc_tls_keyfile) == ("spark-job", SECRET, "/ca.pem", "/c.pem", "/k.pem")
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    assert parse(**{"tc.secretFile": str(secret_file)}).config.tc_secret == SECRET
    assert parse(**{"tc.secretfile": str(secret_file)}).config.tc_secret == SECRET  # as Spark
    assert parse().config.tc_secret is None and parse().config.tc_principal == "txnstream"


def test_tc_secret_never_shows_in_a_repr_or_an_error(tmp_path):
    opts = sink(**{"tc.secret": SECRET, "tc.tls.keyfile": "/keys/pw-Keyfile"})
    for text in (repr(opts), str(opts), repr(opts.config), f"{opts}"):
        assert SECRET not in text and "pw-Keyfile" not in text
    empty = tmp_path / "empty"
    empty.write_text("\n")
    errors = []
    for bad in ({"tc.secret": SECRET, "tc.secretFile": str(empty)},
                {"tc.secretFile": str(empty)},
                {"tc.secretFile": str(tmp_path / "missing")},
                {"tc.secret": SECRET, "tc.principal": "no spaces"},
                {"tc.secret": SECRET, "tc.secrett": SECRET},
                {"tc.secret": ""}):
        with pytest.raises(ConfigError) as err:
            sink(**bad)
        errors.append(str(err.value))
        assert SECRET not in str(err.value)
    assert errors[0] == "give one of the options 'tc.secret' and 'tc.secretFile', not both"
    assert errors[1].startswith("option 'tc.secretFile': ") and "is empty" in errors[1]
    assert errors[2].startswith("option 'tc.secretFile': cannot read")
    assert errors[3].startswith("option 'tc.principal': 'no spaces' is not a principal")
    assert errors[4].startswith("unknown option 'tc.secrett'")
    assert errors[5] == "option 'tc.secret' is empty"


def test_sink_clients_are_cached_per_secret_too():
    pytest.importorskip("pyspark")
    from txnstream_spark import sink as src

    a, b = sink(**{"tc.secret": "one"}).config, sink(**{"tc.secret": "two"}).config
    assert repr(a) == repr(b)  # repr hides the secret: not a cache key
    assert src._client_key(a) != src._client_key(b)
    assert src._client_key(a) == src._client_key(sink(**{"tc.secret": "one"}).config)
    assert "one" not in src._client_key(a)
    pw1 = sink(**{"kafka.sasl.password": "p1"}).config
    pw2 = sink(**{"kafka.sasl.password": "p2"}).config
    assert src._client_key(pw1) != src._client_key(pw2)


def test_the_removed_max_buffered_bytes_is_refused_naming_what_to_use():
    from txnstream.consumer import Consumer

    with pytest.raises(ConfigError, match="max_buffered_bytes was removed.*fetch.max.bytes"):
        Consumer(Config(bootstrap_servers="127.0.0.1:1"), None, "t", "s",  # type: ignore[arg-type]
                 max_buffered_bytes=3_000)


def test_ending_offsets_earliest_is_refused_naming_the_option():
    """Kafka's source: "ending offset can't be earliest for batch queries". It used to be
    accepted here and crash planning with AttributeError."""
    with pytest.raises(ConfigError) as err:
        source(endingOffsets="earliest")
    assert str(err.value).startswith("option 'endingOffsets' must be 'latest' or JSON")


@pytest.mark.parametrize("bad", [Config("127.0.0.1:1"), 9092, b"127.0.0.1:9092"])
def test_client_refuses_a_bootstrap_that_is_not_a_host_list(bad):
    # Client(Config(...)) used to make a client whose every request failed 15 s later
    # with librdkafka's "Broker transport failure" (the Config's repr as bootstrap)
    with pytest.raises(ConfigError, match="bootstrap_servers") as err:
        Client(bad)
    if isinstance(bad, Config):
        assert "config=" in str(err.value)
