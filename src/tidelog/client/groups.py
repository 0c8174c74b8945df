"""Consumer groups as the admin sees them: value types, the consumer protocol's member
metadata, and the offset-reset rules of Kafka's consumer-group tool.

Members of a group whose protocol type is ``consumer`` carry two opaque byte strings that the
broker stores without reading: the *subscription* a member sent in JoinGroup and the
*assignment* the leader handed it in SyncGroup. Both are Kafka's non-flexible
ConsumerProtocolSubscription / ConsumerProtocolAssignment messages, prefixed with an int16
version (big-endian throughout; strings are int16 length + UTF-8, bytes are int32 length with
-1 for null, arrays are int32 count with -1 for null)::

    Assignment    v0-v3:  version, [topic string, [partition int32]], user_data bytes
    Subscription  v0:     version, [topic string], user_data bytes
                  v1+:    ... owned_partitions [topic string, [partition int32]]
                  v2+:    ... generation_id int32
                  v3+:    ... rack_id nullable string

Versions above 3 are read as version 3 and what follows is ignored, because newer writers only
append fields (Kafka's own decoder does the same). Every length is checked against the bytes
that are left before anything is allocated; malformed input raises
:class:`ConsumerProtocolError`.

:func:`plan_reset` holds the reset rules of ``kafka-consumer-groups --reset-offsets``.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tidelog.client.errors import ClientError
from tidelog.client.types import TopicPartition

HIGHEST_CONSUMER_PROTOCOL_VERSION = 3

# Group states a classic group can be in, as DescribeGroups and ListGroups name them.
INACTIVE_STATES = frozenset({"Empty", "Dead"})


class ConsumerProtocolError(ClientError):
    """A member's subscription or assignment bytes are not a valid consumer protocol message."""


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A committed offset: the next offset the group will read, with optional metadata."""

    offset: int
    metadata: str | None = None
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadata:
    """A group member as a transactional producer names it when it commits offsets in a
    transaction (KIP-447): its coordinator then fences a member that is no longer in the
    group's current generation. Only ``group_id``: no fencing (generation -1)."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class Assignment:
    version: int
    partitions: tuple[TopicPartition, ...]
    user_data: bytes | None = None


@dataclass(frozen=True, slots=True)
class Subscription:
    version: int
    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation_id: int = -1
    rack_id: str | None = None


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    state: str
    protocol_type: str
    group_type: str = ""


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: tuple[TopicPartition, ...] = ()
    subscription: Subscription | None = None


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: tuple[MemberDescription, ...] = field(default_factory=tuple)
    coordinator: int = -1

    @property
    def is_inactive(self) -> bool:
        """No member is active: Kafka lets offsets be altered only then."""
        return self.state in INACTIVE_STATES

    def owner(self, tp: TopicPartition) -> MemberDescription | None:
        for member in self.members:
            if tp in member.assignment:
                return member
        return None


class _Reader:
    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def _take(self, size: int, field_name: str) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise ConsumerProtocolError(
                f"{self.what}: {field_name} needs {size} bytes at offset {self.pos}, "
                f"only {len(self.data) - self.pos} left"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def int16(self, field_name: str) -> int:
        value: int = struct.unpack(">h", self._take(2, field_name))[0]
        return value

    def int32(self, field_name: str) -> int:
        value: int = struct.unpack(">i", self._take(4, field_name))[0]
        return value

    def string(self, field_name: str, *, nullable: bool = False) -> str | None:
        size = self.int16(field_name)
        if size < 0:
            if nullable and size == -1:
                return None
            raise ConsumerProtocolError(f"{self.what}: {field_name} has length {size}")
        raw = self._take(size, field_name)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConsumerProtocolError(f"{self.what}: {field_name} is not UTF-8") from None

    def required_string(self, field_name: str) -> str:
        value = self.string(field_name)
        assert value is not None
        return value

    def nullable_bytes(self, field_name: str) -> bytes | None:
        size = self.int32(field_name)
        if size == -1:
            return None
        if size < 0:
            raise ConsumerProtocolError(f"{self.what}: {field_name} has length {size}")
        return bytes(self._take(size, field_name))

    def count(self, field_name: str, item_size: int) -> int:
        """An array length, checked against the bytes left (each item needs ``item_size``)."""
        size = self.int32(field_name)
        if size < 0:
            # Kafka writes these arrays as non-nullable; a null one holds nothing.
            if size == -1:
                return 0
            raise ConsumerProtocolError(f"{self.what}: {field_name} has {size} items")
        if size * item_size > len(self.data) - self.pos:
            raise ConsumerProtocolError(
                f"{self.what}: {field_name} claims {size} items but only "
                f"{len(self.data) - self.pos} bytes are left"
            )
        return size

    def topic_partitions(self, field_name: str) -> tuple[TopicPartition, ...]:
        out: list[TopicPartition] = []
        # A topic entry is at least a string length and an array count.
        for _ in range(self.count(field_name, 6)):
            topic = self.required_string(f"{field_name} topic")
            n = self.count(f"{field_name} partitions of {topic!r}", 4)
            raw = self._take(4 * n, f"{field_name} partitions of {topic!r}")
            out.extend(TopicPartition(topic, p) for p in struct.unpack(f">{n}i", raw))
        return tuple(out)


def _version(reader: _Reader) -> int:
    version = reader.int16("version")
    if version < 0:
        raise ConsumerProtocolError(f"{reader.what}: version {version} is negative")
    return version


def decode_assignment(data: bytes | bytearray | memoryview) -> Assignment:
    """A member's assignment; empty bytes (a member not yet synced) is an empty assignment."""
    raw = bytes(data)
    if not raw:
        return Assignment(version=0, partitions=())
    reader = _Reader(raw, "consumer assignment")
    version = _version(reader)
    partitions = reader.topic_partitions("assigned partitions")
    user_data = reader.nullable_bytes("user data")
    return Assignment(version=version, partitions=partitions, user_data=user_data)


def decode_subscription(data: bytes | bytearray | memoryview) -> Subscription:
    """A member's subscription, the metadata it sent when it joined."""
    reader = _Reader(bytes(data), "consumer subscription")
    version = _version(reader)
    topics = tuple(reader.required_string("topic") for _ in range(reader.count("topics", 2)))
    user_data = reader.nullable_bytes("user data")
    owned: tuple[TopicPartition, ...] = ()
    generation_id = -1
    rack_id = None
    if version >= 1:
        owned = reader.topic_partitions("owned partitions")
    if version >= 2:
        generation_id = reader.int32("generation id")
    if version >= 3:
        rack_id = reader.string("rack id", nullable=True)
    return Subscription(
        version=version,
        topics=topics,
        user_data=user_data,
        owned_partitions=owned,
        generation_id=generation_id,
        rack_id=rack_id,
    )


# -- encoding (what a member sends in JoinGroup, what a leader sends in SyncGroup) ------------


def _put_string(out: bytearray, value: str) -> None:
    raw = value.encode("utf-8")
    if len(raw) > 0x7FFF:
        raise ConsumerProtocolError(f"string of {len(raw)} bytes is too long for an int16 length")
    out += struct.pack(">h", len(raw))
    out += raw


def _put_bytes(out: bytearray, value: bytes | None) -> None:
    if value is None:
        out += struct.pack(">i", -1)
    else:
        out += struct.pack(">i", len(value))
        out += value


def _put_topic_partitions(out: bytearray, partitions: Iterable[TopicPartition]) -> None:
    # Topics in order of first appearance, partitions in the order given.
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    out += struct.pack(">i", len(by_topic))
    for topic, numbers in by_topic.items():
        _put_string(out, topic)
        out += struct.pack(f">i{len(numbers)}i", len(numbers), *numbers)


def _check_version(version: int) -> None:
    if not 0 <= version <= HIGHEST_CONSUMER_PROTOCOL_VERSION:
        raise ConsumerProtocolError(
            f"consumer protocol version {version}: expected 0..{HIGHEST_CONSUMER_PROTOCOL_VERSION}"
        )


def encode_subscription(subscription: Subscription) -> bytes:
    """``subscription`` as ConsumerProtocolSubscription bytes of its version (fields the
    version does not have are left out)."""
    version = subscription.version
    _check_version(version)
    out = bytearray(struct.pack(">hi", version, len(subscription.topics)))
    for topic in subscription.topics:
        _put_string(out, topic)
    _put_bytes(out, subscription.user_data)
    if version >= 1:
        _put_topic_partitions(out, subscription.owned_partitions)
    if version >= 2:
        out += struct.pack(">i", subscription.generation_id)
    if version >= 3:
        if subscription.rack_id is None:
            out += struct.pack(">h", -1)
        else:
            _put_string(out, subscription.rack_id)
    return bytes(out)


def encode_assignment(assignment: Assignment) -> bytes:
    """``assignment`` as ConsumerProtocolAssignment bytes (one layout for v0-v3)."""
    _check_version(assignment.version)
    out = bytearray(struct.pack(">h", assignment.version))
    _put_topic_partitions(out, assignment.partitions)
    _put_bytes(out, assignment.user_data)
    return bytes(out)


# -- offset resets ----------------------------------------------------------------------------

RESET_KINDS = ("earliest", "latest", "datetime", "offset", "shift")


@dataclass(frozen=True, slots=True)
class ResetSpec:
    """Where to move a group's offsets: ``kind`` is one of RESET_KINDS; ``value`` is the
    target offset, the shift, or the epoch-millisecond time."""

    kind: str
    value: int = 0

    def __post_init__(self) -> None:
        if self.kind not in RESET_KINDS:
            raise ValueError(f"reset {self.kind!r}: expected one of {', '.join(RESET_KINDS)}")


def parse_datetime(text: str) -> int:
    """Epoch milliseconds of an ISO 8601 time (``2024-05-01T12:00:00.000``, optional zone;
    without one it is UTC)."""
    stripped = text.strip()
    try:
        moment = datetime.datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO 8601 date and time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def plan_reset(
    spec: ResetSpec,
    partitions: Iterable[TopicPartition],
    *,
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    committed: Mapping[TopicPartition, int | None] | None = None,
    by_time: Mapping[TopicPartition, int] | None = None,
) -> dict[TopicPartition, int]:
    """The new committed offset of each partition under Kafka's reset rules.

    ``earliest``/``latest`` are the log start and end offsets. An explicit offset and a shift
    are clamped to [earliest, latest]. A shift needs a committed offset. For a time, ``by_time``
    holds the first offset at or after it, or -1 where there is none: such a partition moves
    to its end, as Kafka's tool does.
    """
    out: dict[TopicPartition, int] = {}
    for tp in partitions:
        low, high = earliest[tp], latest[tp]
        if spec.kind == "earliest":
            target = low
        elif spec.kind == "latest":
            target = high
        elif spec.kind == "datetime":
            found = -1 if by_time is None else by_time.get(tp, -1)
            target = high if found < 0 else found
        elif spec.kind == "offset":
            target = spec.value
        else:
            current = None if committed is None else committed.get(tp)
            if current is None:
                raise ValueError(
                    f"cannot shift the offset of {tp}: the group has no committed offset for it"
                )
            target = current + spec.value
        out[tp] = min(max(target, low), high)
    return out


__all__ = [
    "HIGHEST_CONSUMER_PROTOCOL_VERSION",
    "INACTIVE_STATES",
    "RESET_KINDS",
    "Assignment",
    "ConsumerProtocolError",
    "GroupDescription",
    "GroupListing",
    "MemberDescription",
    "OffsetAndMetadata",
    "ResetSpec",
    "Subscription",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "encode_subscription",
    "parse_datetime",
    "plan_reset",
]
