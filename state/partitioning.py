"""Kafka's Java-compatible murmur2 key partitioner (key groups are partitions).

``key_group(key, P) == (murmur2(key) & 0x7fffffff) % P`` is the partition the Java
client, librdkafka's ``murmur2_random`` partitioner and Spark place a key in.
"""

from __future__ import annotations

from confluent_kafka import murmur2 as _native_partition

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Return Kafka's 32-bit murmur2 hash of ``data`` as a signed int (like Java)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    n4 = length // 4
    for i in range(n4):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    tail = 4 * n4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def key_group(key: bytes, partitions: int) -> int:
    """Return the key group (partition) of serialized ``key`` among ``partitions``.

    Uses librdkafka's native implementation; :func:`murmur2` is the reference.
    """
    result: int = _native_partition(key, partitions)
    return result
