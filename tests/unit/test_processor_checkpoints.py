"""The exactly-once processor's settings and its transform turn (issue 36), no broker."""

from __future__ import annotations

import pytest

from txnstream.errors import ConfigError
from txnstream.message import Message
from txnstream.processor import ExactlyOnceProcessor, ProcessorStats, _check_settings


@pytest.mark.parametrize(("args", "named"), [
    ((0, 1.0, 10, 30.0), "batch_size"),
    ((True, 1.0, 10, 30.0), "batch_size"),
    ((10, 1.0, 0, 30.0), "commit_every"),
    ((10, 1.0, 2.5, 30.0), "commit_every"),
    ((10, 0.0, 10, 30.0), "commit_interval_s"),
    ((10, float("nan"), 10, 30.0), "commit_interval_s"),
    ((10, "1", 10, 30.0), "commit_interval_s"),
    ((10, 1.0, 10, -1.0), "txn_timeout_s"),
    ((10, 20.0, 10, 30.0), "at most half of txn_timeout_s"),
])
def test_settings_a_checkpoint_cannot_keep_are_refused_by_name(args, named):
    with pytest.raises(ConfigError, match=named):
        _check_settings(*args)


def test_the_defaults_are_accepted():
    _check_settings(500, 1.0, 10_000, 30.0)
    _check_settings(1, 15.0, 1, 30.0)  # exactly half


class _Sends:
    """Records what the transform hands to ``send_batch``."""

    num_partitions = 4

    def __init__(self) -> None:
        self.calls: list[tuple[list, list, list]] = []

    def partitions_for(self, keys):
        return [0 if k is None else len(k) % 4 for k in keys]

    def send_batch(self, values, partitions, txn, keys):
        self.calls.append((list(values), list(partitions), list(keys)))


def _proc(fn) -> ExactlyOnceProcessor:
    proc = ExactlyOnceProcessor.__new__(ExactlyOnceProcessor)
    proc.fn = fn
    proc.producer = _Sends()  # type: ignore[assignment]
    return proc


def _msgs(n: int) -> list[Message]:
    return [Message(topic="in", partition=0, offset=i, key=f"k{i}".encode(),
                    value=f"v{i}".encode(), headers=(), timestamp_ms=0)
            for i in range(n)]


def test_a_batch_of_outputs_goes_out_in_one_send_batch_in_input_order():
    def fn(m):
        if m.offset == 1:
            return None  # filtered out
        if m.offset == 2:
            return [b"a", ("key", b"b")]  # str keys are encoded
        return m.key, m.value.upper()

    proc = _proc(fn)
    assert proc._transform(_msgs(4), txn=object()) == 4  # type: ignore[arg-type]
    [(values, partitions, keys)] = proc.producer.calls  # type: ignore[attr-defined]
    assert values == [b"V0", b"a", b"b", b"V3"]
    assert keys == [b"k0", None, b"key", b"k3"]
    assert partitions == [2, 0, 3, 2]


def test_an_output_of_the_wrong_type_names_its_input():
    proc = _proc(lambda m: m.value.decode())  # str, not bytes
    with pytest.raises(TypeError, match=r"in-0@0 is str"):
        proc._transform(_msgs(2), txn=object())  # type: ignore[arg-type]
    assert not proc.producer.calls  # type: ignore[attr-defined]


def test_a_batch_with_no_outputs_sends_nothing():
    proc = _proc(lambda m: None)
    assert proc._transform(_msgs(3), txn=object()) == 0  # type: ignore[arg-type]
    assert not proc.producer.calls  # type: ignore[attr-defined]


def test_aborted_batches_reads_the_aborted_checkpoints():
    assert ProcessorStats(aborted_checkpoints=3).aborted_batches == 3
