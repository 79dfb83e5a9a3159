"""The sink's vectorized partitioner against Java's murmur2 vectors and the scalar one."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from txnstream.kafka.partitioning import murmur2 as _murmur2
from txnstream.kafka.partitioning import murmur2_partition
from txnstream_spark.partitioner import murmur2_hashes, partitions_for

# Kafka's UtilsTest.testMurmur2 (signed Java ints)
JAVA = {b"21": -973932308, b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107}


def test_java_vectors_scalar_and_vectorized():
    keys = list(JAVA)
    hashed = murmur2_hashes(pa.array(keys, pa.binary())).tolist()
    for key, h in zip(keys, hashed, strict=True):
        assert h == JAVA[key] & 0xFFFFFFFF, key
        assert _murmur2(key) == JAVA[key] & 0xFFFFFFFF, key


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
