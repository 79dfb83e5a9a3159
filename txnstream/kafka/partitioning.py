"""Kafka's default partitioner, as Java clients compute it (``Utils.murmur2``)."""

from __future__ import annotations

__all__ = ["murmur2", "murmur2_partition"]


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``Utils.murmur2``), so keys land where Java clients put them."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = length - rest
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def murmur2_partition(key: bytes, num_partitions: int) -> int:
    """Kafka's default partition for a keyed record."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions
