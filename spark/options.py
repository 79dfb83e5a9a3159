"""Options of the ``txnstream`` Spark data source, parsed once, with errors that name them.

Every option is checked here, on the driver, before a query takes anything: numbers are
whole or finite and in range, offsets JSON holds partitions and offsets. The coordinator
line's credentials (``tc.*``, see :data:`TC_OPTIONS`) go into the :class:`Config` the
driver ships to the executors; a secret never shows in a repr (``Config`` hides it) or in
an error (they name the option, never its value). Where Spark shows a source's options,
it masks those whose name matches ``spark.redaction.regex`` (by default any holding
``secret``); ``tc.secretFile`` keeps the secret out of the options altogether.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from txnstream.config import (
    Config,
    KafkaSettings,
    TopicNames,
    check_principal,
    read_secret_file,
    txn_producer_problem,
)
from txnstream.errors import ConfigError
from txnstream.types import TopicPartition
from txnstream.validate import (
    MAX_LONG,
    MAX_PARTITION,
    seconds_text,
    whole_number,
    whole_number_text,
)

__all__ = ["EARLIEST", "LATEST", "Offsets", "SourceOptions", "SinkOptions", "TC_OPTIONS",
           "Timestamps", "UNSUPPORTED", "named_offsets", "parse_offsets", "parse_time_ms"]

log = logging.getLogger(__name__)

Offsets = dict[str, dict[str, int]]
"""Offsets as JSON holds them: ``{"topic": {"0": 12}}`` (a partition as text)."""

BOOTSTRAP = "kafka.bootstrap.servers"
TXN_TIMEOUT = "txnstream.txnTimeoutSeconds"
DEFAULT_TXN_TIMEOUT = "120"
TC_OPTIONS = {
    "tc.principal": "tc_principal",
    "tc.secret": "tc_secret",
    "tc.secretFile": "tc_secret",
    "tc.tls.cafile": "tc_tls_cafile",
    "tc.tls.certfile": "tc_tls_certfile",
    "tc.tls.keyfile": "tc_tls_keyfile",
}
"""The coordinator line's options (both sides) -> the :class:`Config` field each sets.

``tc.secretFile`` is read on the driver (:func:`read_secret_file`), so only the driver
needs the file; the TLS files are opened where a client connects, so every executor
needs them at the same path."""


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    """Spark hands options over case-insensitively (lower-cased keys): look them up so."""
    return {k.lower(): v for k, v in options.items()}


def _config(options: Mapping[str, str]) -> Config:
    options = _lower(options)
    boot = options.get(BOOTSTRAP)
    if not boot:
        raise ConfigError(f"option '{BOOTSTRAP}' is required: the Kafka brokers, "
                          "e.g. .option('kafka.bootstrap.servers', 'host:9092')")
    kafka = {k[len("kafka."):]: v for k, v in options.items()
             if k.startswith("kafka.") and k != BOOTSTRAP}
    prefix = options.get("txnstream.prefix")
    return Config(bootstrap_servers=boot, topics=TopicNames(prefix) if prefix else TopicNames(),
                  kafka=KafkaSettings(kafka, origin="from the options kafka.*"),
                  **_line(options))


def _line(options: Mapping[str, str]) -> dict[str, Any]:
    """Config fields of the coordinator line from the ``tc.*`` options (lower-cased keys).

    Errors name the option and never show a secret.
    """
    known = {k.lower(): k for k in TC_OPTIONS}
    for key in options:
        if key.startswith("tc.") and key not in known:
            raise ConfigError(f"unknown option {key!r}: the coordinator line's options are "
                              f"{', '.join(TC_OPTIONS)}")
    if "tc.secret" in options and "tc.secretfile" in options:
        raise ConfigError("give one of the options 'tc.secret' and 'tc.secretFile', not both")
    fields: dict[str, Any] = {}
    for key, name in known.items():
        value = options.get(key)
        if value is None:
            continue
        if not value.strip():
            raise ConfigError(f"option '{name}' is empty")
        if name == "tc.principal":
            value = check_principal(value, f"option '{name}'")
        elif name == "tc.secretFile":
            value = read_secret_file(value, f"option '{name}'")
        fields[TC_OPTIONS[name]] = value
    return fields


EARLIEST = -2
"""In offsets JSON: the partition's log start (Kafka's ``-2``)."""
LATEST = -1
"""In offsets JSON: the partition's committed end (Kafka's ``-1``)."""

KAFKA_TEXT = "for batch queries on Kafka"
"""The tail of Kafka's source errors this source repeats word for word."""

SOURCE_OPTIONS = ("subscribe", "startingOffsets", "endingOffsets", "startingTimestamp",
                  "endingTimestamp", "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
                  "startingOffsetsByTimestampStrategy", "maxOffsetsPerTrigger",
                  "maxRecordsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
                  "valueSchema", "includeHeaders", "failOnDataLoss", "txnstream.prefix")
"""The source's own options (besides ``kafka.*`` and ``tc.*``)."""

DEFAULT_MAX_TRIGGER_DELAY = "15m"
"""``maxTriggerDelay``'s default, as Kafka's source has it."""

UNSUPPORTED = {
    "assign": "every partition of the topics named by 'subscribe' is read",
    "subscribePattern": "name the topics with 'subscribe'",
    "groupIdPrefix": "the source uses no consumer group (offsets live in Spark's checkpoint)",
    "kafka.group.id": "the source uses no consumer group (offsets live in Spark's checkpoint)",
    "fetchOffset.numRetries": "the source reads offsets from the served buffer state",
    "fetchOffset.retryIntervalMs": "the source reads offsets from the served buffer state",
    "kafkaConsumer.pollTimeoutMs": "tasks use a fixed poll timeout",
    "kafka.auto.offset.reset": "set 'startingOffsets' (Kafka's source refuses it too)",
    "kafka.enable.auto.commit": "offsets live in Spark's checkpoint (Kafka's source refuses "
                                "it too)",
    "kafka.key.deserializer": "keys are bytes (Kafka's source refuses it too)",
    "kafka.value.deserializer": "values are bytes, or decoded with 'valueSchema' (Kafka's "
                                "source refuses it too)",
    "kafka.interceptor.classes": "Kafka's source refuses it too",
}
"""Kafka source options the source refuses (never ignores), each with why."""


def _check_source_keys(options: Mapping[str, str]) -> None:
    """Refuse a Kafka source option the source does not support, or an unknown one.

    ``options`` has lower-cased keys (as Spark hands them over); errors name the option
    as Kafka's documentation spells it.
    """
    unsupported = {k.lower(): k for k in UNSUPPORTED}
    own = {k.lower() for k in (*SOURCE_OPTIONS, BOOTSTRAP)}
    for key in options:
        if key in unsupported:
            name = unsupported[key]
            raise ConfigError(f"option '{name}' is not supported by the txnstream source: "
                              f"{UNSUPPORTED[name]}")
        if key not in own and not key.startswith(("kafka.", "tc.")):
            raise ConfigError(f"unknown option '{key}' for the txnstream source: its options "
                              f"are {', '.join(SOURCE_OPTIONS)}, kafka.* and tc.* "
                              "(docs/spark.md)")


def parse_offsets(name: str, text: str | None) -> str | Offsets:
    """``earliest`` | ``latest`` | JSON ``{"topic": {"0": 12}}``; errors name the option.

    In the JSON, a partition is a whole number ``0 .. 2**31 - 1`` (written canonically in
    the result: ``"01"`` is ``"1"``) and an offset a JSON integer ``>= 0``, or Kafka's
    ``-2`` (:data:`EARLIEST`) or ``-1`` (:data:`LATEST`).
    """
    if text is None or text in ("earliest", "latest"):
        return text or "earliest"
    return _partition_json(name, text, "offset", EARLIEST,
                           "'earliest', 'latest' or JSON like '{\"topic\": {\"0\": 12}}'")


def _partition_json(name: str, text: str, what: str, minimum: int, shape: str) -> Offsets:
    """JSON ``{"topic": {"0": n}}`` with each ``n`` a whole number ``>= minimum``."""
    rule = f"option '{name}' must be {shape}"
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{rule}; got {text!r:.80} ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{rule}; got {text!r:.80} (not an object)")
    out: Offsets = {}
    for topic, parts in value.items():
        if not isinstance(parts, dict):
            raise ConfigError(f"{rule}; topic {topic!r} has {parts!r:.40}, not an object of "
                              f"partition: {what}")
        offsets = out.setdefault(topic, {})
        for part, n in parts.items():
            p = whole_number_text(part, f"option '{name}': a partition of {topic!r}",
                                  minimum=0, maximum=MAX_PARTITION)
            if str(p) in offsets:
                raise ConfigError(f"option '{name}': partition {p} of {topic!r} is given twice")
            offsets[str(p)] = whole_number(n, f"option '{name}': the {what} of {topic}-{p}",
                                           minimum=minimum, maximum=MAX_LONG)
    return out


@dataclass(frozen=True)
class Timestamps:
    """Offsets given by time, as Kafka's ``*Timestamp`` and ``*OffsetsByTimestamp`` options.

    Each partition's offset is the first whose record time (ms since the epoch) is at or
    after the partition's time. Where no record is that late: a start fails (Kafka's
    ``startingOffsetsByTimestampStrategy=error``) or is the partition's latest
    (``latest``); an end is always the latest.
    """

    option: str
    """The option that gave them, as Kafka spells it (errors name it)."""
    at: int | Offsets
    """One time for every partition (``startingTimestamp``), or a time per partition."""
    no_match_latest: bool
    """No record late enough: the partition's latest (True) or an error (False)."""

    def time_of(self, topic: str, partition: int) -> int | None:
        """The time given for a partition; None if the per-partition JSON leaves it out."""
        if isinstance(self.at, int):
            return self.at
        return self.at.get(topic, {}).get(str(partition))

    def resolve(self, topics: Sequence[str], tps: Sequence[TopicPartition],
                offsets_for_times: Callable[[dict[TopicPartition, int]],
                                            dict[TopicPartition, int]]
                ) -> dict[TopicPartition, int]:
        """Each partition's first offset at or after its time, as Kafka's source finds it.

        ``offsets_for_times``: the broker's answer (Kafka's ListOffsets by time, -1
        where no record is that late). The offset is the log's (a marker's or an aborted
        record's too): a range from it delivers the committed records from there on. No
        record that late: the partition's :data:`LATEST` (an end, or a start under
        ``startingOffsetsByTimestampStrategy=latest``), else Kafka's error.
        """
        if isinstance(self.at, dict):
            named_offsets(self.at, self.option, topics, tps, by_time=True)
        times = {tp: t for tp in tps if (t := self.time_of(tp.topic, tp.partition))
                 is not None}
        found = offsets_for_times(times)
        out: dict[TopicPartition, int] = {}
        for tp, at in times.items():
            offset = found.get(tp, -1)
            if offset < 0 and not self.no_match_latest:
                raise ConfigError(
                    f"option '{self.option}': No offset matched from request of "
                    f"topic-partition {tp} and timestamp {at}. (set "
                    "'startingOffsetsByTimestampStrategy' to 'latest' to start such "
                    "partitions at their latest offset)")
            out[tp] = offset if offset >= 0 else LATEST
        return out


_TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000,
                  "h": 3_600_000, "d": 86_400_000}
_TIME_TEXT = re.compile(r"([0-9]{1,18})\s*([a-z]+)?")


def parse_time_ms(text: str, name: str) -> int:
    """A duration as Spark writes one (``15m``, ``30s``, ``500ms``; no unit: ms), > 0 ms."""
    m = _TIME_TEXT.fullmatch(text.strip().lower())
    if m is None or (m.group(2) or "ms") not in _TIME_UNITS_MS:
        raise ConfigError(f"option '{name}' must be a duration such as '15m', '30s' or "
                          f"'500ms' (units {', '.join(_TIME_UNITS_MS)}), got {text!r:.40}")
    ms = int(int(m.group(1)) * _TIME_UNITS_MS[m.group(2) or "ms"])
    if ms <= 0:
        raise ConfigError(f"option '{name}' must be longer than 0 ms, got {text!r:.40}")
    return ms


def _timestamps(options: Mapping[str, str], one: str, per_partition: str,
                no_match_latest: bool) -> Timestamps | None:
    """The start (or end) by time; None if neither option is given.

    Kafka's order of preference: ``one`` (a time for every partition), then
    ``per_partition`` (JSON).
    """
    if (text := options.get(one.lower())) is not None:
        at = whole_number_text(text, f"option '{one}' (ms since the epoch)", minimum=0)
        return Timestamps(one, at, no_match_latest)
    if (text := options.get(per_partition.lower())) is not None:
        return Timestamps(per_partition, _partition_json(
            per_partition, text, "timestamp", 0,
            "JSON of times in ms since the epoch, like '{\"topic\": {\"0\": 1700000000000}}'"),
            no_match_latest)
    return None


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    """A ``true``/``false`` option (any case), as Kafka's source reads them."""
    text = options.get(name.lower())
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise ConfigError(f"option '{name}' must be 'true' or 'false', got {text!r:.40}")
    return text.strip().lower() == "true"


@dataclass(frozen=True)
class SourceOptions:
    """What ``spark.read(Stream).format("txnstream")`` was given."""

    config: Config
    topics: tuple[str, ...]
    starting: str | Offsets | Timestamps
    """``earliest``, ``latest``, offsets (-2: earliest, -1: latest) or times."""
    ending: str | Offsets | Timestamps
    """``latest``, offsets (-1: latest) or times."""
    max_records_per_trigger: int | None
    """``maxOffsetsPerTrigger`` (or its alias ``maxRecordsPerTrigger``)."""
    value_schema: str | None = None
    """The ``valueSchema`` option as given (see :mod:`txnstream_spark.avro`); None: raw bytes."""
    ending_given: str | None = None
    """The ending option given, if any (a stream refuses it, as Kafka's does)."""
    fail_on_data_loss: bool = True
    """``failOnDataLoss``: records deleted before they were read fail the query (True) or
    are skipped with a warning naming them (False), as in Kafka's source."""
    min_offsets_per_trigger: int | None = None
    """``minOffsetsPerTrigger``: a micro-batch waits for this many new offsets, or for
    ``max_trigger_delay_ms`` since the last one (Kafka's admission control)."""
    max_trigger_delay_ms: int = 15 * 60_000
    """``maxTriggerDelay`` (default 15 minutes, as Kafka's)."""
    trigger_options: tuple[str, ...] = ()
    """The micro-batch size options given (a batch read warns that it ignores them)."""

    @classmethod
    def parse(cls, options: Mapping[str, str], stream: bool = False) -> SourceOptions:
        """Validate the options; ``ConfigError`` names the one at fault.

        Without ``startingOffsets`` a stream starts at the latest offsets and a batch read
        at the earliest, as Kafka's source does.
        """
        _check_source_keys(_lower(options))
        config = _config(options)
        options = _lower(options)
        topics = tuple(t.strip() for t in (options.get("subscribe") or "").split(",") if t.strip())
        if not topics:
            raise ConfigError("option 'subscribe' is required: comma-separated topic names")
        if "maxoffsetspertrigger" in options and "maxrecordspertrigger" in options:
            raise ConfigError("give one of the options 'maxOffsetsPerTrigger' and "
                              "'maxRecordsPerTrigger' (its alias), not both")
        limit = None
        for name in ("maxOffsetsPerTrigger", "maxRecordsPerTrigger"):
            if (text := options.get(name.lower())) is not None:
                limit = whole_number_text(text, f"option '{name}'", minimum=1, maximum=MAX_LONG)
        least = None
        if (text := options.get("minoffsetspertrigger")) is not None:
            least = whole_number_text(text, "option 'minOffsetsPerTrigger'", minimum=1)
            if limit is not None and least > limit:  # Kafka's words
                raise ConfigError(f"option 'minOffsetsPerTrigger': The value of "
                                  f"minOffsetPerTrigger({least}) is higher than the "
                                  f"maxOffsetsPerTrigger({limit}).")
        delay = parse_time_ms(options.get("maxtriggerdelay", DEFAULT_MAX_TRIGGER_DELAY),
                              "maxTriggerDelay")
        isolation = options.get("kafka.isolation.level")
        if isolation is not None and isolation.strip() != "read_committed":
            raise ConfigError("option 'kafka.isolation.level' can only be 'read_committed': "
                              "the source reads committed records only, always")
        if not _flag(options, "includeHeaders", True):
            raise ConfigError("option 'includeHeaders' can only be 'true': the source always "
                              "has a headers column (drop it with .drop('headers'))")
        value_schema = options.get("valueschema")
        if value_schema is not None:
            from .avro import load_value_schema

            load_value_schema(value_schema)  # fail here, naming the option
        strategy = options.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
        if strategy not in ("error", "latest"):
            raise ConfigError("option 'startingOffsetsByTimestampStrategy' must be 'error' or "
                              f"'latest', got {strategy!r:.40}")
        starting = _timestamps(options, "startingTimestamp", "startingOffsetsByTimestamp",
                               strategy == "latest") \
            or parse_offsets("startingOffsets", options.get("startingoffsets")
                             or ("latest" if stream else "earliest"))
        ending = _timestamps(options, "endingTimestamp", "endingOffsetsByTimestamp", True) \
            or parse_offsets("endingOffsets", options.get("endingoffsets") or "latest")
        if ending == "earliest":  # Kafka's words; it crashed planning here once
            raise ConfigError("option 'endingOffsets' must be 'latest' or JSON offsets: "
                              f"ending offset can't be earliest {KAFKA_TEXT}")
        _check_times(starting, ending)
        given = [k for k in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
                 if k.lower() in options]
        return cls(config, topics, starting, ending, limit, value_schema,
                   ending_given=given[0] if given else None,
                   fail_on_data_loss=_flag(options, "failOnDataLoss", True),
                   min_offsets_per_trigger=least, max_trigger_delay_ms=delay,
                   trigger_options=tuple(k for k in ("maxOffsetsPerTrigger",
                                                     "maxRecordsPerTrigger",
                                                     "minOffsetsPerTrigger", "maxTriggerDelay")
                                         if k.lower() in options))

    def check_batch(self) -> None:
        """Refuse what Kafka's source refuses in a batch query, with its words."""
        if self.starting == "latest":
            raise ConfigError("option 'startingOffsets': starting offset can't be latest "
                              f"{KAFKA_TEXT}")
        for name, spec, bad, what in (("startingOffsets", self.starting, LATEST, "latest"),
                                      ("endingOffsets", self.ending, EARLIEST, "earliest")):
            if isinstance(spec, dict):
                for topic, parts in spec.items():
                    for p, offset in parts.items():
                        if offset == bad:
                            said = "startingOffsets" if bad == LATEST else "ending offset"
                            raise ConfigError(f"option '{name}': {said} for {topic}-{p} "
                                              f"can't be {what} {KAFKA_TEXT}")
        for name in self.trigger_options:  # Kafka's warnings
            log.warning("%s option ignored in batch queries", name)

    def check_stream(self) -> None:
        """Refuse what Kafka's source refuses in a streaming query, with its words."""
        if self.ending_given == "endingOffsets":
            raise ConfigError("option 'endingOffsets': ending offset not valid in streaming "
                              "queries")
        if self.ending_given:
            raise ConfigError(f"option '{self.ending_given}': ending timestamp not valid in "
                              "streaming queries")


def _check_times(starting: object, ending: object) -> None:
    """A start by time after the end by time, for the same partition, is refused."""
    if not isinstance(starting, Timestamps) or not isinstance(ending, Timestamps):
        return
    pairs: list[tuple[str, int | None, int | None]]
    if isinstance(starting.at, int) and isinstance(ending.at, int):
        pairs = [("every partition", starting.at, ending.at)]
    else:
        keys = {(t, p) for spec in (starting.at, ending.at) if isinstance(spec, dict)
                for t, parts in spec.items() for p in parts}
        pairs = [(f"{t}-{p}", starting.time_of(t, int(p)), ending.time_of(t, int(p)))
                 for t, p in sorted(keys)]
    for where, s, e in pairs:
        if s is not None and e is not None and s > e:
            raise ConfigError(f"options '{starting.option}' and '{ending.option}': the starting "
                              f"timestamp {s} of {where} is after its ending timestamp {e}")


@dataclass(frozen=True)
class SinkOptions:
    """What ``df.write(Stream).format("txnstream")`` was given."""

    config: Config
    topic: str | None
    txn_timeout_s: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Validate the options; ``ConfigError`` names the one at fault.

        The sink writes into txns, so ``kafka.*`` settings that break their durability
        (``kafka.acks`` other than ``all``/``-1``, ``kafka.enable.idempotence`` false:
        :func:`~txnstream.config.txn_producer_problem`) are refused here, on the driver,
        before a batch runs.
        """
        config = _config(options)
        if (problem := txn_producer_problem(config.kafka)) is not None:
            name, value, why = problem
            raise ConfigError(f"option 'kafka.{name}' is {value!r}: {why}")
        options = _lower(options)
        timeout = seconds_text(options.get(TXN_TIMEOUT.lower(), DEFAULT_TXN_TIMEOUT),
                               f"option '{TXN_TIMEOUT}'", maximum=config.max_txn_timeout_s,
                               cap="max_txn_timeout_s, where coordinators cap a txn's timeout")
        return cls(config, options.get("topic"), timeout)


def named_offsets(spec: Mapping[str, Mapping[str, Any]], name: str, topics: Sequence[str],
                  tps: Sequence[TopicPartition], by_time: bool = False
                  ) -> dict[TopicPartition, Any]:
    """Option ``name``'s per-partition JSON, checked against ``tps``.

    It must name every partition of the subscribed ``topics`` and no other, as Kafka's
    source requires; the ``ConfigError`` names the option and the partitions.
    """
    known = set(tps)
    out: dict[TopicPartition, Any] = {}
    for t, parts in spec.items():
        if t not in topics:
            raise ConfigError(f"option '{name}' names topic {t!r}, which is not "
                              f"subscribed ({', '.join(topics)})")
        for p, offset in parts.items():
            tp = TopicPartition(t, int(p))
            if tp not in known:
                n = sum(1 for k in known if k.topic == t)
                raise ConfigError(f"option '{name}' names {tp}, which does not exist "
                                  f"({t!r} has {n} partitions)")
            out[tp] = offset
    if missing := [tp for tp in tps if tp not in out]:
        what = "a timestamp" if by_time else "an offset"
        hint = "" if by_time else " (-2: earliest, -1: latest)"
        raise ConfigError(f"option '{name}' must give {what} for every partition of the "
                          f"subscribed topics{hint}, as Kafka's source requires; missing: "
                          f"{', '.join(map(str, missing))}")
    return out
