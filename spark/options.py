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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from txnstream.config import Config, TopicNames, check_principal, read_secret_file
from txnstream.errors import ConfigError
from txnstream.validate import (
    MAX_LONG,
    MAX_PARTITION,
    seconds_text,
    whole_number,
    whole_number_text,
)

__all__ = ["EARLIEST", "LATEST", "Offsets", "SourceOptions", "SinkOptions", "TC_OPTIONS",
           "UNSUPPORTED", "parse_offsets"]

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
                  kafka=kafka, **_line(options))


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

SOURCE_OPTIONS = ("subscribe", "startingOffsets", "endingOffsets", "maxOffsetsPerTrigger",
                  "maxRecordsPerTrigger", "valueSchema", "includeHeaders", "failOnDataLoss",
                  "txnstream.prefix")
"""The source's own options (besides ``kafka.*`` and ``tc.*``)."""

_NO_TIMESTAMPS = "offsets by timestamp are not supported: give 'startingOffsets' / 'endingOffsets'"
UNSUPPORTED = {
    "assign": "every partition of the topics named by 'subscribe' is read",
    "subscribePattern": "name the topics with 'subscribe'",
    "groupIdPrefix": "the source uses no consumer group (offsets live in Spark's checkpoint)",
    "kafka.group.id": "the source uses no consumer group (offsets live in Spark's checkpoint)",
    "minOffsetsPerTrigger": "a micro-batch takes what is committed, up to "
                            "'maxOffsetsPerTrigger'",
    "maxTriggerDelay": "it goes with 'minOffsetsPerTrigger', which is not supported",
    "startingTimestamp": _NO_TIMESTAMPS,
    "endingTimestamp": _NO_TIMESTAMPS,
    "startingOffsetsByTimestamp": _NO_TIMESTAMPS,
    "endingOffsetsByTimestamp": _NO_TIMESTAMPS,
    "startingOffsetsByTimestampStrategy": _NO_TIMESTAMPS,
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
    what = (f"option '{name}' must be 'earliest', 'latest' or JSON like "
            f"'{{\"topic\": {{\"0\": 12}}}}'")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{what}; got {text!r:.80} ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{what}; got {text!r:.80} (not an object)")
    out: Offsets = {}
    for topic, parts in value.items():
        if not isinstance(parts, dict):
            raise ConfigError(f"{what}; topic {topic!r} has {parts!r:.40}, not an object of "
                              "partition: offset")
        offsets = out.setdefault(topic, {})
        for part, offset in parts.items():
            p = whole_number_text(part, f"option '{name}': a partition of {topic!r}",
                                  minimum=0, maximum=MAX_PARTITION)
            if str(p) in offsets:
                raise ConfigError(f"option '{name}': partition {p} of {topic!r} is given twice")
            offsets[str(p)] = whole_number(offset, f"option '{name}': the offset of "
                                           f"{topic}-{p}", minimum=EARLIEST, maximum=MAX_LONG)
    return out


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
    starting: str | Offsets
    """``earliest``, ``latest`` or offsets (-2: earliest, -1: latest)."""
    ending: str | Offsets
    """``latest`` or offsets (-1: latest)."""
    max_records_per_trigger: int | None
    """``maxOffsetsPerTrigger`` (or its alias ``maxRecordsPerTrigger``)."""
    value_schema: str | None = None
    """The ``valueSchema`` option as given (see :mod:`txnstream_spark.avro`); None: raw bytes."""
    ending_given: bool = False
    """``endingOffsets`` was given (a stream refuses it, as Kafka's does)."""
    fail_on_data_loss: bool = True
    """``failOnDataLoss``: records deleted before they were read fail the query (True) or
    are skipped with a warning naming them (False), as in Kafka's source."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Validate the options; ``ConfigError`` names the one at fault."""
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
        starting = parse_offsets("startingOffsets", options.get("startingoffsets"))
        ending = parse_offsets("endingOffsets", options.get("endingoffsets") or "latest")
        if ending == "earliest":  # Kafka's words; it crashed planning here once
            raise ConfigError("option 'endingOffsets' must be 'latest' or JSON offsets: "
                              f"ending offset can't be earliest {KAFKA_TEXT}")
        return cls(config, topics, starting, ending, limit, value_schema,
                   ending_given="endingoffsets" in options,
                   fail_on_data_loss=_flag(options, "failOnDataLoss", True))

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
        if self.max_records_per_trigger is not None:
            log.warning("maxOffsetsPerTrigger option ignored in batch queries")

    def check_stream(self) -> None:
        """Refuse what Kafka's source refuses in a streaming query, with its words."""
        if self.ending_given:
            raise ConfigError("option 'endingOffsets': ending offset not valid in streaming "
                              "queries")


@dataclass(frozen=True)
class SinkOptions:
    """What ``df.write(Stream).format("txnstream")`` was given."""

    config: Config
    topic: str | None
    txn_timeout_s: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Validate the options; ``ConfigError`` names the one at fault."""
        config = _config(options)
        options = _lower(options)
        timeout = seconds_text(options.get(TXN_TIMEOUT.lower(), DEFAULT_TXN_TIMEOUT),
                               f"option '{TXN_TIMEOUT}'", maximum=config.max_txn_timeout_s,
                               cap="max_txn_timeout_s, where coordinators cap a txn's timeout")
        return cls(config, options.get("topic"), timeout)
