"""The metadata image: the cluster's state after replaying the metadata log to an offset.

A :class:`MetadataImage` is immutable. :meth:`MetadataImage.apply` takes records with
their log offsets and returns a new image and a :class:`MetadataDelta` naming what
changed, which is what a broker needs to act (create or delete partition logs, give logs
new configs). Replaying the same records from :meth:`MetadataImage.empty` always gives
the same image: the image depends on nothing but the records and their offsets (the
cluster id, read from ``meta.properties``, is passed to :meth:`empty`). The image knows
the offset and leader epoch it was built at (:attr:`MetadataImage.offset`, ``epoch``).
Applying a change copies only the maps its records touch (copy on write), so a change to
one partition does not cost a copy of the whole image.

Rules of replay:

* a TopicRecord needs a new name and a new id; partitions and configs follow it;
* a PartitionRecord states a partition whole (creation, or restatement);
* a PartitionChangeRecord raises the partition epoch, and the leader epoch when the
  leader changes; both records may carry a reassignment under way (adding and removing
  replicas), absent meaning none;
* RemoveTopicRecord drops the topic, its partitions and its config overrides;
* ConfigRecord sets or deletes one key of a topic or broker resource;
* RegisterBrokerRecord (re)registers a broker whose epoch is the record's offset;
  BrokerRegistrationChangeRecord fences, unfences or marks in controlled shutdown,
  and UnregisterBrokerRecord removes, the registration of the epoch it names;
* ProducerIdsRecord moves the next producer id block forward, never back;
* UserScramCredentialRecord sets a user's credential for one SCRAM mechanism;
  RemoveUserScramCredentialRecord deletes one that exists;
* AccessControlEntryRecord adds an ACL under a new id; RemoveAccessControlEntryRecord
  deletes the ACL of an id that exists;
* ClientQuotaRecord sets or removes one quota key of an entity Kafka allows; an entity
  whose last key is removed is gone.

A record that breaks these rules (a partition of an unknown topic ...) raises
:class:`~tidelog.metadata.errors.MetadataReplayError`: the log was written by a
controller that checked them, so a violation means the log is not ours or is damaged.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Generic, TypeVar, cast

from tidelog.metadata.acls import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from tidelog.metadata.errors import MetadataReplayError
from tidelog.metadata.quotas import QuotaEntity, entity_error
from tidelog.metadata.records import (
    AccessControlEntryRecord,
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    ClientQuotaRecord,
    ConfigRecord,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveAccessControlEntryRecord,
    RemoveTopicRecord,
    RemoveUserScramCredentialRecord,
    TopicRecord,
    UnregisterBrokerRecord,
    UserScramCredentialRecord,
)

__all__ = [
    "BROKER_RESOURCE",
    "TOPIC_RESOURCE",
    "BrokerRegistration",
    "MetadataDelta",
    "MetadataImage",
    "PartitionImage",
    "ScramCredentialImage",
    "TopicImage",
]

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
_EMPTY: Mapping[str, str] = MappingProxyType({})
K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class PartitionImage:
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    #: A reassignment under way (KIP-455): replicas being added (not yet in the ISR)
    #: and being removed; ``replicas`` is the target followed by the removing ones.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    def changed(self, record: PartitionChangeRecord) -> PartitionImage:
        """This partition after ``record``: the partition epoch one higher, the leader
        epoch too when the leader changes (the one rule of replay, which the controller
        also uses to answer with the state a change leads to)."""
        leader = self.leader if record.leader is None else record.leader
        return PartitionImage(
            self.partition,
            self.replicas if record.replicas is None else record.replicas,
            self.isr if record.isr is None else record.isr,
            leader,
            self.leader_epoch + (1 if leader != self.leader else 0),
            self.partition_epoch + 1,
            self.adding_replicas if record.adding_replicas is None else record.adding_replicas,
            self.removing_replicas
            if record.removing_replicas is None
            else record.removing_replicas,
        )


@dataclass(frozen=True)
class TopicImage:
    name: str
    topic_id: uuid.UUID
    partitions: Mapping[int, PartitionImage]

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)

    @property
    def replication_factor(self) -> int:
        first = self.partitions.get(0)
        return len(first.replicas) if first is not None else 0


@dataclass(frozen=True)
class BrokerRegistration:
    broker_id: int
    incarnation_id: uuid.UUID
    #: Offset of the registration record in the metadata log.
    epoch: int
    endpoints: tuple[BrokerEndpoint, ...]
    rack: str | None
    #: A fenced broker leads nothing and is not given to clients.
    fenced: bool = True
    in_controlled_shutdown: bool = False
    log_dirs: tuple[uuid.UUID, ...] = ()

    @property
    def active(self) -> bool:
        """Whether it may lead partitions: unfenced and not shutting down (Kafka's
        ``isActive``)."""
        return not self.fenced and not self.in_controlled_shutdown


@dataclass(frozen=True)
class ScramCredentialImage:
    """A user's credential for one SCRAM mechanism (never the password)."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


@dataclass(frozen=True)
class MetadataDelta:
    """What one :meth:`MetadataImage.apply` changed.

    Topics are named as in the new image (deleted ones as in the old one). Partitions of
    created topics are listed in ``created_partitions`` too.
    """

    created_topics: tuple[TopicImage, ...] = ()
    deleted_topics: tuple[TopicImage, ...] = ()
    created_partitions: tuple[tuple[str, int], ...] = ()
    changed_partitions: tuple[tuple[str, int], ...] = ()
    #: Topics (still existing) whose config overrides changed.
    changed_topic_configs: frozenset[str] = frozenset()
    #: Broker config resources ("" or a node id) whose dynamic configs changed.
    changed_broker_configs: frozenset[str] = frozenset()
    registered_brokers: tuple[int, ...] = ()
    #: Brokers fenced, unfenced or put in controlled shutdown.
    changed_brokers: tuple[int, ...] = ()
    unregistered_brokers: tuple[int, ...] = ()
    #: Users whose SCRAM credentials were set or removed.
    changed_scram_users: frozenset[str] = frozenset()
    #: Ids of the ACLs added or removed.
    changed_acls: frozenset[uuid.UUID] = frozenset()
    #: Client quota entities whose quotas were set or removed.
    changed_client_quotas: frozenset[QuotaEntity] = frozenset()
    producer_ids_changed: bool = False
    features_changed: bool = False

    @property
    def empty(self) -> bool:
        return not (
            self.created_topics
            or self.deleted_topics
            or self.created_partitions
            or self.changed_partitions
            or self.changed_topic_configs
            or self.changed_broker_configs
            or self.registered_brokers
            or self.changed_brokers
            or self.unregistered_brokers
            or self.changed_scram_users
            or self.changed_acls
            or self.changed_client_quotas
            or self.producer_ids_changed
            or self.features_changed
        )


def _thawed(mapping: Mapping[K, V]) -> dict[K, V]:
    """A writable copy of an image's map. ``copy()`` of a read-only view copies the dict
    beneath it without hashing a key again: 40x faster than ``dict(view)`` for 10,000
    UUID keys, and replay copies a topic index for every batch that creates a topic."""
    if isinstance(mapping, MappingProxyType | dict):
        return cast(dict[K, V], mapping.copy())
    return dict(mapping)


def _frozen(mapping: Mapping[K, V]) -> Mapping[K, V]:
    """A read-only view: the mapping itself when it is one already (not copied)."""
    return mapping if isinstance(mapping, MappingProxyType) else MappingProxyType(mapping)


@dataclass(frozen=True)
class MetadataImage:
    """The cluster metadata as of :attr:`offset` (the last record or control batch loaded;
    -1 when none) in :attr:`epoch` (the leader epoch of that batch, the Raft epoch that
    wrote it; -1 when none)."""

    cluster_id: str | None
    topics_by_name: Mapping[str, TopicImage]
    topics_by_id: Mapping[uuid.UUID, TopicImage]
    #: Topic config overrides by topic name.
    topic_configs: Mapping[str, Mapping[str, str]]
    #: Dynamic broker configs by resource name: "" cluster default, "<id>" one broker.
    broker_configs: Mapping[str, Mapping[str, str]]
    brokers: Mapping[int, BrokerRegistration]
    #: First producer id of the next block to hand out.
    next_producer_id: int
    features: Mapping[str, int]
    #: SCRAM credentials: (user name, Kafka's mechanism type id) -> credential.
    scram_credentials: Mapping[tuple[str, int], ScramCredentialImage] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    #: ACLs by id.
    acls: Mapping[uuid.UUID, AclBinding] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    #: Client quotas: entity -> quota key -> value (an entity has at least one key).
    client_quotas: Mapping[QuotaEntity, Mapping[str, float]] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    offset: int = -1
    epoch: int = -1

    @classmethod
    def empty(cls, cluster_id: str | None = None) -> MetadataImage:
        return cls(
            cluster_id=cluster_id,
            topics_by_name=MappingProxyType({}),
            topics_by_id=MappingProxyType({}),
            topic_configs=MappingProxyType({}),
            broker_configs=MappingProxyType({}),
            brokers=MappingProxyType({}),
            next_producer_id=0,
            features=MappingProxyType({}),
        )

    # -- queries -----------------------------------------------------------------------

    def topic(self, name: str) -> TopicImage | None:
        return self.topics_by_name.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicImage | None:
        return self.topics_by_id.get(topic_id)

    def partition(self, name: str, partition: int) -> PartitionImage | None:
        topic = self.topics_by_name.get(name)
        return None if topic is None else topic.partitions.get(partition)

    def topic_config(self, name: str) -> Mapping[str, str]:
        """The topic's config overrides (empty when none)."""
        return self.topic_configs.get(name, _EMPTY)

    def broker_config(self, resource_name: str) -> Mapping[str, str]:
        """Dynamic configs of a broker resource ("" is the cluster-wide default)."""
        return self.broker_configs.get(resource_name, _EMPTY)

    def scram_credential(self, user: str, mechanism: int) -> ScramCredentialImage | None:
        return self.scram_credentials.get((user, mechanism))

    def unfenced_brokers(self) -> list[BrokerRegistration]:
        """The registered brokers that are not fenced, by id: those clients are given."""
        return [r for _, r in sorted(self.brokers.items()) if not r.fenced]

    # -- replay ------------------------------------------------------------------------

    def apply(
        self, entries: Iterable[tuple[int, MetadataRecord]], *, epoch: int | None = None
    ) -> tuple[MetadataImage, MetadataDelta]:
        """The image after ``entries`` ((offset, record) in log order) and what changed.

        ``epoch``: the leader epoch of the batch the entries come from (None: unchanged).
        """
        replay = _Replay(self)
        for offset, record in entries:
            if offset <= replay.offset:
                raise MetadataReplayError(
                    f"record at offset {offset} does not follow offset {replay.offset}"
                )
            replay.apply(offset, record)
        image, delta = replay.result()
        if epoch is not None and epoch != image.epoch:
            self._check_epoch(epoch)
            image = dataclasses.replace(image, epoch=epoch)
        return image, delta

    def advanced_to(self, offset: int, epoch: int) -> MetadataImage:
        """This image at a later ``offset`` and ``epoch`` with nothing changed (the loader
        passing a control batch, which holds no metadata records)."""
        if offset <= self.offset:
            raise MetadataReplayError(f"offset {offset} does not follow offset {self.offset}")
        self._check_epoch(epoch)
        return dataclasses.replace(self, offset=offset, epoch=epoch)

    def _check_epoch(self, epoch: int) -> None:
        if epoch < self.epoch:
            raise MetadataReplayError(f"epoch {epoch} follows the later epoch {self.epoch}")


class _Replay:
    """A working copy of an image that copies a map only when a record changes it.

    A change to one partition copies that topic's partition map and the two topic
    indexes (references only), never the config maps, the brokers or other topics'
    partitions: replay cost follows what the records touch, not the image's size.
    """

    def __init__(self, base: MetadataImage) -> None:
        self.base = base
        self.offset = base.offset
        self.by_name: Mapping[str, TopicImage] = base.topics_by_name
        self.by_id: Mapping[uuid.UUID, TopicImage] = base.topics_by_id
        self._topics_copied = False
        self.topic_configs = _ConfigsCopy(base.topic_configs)
        self.broker_configs = _ConfigsCopy(base.broker_configs)
        self.brokers: Mapping[int, BrokerRegistration] = base.brokers
        self.next_producer_id = base.next_producer_id
        self.features: Mapping[str, int] = base.features
        self.scram: Mapping[tuple[str, int], ScramCredentialImage] = base.scram_credentials
        self.changed_scram_users: set[str] = set()
        self.acls: Mapping[uuid.UUID, AclBinding] = base.acls
        self.changed_acls: set[uuid.UUID] = set()
        self.client_quotas: _ConfigsCopy[QuotaEntity, float] = _ConfigsCopy(base.client_quotas)
        self.changed_client_quotas: set[QuotaEntity] = set()
        # Partitions of the topics touched, by topic id.
        self.partitions: dict[uuid.UUID, dict[int, PartitionImage]] = {}
        self.created_topics: dict[uuid.UUID, str] = {}
        self.deleted: dict[uuid.UUID, TopicImage] = {}
        self.created_partitions: dict[tuple[uuid.UUID, int], None] = {}
        self.changed_partitions: dict[tuple[uuid.UUID, int], None] = {}
        self.changed_topic_configs: set[str] = set()
        self.changed_broker_configs: set[str] = set()
        self.registered: list[int] = []
        self.changed_brokers: list[int] = []
        self.unregistered: list[int] = []
        self.producer_ids_changed = False
        self.features_changed = False

    def _writable_topics(self) -> tuple[dict[str, TopicImage], dict[uuid.UUID, TopicImage]]:
        if not self._topics_copied:
            self.by_name = _thawed(self.by_name)
            self.by_id = _thawed(self.by_id)
            self._topics_copied = True
        assert isinstance(self.by_name, dict) and isinstance(self.by_id, dict)
        return self.by_name, self.by_id

    def _topic(self, topic_id: uuid.UUID, what: str) -> TopicImage:
        topic = self.by_id.get(topic_id)
        if topic is None:
            raise MetadataReplayError(f"{what} names unknown topic id {topic_id}")
        return topic

    def _parts(self, topic: TopicImage) -> dict[int, PartitionImage]:
        parts = self.partitions.get(topic.topic_id)
        if parts is None:
            parts = _thawed(topic.partitions)
            self.partitions[topic.topic_id] = parts
        return parts

    def _registration(self, broker_id: int, epoch: int, what: str) -> BrokerRegistration:
        registration = self.brokers.get(broker_id)
        if registration is None or registration.epoch != epoch:
            raise MetadataReplayError(
                f"{what} names broker {broker_id} at epoch {epoch}, which is not registered"
            )
        return registration

    def apply(self, offset: int, record: MetadataRecord) -> None:
        self.offset = offset
        if isinstance(record, TopicRecord):
            if record.name in self.by_name:
                raise MetadataReplayError(f"topic {record.name!r} is created twice")
            if record.topic_id in self.by_id:
                raise MetadataReplayError(f"topic id {record.topic_id} is used twice")
            topic = TopicImage(record.name, record.topic_id, MappingProxyType({}))
            by_name, by_id = self._writable_topics()
            by_name[record.name] = topic
            by_id[record.topic_id] = topic
            self.partitions[record.topic_id] = {}
            self.created_topics[record.topic_id] = record.name
        elif isinstance(record, PartitionRecord):
            topic = self._topic(record.topic_id, "partition record")
            if record.partition < 0 or not record.replicas:
                raise MetadataReplayError(
                    f"partition record {topic.name}-{record.partition} is malformed"
                )
            parts = self._parts(topic)
            key = (topic.topic_id, record.partition)
            if record.partition in parts:
                self.changed_partitions[key] = None
            else:
                self.created_partitions[key] = None
            parts[record.partition] = PartitionImage(
                record.partition,
                record.replicas,
                record.isr,
                record.leader,
                record.leader_epoch,
                record.partition_epoch,
                record.adding_replicas,
                record.removing_replicas,
            )
        elif isinstance(record, PartitionChangeRecord):
            topic = self._topic(record.topic_id, "partition change")
            parts = self._parts(topic)
            old = parts.get(record.partition)
            if old is None:
                raise MetadataReplayError(
                    f"partition change names unknown partition {topic.name}-{record.partition}"
                )
            parts[record.partition] = old.changed(record)
            key = (topic.topic_id, record.partition)
            if key not in self.created_partitions:
                self.changed_partitions[key] = None
        elif isinstance(record, RemoveTopicRecord):
            topic = self._topic(record.topic_id, "remove topic")
            by_name, by_id = self._writable_topics()
            del by_id[topic.topic_id]
            del by_name[topic.name]
            self.partitions.pop(topic.topic_id, None)
            if self.topic_configs.remove(topic.name):
                self.changed_topic_configs.discard(topic.name)
            if self.created_topics.pop(topic.topic_id, None) is None:
                self.deleted[topic.topic_id] = self.base.topics_by_id[topic.topic_id]
            for keys in (self.created_partitions, self.changed_partitions):
                for key in [k for k in keys if k[0] == topic.topic_id]:
                    del keys[key]
        elif isinstance(record, ConfigRecord):
            self._apply_config(record)
        elif isinstance(record, RegisterBrokerRecord):
            brokers = _thawed(self.brokers)
            brokers[record.broker_id] = BrokerRegistration(
                record.broker_id,
                record.incarnation_id,
                offset,
                record.endpoints,
                record.rack,
                record.fenced,
                record.in_controlled_shutdown,
                record.log_dirs,
            )
            self.brokers = brokers
            self.registered.append(record.broker_id)
        elif isinstance(record, BrokerRegistrationChangeRecord):
            known = self._registration(record.broker_id, record.broker_epoch, "registration change")
            shutting_down = record.in_controlled_shutdown
            brokers = _thawed(self.brokers)
            brokers[record.broker_id] = dataclasses.replace(
                known,
                fenced=known.fenced if record.fenced is None else record.fenced,
                in_controlled_shutdown=(
                    known.in_controlled_shutdown if shutting_down is None else shutting_down
                ),
            )
            self.brokers = brokers
            self.changed_brokers.append(record.broker_id)
        elif isinstance(record, UnregisterBrokerRecord):
            self._registration(record.broker_id, record.broker_epoch, "unregistration")
            brokers = _thawed(self.brokers)
            del brokers[record.broker_id]
            self.brokers = brokers
            self.unregistered.append(record.broker_id)
        elif isinstance(record, ProducerIdsRecord):
            if record.next_producer_id < self.next_producer_id:
                raise MetadataReplayError(
                    f"producer id block moves back from {self.next_producer_id} "
                    f"to {record.next_producer_id}"
                )
            self.next_producer_id = record.next_producer_id
            self.producer_ids_changed = True
        elif isinstance(record, FeatureLevelRecord):
            features = _thawed(self.features)
            if record.level == 0:
                features.pop(record.name, None)
            else:
                features[record.name] = record.level
            self.features = features
            self.features_changed = True
        elif isinstance(record, UserScramCredentialRecord):
            scram = _thawed(self.scram)
            scram[(record.name, record.mechanism)] = ScramCredentialImage(
                record.salt, record.stored_key, record.server_key, record.iterations
            )
            self.scram = scram
            self.changed_scram_users.add(record.name)
        elif isinstance(record, RemoveUserScramCredentialRecord):
            credential = (record.name, record.mechanism)
            if credential not in self.scram:
                raise MetadataReplayError(
                    f"removes SCRAM credential {record.mechanism} of {record.name!r}, "
                    "which does not exist"
                )
            scram = _thawed(self.scram)
            del scram[credential]
            self.scram = scram
            self.changed_scram_users.add(record.name)
        elif isinstance(record, AccessControlEntryRecord):
            if record.acl_id in self.acls:
                raise MetadataReplayError(f"ACL id {record.acl_id} is used twice")
            acls = _thawed(self.acls)
            acls[record.acl_id] = _acl_binding(record)
            self.acls = acls
            self.changed_acls.add(record.acl_id)
        elif isinstance(record, RemoveAccessControlEntryRecord):
            if record.acl_id not in self.acls:
                raise MetadataReplayError(f"removes ACL {record.acl_id}, which does not exist")
            acls = _thawed(self.acls)
            del acls[record.acl_id]
            self.acls = acls
            self.changed_acls.add(record.acl_id)
        elif isinstance(record, ClientQuotaRecord):
            problem = entity_error(list(record.entity))
            if problem is not None:
                raise MetadataReplayError(f"client quota record: {problem}")
            entity = tuple(sorted(record.entity))
            self.client_quotas.set(entity, record.key, None if record.remove else record.value)
            self.changed_client_quotas.add(entity)

    def _apply_config(self, record: ConfigRecord) -> None:
        if record.resource_type == TOPIC_RESOURCE:
            store, changed = self.topic_configs, self.changed_topic_configs
        elif record.resource_type == BROKER_RESOURCE:
            store, changed = self.broker_configs, self.changed_broker_configs
        else:
            raise MetadataReplayError(
                f"config record for unsupported resource type {record.resource_type}"
            )
        store.set(record.resource_name, record.name, record.value)
        changed.add(record.resource_name)

    def result(self) -> tuple[MetadataImage, MetadataDelta]:
        if self.partitions:
            by_name, by_id = self._writable_topics()
            for topic_id, parts in self.partitions.items():
                old = by_id[topic_id]
                topic = TopicImage(
                    old.name, topic_id, MappingProxyType(dict(sorted(parts.items())))
                )
                by_id[topic_id] = topic
                by_name[topic.name] = topic
        image = MetadataImage(
            cluster_id=self.base.cluster_id,
            topics_by_name=_frozen(self.by_name),
            topics_by_id=_frozen(self.by_id),
            topic_configs=self.topic_configs.result(),
            broker_configs=self.broker_configs.result(),
            brokers=_frozen(self.brokers),
            next_producer_id=self.next_producer_id,
            features=_frozen(self.features),
            scram_credentials=_frozen(self.scram),
            acls=_frozen(self.acls),
            client_quotas=self.client_quotas.result(),
            offset=self.offset,
            epoch=self.base.epoch,
        )

        def named(keys: Iterable[tuple[uuid.UUID, int]]) -> tuple[tuple[str, int], ...]:
            return tuple((self.by_id[tid].name, p) for tid, p in keys)

        delta = MetadataDelta(
            created_topics=tuple(self.by_id[tid] for tid in self.created_topics),
            deleted_topics=tuple(self.deleted.values()),
            created_partitions=named(self.created_partitions),
            changed_partitions=named(self.changed_partitions),
            changed_topic_configs=frozenset(
                name for name in self.changed_topic_configs if name in self.by_name
            ),
            changed_broker_configs=frozenset(self.changed_broker_configs),
            registered_brokers=tuple(self.registered),
            changed_brokers=tuple(self.changed_brokers),
            unregistered_brokers=tuple(self.unregistered),
            changed_scram_users=frozenset(self.changed_scram_users),
            changed_acls=frozenset(self.changed_acls),
            changed_client_quotas=frozenset(self.changed_client_quotas),
            producer_ids_changed=self.producer_ids_changed,
            features_changed=self.features_changed,
        )
        return image, delta


def _acl_binding(record: AccessControlEntryRecord) -> AclBinding:
    """The ACL a record states; a code outside Kafka's enums is a damaged record."""
    try:
        return AclBinding(
            ResourceType(record.resource_type),
            record.resource_name,
            PatternType(record.pattern_type),
            record.principal,
            record.host,
            AclOperation(record.operation),
            AclPermissionType(record.permission),
        )
    except ValueError as exc:
        raise MetadataReplayError(f"ACL {record.acl_id}: {exc}") from None


class _ConfigsCopy(Generic[K, V]):
    """Config overrides (or client quotas) by resource, copied on write: the top map once,
    and a resource's own map only when one of its keys changes."""

    def __init__(self, base: Mapping[K, Mapping[str, V]]) -> None:
        self._base = base
        self._top: dict[K, Mapping[str, V]] | None = None
        self._copied: dict[K, dict[str, V]] = {}

    def _writable(self) -> dict[K, Mapping[str, V]]:
        if self._top is None:
            self._top = _thawed(self._base)
        return self._top

    def set(self, resource: K, key: str, value: V | None) -> None:
        top = self._writable()
        values = self._copied.get(resource)
        if values is None:
            known = top.get(resource)
            values = {} if known is None else _thawed(known)
            self._copied[resource] = values
            top[resource] = values
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value

    def remove(self, resource: K) -> bool:
        """Drop every key of ``resource``; whether it had any."""
        top = self._writable()
        self._copied.pop(resource, None)
        return top.pop(resource, None) is not None

    def result(self) -> Mapping[K, Mapping[str, V]]:
        if self._top is None:
            return self._base
        for resource, values in self._copied.items():
            if values:
                self._top[resource] = MappingProxyType(values)
            else:
                del self._top[resource]
        return MappingProxyType(self._top)
