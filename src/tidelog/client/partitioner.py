"""The default partitioner, bit-compatible with Kafka's Java client.

A record with a key goes to ``to_positive(murmur2(key)) % num_partitions``, exactly as the Java
client's built-in partitioner computes it, so the same key lands on the same partition whoever
produced it. ``murmur2`` returns Java's signed 32-bit result; ``to_positive`` clears the sign bit
(Java's ``Utils.toPositive``), which is not the same as ``abs``.

Records without a key (or all records with ``partitioner.ignore.keys``) stick to one partition
until the batch being filled for it is handed to the sender, then move to another partition
with a leader: the sticky behaviour of KIP-480, which fills batches instead of spreading single
records.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
# Unpackers of n little-endian 32-bit words, made once per n.
_WORDS: dict[int, Callable[[bytes], tuple[int, ...]]] = {}


def murmur2(data: bytes | bytearray | memoryview) -> int:
    """32-bit murmur2 of ``data`` with Kafka's seed, as a signed (Java ``int``) value."""
    view = data if type(data) is bytes else bytes(data)
    length = len(view)
    h = (_SEED ^ length) & _MASK
    count = length >> 2
    if count:
        words = _WORDS.get(count)
        if words is None:
            words = _WORDS[count] = struct.Struct(f"<{count}I").unpack_from
        m, mask = _M, _MASK
        for k in words(view):
            k = (k * m) & mask
            k ^= k >> 24
            # (h * m) ^ (k * m), masked once: the low 32 bits of an xor are the xor of the
            # low 32 bits.
            h = ((h * m) ^ (k * m)) & mask
    whole = count << 2
    tail = length & 3
    if tail:
        if tail == 3:
            h ^= view[whole + 2] << 16
        if tail >= 2:
            h ^= view[whole + 1] << 8
        h ^= view[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """Java's ``Utils.toPositive``: the low 31 bits."""
    return number & 0x7FFFFFFF


# Keys seen lately and their to_positive(murmur2(key)): keys repeat (an entity's records share
# its key), and a lookup costs a few percent of the hash. Only short keys, and no more than
# _CACHE_KEYS of them (the dict is emptied when full), so the memory stays small.
_CACHE: dict[bytes, int] = {}
_CACHE_KEYS = 4096
_CACHE_KEY_BYTES = 64


def partition_for_key(key: bytes | bytearray | memoryview, num_partitions: int) -> int:
    if num_partitions <= 0:
        raise ValueError("a topic has at least one partition")
    if type(key) is not bytes or len(key) > _CACHE_KEY_BYTES:
        return to_positive(murmur2(key)) % num_partitions
    positive = _CACHE.get(key)
    if positive is None:
        if len(_CACHE) >= _CACHE_KEYS:
            _CACHE.clear()
        positive = _CACHE[key] = to_positive(murmur2(key))
    return positive % num_partitions


class StickyPartitioner:
    """Chooses partitions for records without a key: one per topic until told to move on."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._current: dict[str, int] = {}

    def partition(self, topic: str, num_partitions: int, available: Sequence[int]) -> int:
        current = self._current.get(topic)
        if current is None or current >= num_partitions:
            current = self._choose(num_partitions, available, previous=None)
            self._current[topic] = current
        return current

    def batch_sealed(
        self, topic: str, partition: int, num_partitions: int, available: Sequence[int]
    ) -> None:
        """The batch of ``partition`` was handed off: stick to a different partition next."""
        if self._current.get(topic) == partition:
            self._current[topic] = self._choose(num_partitions, available, previous=partition)

    def _choose(self, num_partitions: int, available: Sequence[int], previous: int | None) -> int:
        # Partitions with a leader first; the previous one rather than one without a leader.
        candidates = (
            [p for p in available if p != previous]
            or list(available)
            or [p for p in range(num_partitions) if p != previous]
        )
        if not candidates:
            return 0 if previous is None else previous
        return self._rng.choice(candidates)
