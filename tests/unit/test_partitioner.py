"""The sink's vectorized partitioner against Java's murmur2 vectors and the scalar one."""

from __future__ import annotations

import itertools
import os

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txnstream.kafka import partitioning
from txnstream.kafka.partitioning import murmur2 as _murmur2
from txnstream.kafka.partitioning import murmur2_partition
from txnstream_spark.partitioner import murmur2_hashes, partitions_for

# Kafka's UtilsTest.testMurmur2 (signed Java ints)
JAVA = {b"21": -973932308, b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107}

# Every tail length (0..3 bytes after the 4-byte words) and bytes >= 0x80 (Java's bytes are
# signed), then keys of many words; computed with the per-word loop that transcribes
# Java's Utils.murmur2 line by line (``_java_murmur2`` below), before it was sped up.
MORE = {b"": 275646681, b"a": 2731586172, b"ab": 316155434, b"abc": 479470107,
        b"abcd": 2971317748, b"abcde": 461995741, b"abcdef": 1870650108,
        b"abcdefg": 3948500121, b"abcdefgh": 3339539933, b"abcdefghi": 3675287486,
        b"\xff": 3983499611, b"\xff" * 2: 2652134368, b"\xff" * 3: 1548199422,
        b"\xff" * 4: 644171429, b"\xff" * 5: 3931128674, b"\xff" * 7: 4223673747,
        b"\xff" * 8: 185950397, bytes(range(256)) * 4 + b"xyz": 2197618010,
        b"k" * 1001: 1238844260, bytes(range(200, 256)) * 3: 3593102771}


def _java_murmur2(data: bytes) -> int:
    """Java's ``Utils.murmur2``, one statement per Java statement (the reference)."""
    length, m, mask = len(data), 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ length) & mask
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    tail = length & ~3
    if length % 4 == 3:
        h ^= data[tail + 2] << 16
    if length % 4 >= 2:
        h ^= data[tail + 1] << 8
    if length % 4 >= 1:
        h ^= data[tail]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def test_java_vectors_scalar_and_vectorized():
    keys = list(JAVA)
    hashed = murmur2_hashes(pa.array(keys, pa.binary())).tolist()
    for key, h in zip(keys, hashed, strict=True):
        assert h == JAVA[key] & 0xFFFFFFFF, key
        assert _murmur2(key) == JAVA[key] & 0xFFFFFFFF, key


def test_every_tail_length_and_long_keys_scalar_and_vectorized():
    keys = list(MORE)
    hashed = murmur2_hashes(pa.array(keys, pa.binary())).tolist()
    for key, h in zip(keys, hashed, strict=True):
        assert _murmur2(key) == MORE[key] == _java_murmur2(key), key
        assert h == MORE[key] & 0xFFFFFFFF, key


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=70))
def test_scalar_equals_the_line_by_line_transcription_of_java(key):
    assert _murmur2(key) == _java_murmur2(key)
    assert murmur2_partition(key, 7) == (_java_murmur2(key) & 0x7FFFFFFF) % 7


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=13)), max_size=60),
       st.integers(1, 17), st.integers(0, 5), st.integers(0, 100))
def test_vectorized_equals_scalar_on_slices_and_nulls(keys, num_partitions, cut, rr):
    arr = pa.array(keys, pa.binary()).slice(min(cut, len(keys)))
    rows = keys[min(cut, len(keys)):]
    parts, next_rr = partitions_for(arr, len(rows), num_partitions, rr)
    expect, r = [], rr
    for k in rows:
        if k is None:
            expect.append(r % num_partitions)
            r += 1
        else:
            expect.append(murmur2_partition(k, num_partitions))
    assert parts == expect
    assert next_rr == r


def test_string_keys_hash_as_their_utf8_bytes():
    keys = ["ключ", "k", ""]
    parts, _ = partitions_for(pa.array(keys), 3, 7, 0)
    assert parts == [murmur2_partition(k.encode(), 7) for k in keys]


def test_no_keys_is_round_robin_from_the_given_position():
    assert partitions_for(None, 5, 3, 4) == ([1, 2, 0, 1, 2], 9)


native_partitions = partitioning._native_partitions()


def test_the_native_batch_partitioner_is_built():
    """Built wherever the package installed with a compiler; the Python one otherwise."""
    if os.environ.get("TXNSTREAM_NATIVE") == "0":
        assert native_partitions is None
        return
    assert native_partitions is not None
    assert partitioning.murmur2_partitions is native_partitions


@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=60),
       st.integers(1, 2**31 - 1))
@settings(max_examples=500, deadline=None)
def test_native_batch_partitions_equal_python_and_java(keys, num_partitions):
    """The C loop gives every key Java's partition (-1: None), as the Python one does."""
    expected = partitioning._python_partitions(keys, num_partitions)
    assert expected == [-1 if k is None else (_java_murmur2(k) & 0x7FFFFFFF) % num_partitions
                        for k in keys]
    if native_partitions is not None:
        assert native_partitions(keys, num_partitions) == expected
        assert native_partitions(tuple(keys), num_partitions) == expected


def test_the_known_vectors_through_the_batch_partitioner():
    keys = list(JAVA) + list(MORE)
    want = [(JAVA.get(k, 0) & 0xFFFFFFFF if k in JAVA else MORE[k]) & 0x7FFFFFFF for k in keys]
    for n in (1, 7, 2**31 - 1):
        assert partitioning.murmur2_partitions(keys, n) == [w % n for w in want]


@pytest.mark.parametrize("keys, n, error", [
    ([b"a", "b"], 3, TypeError), ([b"a", 5], 3, TypeError), ([b"a"], 0, ValueError)])
def test_the_native_batch_partitioner_names_what_it_refuses(keys, n, error):
    if native_partitions is None:
        pytest.skip("the native partitioner is not built (TXNSTREAM_NATIVE=0)")
    with pytest.raises(error, match="key 1|partitions"):
        native_partitions(keys, n)


def test_a_producer_keeps_keyless_records_in_turn_among_keyed_ones():
    """partitions_for: keys by murmur2, None by the next in turn, in the keys' order."""
    from types import SimpleNamespace

    from txnstream.producer import Producer

    fake = SimpleNamespace(num_partitions=5, _rr=itertools.count(3))
    keys = [None, b"abc", None, b"21", None]
    got = Producer.partitions_for(fake, keys)  # type: ignore[arg-type]
    assert got == [3, murmur2_partition(b"abc", 5), 4, murmur2_partition(b"21", 5), 0]
