"""The log epoch noted beside a stream's offsets (issue 34 item 9): pure helpers."""

from __future__ import annotations

import json

import pytest

from txnstream.types import TopicPartition
from txnstream_spark.log_epochs import EPOCHS_KEY, gone_since_planned, join, replaced, split

T0, T1, U0 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)


def test_epochs_travel_beside_the_offsets_and_come_back_out_through_json():
    offsets = {"t": {"0": 12, "1": 3}, "u": {"0": 7}}
    noted = json.loads(json.dumps(join(offsets, {T0: 1, T1: 0, U0: 2})))
    assert noted[EPOCHS_KEY] == {"t": {"0": 1, "1": 0}, "u": {"0": 2}}
    assert split(noted) == (offsets, {T0: 1, T1: 0, U0: 2})


def test_only_partitions_the_offsets_name_are_noted_and_none_adds_no_key():
    assert join({"t": {"0": 1}}, {T0: 0, T1: 4, U0: 1}) == {"t": {"0": 1},
                                                            EPOCHS_KEY: {"t": {"0": 0}}}
    assert join({"t": {"0": 1}}, {}) == {"t": {"0": 1}}


def test_offsets_written_before_epochs_were_noted_note_none():
    assert split({"t": {"0": 12}}) == ({"t": {"0": 12}}, {})


def test_a_partition_is_on_a_new_log_only_where_its_epoch_grew():
    assert replaced({T0: 0, T1: 1, U0: 2}, {T0: 1, T1: 1, U0: 1}) == {T0: (0, 1)}
    assert replaced({T0: 0}, {}) == {}, "no view (read plain): nothing decided"


@pytest.mark.parametrize("bad, says", [
    ({EPOCHS_KEY: [1]}, "must map topics"),
    ({EPOCHS_KEY: {"t": 3}}, "of topic 't' must map partitions"),
    ({EPOCHS_KEY: {"t": {"0": "x"}}}, "t-0 is 'x', not a log epoch"),
])
def test_a_malformed_epochs_entry_is_named(bad, says):
    with pytest.raises(ValueError, match=says):
        split(bad)


def test_a_range_is_gone_only_if_nonempty_and_planned_on_an_older_log_than_seen_now():
    tp = TopicPartition("t", 0)
    assert gone_since_planned(tp, 0, 4, 0, 1) == (
        "t-0 was deleted and created again while offsets 0..4 of its log (log epoch 0, "
        "now 1) were being planned: they may not have been read")
    assert gone_since_planned(tp, 4, 4, 0, 1) is None  # empty: nothing to read
    assert gone_since_planned(tp, 0, 4, 1, 1) is None  # the same log
    assert gone_since_planned(tp, 0, 4, None, 1) is None  # planned with no epoch noted
    assert gone_since_planned(tp, 0, 4, 0, None) is None  # not followed: not known
