"""The source's timestamp and admission-control options, parsed as Kafka's source parses them.

Pure parsing: nothing runs. What the options do on a real broker and Spark is in
``tests/spark/test_source_times.py``.
"""

from __future__ import annotations

import logging

import pytest

from txnstream.errors import ConfigError
from txnstream_spark.options import SourceOptions, Timestamps, parse_time_ms

BOOT = {"kafka.bootstrap.servers": "127.0.0.1:1"}


def source(**options: str) -> SourceOptions:
    return SourceOptions.parse({**BOOT, "subscribe": "in", **options})


@pytest.mark.parametrize("text,ms", [("15m", 900_000), ("30s", 30_000), ("500ms", 500),
                                     ("250", 250), ("2h", 7_200_000), ("1d", 86_400_000),
                                     (" 3 min ", 180_000), ("1500us", 1)])
def test_durations_read_as_spark_reads_them(text, ms):
    assert parse_time_ms(text, "maxTriggerDelay") == ms


@pytest.mark.parametrize("text", ["", "nan", "-5s", "1.5s", "5 parsecs", "0", "0s", "10us",
                                  "1e3", "1_000"])
def test_bad_durations_are_refused_naming_the_option(text):
    with pytest.raises(ConfigError, match="option 'maxTriggerDelay' must be"):
        parse_time_ms(text, "maxTriggerDelay")


def test_min_offsets_per_trigger_defaults_and_bounds():
    opts = source(minOffsetsPerTrigger="10")
    assert opts.min_offsets_per_trigger == 10
    assert opts.max_trigger_delay_ms == 15 * 60_000  # Kafka's default, 15m
    assert source(minOffsetsPerTrigger="10", maxTriggerDelay="5s").max_trigger_delay_ms == 5000
    for bad in ("0", "-1", "nan", "1.5", ""):
        with pytest.raises(ConfigError, match="option 'minOffsetsPerTrigger' must be"):
            source(minOffsetsPerTrigger=bad)


def test_min_above_max_offsets_per_trigger_is_refused_with_kafkas_text():
    with pytest.raises(ConfigError) as exc:
        source(minOffsetsPerTrigger="20", maxOffsetsPerTrigger="10")
    assert ("The value of minOffsetPerTrigger(20) is higher than the "
            "maxOffsetsPerTrigger(10).") in str(exc.value)
    assert "option 'minOffsetsPerTrigger'" in str(exc.value)
    assert source(minOffsetsPerTrigger="10", maxOffsetsPerTrigger="10").min_offsets_per_trigger


def test_a_batch_read_warns_that_it_ignores_the_trigger_options(caplog):
    opts = source(maxOffsetsPerTrigger="5", minOffsetsPerTrigger="2", maxTriggerDelay="1m")
    with caplog.at_level(logging.WARNING):
        opts.check_batch()
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"{o} option ignored in batch queries"
                    for o in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")]


def test_timestamps_follow_kafkas_order_of_preference():
    both = source(startingTimestamp="1000", startingOffsetsByTimestamp='{"in": {"0": 5}}',
                  startingOffsets="latest")
    assert both.starting == Timestamps("startingTimestamp", 1000, False)
    per = source(startingOffsetsByTimestamp='{"in": {"0": 5, "01": 6}}'.replace('"01"', '"1"'),
                 startingOffsets="latest")
    assert per.starting == Timestamps("startingOffsetsByTimestamp", {"in": {"0": 5, "1": 6}},
                                      False)
    assert source(startingOffsets="latest").starting == "latest"
    end = source(endingTimestamp="7", endingOffsets="latest")
    assert end.ending == Timestamps("endingTimestamp", 7, True)  # no match: latest


def test_the_no_match_strategy_is_error_or_latest():
    assert source(startingTimestamp="1").starting.no_match_latest is False
    latest = source(startingTimestamp="1", startingOffsetsByTimestampStrategy="LATEST")
    assert latest.starting.no_match_latest is True
    with pytest.raises(ConfigError, match="option 'startingOffsetsByTimestampStrategy' must "
                                          "be 'error' or 'latest'"):
        source(startingTimestamp="1", startingOffsetsByTimestampStrategy="earliest")


@pytest.mark.parametrize("option,value,says", [
    ("startingTimestamp", "-1", "option 'startingTimestamp' (ms since the epoch) must be a "
                                "whole number >= 0"),
    ("startingTimestamp", "soon", "option 'startingTimestamp' (ms since the epoch) must be"),
    ("endingTimestamp", "1.5", "option 'endingTimestamp' (ms since the epoch) must be"),
    ("startingOffsetsByTimestamp", '{"in": {"0": -2}}',
     "option 'startingOffsetsByTimestamp': the timestamp of in-0 must be"),
    ("endingOffsetsByTimestamp", '{"in": [1]}', "option 'endingOffsetsByTimestamp' must be JSON"),
    ("endingOffsetsByTimestamp", "nope", "option 'endingOffsetsByTimestamp' must be JSON"),
])
def test_bad_times_are_refused_naming_the_option(option, value, says):
    with pytest.raises(ConfigError) as exc:
        source(**{option: value})
    assert says in str(exc.value)


@pytest.mark.parametrize("start,end,where", [
    ({"startingTimestamp": "20"}, {"endingTimestamp": "10"}, "every partition"),
    ({"startingOffsetsByTimestamp": '{"in": {"0": 5, "1": 30}}'},
     {"endingOffsetsByTimestamp": '{"in": {"0": 9, "1": 20}}'}, "in-1"),
    ({"startingTimestamp": "30"}, {"endingOffsetsByTimestamp": '{"in": {"0": 40, "1": 20}}'},
     "in-1"),
])
def test_a_start_time_after_the_end_time_is_refused(start, end, where):
    with pytest.raises(ConfigError) as exc:
        source(**start, **end)
    assert "the starting timestamp" in str(exc.value) and where in str(exc.value)


@pytest.mark.parametrize("option,value", [("endingTimestamp", "5"),
                                          ("endingOffsetsByTimestamp", '{"in": {"0": 5}}')])
def test_a_stream_refuses_an_ending_time_with_kafkas_text(option, value):
    with pytest.raises(ConfigError) as exc:
        source(**{option: value}).check_stream()
    assert f"option '{option}': ending timestamp not valid in streaming queries" \
        in str(exc.value)
