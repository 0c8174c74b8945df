"""Which ``__consumer_offsets`` partition (and so which broker) coordinates a group.

Kafka maps a group to ``Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions``. Both
halves are Java's: ``String.hashCode`` runs over UTF-16 code units (a character outside the
Basic Multilingual Plane counts as its two surrogates) with 32-bit wrap-around, and Kafka's
``Utils.abs`` maps ``Integer.MIN_VALUE`` to 0 and every other value to its absolute value. Every
client computes the coordinator through FindCoordinator, but a group's offsets must land in the
partition Kafka's tools expect, so the numbers have to agree exactly.
"""

from __future__ import annotations

_INT32_MIN = -(2**31)


def java_string_hash_code(text: str) -> int:
    """``String.hashCode()`` of ``text`` as Java computes it (a signed 32-bit int)."""
    units = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


def kafka_abs(n: int) -> int:
    """Kafka's ``Utils.abs``: the absolute value, except that ``Integer.MIN_VALUE`` gives 0."""
    return 0 if n == _INT32_MIN else abs(n)


def partition_for_group(group_id: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition that holds ``group_id``'s offsets and metadata."""
    if partitions < 1:
        raise ValueError(f"the offsets topic needs at least one partition, got {partitions}")
    return kafka_abs(java_string_hash_code(group_id)) % partitions
