"""__consumer_offsets record layouts, consumer subscriptions, and the group partition hash."""

from __future__ import annotations

import contextlib
import struct

import pytest
from coordinator_helpers import subscription
from hypothesis import given
from hypothesis import strategies as st

from tidelog.coordinator import (
    GroupRecordError,
    java_string_hash_code,
    kafka_abs,
    partition_for_group,
)
from tidelog.coordinator.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
    parse_subscription_topics,
)


def s16(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def b32(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


# -- Java's String.hashCode and Kafka's abs


def test_java_hash_code_by_hand() -> None:
    assert java_string_hash_code("") == 0
    assert java_string_hash_code("a") == 97
    assert java_string_hash_code("ab") == 97 * 31 + 98
    # "hello": 104*31^4 + 101*31^3 + 108*31^2 + 108*31 + 111
    assert java_string_hash_code("hello") == 99162322
    # non-ASCII in the BMP: one UTF-16 unit each (é = 0xE9, € = 0x20AC)
    assert java_string_hash_code("é€") == 0xE9 * 31 + 0x20AC
    # outside the BMP: U+1F600 is the surrogate pair D83D DE00
    assert java_string_hash_code("😀") == 0xD83D * 31 + 0xDE00 == 1772899
    # 32-bit overflow: 31^7 * 97 alone wraps
    expected = 0
    for ch in "my-group":
        expected = (expected * 31 + ord(ch)) % 2**32
    assert java_string_hash_code("my-group") == expected - 2**32 == -1906497762


def test_kafka_abs_and_partition() -> None:
    assert java_string_hash_code("polygenelubricants") == -(2**31)
    assert kafka_abs(-(2**31)) == 0
    assert partition_for_group("polygenelubricants", 50) == 0
    # abs, not masking: -1906497762 -> 1906497762 % 50 == 12 (masking would give 36)
    assert partition_for_group("my-group", 50) == 12
    assert (-1906497762 & 0x7FFFFFFF) % 50 == 36
    assert partition_for_group("hello", 50) == 99162322 % 50
    assert partition_for_group("grüppe-😀", 7) == abs(java_string_hash_code("grüppe-😀")) % 7
    with pytest.raises(ValueError):
        partition_for_group("g", 0)


@given(st.text())
def test_hash_code_matches_the_polynomial(text: str) -> None:
    units = text.encode("utf-16-be", "surrogatepass")
    codes = [int.from_bytes(units[i : i + 2], "big") for i in range(0, len(units), 2)]
    n = len(codes)
    total = sum(c * pow(31, n - 1 - i, 2**32) for i, c in enumerate(codes)) % 2**32
    signed = total - 2**32 if total >= 2**31 else total
    assert java_string_hash_code(text) == signed
    assert 0 <= partition_for_group(text, 50) < 50


# -- keys and values, byte for byte


def test_offset_commit_key_layout() -> None:
    key = encode_offset_commit_key("grp", "topic", 7)
    assert key == struct.pack(">h", 1) + s16("grp") + s16("topic") + struct.pack(">i", 7)
    assert decode_key(key) == OffsetCommitKey("grp", "topic", 7)
    # version 0 keys (older brokers) have the same layout
    assert decode_key(struct.pack(">h", 0) + key[2:]) == OffsetCommitKey("grp", "topic", 7)


def test_group_metadata_key_layout() -> None:
    key = encode_group_metadata_key("grp")
    assert key == struct.pack(">h", 2) + s16("grp")
    assert decode_key(key) == GroupMetadataKey("grp")
    assert decode_key(struct.pack(">h", 5) + b"whatever") is None  # newer group types


def test_offset_commit_value_v3_layout() -> None:
    v = OffsetCommitValue(offset=42, metadata="meta", commit_timestamp=1000, leader_epoch=5)
    raw = encode_offset_commit_value(v)
    assert raw == struct.pack(">hqi", 3, 42, 5) + s16("meta") + struct.pack(">q", 1000)
    assert decode_offset_commit_value(raw) == v


def test_offset_commit_value_v1_with_expiry() -> None:
    v = OffsetCommitValue(42, "", 1000, expire_timestamp=5000)
    raw = encode_offset_commit_value(v)
    assert raw == struct.pack(">hq", 1, 42) + s16("") + struct.pack(">qq", 1000, 5000)
    assert decode_offset_commit_value(raw) == v


def test_offset_commit_value_old_and_flexible_versions() -> None:
    v0 = struct.pack(">hq", 0, 9) + s16("m") + struct.pack(">q", 77)
    assert decode_offset_commit_value(v0) == OffsetCommitValue(9, "m", 77)
    # v4: compact string (length + 1 as uvarint), then an empty tagged-field section
    v4 = struct.pack(">hqi", 4, 9, 2) + b"\x02m" + struct.pack(">q", 77) + b"\x00"
    assert decode_offset_commit_value(v4) == OffsetCommitValue(9, "m", 77, 2)
    # v4 with an unknown tagged field (tag 0, 3 bytes) is skipped
    v4_tag = v4[:-1] + b"\x01\x00\x03abc"
    assert decode_offset_commit_value(v4_tag) == OffsetCommitValue(9, "m", 77, 2)


def test_group_metadata_value_v3_layout() -> None:
    member = MemberMetadataValue("m1", "inst", "client", "/1.2.3.4", 30000, 10000, b"sub", b"asg")
    v = GroupMetadataValue("consumer", 4, "range", "m1", 123, (member,))
    raw = encode_group_metadata_value(v)
    expected = (
        struct.pack(">h", 3)
        + s16("consumer")
        + struct.pack(">i", 4)
        + s16("range")
        + s16("m1")
        + struct.pack(">q", 123)
        + struct.pack(">i", 1)
        + s16("m1")
        + s16("inst")
        + s16("client")
        + s16("/1.2.3.4")
        + struct.pack(">ii", 30000, 10000)
        + b32(b"sub")
        + b32(b"asg")
    )
    assert raw == expected
    assert decode_group_metadata_value(raw) == v
    empty = GroupMetadataValue("consumer", 5, None, None, 999, ())
    assert decode_group_metadata_value(encode_group_metadata_value(empty)) == empty


def test_group_metadata_value_v0() -> None:
    raw = (
        struct.pack(">h", 0)
        + s16("consumer")
        + struct.pack(">i", 2)
        + s16("range")
        + s16("m1")
        + struct.pack(">i", 1)
        + s16("m1")
        + s16("c")
        + s16("h")
        + struct.pack(">i", 6000)
        + b32(b"s")
        + b32(b"a")
    )
    v = decode_group_metadata_value(raw)
    assert v.current_state_timestamp == -1
    assert v.members == (MemberMetadataValue("m1", None, "c", "h", 6000, 6000, b"s", b"a"),)


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"\x00",
        struct.pack(">h", 9),
        struct.pack(">h", 3) + s16("consumer"),
        struct.pack(">h", 3)
        + s16("consumer")
        + struct.pack(">i", 1)
        + s16(None)
        + s16(None)
        # members count far beyond the data
        + struct.pack(">q", 0)
        + struct.pack(">i", 1_000_000),
        struct.pack(">h", 3) + struct.pack(">h", 2) + b"\xff\xfe",  # bad UTF-8
    ],
)
def test_malformed_group_metadata_raises_record_error(bad: bytes) -> None:
    with pytest.raises(GroupRecordError):
        decode_group_metadata_value(bad)


@given(st.binary(max_size=80))
def test_random_bytes_raise_only_record_errors(data: bytes) -> None:
    for decode in (
        decode_key,
        decode_offset_commit_value,
        decode_group_metadata_value,
        parse_subscription_topics,
    ):
        with contextlib.suppress(GroupRecordError):
            decode(data)


members_st = st.builds(
    MemberMetadataValue,
    st.text(max_size=10),
    st.none() | st.text(max_size=5),
    st.text(max_size=5),
    st.text(max_size=5),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**31 - 1),
    st.binary(max_size=20),
    st.binary(max_size=20),
)


@given(
    st.builds(
        GroupMetadataValue,
        st.text(max_size=10),
        st.integers(0, 2**31 - 1),
        st.none() | st.text(max_size=10),
        st.none() | st.text(max_size=10),
        st.integers(-1, 2**62),
        st.lists(members_st, max_size=4).map(tuple),
    )
)
def test_group_metadata_round_trip(v: GroupMetadataValue) -> None:
    assert decode_group_metadata_value(encode_group_metadata_value(v)) == v


@given(
    st.integers(-1, 2**62),
    st.text(max_size=30),
    st.integers(0, 2**62),
    st.integers(-1, 2**31 - 1),
)
def test_offset_commit_round_trip(offset: int, metadata: str, ts: int, epoch: int) -> None:
    v = OffsetCommitValue(offset, metadata, ts, epoch)
    assert decode_offset_commit_value(encode_offset_commit_value(v)) == v


# -- consumer protocol subscription


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscription_topics_of_every_version(version: int) -> None:
    blob = subscription(["a", "b", "ü"], version=version)
    assert parse_subscription_topics(blob) == frozenset({"a", "b", "ü"})


def test_subscription_of_a_future_version_is_read_by_its_prefix() -> None:
    blob = subscription(["a"], version=3)
    assert parse_subscription_topics(struct.pack(">h", 7) + blob[2:] + b"more") == {"a"}
    with pytest.raises(GroupRecordError):
        parse_subscription_topics(struct.pack(">hi", 0, 5))
