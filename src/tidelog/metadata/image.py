"""The metadata image: the cluster's state after replaying the metadata log to an offset.

A :class:`MetadataImage` is immutable. :meth:`MetadataImage.apply` takes records with
their log offsets and returns a new image and a :class:`MetadataDelta` naming what
changed, which is what a broker needs to act (create or delete partition logs, give logs
new configs). Replaying the same records from :meth:`MetadataImage.empty` always gives
the same image: the image depends on nothing but the records and their offsets (the
cluster id, read from ``meta.properties``, is passed to :meth:`empty`).

Rules of replay:

* a TopicRecord needs a new name and a new id; partitions and configs follow it;
* a PartitionRecord states a partition whole (creation, or restatement);
* a PartitionChangeRecord raises the partition epoch, and the leader epoch when the
  leader changes;
* RemoveTopicRecord drops the topic, its partitions and its config overrides;
* ConfigRecord sets or deletes one key of a topic or broker resource;
* RegisterBrokerRecord (re)registers a broker whose epoch is the record's offset;
* ProducerIdsRecord moves the next producer id block forward, never back.

A record that breaks these rules (a partition of an unknown topic ...) raises
:class:`~tidelog.metadata.errors.MetadataReplayError`: the log was written by a
controller that checked them, so a violation means the log is not ours or is damaged.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from tidelog.metadata.errors import MetadataReplayError
from tidelog.metadata.records import (
    BrokerEndpoint,
    ConfigRecord,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
)

__all__ = [
    "BROKER_RESOURCE",
    "TOPIC_RESOURCE",
    "BrokerRegistration",
    "MetadataDelta",
    "MetadataImage",
    "PartitionImage",
    "TopicImage",
]

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class PartitionImage:
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int


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
            or self.producer_ids_changed
            or self.features_changed
        )


def _frozen(mapping: dict[str, str]) -> Mapping[str, str]:
    return MappingProxyType(mapping)


@dataclass(frozen=True)
class MetadataImage:
    """The cluster metadata at :attr:`offset` (the last applied record; -1 when none)."""

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
    offset: int = -1

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

    # -- replay ------------------------------------------------------------------------

    def apply(
        self, entries: Iterable[tuple[int, MetadataRecord]]
    ) -> tuple[MetadataImage, MetadataDelta]:
        """The image after ``entries`` ((offset, record) in log order) and what changed."""
        replay = _Replay(self)
        for offset, record in entries:
            if offset <= replay.offset:
                raise MetadataReplayError(
                    f"record at offset {offset} does not follow offset {replay.offset}"
                )
            replay.apply(offset, record)
        return replay.result()


class _Replay:
    """Mutable working copy of an image; copies the maps it touches, once."""

    def __init__(self, base: MetadataImage) -> None:
        self.base = base
        self.offset = base.offset
        self.by_name = dict(base.topics_by_name)
        self.by_id = dict(base.topics_by_id)
        self.topic_configs = {k: dict(v) for k, v in base.topic_configs.items()}
        self.broker_configs = {k: dict(v) for k, v in base.broker_configs.items()}
        self.brokers = dict(base.brokers)
        self.next_producer_id = base.next_producer_id
        self.features = dict(base.features)
        # Partitions of the topics touched, by topic id.
        self.partitions: dict[uuid.UUID, dict[int, PartitionImage]] = {}
        self.created_topics: dict[uuid.UUID, str] = {}
        self.deleted: dict[uuid.UUID, TopicImage] = {}
        self.created_partitions: dict[tuple[uuid.UUID, int], None] = {}
        self.changed_partitions: dict[tuple[uuid.UUID, int], None] = {}
        self.changed_topic_configs: set[str] = set()
        self.changed_broker_configs: set[str] = set()
        self.registered: list[int] = []
        self.producer_ids_changed = False
        self.features_changed = False

    def _topic(self, topic_id: uuid.UUID, what: str) -> TopicImage:
        topic = self.by_id.get(topic_id)
        if topic is None:
            raise MetadataReplayError(f"{what} names unknown topic id {topic_id}")
        return topic

    def _parts(self, topic: TopicImage) -> dict[int, PartitionImage]:
        parts = self.partitions.get(topic.topic_id)
        if parts is None:
            parts = dict(topic.partitions)
            self.partitions[topic.topic_id] = parts
        return parts

    def apply(self, offset: int, record: MetadataRecord) -> None:
        self.offset = offset
        if isinstance(record, TopicRecord):
            if record.name in self.by_name:
                raise MetadataReplayError(f"topic {record.name!r} is created twice")
            if record.topic_id in self.by_id:
                raise MetadataReplayError(f"topic id {record.topic_id} is used twice")
            topic = TopicImage(record.name, record.topic_id, MappingProxyType({}))
            self.by_name[record.name] = topic
            self.by_id[record.topic_id] = topic
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
            )
        elif isinstance(record, PartitionChangeRecord):
            topic = self._topic(record.topic_id, "partition change")
            parts = self._parts(topic)
            old = parts.get(record.partition)
            if old is None:
                raise MetadataReplayError(
                    f"partition change names unknown partition {topic.name}-{record.partition}"
                )
            leader = old.leader if record.leader is None else record.leader
            parts[record.partition] = PartitionImage(
                record.partition,
                old.replicas if record.replicas is None else record.replicas,
                old.isr if record.isr is None else record.isr,
                leader,
                old.leader_epoch + (1 if leader != old.leader else 0),
                old.partition_epoch + 1,
            )
            key = (topic.topic_id, record.partition)
            if key not in self.created_partitions:
                self.changed_partitions[key] = None
        elif isinstance(record, RemoveTopicRecord):
            topic = self._topic(record.topic_id, "remove topic")
            del self.by_id[topic.topic_id]
            del self.by_name[topic.name]
            self.partitions.pop(topic.topic_id, None)
            if self.topic_configs.pop(topic.name, None) is not None:
                self.changed_topic_configs.discard(topic.name)
            if self.created_topics.pop(topic.topic_id, None) is None:
                self.deleted[topic.topic_id] = self.base.topics_by_id[topic.topic_id]
            for keys in (self.created_partitions, self.changed_partitions):
                for key in [k for k in keys if k[0] == topic.topic_id]:
                    del keys[key]
        elif isinstance(record, ConfigRecord):
            self._apply_config(record)
        elif isinstance(record, RegisterBrokerRecord):
            self.brokers[record.broker_id] = BrokerRegistration(
                record.broker_id, record.incarnation_id, offset, record.endpoints, record.rack
            )
            self.registered.append(record.broker_id)
        elif isinstance(record, ProducerIdsRecord):
            if record.next_producer_id < self.next_producer_id:
                raise MetadataReplayError(
                    f"producer id block moves back from {self.next_producer_id} "
                    f"to {record.next_producer_id}"
                )
            self.next_producer_id = record.next_producer_id
            self.producer_ids_changed = True
        elif isinstance(record, FeatureLevelRecord):
            if record.level == 0:
                self.features.pop(record.name, None)
            else:
                self.features[record.name] = record.level
            self.features_changed = True

    def _apply_config(self, record: ConfigRecord) -> None:
        if record.resource_type == TOPIC_RESOURCE:
            store, changed = self.topic_configs, self.changed_topic_configs
        elif record.resource_type == BROKER_RESOURCE:
            store, changed = self.broker_configs, self.changed_broker_configs
        else:
            raise MetadataReplayError(
                f"config record for unsupported resource type {record.resource_type}"
            )
        values = store.setdefault(record.resource_name, {})
        if record.value is None:
            values.pop(record.name, None)
        else:
            values[record.name] = record.value
        if not values:
            del store[record.resource_name]
        changed.add(record.resource_name)

    def result(self) -> tuple[MetadataImage, MetadataDelta]:
        for topic_id, parts in self.partitions.items():
            old = self.by_id[topic_id]
            topic = TopicImage(old.name, topic_id, MappingProxyType(dict(sorted(parts.items()))))
            self.by_id[topic_id] = topic
            self.by_name[topic.name] = topic
        image = MetadataImage(
            cluster_id=self.base.cluster_id,
            topics_by_name=MappingProxyType(self.by_name),
            topics_by_id=MappingProxyType(self.by_id),
            topic_configs=MappingProxyType({k: _frozen(v) for k, v in self.topic_configs.items()}),
            broker_configs=MappingProxyType(
                {k: _frozen(v) for k, v in self.broker_configs.items()}
            ),
            brokers=MappingProxyType(self.brokers),
            next_producer_id=self.next_producer_id,
            features=MappingProxyType(self.features),
            offset=self.offset,
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
            producer_ids_changed=self.producer_ids_changed,
            features_changed=self.features_changed,
        )
        return image, delta
