"""Consumer protocol decoding (hand-built bytes, versions 0-3 and later) and the offset-reset
rules of tidelog.client.groups."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.client.groups import (
    Assignment,
    ConsumerProtocolError,
    GroupDescription,
    MemberDescription,
    ResetSpec,
    Subscription,
    decode_assignment,
    decode_subscription,
    parse_datetime,
    plan_reset,
)
from tidelog.client.types import TopicPartition

# -- hand-built encodings (big-endian, Kafka's non-flexible primitives) ---------------------


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def string(s: str | None) -> bytes:
    if s is None:
        return i16(-1)
    raw = s.encode()
    return i16(len(raw)) + raw


def nbytes(b: bytes | None) -> bytes:
    return i32(-1) if b is None else i32(len(b)) + b


def topic_partitions(items: list[tuple[str, list[int]]]) -> bytes:
    out = i32(len(items))
    for topic, parts in items:
        out += string(topic) + i32(len(parts)) + b"".join(i32(p) for p in parts)
    return out


def assignment_bytes(
    version: int, items: list[tuple[str, list[int]]], user_data: bytes | None
) -> bytes:
    return i16(version) + topic_partitions(items) + nbytes(user_data)


def subscription_bytes(
    version: int,
    topics: list[str],
    user_data: bytes | None,
    owned: list[tuple[str, list[int]]] | None = None,
    generation: int = -1,
    rack: str | None = None,
) -> bytes:
    out = i16(version) + i32(len(topics)) + b"".join(string(t) for t in topics)
    out += nbytes(user_data)
    if version >= 1:
        out += topic_partitions(owned or [])
    if version >= 2:
        out += i32(generation)
    if version >= 3:
        out += string(rack)
    return out


# -- assignments ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_assignment_every_version(version: int) -> None:
    data = assignment_bytes(version, [("orders", [0, 2]), ("päyments", [7])], b"\x00\xffud")
    assert decode_assignment(data) == Assignment(
        version=version,
        partitions=(
            TopicPartition("orders", 0),
            TopicPartition("orders", 2),
            TopicPartition("päyments", 7),
        ),
        user_data=b"\x00\xffud",
    )


def test_assignment_null_user_data_and_no_topics() -> None:
    assert decode_assignment(assignment_bytes(0, [], None)) == Assignment(0, (), None)
    assert decode_assignment(assignment_bytes(1, [("t", [])], b"")) == Assignment(1, (), b"")


def test_empty_assignment_bytes_mean_not_yet_assigned() -> None:
    assert decode_assignment(b"") == Assignment(0, ())


def test_later_assignment_versions_read_as_version_3_ignoring_appended_fields() -> None:
    data = assignment_bytes(7, [("t", [1])], None) + b"fields a newer writer appended"
    assert decode_assignment(data) == Assignment(7, (TopicPartition("t", 1),), None)


def test_assignment_accepts_memoryview() -> None:
    data = assignment_bytes(0, [("t", [4])], None)
    assert decode_assignment(memoryview(data)).partitions == (TopicPartition("t", 4),)


# -- subscriptions ----------------------------------------------------------------------------


def test_subscription_v0() -> None:
    data = subscription_bytes(0, ["a", "b"], b"ud")
    assert decode_subscription(data) == Subscription(0, ("a", "b"), b"ud")


def test_subscription_v1_owned_partitions() -> None:
    data = subscription_bytes(1, ["a"], None, [("a", [3, 1])])
    assert decode_subscription(data) == Subscription(
        1, ("a",), None, (TopicPartition("a", 3), TopicPartition("a", 1))
    )


def test_subscription_v2_generation() -> None:
    data = subscription_bytes(2, ["a"], None, [], generation=42)
    sub = decode_subscription(data)
    assert (sub.version, sub.generation_id, sub.rack_id, sub.owned_partitions) == (2, 42, None, ())


@pytest.mark.parametrize("rack", ["rack-1", None])
def test_subscription_v3_rack(rack: str | None) -> None:
    data = subscription_bytes(3, ["x", "y"], b"", [("x", [0])], generation=5, rack=rack)
    assert decode_subscription(data) == Subscription(
        3, ("x", "y"), b"", (TopicPartition("x", 0),), 5, rack
    )


def test_later_subscription_versions_read_as_version_3() -> None:
    data = subscription_bytes(3, ["a"], None, [], generation=9, rack="r")
    data = i16(4) + data[2:] + i32(123)
    sub = decode_subscription(data)
    assert (sub.version, sub.topics, sub.generation_id, sub.rack_id) == (4, ("a",), 9, "r")


def test_fields_of_later_versions_are_not_read_from_earlier_ones() -> None:
    # A v0 subscription followed by junk: the junk is not taken for owned partitions.
    data = subscription_bytes(0, ["a"], None) + b"\xff\xff\xff\xff"
    assert decode_subscription(data) == Subscription(0, ("a",), None)


# -- malformed input --------------------------------------------------------------------------

VALID = [
    assignment_bytes(0, [("orders", [0, 1, 2])], b"userdata"),
    subscription_bytes(3, ["orders", "more"], b"ud", [("orders", [1])], 3, "rack"),
]


@pytest.mark.parametrize("index", [0, 1])
def test_every_truncation_is_a_consumer_protocol_error(index: int) -> None:
    decode = decode_assignment if index == 0 else decode_subscription
    data = VALID[index]
    decode(data)
    for cut in range(1, len(data)):
        with pytest.raises(ConsumerProtocolError):
            decode(data[:cut])


def test_huge_counts_are_refused_before_allocating() -> None:
    with pytest.raises(ConsumerProtocolError, match="claims 2147483647 items"):
        decode_assignment(i16(0) + i32(0x7FFFFFFF) + b"\x00" * 16)
    with pytest.raises(ConsumerProtocolError, match="partitions"):
        decode_assignment(i16(0) + i32(1) + string("t") + i32(1_000_000) + i32(0))
    with pytest.raises(ConsumerProtocolError, match="user data"):
        decode_assignment(i16(0) + i32(0) + i32(1_000_000))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (i16(-1) + i32(0) + i32(-1), "version -1 is negative"),
        (i16(0) + i32(1) + i16(-1) + i32(0) + i32(-1), "topic has length -1"),
        (i16(0) + i32(1) + i16(2) + b"\xff\xfe" + i32(0) + i32(-1), "not UTF-8"),
        (i16(0) + i32(-5) + i32(-1), "-5 items"),
        (i16(0) + i32(0) + i32(-3), "user data has length -3"),
        (b"\x00", "version needs 2 bytes"),
    ],
)
def test_malformed_assignments(data: bytes, match: str) -> None:
    with pytest.raises(ConsumerProtocolError, match=match):
        decode_assignment(data)


def test_bad_rack_length() -> None:
    data = subscription_bytes(2, [], None, [], 1) + i16(-2)
    with pytest.raises(ConsumerProtocolError, match="rack id has length -2"):
        decode_subscription(i16(3) + data[2:])


@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_the_modules_error(data: bytes) -> None:
    for decode in (decode_assignment, decode_subscription):
        with contextlib.suppress(ConsumerProtocolError):
            decode(data)


@given(
    st.integers(0, 3),
    st.lists(
        st.tuples(st.text(min_size=1, max_size=8), st.lists(st.integers(0, 2**31 - 1), max_size=4)),
        max_size=4,
    ),
    st.one_of(st.none(), st.binary(max_size=16)),
)
def test_assignment_roundtrip_property(
    version: int, items: list[tuple[str, list[int]]], user_data: bytes | None
) -> None:
    decoded = decode_assignment(assignment_bytes(version, items, user_data))
    assert decoded.version == version
    assert decoded.user_data == user_data
    assert decoded.partitions == tuple(TopicPartition(t, p) for t, ps in items for p in ps)


# -- group description helpers ----------------------------------------------------------------


def test_owner_and_inactive_states() -> None:
    a = MemberDescription("m-a", None, "c-a", "/10.0.0.1", (TopicPartition("t", 0),))
    b = MemberDescription("m-b", "static", "c-b", "/10.0.0.2", (TopicPartition("t", 1),))
    group = GroupDescription("g", "Stable", "consumer", "range", (a, b))
    assert group.owner(TopicPartition("t", 1)) is b
    assert group.owner(TopicPartition("t", 2)) is None
    assert not group.is_inactive
    assert GroupDescription("g", "Empty", "consumer", "").is_inactive
    assert GroupDescription("g", "Dead", "", "").is_inactive
    assert not GroupDescription("g", "PreparingRebalance", "consumer", "").is_inactive


# -- offset resets ----------------------------------------------------------------------------

T0, T1, T2 = (TopicPartition("t", p) for p in range(3))
EARLIEST = {T0: 10, T1: 0, T2: 5}
LATEST = {T0: 20, T1: 0, T2: 50}


def plan(spec: ResetSpec, **kw: object) -> dict[TopicPartition, int]:
    return plan_reset(spec, [T0, T1, T2], earliest=EARLIEST, latest=LATEST, **kw)  # type: ignore[arg-type]


def test_to_earliest_and_latest() -> None:
    assert plan(ResetSpec("earliest")) == {T0: 10, T1: 0, T2: 5}
    assert plan(ResetSpec("latest")) == {T0: 20, T1: 0, T2: 50}


def test_to_offset_is_clamped_to_the_log() -> None:
    assert plan(ResetSpec("offset", 12)) == {T0: 12, T1: 0, T2: 12}
    assert plan(ResetSpec("offset", 0)) == {T0: 10, T1: 0, T2: 5}
    assert plan(ResetSpec("offset", 1000)) == {T0: 20, T1: 0, T2: 50}


def test_shift_by_is_clamped_to_the_log() -> None:
    committed = {T0: 15, T1: 0, T2: 48}
    assert plan(ResetSpec("shift", 3), committed=committed) == {T0: 18, T1: 0, T2: 50}
    assert plan(ResetSpec("shift", -7), committed=committed) == {T0: 10, T1: 0, T2: 41}


def test_shift_needs_a_committed_offset() -> None:
    with pytest.raises(ValueError, match="no committed offset"):
        plan(ResetSpec("shift", 1), committed={T0: 15, T1: 0, T2: None})


def test_to_datetime_falls_back_to_the_end_where_no_record_is_that_late() -> None:
    by_time = {T0: 14, T1: -1, T2: -1}
    assert plan(ResetSpec("datetime", 1_700_000_000_000), by_time=by_time) == {
        T0: 14,
        T1: 0,
        T2: 50,
    }


def test_unknown_reset_kind() -> None:
    with pytest.raises(ValueError, match="expected one of"):
        ResetSpec("sideways")


@given(
    st.sampled_from(["earliest", "latest", "offset", "shift", "datetime"]),
    st.integers(-(2**40), 2**40),
    st.integers(0, 2**40),
    st.integers(0, 2**20),
    st.integers(-1, 2**40),
)
def test_reset_always_lands_inside_the_log(
    kind: str, value: int, low: int, width: int, found: int
) -> None:
    tp = TopicPartition("p", 0)
    high = low + width
    value = abs(value) if kind == "offset" else value
    result = plan_reset(
        ResetSpec(kind, value),
        [tp],
        earliest={tp: low},
        latest={tp: high},
        committed={tp: low + width // 2},
        by_time={tp: found if found < 0 else min(max(found, low), high)},
    )
    assert low <= result[tp] <= high


def test_parse_datetime() -> None:
    assert parse_datetime("1970-01-01T00:00:01") == 1000
    assert parse_datetime("1970-01-01T00:00:01.250Z") == 1250
    assert parse_datetime("1970-01-01T02:00:00+02:00") == 0
    with pytest.raises(ValueError, match="not an ISO 8601"):
        parse_datetime("yesterday")
