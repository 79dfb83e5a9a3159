"""Kafka's default partitioner over a whole Arrow column at once (the sink's hot path).

:func:`txnstream.kafka.partitioning.murmur2_partition` hashes one key in Python (microseconds a
key); here numpy hashes every key of a batch together, grouped by key length, straight
from the Arrow buffers. Same partitions as Java's ``Utils.murmur2`` and the scalar one.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["murmur2_hashes", "partitions_for"]

_SEED = 0x9747B28C
_M = np.uint32(0x5BD1E995)


def _murmur2_fixed(rows: np.ndarray) -> np.ndarray:
    """Hashes of ``rows``, an (n, L) uint8 array of n keys of one length L."""
    n, length = rows.shape
    h = np.full(n, (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
    blocks = length // 4
    if blocks:
        words = np.ascontiguousarray(rows[:, :blocks * 4]).view("<u4")  # (n, blocks)
        for i in range(blocks):
            k = words[:, i] * _M
            k ^= k >> np.uint32(24)
            k *= _M
            h *= _M
            h ^= k
    rest = length % 4
    tail = blocks * 4
    if rest == 3:
        h ^= rows[:, tail + 2].astype(np.uint32) << np.uint32(16)
    if rest >= 2:
        h ^= rows[:, tail + 1].astype(np.uint32) << np.uint32(8)
    if rest >= 1:
        h ^= rows[:, tail].astype(np.uint32)
        h *= _M
    h ^= h >> np.uint32(13)
    h *= _M
    h ^= h >> np.uint32(15)
    return h


def murmur2_hashes(keys: pa.Array) -> np.ndarray:
    """Java's ``Utils.murmur2`` of every key (uint32); 0 where the key is null."""
    if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type) \
            or pa.types.is_large_binary(keys.type):
        keys = keys.cast(pa.binary())
    n = len(keys)
    out = np.zeros(n, dtype=np.uint32)
    if not n:
        return out
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[keys.offset:keys.offset + n + 1]
    data = (np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None
            else np.zeros(0, dtype=np.uint8))
    lengths = np.diff(offsets)
    valid = keys.is_valid().to_numpy(zero_copy_only=False)
    for length in np.unique(lengths[valid]):
        idx = np.nonzero(valid & (lengths == length))[0]
        starts = offsets[idx].astype(np.int64)
        rows = data[starts[:, None] + np.arange(length, dtype=np.int64)] if length else \
            np.zeros((len(idx), 0), dtype=np.uint8)
        out[idx] = _murmur2_fixed(rows)
    return out


def partitions_for(keys: pa.Array | None, n: int, num_partitions: int, next_rr: int
                   ) -> tuple[list[int], int]:
    """The partition of each of ``n`` rows: murmur2 of the key, round-robin where null.

    Returns the partitions and the next round-robin position.
    """
    if keys is None:
        parts = (np.arange(next_rr, next_rr + n) % num_partitions)
        return parts.tolist(), next_rr + n
    hashed = (murmur2_hashes(keys) & np.uint32(0x7FFFFFFF)).astype(np.int64) % num_partitions
    nulls = ~keys.is_valid().to_numpy(zero_copy_only=False)
    k = int(nulls.sum())
    if k:
        hashed[nulls] = np.arange(next_rr, next_rr + k) % num_partitions
    return hashed.tolist(), next_rr + k
