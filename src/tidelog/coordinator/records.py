"""The records of ``__consumer_offsets``, in Kafka's own key and value schemas.

Every record key and value starts with an ``int16`` version. Keys:

- version 0 or 1: offset commit key ``group: string, topic: string, partition: int32``
  (Kafka writes version 1; 0 is the same layout from older brokers);
- version 2: group metadata key ``group: string``;
- versions 3 and above belong to the newer group types (KIP-848 consumer groups, share and
  streams groups), which Tidelog does not run; :func:`decode_key` returns ``None`` for them so a
  replay skips them.

Values (a null value is a tombstone: the offset or the group was deleted):

- ``OffsetCommitValue`` v0-v4: ``offset: int64``, ``leaderEpoch: int32`` (v3+), ``metadata:
  string``, ``commitTimestamp: int64``, ``expireTimestamp: int64`` (v1 only); v4 is the flexible
  encoding (compact strings and a tagged-field section). Tidelog writes v3, or v1 when the commit
  carried an explicit retention time (OffsetCommit v2-v4), as Kafka does.
- ``GroupMetadataValue`` v0-v4: ``protocolType: string``, ``generation: int32``, ``protocol:
  nullable string``, ``leader: nullable string``, ``currentStateTimestamp: int64`` (v2+),
  ``members: [memberId: string, groupInstanceId: nullable string (v3+), clientId: string,
  clientHost: string, rebalanceTimeout: int32 (v1+), sessionTimeout: int32, subscription: bytes,
  assignment: bytes]``; v4 is flexible. Tidelog writes v3.

Non-flexible strings are an ``int16`` length (-1 for null) and UTF-8; bytes an ``int32`` length.
Everything read is bounds-checked; malformed input raises :class:`GroupRecordError`.

The consumer protocol subscription (the member metadata of protocol type ``consumer``) is parsed
here too, only as far as its topic list: ``version: int16, topics: [string], ...`` — the topics
come first in every version (0-3), so later fields and newer versions are ignored.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tidelog.coordinator.errors import GroupRecordError

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1
GROUP_METADATA_VALUE_VERSION = 3

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    offset: int
    metadata: str
    commit_timestamp: int
    leader_epoch: int = -1
    expire_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class MemberMetadataValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[MemberMetadataValue, ...]


# -- writing


class _Writer:
    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def i16(self, v: int) -> None:
        self.buf += _I16.pack(v)

    def i32(self, v: int) -> None:
        self.buf += _I32.pack(v)

    def i64(self, v: int) -> None:
        self.buf += _I64.pack(v)

    def string(self, v: str | None) -> None:
        if v is None:
            self.i16(-1)
            return
        data = v.encode("utf-8")
        if len(data) > 0x7FFF:
            raise ValueError(f"a string field is at most 32767 bytes, got {len(data)}")
        self.i16(len(data))
        self.buf += data

    def bytes_(self, v: bytes) -> None:
        self.i32(len(v))
        self.buf += v


def encode_offset_commit_key(group: str, topic: str, partition: int) -> bytes:
    w = _Writer()
    w.i16(OFFSET_COMMIT_KEY_VERSION)
    w.string(group)
    w.string(topic)
    w.i32(partition)
    return bytes(w.buf)


def encode_group_metadata_key(group: str) -> bytes:
    w = _Writer()
    w.i16(GROUP_METADATA_KEY_VERSION)
    w.string(group)
    return bytes(w.buf)


def encode_offset_commit_value(value: OffsetCommitValue) -> bytes:
    """Version 3, or version 1 when the commit has an explicit expire timestamp."""
    w = _Writer()
    if value.expire_timestamp >= 0:
        w.i16(OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY)
        w.i64(value.offset)
        w.string(value.metadata)
        w.i64(value.commit_timestamp)
        w.i64(value.expire_timestamp)
    else:
        w.i16(OFFSET_COMMIT_VALUE_VERSION)
        w.i64(value.offset)
        w.i32(value.leader_epoch)
        w.string(value.metadata)
        w.i64(value.commit_timestamp)
    return bytes(w.buf)


def encode_group_metadata_value(value: GroupMetadataValue) -> bytes:
    w = _Writer()
    w.i16(GROUP_METADATA_VALUE_VERSION)
    w.string(value.protocol_type)
    w.i32(value.generation)
    w.string(value.protocol)
    w.string(value.leader)
    w.i64(value.current_state_timestamp)
    w.i32(len(value.members))
    for m in value.members:
        w.string(m.member_id)
        w.string(m.group_instance_id)
        w.string(m.client_id)
        w.string(m.client_host)
        w.i32(m.rebalance_timeout_ms)
        w.i32(m.session_timeout_ms)
        w.bytes_(m.subscription)
        w.bytes_(m.assignment)
    return bytes(w.buf)


# -- reading


class _Reader:
    """Bounds-checked reader over one key or value; ``flexible`` switches to compact forms."""

    __slots__ = ("data", "flexible", "pos", "what")

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what
        self.flexible = False

    def _take(self, n: int) -> bytes:
        if n < 0 or len(self.data) - self.pos < n:
            raise GroupRecordError(
                f"{self.what}: needs {n} bytes at position {self.pos}, "
                f"only {len(self.data) - self.pos} remain"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def i16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def uvarint(self) -> int:
        result = 0
        shift = 0
        while True:
            b = self._take(1)[0]
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 28:
                raise GroupRecordError(f"{self.what}: unsigned varint longer than 5 bytes")

    def _length(self, *, wide: bool) -> int:
        """A length (-1 for null) in the current encoding."""
        if self.flexible:
            return self.uvarint() - 1
        return self.i32() if wide else self.i16()

    def nullable_string(self) -> str | None:
        n = self._length(wide=False)
        if n < 0:
            return None
        raw = self._take(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GroupRecordError(f"{self.what}: a string is not valid UTF-8") from exc

    def string(self) -> str:
        s = self.nullable_string()
        if s is None:
            raise GroupRecordError(f"{self.what}: a non-nullable string is null")
        return s

    def bytes_(self) -> bytes:
        n = self._length(wide=True)
        if n < 0:
            raise GroupRecordError(f"{self.what}: a non-nullable bytes field is null")
        return self._take(n)

    def array_length(self, min_item_size: int) -> int:
        n = self._length(wide=True)
        if n < 0:
            raise GroupRecordError(f"{self.what}: a non-nullable array is null")
        if n * min_item_size > len(self.data) - self.pos:
            raise GroupRecordError(f"{self.what}: array of {n} items exceeds the remaining bytes")
        return n

    def tagged_fields(self) -> None:
        """Skip a tagged-field section (flexible versions); no tags are known here."""
        if not self.flexible:
            return
        for _ in range(self.uvarint()):
            self.uvarint()
            self._take(self.uvarint())

    def end(self) -> None:
        # Kafka tolerates trailing bytes in these records (newer writers may add fields).
        return


def decode_key(key: bytes | None) -> OffsetCommitKey | GroupMetadataKey | None:
    """The key of a ``__consumer_offsets`` record; ``None`` for key versions Tidelog ignores."""
    if key is None:
        raise GroupRecordError("a __consumer_offsets record has no key")
    r = _Reader(bytes(key), "__consumer_offsets key")
    version = r.i16()
    if version in (0, 1):
        group = r.string()
        topic = r.string()
        partition = r.i32()
        return OffsetCommitKey(group, topic, partition)
    if version == 2:
        return GroupMetadataKey(r.string())
    if version < 0:
        raise GroupRecordError(f"__consumer_offsets key has negative version {version}")
    return None


def decode_offset_commit_value(value: bytes) -> OffsetCommitValue:
    r = _Reader(bytes(value), "OffsetCommitValue")
    version = r.i16()
    if not 0 <= version <= 4:
        raise GroupRecordError(f"OffsetCommitValue version {version} is not one of 0-4")
    r.flexible = version >= 4
    offset = r.i64()
    leader_epoch = r.i32() if version >= 3 else -1
    metadata = r.string()
    commit_timestamp = r.i64()
    expire_timestamp = r.i64() if version == 1 else -1
    r.tagged_fields()
    return OffsetCommitValue(offset, metadata, commit_timestamp, leader_epoch, expire_timestamp)


def decode_group_metadata_value(value: bytes) -> GroupMetadataValue:
    r = _Reader(bytes(value), "GroupMetadataValue")
    version = r.i16()
    if not 0 <= version <= 4:
        raise GroupRecordError(f"GroupMetadataValue version {version} is not one of 0-4")
    r.flexible = version >= 4
    protocol_type = r.string()
    generation = r.i32()
    protocol = r.nullable_string()
    leader = r.nullable_string()
    state_ts = r.i64() if version >= 2 else -1
    count = r.array_length(min_item_size=16)
    members = []
    for _ in range(count):
        member_id = r.string()
        instance_id = r.nullable_string() if version >= 3 else None
        client_id = r.string()
        client_host = r.string()
        rebalance_timeout = r.i32() if version >= 1 else -1
        session_timeout = r.i32()
        if rebalance_timeout < 0:
            # v0 had no rebalance timeout; Kafka used the session timeout for both then
            rebalance_timeout = session_timeout
        subscription = r.bytes_()
        assignment = r.bytes_()
        r.tagged_fields()
        members.append(
            MemberMetadataValue(
                member_id,
                instance_id,
                client_id,
                client_host,
                rebalance_timeout,
                session_timeout,
                subscription,
                assignment,
            )
        )
    r.tagged_fields()
    return GroupMetadataValue(protocol_type, generation, protocol, leader, state_ts, tuple(members))


def parse_subscription_topics(metadata: bytes) -> frozenset[str]:
    """The topics of a ``ConsumerProtocolSubscription`` (any version; topics come first)."""
    r = _Reader(bytes(metadata), "ConsumerProtocolSubscription")
    version = r.i16()
    if version < 0:
        raise GroupRecordError(f"ConsumerProtocolSubscription has negative version {version}")
    count = r.array_length(min_item_size=2)
    return frozenset(r.string() for _ in range(count))
