"""Metadata records: what the metadata log holds, one record per record-batch record.

Encoding of one record's value (the record key is null)::

    type     uint8     which record (RecordType)
    version  uint8     the version of that type's body (all are 0 today)
    body     UTF-8 JSON object, keys sorted, no spaces

JSON keeps the records readable with ``tidelog dump-log`` and makes adding a field
cheap: a decoder ignores fields it does not know, and a field added later gets a default,
so a newer body version only appears when a field changes meaning. UUIDs are written in
their 36-character text form. Every record is small, and the batch around it is
checksummed (CRC-32C) and may be compressed, so a binary body would buy little.

Decoding never trusts the bytes: a wrong type, a body that is not a JSON object or a
field of the wrong type raises :class:`~tidelog.metadata.errors.MetadataRecordError`.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from tidelog.metadata.errors import MetadataRecordError

__all__ = [
    "AccessControlEntryRecord",
    "BrokerEndpoint",
    "BrokerRegistrationChangeRecord",
    "ClientQuotaRecord",
    "ConfigRecord",
    "FeatureLevelRecord",
    "MetadataRecord",
    "PartitionChangeRecord",
    "PartitionRecord",
    "ProducerIdsRecord",
    "RecordType",
    "RegisterBrokerRecord",
    "RemoveAccessControlEntryRecord",
    "RemoveTopicRecord",
    "RemoveUserScramCredentialRecord",
    "TopicRecord",
    "UnregisterBrokerRecord",
    "UserScramCredentialRecord",
    "decode_record",
    "encode_record",
]

# Body sizes are bounded by the batch; this bounds what a decoder even looks at.
MAX_RECORD_BYTES = 64 * 1024 * 1024


class RecordType(enum.IntEnum):
    REGISTER_BROKER = 1
    TOPIC = 2
    PARTITION = 3
    PARTITION_CHANGE = 4
    CONFIG = 5
    REMOVE_TOPIC = 6
    PRODUCER_IDS = 7
    FEATURE_LEVEL = 8
    USER_SCRAM_CREDENTIAL = 9
    REMOVE_USER_SCRAM_CREDENTIAL = 10
    UNREGISTER_BROKER = 11
    BROKER_REGISTRATION_CHANGE = 12
    ACCESS_CONTROL_ENTRY = 13
    REMOVE_ACCESS_CONTROL_ENTRY = 14
    CLIENT_QUOTA = 15


Json = dict[str, object]


class _Fields:
    """Typed access to a decoded JSON body; every mismatch is a MetadataRecordError."""

    def __init__(self, kind: str, body: Mapping[str, object]) -> None:
        self.kind = kind
        self.body = body

    def _fail(self, name: str, expected: str) -> MetadataRecordError:
        return MetadataRecordError(
            f"{self.kind} record field {name!r} is {self.body.get(name)!r}, expected {expected}"
        )

    def integer(self, name: str, default: int | None = None) -> int:
        value = self.body.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._fail(name, "an integer")
        return value

    def text(self, name: str) -> str:
        value = self.body.get(name)
        if not isinstance(value, str):
            raise self._fail(name, "a string")
        return value

    def opt_text(self, name: str) -> str | None:
        value = self.body.get(name)
        if value is not None and not isinstance(value, str):
            raise self._fail(name, "a string or null")
        return value

    def uid(self, name: str) -> uuid.UUID:
        text = self.text(name)
        try:
            return uuid.UUID(text)
        except ValueError:
            raise self._fail(name, "a UUID") from None

    def integers(self, name: str) -> tuple[int, ...]:
        value = self.body.get(name)
        if not isinstance(value, list) or not all(
            isinstance(item, int) and not isinstance(item, bool) for item in value
        ):
            raise self._fail(name, "a list of integers")
        return tuple(value)

    def opt_integers(self, name: str) -> tuple[int, ...] | None:
        return None if self.body.get(name) is None else self.integers(name)

    def opt_integer(self, name: str) -> int | None:
        return None if self.body.get(name) is None else self.integer(name)

    def flag(self, name: str, default: bool) -> bool:
        value = self.body.get(name, default)
        if not isinstance(value, bool):
            raise self._fail(name, "a boolean")
        return value

    def opt_flag(self, name: str) -> bool | None:
        value = self.body.get(name)
        if value is not None and not isinstance(value, bool):
            raise self._fail(name, "a boolean or null")
        return value

    def uids(self, name: str) -> tuple[uuid.UUID, ...]:
        """A list of UUIDs (empty when the field is absent)."""
        value = self.body.get(name, [])
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self._fail(name, "a list of UUIDs")
        try:
            return tuple(uuid.UUID(item) for item in value)
        except ValueError:
            raise self._fail(name, "a list of UUIDs") from None

    def data(self, name: str) -> bytes:
        """Bytes, written as standard base64 text."""
        text = self.text(name)
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise self._fail(name, "base64 bytes") from None

    def number(self, name: str) -> float:
        value = self.body.get(name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self._fail(name, "a number")
        return float(value)

    def objects(self, name: str) -> list[Mapping[str, object]]:
        value = self.body.get(name)
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise self._fail(name, "a list of objects")
        return value


@dataclass(frozen=True)
class BrokerEndpoint:
    name: str
    host: str
    port: int
    security_protocol: str


@dataclass(frozen=True)
class RegisterBrokerRecord:
    """A broker registered (Kafka's RegisterBrokerRecord); ``incarnation_id`` is new at
    every start of the broker process.

    The broker epoch is the offset of this record in the metadata log (as in KRaft). A
    broker registers fenced, as in Kafka: it is given no leadership until a heartbeat
    shows it has caught up with the metadata log. ``log_dirs`` are its log directory ids.
    A record written before these fields existed reads as fenced, not shutting down.
    """

    TYPE: ClassVar[RecordType] = RecordType.REGISTER_BROKER
    broker_id: int
    incarnation_id: uuid.UUID
    endpoints: tuple[BrokerEndpoint, ...]
    rack: str | None = None
    fenced: bool = True
    in_controlled_shutdown: bool = False
    log_dirs: tuple[uuid.UUID, ...] = ()

    def to_json(self) -> Json:
        return {
            "broker_id": self.broker_id,
            "incarnation_id": str(self.incarnation_id),
            "endpoints": [
                {"name": e.name, "host": e.host, "port": e.port, "protocol": e.security_protocol}
                for e in self.endpoints
            ],
            "rack": self.rack,
            "fenced": self.fenced,
            "in_controlled_shutdown": self.in_controlled_shutdown,
            "log_dirs": [str(d) for d in self.log_dirs],
        }

    @classmethod
    def from_json(cls, f: _Fields) -> RegisterBrokerRecord:
        endpoints = []
        for item in f.objects("endpoints"):
            e = _Fields("endpoint", item)
            endpoints.append(
                BrokerEndpoint(
                    e.text("name"), e.text("host"), e.integer("port"), e.text("protocol")
                )
            )
        return cls(
            f.integer("broker_id"),
            f.uid("incarnation_id"),
            tuple(endpoints),
            f.opt_text("rack"),
            f.flag("fenced", True),
            f.flag("in_controlled_shutdown", False),
            f.uids("log_dirs"),
        )


@dataclass(frozen=True)
class UnregisterBrokerRecord:
    """The broker's registration of ``broker_epoch`` is removed (Kafka's
    UnregisterBrokerRecord): it is no longer a member of the cluster."""

    TYPE: ClassVar[RecordType] = RecordType.UNREGISTER_BROKER
    broker_id: int
    broker_epoch: int

    def to_json(self) -> Json:
        return {"broker_id": self.broker_id, "broker_epoch": self.broker_epoch}

    @classmethod
    def from_json(cls, f: _Fields) -> UnregisterBrokerRecord:
        return cls(f.integer("broker_id"), f.integer("broker_epoch"))


@dataclass(frozen=True)
class BrokerRegistrationChangeRecord:
    """A registered broker's state changes (Kafka's BrokerRegistrationChangeRecord).

    ``fenced``: True fences it, False unfences it (Kafka's int8 1 and -1);
    ``in_controlled_shutdown``: True marks it as shutting down in a controlled way; None
    leaves either as it is (Kafka's 0). ``broker_epoch`` names the registration the change
    is for: replaying it against another registration is an error.
    """

    TYPE: ClassVar[RecordType] = RecordType.BROKER_REGISTRATION_CHANGE
    broker_id: int
    broker_epoch: int
    fenced: bool | None = None
    in_controlled_shutdown: bool | None = None

    def to_json(self) -> Json:
        return {
            "broker_id": self.broker_id,
            "broker_epoch": self.broker_epoch,
            "fenced": self.fenced,
            "in_controlled_shutdown": self.in_controlled_shutdown,
        }

    @classmethod
    def from_json(cls, f: _Fields) -> BrokerRegistrationChangeRecord:
        return cls(
            f.integer("broker_id"),
            f.integer("broker_epoch"),
            f.opt_flag("fenced"),
            f.opt_flag("in_controlled_shutdown"),
        )


@dataclass(frozen=True)
class TopicRecord:
    """A topic exists under ``name`` with id ``topic_id`` (its partitions follow)."""

    TYPE: ClassVar[RecordType] = RecordType.TOPIC
    name: str
    topic_id: uuid.UUID

    def to_json(self) -> Json:
        return {"name": self.name, "topic_id": str(self.topic_id)}

    @classmethod
    def from_json(cls, f: _Fields) -> TopicRecord:
        return cls(f.text("name"), f.uid("topic_id"))


@dataclass(frozen=True)
class PartitionRecord:
    """A partition of a topic with its whole state (creation, or a full restatement).

    ``adding_replicas`` and ``removing_replicas`` describe a reassignment under way
    (KIP-455): ``replicas`` is then the target replicas followed by those being removed.
    They are written only when not empty, so a record without them (every record written
    before reassignments existed) reads as "no reassignment".
    """

    TYPE: ClassVar[RecordType] = RecordType.PARTITION
    topic_id: uuid.UUID
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    def to_json(self) -> Json:
        body: Json = {
            "topic_id": str(self.topic_id),
            "partition": self.partition,
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "partition_epoch": self.partition_epoch,
        }
        if self.adding_replicas:
            body["adding_replicas"] = list(self.adding_replicas)
        if self.removing_replicas:
            body["removing_replicas"] = list(self.removing_replicas)
        return body

    @classmethod
    def from_json(cls, f: _Fields) -> PartitionRecord:
        return cls(
            f.uid("topic_id"),
            f.integer("partition"),
            f.integers("replicas"),
            f.integers("isr"),
            f.integer("leader"),
            f.integer("leader_epoch", 0),
            f.integer("partition_epoch", 0),
            f.opt_integers("adding_replicas") or (),
            f.opt_integers("removing_replicas") or (),
        )


@dataclass(frozen=True)
class PartitionChangeRecord:
    """A change of leader, ISR, replicas or reassignment; ``None`` fields stay as they are.

    Applying it raises the partition epoch by one, and the leader epoch by one when the
    leader changes. ``adding_replicas``/``removing_replicas`` (KIP-455) are written only
    when set, so records from before reassignments existed read as "unchanged".
    """

    TYPE: ClassVar[RecordType] = RecordType.PARTITION_CHANGE
    topic_id: uuid.UUID
    partition: int
    leader: int | None = None
    isr: tuple[int, ...] | None = None
    replicas: tuple[int, ...] | None = None
    adding_replicas: tuple[int, ...] | None = None
    removing_replicas: tuple[int, ...] | None = None

    def to_json(self) -> Json:
        body: Json = {
            "topic_id": str(self.topic_id),
            "partition": self.partition,
            "leader": self.leader,
            "isr": None if self.isr is None else list(self.isr),
            "replicas": None if self.replicas is None else list(self.replicas),
        }
        if self.adding_replicas is not None:
            body["adding_replicas"] = list(self.adding_replicas)
        if self.removing_replicas is not None:
            body["removing_replicas"] = list(self.removing_replicas)
        return body

    @classmethod
    def from_json(cls, f: _Fields) -> PartitionChangeRecord:
        return cls(
            f.uid("topic_id"),
            f.integer("partition"),
            f.opt_integer("leader"),
            f.opt_integers("isr"),
            f.opt_integers("replicas"),
            f.opt_integers("adding_replicas"),
            f.opt_integers("removing_replicas"),
        )


@dataclass(frozen=True)
class ConfigRecord:
    """Set (``value`` text) or delete (``value`` None) one config key of a resource.

    ``resource_type`` is Kafka's ConfigResource type: 2 topic (name: the topic name),
    4 broker (name: the node id as text, or "" for the cluster-wide default).
    """

    TYPE: ClassVar[RecordType] = RecordType.CONFIG
    resource_type: int
    resource_name: str
    name: str
    value: str | None

    def to_json(self) -> Json:
        return {
            "resource_type": self.resource_type,
            "resource_name": self.resource_name,
            "name": self.name,
            "value": self.value,
        }

    @classmethod
    def from_json(cls, f: _Fields) -> ConfigRecord:
        return cls(
            f.integer("resource_type"), f.text("resource_name"), f.text("name"), f.opt_text("value")
        )


@dataclass(frozen=True)
class RemoveTopicRecord:
    """The topic with this id is gone, with its partitions and config overrides."""

    TYPE: ClassVar[RecordType] = RecordType.REMOVE_TOPIC
    topic_id: uuid.UUID

    def to_json(self) -> Json:
        return {"topic_id": str(self.topic_id)}

    @classmethod
    def from_json(cls, f: _Fields) -> RemoveTopicRecord:
        return cls(f.uid("topic_id"))


@dataclass(frozen=True)
class ProducerIdsRecord:
    """A block of producer ids was handed to ``broker_id``; ``next_producer_id`` is the
    first id of the next block (ids below it are never handed out again)."""

    TYPE: ClassVar[RecordType] = RecordType.PRODUCER_IDS
    broker_id: int
    broker_epoch: int
    next_producer_id: int

    def to_json(self) -> Json:
        return {
            "broker_id": self.broker_id,
            "broker_epoch": self.broker_epoch,
            "next_producer_id": self.next_producer_id,
        }

    @classmethod
    def from_json(cls, f: _Fields) -> ProducerIdsRecord:
        return cls(f.integer("broker_id"), f.integer("broker_epoch"), f.integer("next_producer_id"))


@dataclass(frozen=True)
class FeatureLevelRecord:
    """A finalized feature level (``metadata.version`` ...); level 0 removes the feature."""

    TYPE: ClassVar[RecordType] = RecordType.FEATURE_LEVEL
    name: str
    level: int

    def to_json(self) -> Json:
        return {"name": self.name, "level": self.level}

    @classmethod
    def from_json(cls, f: _Fields) -> FeatureLevelRecord:
        return cls(f.text("name"), f.integer("level"))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True)
class UserScramCredentialRecord:
    """A user's SCRAM credential for one mechanism, set or replaced (Kafka's
    UserScramCredentialRecord): ``mechanism`` is Kafka's type id (1 SCRAM-SHA-256,
    2 SCRAM-SHA-512); salt, stored key and server key are what verify a client's proof.
    The password is never recorded."""

    TYPE: ClassVar[RecordType] = RecordType.USER_SCRAM_CREDENTIAL
    name: str
    mechanism: int
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_json(self) -> Json:
        return {
            "name": self.name,
            "mechanism": self.mechanism,
            "salt": _b64(self.salt),
            "stored_key": _b64(self.stored_key),
            "server_key": _b64(self.server_key),
            "iterations": self.iterations,
        }

    @classmethod
    def from_json(cls, f: _Fields) -> UserScramCredentialRecord:
        return cls(
            f.text("name"),
            f.integer("mechanism"),
            f.data("salt"),
            f.data("stored_key"),
            f.data("server_key"),
            f.integer("iterations"),
        )


@dataclass(frozen=True)
class RemoveUserScramCredentialRecord:
    """The user's credential for ``mechanism`` is deleted (Kafka's
    RemoveUserScramCredentialRecord)."""

    TYPE: ClassVar[RecordType] = RecordType.REMOVE_USER_SCRAM_CREDENTIAL
    name: str
    mechanism: int

    def to_json(self) -> Json:
        return {"name": self.name, "mechanism": self.mechanism}

    @classmethod
    def from_json(cls, f: _Fields) -> RemoveUserScramCredentialRecord:
        return cls(f.text("name"), f.integer("mechanism"))


@dataclass(frozen=True)
class AccessControlEntryRecord:
    """One ACL (Kafka's AccessControlEntryRecord), named by ``acl_id`` so that a removal
    names it alone. The enum fields carry Kafka's wire codes
    (:mod:`tidelog.security.authorizer`): resource type, pattern type, operation and
    permission; ``principal`` is ``Type:name`` and ``host`` an address or ``*``."""

    TYPE: ClassVar[RecordType] = RecordType.ACCESS_CONTROL_ENTRY
    acl_id: uuid.UUID
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int

    def to_json(self) -> Json:
        return {
            "id": str(self.acl_id),
            "resource_type": self.resource_type,
            "resource_name": self.resource_name,
            "pattern_type": self.pattern_type,
            "principal": self.principal,
            "host": self.host,
            "operation": self.operation,
            "permission_type": self.permission,
        }

    @classmethod
    def from_json(cls, f: _Fields) -> AccessControlEntryRecord:
        return cls(
            f.uid("id"),
            f.integer("resource_type"),
            f.text("resource_name"),
            f.integer("pattern_type"),
            f.text("principal"),
            f.text("host"),
            f.integer("operation"),
            f.integer("permission_type"),
        )


@dataclass(frozen=True)
class RemoveAccessControlEntryRecord:
    """The ACL ``acl_id`` is deleted (Kafka's RemoveAccessControlEntryRecord)."""

    TYPE: ClassVar[RecordType] = RecordType.REMOVE_ACCESS_CONTROL_ENTRY
    acl_id: uuid.UUID

    def to_json(self) -> Json:
        return {"id": str(self.acl_id)}

    @classmethod
    def from_json(cls, f: _Fields) -> RemoveAccessControlEntryRecord:
        return cls(f.uid("id"))


@dataclass(frozen=True)
class ClientQuotaRecord:
    """One quota key of a client quota entity set to ``value``, or removed (Kafka's
    ClientQuotaRecord). ``entity`` is (entity type, name) pairs sorted by type, a name of
    None being the type's default: see :mod:`tidelog.metadata.quotas`."""

    TYPE: ClassVar[RecordType] = RecordType.CLIENT_QUOTA
    entity: tuple[tuple[str, str | None], ...]
    key: str
    value: float
    remove: bool = False

    def to_json(self) -> Json:
        return {
            "entity": [{"entity_type": kind, "entity_name": name} for kind, name in self.entity],
            "key": self.key,
            "value": self.value,
            "remove": self.remove,
        }

    @classmethod
    def from_json(cls, f: _Fields) -> ClientQuotaRecord:
        entity = []
        for item in f.objects("entity"):
            e = _Fields("client quota entity", item)
            entity.append((e.text("entity_type"), e.opt_text("entity_name")))
        return cls(tuple(entity), f.text("key"), f.number("value"), f.flag("remove", False))


MetadataRecord = (
    RegisterBrokerRecord
    | UnregisterBrokerRecord
    | BrokerRegistrationChangeRecord
    | TopicRecord
    | PartitionRecord
    | PartitionChangeRecord
    | ConfigRecord
    | RemoveTopicRecord
    | ProducerIdsRecord
    | FeatureLevelRecord
    | UserScramCredentialRecord
    | RemoveUserScramCredentialRecord
    | AccessControlEntryRecord
    | RemoveAccessControlEntryRecord
    | ClientQuotaRecord
)

_DECODERS: dict[RecordType, Callable[[_Fields], MetadataRecord]] = {
    RecordType.REGISTER_BROKER: RegisterBrokerRecord.from_json,
    RecordType.UNREGISTER_BROKER: UnregisterBrokerRecord.from_json,
    RecordType.BROKER_REGISTRATION_CHANGE: BrokerRegistrationChangeRecord.from_json,
    RecordType.TOPIC: TopicRecord.from_json,
    RecordType.PARTITION: PartitionRecord.from_json,
    RecordType.PARTITION_CHANGE: PartitionChangeRecord.from_json,
    RecordType.CONFIG: ConfigRecord.from_json,
    RecordType.REMOVE_TOPIC: RemoveTopicRecord.from_json,
    RecordType.PRODUCER_IDS: ProducerIdsRecord.from_json,
    RecordType.FEATURE_LEVEL: FeatureLevelRecord.from_json,
    RecordType.USER_SCRAM_CREDENTIAL: UserScramCredentialRecord.from_json,
    RecordType.REMOVE_USER_SCRAM_CREDENTIAL: RemoveUserScramCredentialRecord.from_json,
    RecordType.ACCESS_CONTROL_ENTRY: AccessControlEntryRecord.from_json,
    RecordType.REMOVE_ACCESS_CONTROL_ENTRY: RemoveAccessControlEntryRecord.from_json,
    RecordType.CLIENT_QUOTA: ClientQuotaRecord.from_json,
}
# The newest body version of each type this code reads and writes.
VERSION = 0


def encode_record(record: MetadataRecord) -> bytes:
    """The value bytes of one metadata record."""
    body = json.dumps(record.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return bytes((int(record.TYPE), VERSION)) + body.encode("utf-8")


def decode_record(value: bytes | bytearray | memoryview | None) -> MetadataRecord:
    """The record a value holds; raises MetadataRecordError for anything malformed."""
    if value is None:
        raise MetadataRecordError("metadata record without a value")
    data = bytes(value)
    if len(data) < 2:
        raise MetadataRecordError(f"metadata record of {len(data)} bytes has no header")
    if len(data) > MAX_RECORD_BYTES:
        raise MetadataRecordError(f"metadata record of {len(data)} bytes is too large")
    try:
        kind = RecordType(data[0])
    except ValueError:
        raise MetadataRecordError(f"unknown metadata record type {data[0]}") from None
    if data[1] > VERSION:
        raise MetadataRecordError(
            f"{kind.name} record version {data[1]} is newer than this broker reads ({VERSION})"
        )
    try:
        body = json.loads(data[2:].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MetadataRecordError(f"{kind.name} record body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise MetadataRecordError(f"{kind.name} record body is not a JSON object")
    return _DECODERS[kind](_Fields(kind.name, body))
