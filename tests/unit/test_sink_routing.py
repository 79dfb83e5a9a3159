"""Where the Spark sink sends each row: option ``topic``, else the ``topic`` column.

The option overrides the column, as in Kafka's sink (issue 23).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from txnstream.errors import ConfigError
from txnstream_spark.sink import _by_topic


def routed(rb, default, done=0):
    return {t: rows.column("value").to_pylist() for t, rows in _by_topic(rb, default, done)}


def test_option_topic_when_there_is_no_topic_column():
    rb = pa.RecordBatch.from_pydict({"value": ["a", "b"]})
    assert routed(rb, "out") == {"out": ["a", "b"]}


def test_topic_column_splits_rows_and_keeps_their_order():
    rb = pa.RecordBatch.from_pydict({"value": ["a", "b", "c", "d"],
                                     "topic": ["x", "y", "x", "y"]})
    assert routed(rb, None) == {"x": ["a", "c"], "y": ["b", "d"]}


def test_the_option_overrides_the_column_null_or_not():
    rb = pa.RecordBatch.from_pydict({"value": ["a", "b"], "topic": [None, "y"]})
    assert routed(rb, "out") == {"out": ["a", "b"]}


def test_null_topic_without_the_option_names_the_row():
    rb = pa.RecordBatch.from_pydict({"value": ["a", "b", "c"], "topic": ["y", "y", None]})
    with pytest.raises(ConfigError, match="row 12: no topic"):
        routed(rb, None, done=10)
