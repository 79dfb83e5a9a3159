"""Options of the ``txnstream`` Spark data source, parsed once, with errors that name them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from txnstream.config import Config, TopicNames
from txnstream.errors import ConfigError

__all__ = ["SourceOptions", "SinkOptions", "parse_offsets"]

BOOTSTRAP = "kafka.bootstrap.servers"


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
                  kafka=kafka)


def parse_offsets(name: str, text: str | None) -> str | dict[str, dict[str, int]]:
    """``earliest`` | ``latest`` | JSON ``{"topic": {"0": 12}}``; errors name the option."""
    if text is None or text in ("earliest", "latest"):
        return text or "earliest"
    try:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("not an object")
        return {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in value.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise ConfigError(f"option '{name}' must be 'earliest', 'latest' or JSON like "
                          f"'{{\"topic\": {{\"0\": 12}}}}'; got {text!r} ({exc})") from exc


@dataclass(frozen=True)
class SourceOptions:
    """What ``spark.read(Stream).format("txnstream")`` was given."""

    config: Config
    topics: tuple[str, ...]
    starting: Any
    ending: Any
    max_records_per_trigger: int | None
    value_schema: str | None = None
    """The ``valueSchema`` option as given (see :mod:`txnstream_spark.avro`); None: raw bytes."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Validate the options; ``ConfigError`` names the one at fault."""
        config = _config(options)
        options = _lower(options)
        topics = tuple(t.strip() for t in (options.get("subscribe") or "").split(",") if t.strip())
        if not topics:
            raise ConfigError("option 'subscribe' is required: comma-separated topic names")
        mrt = options.get("maxrecordspertrigger")
        try:
            limit = int(mrt) if mrt else None
        except ValueError as exc:
            raise ConfigError(f"option 'maxRecordsPerTrigger' must be a number, got {mrt!r}") \
                from exc
        value_schema = options.get("valueschema")
        if value_schema is not None:
            from txnstream_spark.avro import load_value_schema

            load_value_schema(value_schema)  # fail here, naming the option
        return cls(config, topics, parse_offsets("startingOffsets", options.get("startingoffsets")),
                   parse_offsets("endingOffsets", options.get("endingoffsets") or "latest"),
                   limit, value_schema)


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
        try:
            timeout = float(options.get("txnstream.txntimeoutseconds", "120"))
        except ValueError as exc:
            raise ConfigError("option 'txnstream.txnTimeoutSeconds' must be a number") from exc
        return cls(config, options.get("topic"), timeout)
