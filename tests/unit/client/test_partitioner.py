"""The default partitioner must put a key where Kafka's Java client puts it."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.client.partitioner import (
    StickyPartitioner,
    murmur2,
    partition_for_key,
    to_positive,
)

# murmur2 of Kafka's Utils.murmur2 (the Java client), as unsigned 32-bit values; these are the
# numbers kafka-python's Java-compatible implementation yields too.
KNOWN_UNSIGNED = {
    b"": 275646681,
    b"a": 2731586172,
    b"key": 3215029929,
    b"hello world": 1221641059,
    b"tidelog-0": 613145007,
    bytes(range(20)): 424957063,
}


@pytest.mark.parametrize(("key", "expected"), sorted(KNOWN_UNSIGNED.items()))
def test_murmur2_matches_java(key: bytes, expected: int) -> None:
    assert murmur2(key) & 0xFFFFFFFF == expected
    # Java returns a signed int.
    assert murmur2(key) == (expected - (1 << 32) if expected >= 1 << 31 else expected)


@pytest.mark.parametrize(
    ("key", "partitions", "expected"),
    [
        # toPositive(murmur2(key)) % n, from the unsigned values above.
        (b"a", 3, (2731586172 & 0x7FFFFFFF) % 3),
        (b"key", 10, (3215029929 & 0x7FFFFFFF) % 10),
        (b"hello world", 7, 1221641059 % 7),
        (b"tidelog-0", 12, 613145007 % 12),
    ],
)
def test_partition_for_key(key: bytes, partitions: int, expected: int) -> None:
    assert partition_for_key(key, partitions) == expected


def test_partition_numbers_spelled_out() -> None:
    # The same values written out, so a mistake in the formula above cannot hide one here.
    assert partition_for_key(b"a", 3) == 1
    assert partition_for_key(b"key", 10) == 1
    assert partition_for_key(b"hello world", 7) == 2
    assert partition_for_key(b"tidelog-0", 12) == 3


def test_to_positive_is_not_abs() -> None:
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(1 << 31)) == 0
    assert to_positive(5) == 5


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=1000))
def test_partition_in_range_and_stable(key: bytes, partitions: int) -> None:
    first = partition_for_key(key, partitions)
    assert 0 <= first < partitions
    assert partition_for_key(bytearray(key), partitions) == first
    assert -(1 << 31) <= murmur2(key) < 1 << 31


def _murmur2_by_the_book(data: bytes) -> int:
    """Kafka's murmur2 written out step by step (a word at a time, masked at every step), to
    check the producer's faster arithmetic against."""
    seed, m, mask = 0x9747B28C, 0x5BD1E995, 0xFFFFFFFF
    h = (seed ^ len(data)) & mask
    for i in range(0, len(data) - len(data) % 4, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    rest = data[len(data) - len(data) % 4 :]
    if len(rest) == 3:
        h ^= rest[2] << 16
    if len(rest) >= 2:
        h ^= rest[1] << 8
    if rest:
        h ^= rest[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h >= 1 << 31 else h


@given(st.binary(max_size=200))
def test_murmur2_equals_the_step_by_step_definition(key: bytes) -> None:
    assert murmur2(key) == _murmur2_by_the_book(key)
    assert murmur2(bytearray(key)) == murmur2(memoryview(key)) == murmur2(key)


@settings(max_examples=30)
@given(st.lists(st.binary(max_size=80), min_size=1, max_size=40), st.integers(1, 50))
def test_partition_for_key_is_the_same_from_its_cache(keys: list[bytes], partitions: int) -> None:
    """Recently seen keys are answered from a cache (short keys only, emptied when full):
    the answer is the hash's, first time or again, whatever else was asked in between."""
    from tidelog.client import partitioner

    for _ in range(2):
        for key in keys:
            expected = (_murmur2_by_the_book(key) & 0x7FFFFFFF) % partitions
            assert partition_for_key(key, partitions) == expected
            assert len(partitioner._CACHE) <= partitioner._CACHE_KEYS
    many = [b"%d" % i for i in range(partitioner._CACHE_KEYS + 10)]
    for key in many:
        partition_for_key(key, partitions)
    assert len(partitioner._CACHE) <= partitioner._CACHE_KEYS
    assert [partition_for_key(k, partitions) for k in keys] == [
        (_murmur2_by_the_book(k) & 0x7FFFFFFF) % partitions for k in keys
    ]


def test_zero_partitions_is_an_error() -> None:
    with pytest.raises(ValueError):
        partition_for_key(b"k", 0)


def test_sticky_partition_holds_until_batch_sealed() -> None:
    sticky = StickyPartitioner(random.Random(7))
    first = sticky.partition("t", 4, [0, 1, 2, 3])
    assert all(sticky.partition("t", 4, [0, 1, 2, 3]) == first for _ in range(20))
    sticky.batch_sealed("t", first, 4, [0, 1, 2, 3])
    second = sticky.partition("t", 4, [0, 1, 2, 3])
    assert second != first
    # Sealing a batch of another partition does not move the sticky choice.
    sticky.batch_sealed("t", (second + 1) % 4, 4, [0, 1, 2, 3])
    assert sticky.partition("t", 4, [0, 1, 2, 3]) == second


def test_sticky_prefers_partitions_with_a_leader() -> None:
    sticky = StickyPartitioner(random.Random(1))
    for _ in range(10):
        assert sticky.partition("t", 5, [3]) == 3
        sticky.batch_sealed("t", 3, 5, [3])
    fresh = StickyPartitioner(random.Random(2))
    assert fresh.partition("u", 5, [4]) == 4
