"""The consumer protocol bytes a member and a leader send: Kafka's ConsumerProtocolSubscription
and ConsumerProtocolAssignment layouts, checked against hand-built bytes and round trips."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.client.groups import (
    Assignment,
    ConsumerProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from tidelog.client.types import TopicPartition as TP


def s16(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def test_subscription_v3_layout() -> None:
    sub = Subscription(
        3, ("a", "bb"), b"\x00\x00\x00\x07", (TP("a", 2), TP("a", 0), TP("bb", 1)), 7, "r1"
    )
    expected = (
        struct.pack(">hi", 3, 2)
        + s16("a")
        + s16("bb")
        + struct.pack(">i", 4)
        + b"\x00\x00\x00\x07"
        + struct.pack(">i", 2)
        + s16("a")
        + struct.pack(">iii", 2, 2, 0)
        + s16("bb")
        + struct.pack(">ii", 1, 1)
        + struct.pack(">i", 7)
        + s16("r1")
    )
    assert encode_subscription(sub) == expected


def test_subscription_v0_leaves_out_later_fields_and_null_rack_is_minus_one() -> None:
    sub = Subscription(0, ("t",), None, (TP("t", 0),), 5, "ignored")
    assert encode_subscription(sub) == struct.pack(">hi", 0, 1) + s16("t") + struct.pack(">i", -1)
    v3 = encode_subscription(Subscription(3, (), None))
    assert v3.endswith(struct.pack(">h", -1)) and decode_subscription(v3).rack_id is None


def test_assignment_layout() -> None:
    data = encode_assignment(Assignment(3, (TP("x", 1), TP("x", 4), TP("y", 0)), None))
    expected = (
        struct.pack(">hi", 3, 2)
        + s16("x")
        + struct.pack(">iii", 2, 1, 4)
        + s16("y")
        + struct.pack(">ii", 1, 0)
        + struct.pack(">i", -1)
    )
    assert data == expected


def test_versions_outside_the_known_range_are_refused() -> None:
    with pytest.raises(ConsumerProtocolError):
        encode_subscription(Subscription(4, ("t",)))
    with pytest.raises(ConsumerProtocolError):
        encode_assignment(Assignment(-1, ()))


names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8)
partitions = st.lists(st.builds(TP, names, st.integers(0, 2**31 - 1)), max_size=8)


@given(
    st.integers(0, 3),
    st.lists(names, max_size=5).map(tuple),
    st.none() | st.binary(max_size=16),
    partitions,
    st.integers(-1, 2**31 - 1),
    st.none() | names,
)
def test_subscription_round_trip(
    version: int,
    topics: tuple[str, ...],
    user_data: bytes | None,
    owned: list[TP],
    generation: int,
    rack: str | None,
) -> None:
    # Encoding groups partitions by topic (first appearance), as Kafka's writer does.
    grouped = tuple(sorted(owned, key=lambda tp: [t for t, _ in owned].index(tp.topic)))
    sub = Subscription(version, topics, user_data, grouped, generation, rack)
    back = decode_subscription(encode_subscription(sub))
    assert back.topics == topics and back.user_data == user_data
    assert back.owned_partitions == (grouped if version >= 1 else ())
    assert back.generation_id == (generation if version >= 2 else -1)
    assert back.rack_id == (rack if version >= 3 else None)


@given(st.integers(0, 3), partitions, st.none() | st.binary(max_size=16))
def test_assignment_round_trip(version: int, parts: list[TP], user_data: bytes | None) -> None:
    grouped = tuple(sorted(parts, key=lambda tp: [t for t, _ in parts].index(tp.topic)))
    back = decode_assignment(encode_assignment(Assignment(version, grouped, user_data)))
    assert back == Assignment(version, grouped, user_data)
