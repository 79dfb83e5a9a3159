"""The consumer's per-record helpers in C against their Python twins (txnstream.message).

``split_headers`` (the header rule every reader applies) and ``make_message`` (a
``Message`` from its fields) are C where ``txnstream._native`` is built; both must give
what the Python ones give, for any headers a record can carry.
"""

from __future__ import annotations

import dataclasses
import os
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txnstream import message
from txnstream.message import Message, _split_headers
from txnstream.native import native
from txnstream.types import TxnID

NATIVE = native()
RESERVED = ["txn.id", "txn.marker", "txn.tag", "txn.mac", "txn.deliver.at",
            "txn.deliver.after"]

header_names = st.one_of(st.sampled_from(RESERVED), st.text(max_size=12),
                         st.sampled_from(["txn.ID", "txn.id ", "txn", "txn.deliver"]))
header_values = st.one_of(st.none(), st.binary(max_size=20))
headers = st.one_of(st.none(), st.lists(st.tuples(header_names, header_values), max_size=8))


def test_the_native_helpers_are_built():
    """Built wherever the package installed with a compiler (else the Python ones run)."""
    if os.environ.get("TXNSTREAM_NATIVE") == "0":
        assert NATIVE is None and message.make_message is Message
        assert message.split_headers is _split_headers
        return
    assert NATIVE is not None
    assert message.split_headers is NATIVE.split_headers
    assert type(message.make_message).__name__ == "Maker"


@given(headers)
@settings(max_examples=1000, deadline=None)
def test_native_split_headers_equals_python(hdrs):
    want = _split_headers(hdrs)
    if NATIVE is not None:
        assert NATIVE.split_headers(hdrs) == want
        assert NATIVE.split_headers(tuple(hdrs) if hdrs is not None else None) == want


def test_split_headers_takes_the_last_txn_id_and_keeps_user_order():
    hdrs = [("a", b"1"), ("txn.id", b"x"), ("txn.tag", b"t"), ("b", None),
            ("txn.id", b"y"), ("txn.deliver.after", b"5"), ("txn.marker", b"C")]
    want = (b"y", True, [("a", b"1"), ("b", None)], ("txn.deliver.after", b"5"))
    assert _split_headers(hdrs) == want
    if NATIVE is not None:
        assert NATIVE.split_headers(hdrs) == want
        assert NATIVE.split_headers([["a", b"1"]]) == (None, False, [("a", b"1")], None)


@pytest.mark.parametrize("bad", [[("a", b"1", b"2")], [("a",)], [5], 7])
def test_split_headers_refuses_what_python_refuses(bad):
    with pytest.raises((TypeError, ValueError)):
        _split_headers(bad)
    if NATIVE is not None:
        with pytest.raises((TypeError, ValueError)):
            NATIVE.split_headers(bad)


fields_ = st.tuples(
    st.text(max_size=10), st.integers(0, 2**31 - 1), st.integers(0, 2**62),
    st.one_of(st.none(), st.binary(max_size=10)), st.one_of(st.none(), st.binary(max_size=10)),
    st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))),
             max_size=3).map(tuple),
    st.integers(-1, 2**45), st.one_of(st.none(), st.just(TxnID(3, 7))), st.integers(0, 9))


@given(fields_)
@settings(max_examples=300, deadline=None)
def test_make_message_equals_the_dataclass(values):
    want = Message(*values)
    got = message.make_message(*values)
    assert type(got) is Message
    assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
    assert dataclasses.astuple(got) == dataclasses.astuple(want)
    assert got.tp == want.tp
    assert pickle.loads(pickle.dumps(got)) == want
    assert dataclasses.replace(got, redelivery_count=1).redelivery_count == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.offset = 1  # type: ignore[misc]


def test_the_maker_refuses_wrong_calls_and_non_slots():
    if NATIVE is None:
        pytest.skip("txnstream._native is not built (TXNSTREAM_NATIVE=0)")
    with pytest.raises(TypeError, match="9 positional"):
        message.make_message("t", 0, 1)
    with pytest.raises(TypeError, match="positional"):
        message.make_message(*range(9), extra=1)
    with pytest.raises(TypeError, match="not a slot"):
        NATIVE.Maker(Message, ("topic", "tp"))

    class Plain:
        pass

    with pytest.raises(AttributeError):
        NATIVE.Maker(Plain, ("x",))


def test_many_made_messages_are_freed():
    """The maker's instances and their fields are released like the dataclass's."""
    import gc
    import sys

    value = b"v" * 100
    before = sys.getrefcount(value)
    made = [message.make_message("t", 0, i, None, value, (), 0, None, 0) for i in range(1000)]
    assert sys.getrefcount(value) == before + 1000
    del made
    gc.collect()
    assert sys.getrefcount(value) == before
