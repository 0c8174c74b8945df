"""The single-node controller: checks admin operations and writes them to the metadata log.

This node is both controller and broker; the quorum has one voter, so "committed" means
"fsynced in the local metadata log". Every operation follows the same path:

1. check each item of the request against the current image and the configuration, and
   turn each item that passes into metadata records (an item that fails gets its
   :class:`~tidelog.metadata.errors.ApiError` and writes nothing);
2. unless ``validate_only``, append the records of the passing items as one batch and
   fsync it (:meth:`MetadataLog.append`); a request whose records exceed
   :data:`MAX_RECORDS_PER_BATCH` is written as several batches, never splitting an item;
3. apply the batch to the image, giving a new image and a delta, and tell the listeners
   (the broker) so they can create or delete logs and update log configs.

Operations are serialized by one lock and block on the fsync: an asyncio broker calls them
from a worker thread. Time comes from the injected ``clock`` (milliseconds).

Error codes and their conditions follow Kafka's controller; messages are our own.
"""

from __future__ import annotations

import enum
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tidelog.metadata.configs import (
    BROKER_CONFIGS,
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigDef,
    ConfigEntry,
    ConfigResourceType,
    ConfigType,
    describe_broker_configs,
    describe_topic_configs,
    format_value,
    topic_config_value,
    validate_broker_config_changes,
    validate_topic_configs,
)
from tidelog.metadata.errors import OK, ApiError, MetadataError
from tidelog.metadata.image import (
    BROKER_RESOURCE,
    TOPIC_RESOURCE,
    MetadataDelta,
    MetadataImage,
    TopicImage,
)
from tidelog.metadata.log import METADATA_TOPIC, MetadataLog
from tidelog.metadata.meta_properties import ensure_meta_properties
from tidelog.metadata.records import (
    BrokerEndpoint,
    ConfigRecord,
    MetadataRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
)
from tidelog.protocol.error_codes import ErrorCode
from tidelog.storage.checkpoint import FsyncFn
from tidelog.storage.errors import StorageError

__all__ = [
    "INTERNAL_TOPICS",
    "MAX_RECORDS_PER_BATCH",
    "PRODUCER_ID_BLOCK_SIZE",
    "AlterConfigOp",
    "AlterConfigsResource",
    "ConfigResourceResult",
    "Controller",
    "CreatePartitionsResult",
    "CreateTopicResult",
    "DeleteTopicResult",
    "DescribeConfigsResource",
    "DescribeConfigsResult",
    "IncrementalAlterConfigsResource",
    "NewPartitions",
    "NewTopic",
    "ProducerIdBlock",
    "describe_configs",
    "effective_broker_config",
    "validate_topic_name",
]

_log = logging.getLogger(__name__)

Clock = Callable[[], int]
Listener = Callable[[MetadataImage, MetadataDelta], None]

OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})
#: Ids per AllocateProducerIds block (Kafka's block size).
PRODUCER_ID_BLOCK_SIZE = 1000
#: Most records in one metadata batch, and so in one topic or partition increase.
MAX_RECORDS_PER_BATCH = 10_000
MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
# Ids Kafka reserves: the zero UUID (no id) and 1 (the metadata topic).
_RESERVED_IDS = frozenset({uuid.UUID(int=0), uuid.UUID(int=1)})
_MAX_PRODUCER_ID = 2**63 - 1


# -- requests and results ------------------------------------------------------------------


@dataclass(frozen=True)
class NewTopic:
    """One topic of CreateTopics. ``-1`` counts mean the broker defaults.

    ``assignments`` maps each partition (0..n-1) to its replicas' broker ids; when given,
    both counts must be -1.
    """

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    assignments: Mapping[int, Sequence[int]] | None = None
    configs: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class CreateTopicResult:
    name: str
    error: ApiError
    topic_id: uuid.UUID | None = None
    num_partitions: int = -1
    replication_factor: int = -1
    #: The topic's configs as CreateTopics v5+ returns them (empty on error).
    configs: tuple[ConfigEntry, ...] = ()


@dataclass(frozen=True)
class DeleteTopicResult:
    name: str | None
    topic_id: uuid.UUID | None
    error: ApiError


@dataclass(frozen=True)
class NewPartitions:
    """CreatePartitions: raise ``name`` to ``count`` partitions (replicas of each new
    partition in ``assignments``, one list per new partition, when given)."""

    name: str
    count: int
    assignments: Sequence[Sequence[int]] | None = None


@dataclass(frozen=True)
class CreatePartitionsResult:
    name: str
    error: ApiError


class AlterConfigOp(enum.IntEnum):
    """IncrementalAlterConfigs operations (Kafka's numbers)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass(frozen=True)
class AlterConfigsResource:
    """AlterConfigs: the complete new set of dynamic configs of one resource."""

    resource_type: int
    resource_name: str
    configs: Mapping[str, str | None]


@dataclass(frozen=True)
class IncrementalAlterConfigsResource:
    """IncrementalAlterConfigs: (key, operation, value) changes to one resource."""

    resource_type: int
    resource_name: str
    changes: Sequence[tuple[str, int, str | None]]


@dataclass(frozen=True)
class ConfigResourceResult:
    resource_type: int
    resource_name: str
    error: ApiError


@dataclass(frozen=True)
class DescribeConfigsResource:
    resource_type: int
    resource_name: str
    #: Keys to describe; None for all.
    keys: Collection[str] | None = None


@dataclass(frozen=True)
class DescribeConfigsResult:
    resource_type: int
    resource_name: str
    error: ApiError
    entries: tuple[ConfigEntry, ...] = ()


@dataclass(frozen=True)
class ProducerIdBlock:
    error: ApiError
    first_producer_id: int = -1
    length: int = 0


# -- topic names ---------------------------------------------------------------------------


def validate_topic_name(name: str) -> ApiError | None:
    """Kafka's topic name rules; INVALID_TOPIC_EXCEPTION with the reason, or None."""
    if not name:
        return ApiError(ErrorCode.INVALID_TOPIC_EXCEPTION, "a topic name cannot be empty")
    if name in (".", ".."):
        return ApiError(ErrorCode.INVALID_TOPIC_EXCEPTION, "a topic cannot be named '.' or '..'")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return ApiError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name of {len(name)} characters is longer than {MAX_TOPIC_NAME_LENGTH}",
        )
    if not _LEGAL_TOPIC.fullmatch(name):
        return ApiError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} may only hold ASCII letters, digits, '.', '_' and '-'",
        )
    if name == METADATA_TOPIC:
        return ApiError(
            ErrorCode.INVALID_TOPIC_EXCEPTION, f"{METADATA_TOPIC} is reserved for metadata"
        )
    return None


def _collision_key(name: str) -> str:
    # Metric names turn '.' into '_', so Kafka refuses names equal up to that swap.
    return name.replace(".", "_")


# -- describe (read-only, usable without the controller) ----------------------------------


def _broker_resource_scope(name: str, node_id: int) -> tuple[ApiError | None, bool]:
    """(error, per_broker) for a BROKER resource name: "" or this node's id."""
    if name == "":
        return None, False
    if not name.isdigit():
        return ApiError(
            ErrorCode.INVALID_REQUEST, f"broker resource name {name!r} is not an id"
        ), False
    if int(name) != node_id:
        return ApiError(
            ErrorCode.INVALID_REQUEST, f"broker {name} is not this node ({node_id})"
        ), False
    return None, True


def effective_broker_config(config: BrokerConfig, image: MetadataImage) -> BrokerConfig:
    """``config`` under the dynamic broker configs of ``image``."""
    return config.with_dynamic(image.broker_config(""), image.broker_config(str(config.node_id)))


def describe_configs(
    config: BrokerConfig,
    image: MetadataImage,
    resources: Sequence[DescribeConfigsResource],
    *,
    include_synonyms: bool = False,
    include_documentation: bool = False,
) -> list[DescribeConfigsResult]:
    """DescribeConfigs over ``image`` (``config`` is the static broker config)."""
    effective = effective_broker_config(config, image)
    results: list[DescribeConfigsResult] = []
    for res in resources:
        if res.resource_type == ConfigResourceType.TOPIC:
            if image.topic(res.resource_name) is None:
                error = ApiError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {res.resource_name!r} does not exist",
                )
                results.append(DescribeConfigsResult(res.resource_type, res.resource_name, error))
                continue
            entries = describe_topic_configs(
                effective,
                image.topic_config(res.resource_name),
                res.keys,
                include_synonyms=include_synonyms,
                include_documentation=include_documentation,
            )
        elif res.resource_type == ConfigResourceType.BROKER:
            scope_error, per_broker = _broker_resource_scope(res.resource_name, config.node_id)
            if scope_error is not None:
                results.append(
                    DescribeConfigsResult(res.resource_type, res.resource_name, scope_error)
                )
                continue
            entries = describe_broker_configs(
                effective,
                res.keys,
                per_broker=per_broker,
                include_synonyms=include_synonyms,
                include_documentation=include_documentation,
            )
        else:
            error = ApiError(
                ErrorCode.INVALID_REQUEST, f"resource type {res.resource_type} is not supported"
            )
            results.append(DescribeConfigsResult(res.resource_type, res.resource_name, error))
            continue
        results.append(
            DescribeConfigsResult(res.resource_type, res.resource_name, OK, tuple(entries))
        )
    return results


# -- the controller --------------------------------------------------------------------------


class Controller:
    """The active (and only) controller of a single-node cluster.

    Create with :meth:`start`, which checks ``meta.properties``, opens and replays the
    metadata log and registers this node as a broker. :attr:`image` is the latest
    committed image; :meth:`add_listener` callbacks run after every committed change,
    under the controller's lock, with the new image and the delta.
    """

    def __init__(
        self,
        config: BrokerConfig,
        log: MetadataLog,
        image: MetadataImage,
        *,
        clock: Clock,
    ) -> None:
        self._static = config
        self._log = log
        self._image = image
        self._clock = clock
        self._config = effective_broker_config(config, image)
        self._lock = threading.RLock()
        self._listeners: list[Listener] = []
        self._failure: str | None = None
        self.broker_epoch = -1

    @classmethod
    def start(cls, config: BrokerConfig, *, clock: Clock, fsync: FsyncFn = os.fsync) -> Controller:
        """Check meta.properties, replay the metadata log, register this node."""
        dirs = [*config.log_dirs, config.metadata_log_dir]
        cluster_id = ensure_meta_properties(
            dirs, node_id=config.node_id, cluster_id=config.cluster_id, fsync=fsync
        )
        log = MetadataLog.open(config.metadata_log_dir, clock=clock, fsync=fsync)
        try:
            image = log.replay(MetadataImage.empty(cluster_id))
            controller = cls(config, log, image, clock=clock)
            controller.register_broker()
        except BaseException:
            log.close()
            raise
        return controller

    # -- state -------------------------------------------------------------------------

    @property
    def image(self) -> MetadataImage:
        return self._image

    @property
    def config(self) -> BrokerConfig:
        """The broker config with the committed dynamic broker configs applied."""
        return self._config

    @property
    def static_config(self) -> BrokerConfig:
        return self._static

    @property
    def node_id(self) -> int:
        return self._static.node_id

    @property
    def metadata_log(self) -> MetadataLog:
        return self._log

    def add_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def close(self) -> None:
        with self._lock:
            self._log.close()

    # -- committing --------------------------------------------------------------------

    def _commit(self, records: Sequence[MetadataRecord]) -> ApiError:
        """Append ``records`` durably as one batch and apply them; an error when that fails.

        A failed append leaves the log and the image possibly apart, so the controller
        then refuses every further change until restarted (replay settles it).
        """
        if self._failure is not None:
            return ApiError(ErrorCode.UNKNOWN_SERVER_ERROR, self._failure)
        if not records:
            return OK
        try:
            first = self._log.append(records)
        except (StorageError, OSError) as exc:
            self._failure = f"the metadata log failed and needs a restart: {exc}"
            _log.error("%s", self._failure)
            return ApiError(ErrorCode.KAFKA_STORAGE_ERROR, str(exc))
        image, delta = self._image.apply([(first + i, record) for i, record in enumerate(records)])
        self._image = image
        if delta.changed_broker_configs:
            self._config = effective_broker_config(self._static, image)
        for listener in list(self._listeners):
            try:
                listener(image, delta)
            except Exception:
                _log.exception("metadata listener failed")
        return OK

    def _commit_items(
        self, items: Sequence[tuple[int, list[MetadataRecord]]], errors: dict[int, ApiError]
    ) -> None:
        """Commit item records in batches of at most MAX_RECORDS_PER_BATCH records, an
        item never split; a failed batch's error goes to each of its items."""
        batch: list[MetadataRecord] = []
        members: list[int] = []

        def flush() -> None:
            error = self._commit(batch)
            if not error.ok:
                for index in members:
                    errors[index] = error
            batch.clear()
            members.clear()

        for index, records in items:
            if batch and len(batch) + len(records) > MAX_RECORDS_PER_BATCH:
                flush()
            batch.extend(records)
            members.append(index)
        if batch:
            flush()

    # -- brokers -----------------------------------------------------------------------

    def register_broker(self) -> int:
        """Register this node with its advertised listeners; returns the broker epoch."""
        endpoints = tuple(
            BrokerEndpoint(e.name, e.host, e.port, e.security_protocol)
            for e in self._static.advertised_listeners
        )
        record = RegisterBrokerRecord(self.node_id, uuid.uuid4(), endpoints)
        with self._lock:
            error = self._commit([record])
            if not error.ok:
                raise MetadataError(f"cannot register broker {self.node_id}: {error.message}")
            self.broker_epoch = self._image.brokers[self.node_id].epoch
            return self.broker_epoch

    def _live_brokers(self) -> list[int]:
        return sorted(self._image.brokers)

    # -- topics ------------------------------------------------------------------------

    def _new_topic_id(self, taken: Collection[uuid.UUID]) -> uuid.UUID:
        while True:
            candidate = uuid.uuid4()
            if candidate in _RESERVED_IDS or candidate in taken:
                continue
            if candidate in self._image.topics_by_id:
                continue
            # Kafka avoids ids whose base64 text starts with '-' (read as an option).
            if (candidate.bytes[0] >> 2) == 62:
                continue
            return candidate

    def _check_replicas(
        self, partition: int, replicas: Sequence[int], brokers: Collection[int]
    ) -> ApiError | None:
        if not replicas:
            return ApiError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"partition {partition} has no replicas"
            )
        if len(set(replicas)) != len(replicas):
            return ApiError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"partition {partition} lists a broker twice",
            )
        unknown = [b for b in replicas if b not in brokers]
        if unknown:
            return ApiError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"partition {partition} names brokers that are not registered: {unknown[:5]}",
            )
        return None

    def _placement(self, start: int, count: int, replication_factor: int) -> list[list[int]]:
        brokers = self._live_brokers()
        return [
            [brokers[(p + i) % len(brokers)] for i in range(replication_factor)]
            for p in range(start, start + count)
        ]

    def _partition_records(
        self, topic_id: uuid.UUID, start: int, assignments: Sequence[Sequence[int]]
    ) -> list[MetadataRecord]:
        live = set(self._live_brokers())
        records: list[MetadataRecord] = []
        for offset, replicas in enumerate(assignments):
            isr = tuple(b for b in replicas if b in live)
            leader = isr[0] if isr else -1
            records.append(
                PartitionRecord(topic_id, start + offset, tuple(replicas), isr, leader, 0, 0)
            )
        return records

    def _plan_topic(
        self,
        topic: NewTopic,
        taken_names: Mapping[str, str],
        taken_ids: Collection[uuid.UUID],
    ) -> tuple[ApiError, list[MetadataRecord], CreateTopicResult | None]:
        """Check one new topic; its records and its success result when it passes."""
        error = validate_topic_name(topic.name)
        if error is not None:
            return error, [], None
        if topic.name in self._image.topics_by_name or topic.name in taken_names.values():
            return (
                ApiError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {topic.name!r} already exists"),
                [],
                None,
            )
        other = taken_names.get(_collision_key(topic.name))
        if other is not None:
            return (
                ApiError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    f"topic {topic.name!r} collides with existing topic {other!r} "
                    "('.' and '_' are the same in metric names)",
                ),
                [],
                None,
            )
        brokers = self._live_brokers()
        assignments: list[list[int]]
        if topic.assignments:
            if topic.num_partitions != -1 or topic.replication_factor != -1:
                return (
                    ApiError(
                        ErrorCode.INVALID_REQUEST,
                        "give either partition and replica counts or an assignment, not both",
                    ),
                    [],
                    None,
                )
            partitions = sorted(topic.assignments)
            if partitions != list(range(len(partitions))):
                return (
                    ApiError(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        "assigned partitions are not numbered 0, 1, 2, ... without gaps",
                    ),
                    [],
                    None,
                )
            if len(partitions) > MAX_RECORDS_PER_BATCH - 1 - len(topic.configs):
                return (
                    ApiError(
                        ErrorCode.INVALID_PARTITIONS,
                        f"{len(partitions)} partitions exceed the limit of "
                        f"{MAX_RECORDS_PER_BATCH - 1 - len(topic.configs)}",
                    ),
                    [],
                    None,
                )
            assignments = [list(topic.assignments[p]) for p in partitions]
            for p, replicas in enumerate(assignments):
                error = self._check_replicas(p, replicas, brokers)
                if error is not None:
                    return error, [], None
            error = _consistent_replication(assignments, len(assignments[0]))
            if error is not None:
                return error, [], None
        else:
            count = topic.num_partitions
            if count == -1:
                count = self._config.num_partitions
            if count <= 0:
                return (
                    ApiError(
                        ErrorCode.INVALID_PARTITIONS,
                        f"number of partitions {topic.num_partitions} is not positive "
                        "(or -1 for the default)",
                    ),
                    [],
                    None,
                )
            factor = topic.replication_factor
            if factor == -1:
                factor = self._config.default_replication_factor
            if factor <= 0:
                return (
                    ApiError(
                        ErrorCode.INVALID_REPLICATION_FACTOR,
                        f"replication factor {topic.replication_factor} is not positive "
                        "(or -1 for the default)",
                    ),
                    [],
                    None,
                )
            if factor > len(brokers):
                return (
                    ApiError(
                        ErrorCode.INVALID_REPLICATION_FACTOR,
                        f"replication factor {factor} is larger than the {len(brokers)} "
                        "registered broker(s)",
                    ),
                    [],
                    None,
                )
            limit = MAX_RECORDS_PER_BATCH - 1 - len(topic.configs)
            if count > limit:
                return (
                    ApiError(
                        ErrorCode.INVALID_PARTITIONS,
                        f"{count} partitions exceed the limit of {limit} per topic",
                    ),
                    [],
                    None,
                )
            assignments = self._placement(0, count, factor)
        error = validate_topic_configs(topic.configs)
        if error is not None:
            return error, [], None
        overrides = {k: v for k, v in topic.configs.items() if v is not None}
        topic_id = self._new_topic_id(taken_ids)
        records: list[MetadataRecord] = [TopicRecord(topic.name, topic_id)]
        records += [
            ConfigRecord(TOPIC_RESOURCE, topic.name, key, value)
            for key, value in sorted(overrides.items())
        ]
        records += self._partition_records(topic_id, 0, assignments)
        result = CreateTopicResult(
            topic.name,
            OK,
            topic_id,
            len(assignments),
            len(assignments[0]),
            tuple(describe_topic_configs(self._config, overrides)),
        )
        return OK, records, result

    def create_topics(
        self, topics: Sequence[NewTopic], *, validate_only: bool = False
    ) -> list[CreateTopicResult]:
        """CreateTopics: one result per requested topic, in request order."""
        with self._lock:
            counts: dict[str, int] = {}
            for topic in topics:
                counts[topic.name] = counts.get(topic.name, 0) + 1
            taken_names = {_collision_key(name): name for name in self._image.topics_by_name}
            taken_ids: set[uuid.UUID] = set()
            results: list[CreateTopicResult] = []
            planned: list[tuple[int, list[MetadataRecord]]] = []
            for index, topic in enumerate(topics):
                if counts[topic.name] > 1:
                    error = ApiError(
                        ErrorCode.INVALID_REQUEST, f"topic {topic.name!r} is listed twice"
                    )
                    results.append(CreateTopicResult(topic.name, error))
                    continue
                error, records, result = self._plan_topic(topic, taken_names, taken_ids)
                if result is None:
                    results.append(CreateTopicResult(topic.name, error))
                    continue
                results.append(result)
                taken_names[_collision_key(topic.name)] = topic.name
                if result.topic_id is not None:
                    taken_ids.add(result.topic_id)
                planned.append((index, records))
            if validate_only:
                # Nothing is written, so no id is given out.
                return [
                    CreateTopicResult(
                        r.name, r.error, None, r.num_partitions, r.replication_factor, r.configs
                    )
                    if r.error.ok
                    else r
                    for r in results
                ]
            errors: dict[int, ApiError] = {}
            self._commit_items(planned, errors)
            for index, error in errors.items():
                results[index] = CreateTopicResult(results[index].name, error)
            return results

    def auto_create_topic(self, name: str) -> CreateTopicResult:
        """Create ``name`` for a Metadata request that allows auto-creation.

        Off with ``auto.create.topics.enable=false`` (UNKNOWN_TOPIC_OR_PARTITION), except
        for the internal topics, which are created with their own settings whenever a
        coordinator needs them. An existing topic gives TOPIC_ALREADY_EXISTS.
        """
        if name == OFFSETS_TOPIC:
            topic = NewTopic(
                name,
                self._config.offsets_topic_num_partitions,
                min(self._config.offsets_topic_replication_factor, len(self._live_brokers())),
                configs={
                    "cleanup.policy": "compact",
                    "compression.type": "producer",
                    "segment.bytes": str(self._config.get_int("offsets.topic.segment.bytes")),
                },
            )
        elif name == TRANSACTION_STATE_TOPIC:
            topic = NewTopic(
                name,
                self._config.get_int("transaction.state.log.num.partitions"),
                min(
                    self._config.get_int("transaction.state.log.replication.factor"),
                    len(self._live_brokers()),
                ),
                configs={
                    "cleanup.policy": "compact",
                    "compression.type": "uncompressed",
                    "min.insync.replicas": str(
                        self._config.get_int("transaction.state.log.min.isr")
                    ),
                    "segment.bytes": str(
                        self._config.get_int("transaction.state.log.segment.bytes")
                    ),
                },
            )
        elif not self._config.auto_create_topics_enable:
            return CreateTopicResult(
                name,
                ApiError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {name!r} does not exist and auto.create.topics.enable is false",
                ),
            )
        else:
            topic = NewTopic(name)
        return self.create_topics([topic])[0]

    def delete_topics(
        self, names: Sequence[str] = (), topic_ids: Sequence[uuid.UUID] = ()
    ) -> list[DeleteTopicResult]:
        """DeleteTopics by name and/or id: results for names first, then ids."""
        with self._lock:
            requested: list[tuple[str | None, uuid.UUID | None]] = [(n, None) for n in names]
            requested += [(None, i) for i in topic_ids]
            results: list[DeleteTopicResult] = []
            seen: dict[uuid.UUID, int] = {}
            planned: list[tuple[int, list[MetadataRecord]]] = []
            name_counts: dict[str, int] = {}
            id_counts: dict[uuid.UUID, int] = {}
            for n in names:
                name_counts[n] = name_counts.get(n, 0) + 1
            for i in topic_ids:
                id_counts[i] = id_counts.get(i, 0) + 1
            for index, (name, topic_id) in enumerate(requested):
                topic: TopicImage | None
                if name is not None:
                    topic = self._image.topic(name)
                    duplicate = name_counts[name] > 1
                    missing = ApiError(
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
                    )
                else:
                    assert topic_id is not None
                    topic = self._image.topic_by_id(topic_id)
                    duplicate = id_counts[topic_id] > 1
                    missing = ApiError(ErrorCode.UNKNOWN_TOPIC_ID, f"no topic has id {topic_id}")
                if duplicate:
                    error = ApiError(ErrorCode.INVALID_REQUEST, "the topic is listed twice")
                elif not self._config.delete_topic_enable:
                    error = ApiError(
                        ErrorCode.TOPIC_DELETION_DISABLED, "delete.topic.enable is false"
                    )
                elif topic is None:
                    error = missing
                elif topic.topic_id in seen:
                    error = ApiError(
                        ErrorCode.INVALID_REQUEST, "the topic is listed by name and by id"
                    )
                    first = seen[topic.topic_id]
                    results[first] = DeleteTopicResult(
                        results[first].name, results[first].topic_id, error
                    )
                    planned = [p for p in planned if p[0] != first]
                else:
                    error = OK
                    seen[topic.topic_id] = index
                    planned.append((index, [RemoveTopicRecord(topic.topic_id)]))
                results.append(
                    DeleteTopicResult(
                        topic.name if topic is not None else name,
                        topic.topic_id if topic is not None else topic_id,
                        error,
                    )
                )
            errors: dict[int, ApiError] = {}
            self._commit_items(planned, errors)
            for index, error in errors.items():
                old = results[index]
                results[index] = DeleteTopicResult(old.name, old.topic_id, error)
            return results

    def create_partitions(
        self, requests: Sequence[NewPartitions], *, validate_only: bool = False
    ) -> list[CreatePartitionsResult]:
        """CreatePartitions: one result per requested topic."""
        with self._lock:
            counts: dict[str, int] = {}
            for request in requests:
                counts[request.name] = counts.get(request.name, 0) + 1
            results: list[CreatePartitionsResult] = []
            planned: list[tuple[int, list[MetadataRecord]]] = []
            for index, request in enumerate(requests):
                if counts[request.name] > 1:
                    error: ApiError = ApiError(
                        ErrorCode.INVALID_REQUEST, f"topic {request.name!r} is listed twice"
                    )
                    records: list[MetadataRecord] = []
                else:
                    error, records = self._plan_partitions(request)
                results.append(CreatePartitionsResult(request.name, error))
                if error.ok:
                    planned.append((index, records))
            if validate_only:
                return results
            errors: dict[int, ApiError] = {}
            self._commit_items(planned, errors)
            for index, error in errors.items():
                results[index] = CreatePartitionsResult(results[index].name, error)
            return results

    def _plan_partitions(self, request: NewPartitions) -> tuple[ApiError, list[MetadataRecord]]:
        topic = self._image.topic(request.name)
        if topic is None:
            return (
                ApiError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {request.name!r} does not exist"
                ),
                [],
            )
        current = topic.num_partitions
        if request.count < current:
            return (
                ApiError(
                    ErrorCode.INVALID_PARTITIONS,
                    f"topic has {current} partitions; {request.count} would remove some",
                ),
                [],
            )
        if request.count == current:
            return (
                ApiError(ErrorCode.INVALID_PARTITIONS, f"topic already has {current} partitions"),
                [],
            )
        added = request.count - current
        if added > MAX_RECORDS_PER_BATCH:
            return (
                ApiError(
                    ErrorCode.INVALID_PARTITIONS,
                    f"adding {added} partitions exceeds the limit of {MAX_RECORDS_PER_BATCH}",
                ),
                [],
            )
        factor = topic.replication_factor
        if request.assignments is not None:
            if len(request.assignments) != added:
                return (
                    ApiError(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"{len(request.assignments)} assignments given for {added} new partitions",
                    ),
                    [],
                )
            brokers = self._live_brokers()
            assignments = [list(replicas) for replicas in request.assignments]
            for offset, replicas in enumerate(assignments):
                error = self._check_replicas(current + offset, replicas, brokers)
                if error is not None:
                    return error, []
            error = _consistent_replication(assignments, factor, current)
            if error is not None:
                return error, []
        else:
            if factor > len(self._live_brokers()):
                return (
                    ApiError(
                        ErrorCode.INVALID_REPLICATION_FACTOR,
                        f"replication factor {factor} is larger than the registered brokers",
                    ),
                    [],
                )
            assignments = self._placement(current, added, factor)
        return OK, self._partition_records(topic.topic_id, current, assignments)

    # -- configs -----------------------------------------------------------------------

    def _resource_error(self, resource_type: int, name: str) -> ApiError | None:
        if resource_type == ConfigResourceType.TOPIC:
            if self._image.topic(name) is None:
                return ApiError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
                )
            return None
        if resource_type == ConfigResourceType.BROKER:
            if name == "" or name.isdigit():
                return None
            return ApiError(
                ErrorCode.INVALID_REQUEST, f"broker resource name {name!r} is not an id"
            )
        return ApiError(
            ErrorCode.INVALID_REQUEST, f"resource type {resource_type} is not supported"
        )

    def _current(self, resource_type: int, name: str) -> Mapping[str, str]:
        if resource_type == ConfigResourceType.TOPIC:
            return self._image.topic_config(name)
        return self._image.broker_config(name)

    def _config_records(
        self, resource_type: int, name: str, new: Mapping[str, str]
    ) -> tuple[ApiError, list[MetadataRecord]]:
        """Validate a resource's complete new dynamic configs; the records reaching them."""
        if resource_type == ConfigResourceType.TOPIC:
            error = validate_topic_configs(new)
        else:
            error = validate_broker_config_changes(new, per_broker=name != "")
        if error is not None:
            return error, []
        record_type = (
            TOPIC_RESOURCE if resource_type == ConfigResourceType.TOPIC else BROKER_RESOURCE
        )
        current = self._current(resource_type, name)
        records: list[MetadataRecord] = [
            ConfigRecord(record_type, name, key, None) for key in sorted(current) if key not in new
        ]
        records += [
            ConfigRecord(record_type, name, key, value)
            for key, value in sorted(new.items())
            if current.get(key) != value
        ]
        return OK, records

    def _alter(
        self,
        resources: Sequence[tuple[int, str]],
        plan: Callable[[int], tuple[ApiError, list[MetadataRecord]]],
        validate_only: bool,
    ) -> list[ConfigResourceResult]:
        counts: dict[tuple[int, str], int] = {}
        for key in resources:
            counts[key] = counts.get(key, 0) + 1
        results: list[ConfigResourceResult] = []
        planned: list[tuple[int, list[MetadataRecord]]] = []
        for index, (rtype, rname) in enumerate(resources):
            records: list[MetadataRecord] = []
            if counts[(rtype, rname)] > 1:
                error = ApiError(ErrorCode.INVALID_REQUEST, "the resource is listed twice")
            else:
                problem = self._resource_error(rtype, rname)
                if problem is None:
                    error, records = plan(index)
                else:
                    error = problem
            results.append(ConfigResourceResult(rtype, rname, error))
            if error.ok and records:
                planned.append((index, records))
        if not validate_only:
            errors: dict[int, ApiError] = {}
            self._commit_items(planned, errors)
            for index, error in errors.items():
                old = results[index]
                results[index] = ConfigResourceResult(old.resource_type, old.resource_name, error)
        return results

    def alter_configs(
        self, resources: Sequence[AlterConfigsResource], *, validate_only: bool = False
    ) -> list[ConfigResourceResult]:
        """AlterConfigs: each resource's dynamic configs become exactly those given."""

        def plan(index: int) -> tuple[ApiError, list[MetadataRecord]]:
            res = resources[index]
            nulls = [key for key, value in res.configs.items() if value is None]
            if nulls:
                return ApiError(ErrorCode.INVALID_REQUEST, f"config {nulls[0]} has no value"), []
            new = {key: value for key, value in res.configs.items() if value is not None}
            return self._config_records(res.resource_type, res.resource_name, new)

        with self._lock:
            keys = [(r.resource_type, r.resource_name) for r in resources]
            return self._alter(keys, plan, validate_only)

    def incremental_alter_configs(
        self, resources: Sequence[IncrementalAlterConfigsResource], *, validate_only: bool = False
    ) -> list[ConfigResourceResult]:
        """IncrementalAlterConfigs: SET, DELETE, APPEND, SUBTRACT per key."""

        def plan(index: int) -> tuple[ApiError, list[MetadataRecord]]:
            res = resources[index]
            new = dict(self._current(res.resource_type, res.resource_name))
            seen: set[str] = set()
            is_topic = res.resource_type == ConfigResourceType.TOPIC
            defs: Mapping[str, object] = TOPIC_CONFIGS if is_topic else BROKER_CONFIGS
            for key, op, value in res.changes:
                if key in seen:
                    return ApiError(ErrorCode.INVALID_REQUEST, f"config {key} is changed twice"), []
                seen.add(key)
                if key not in defs:
                    kind = "topic" if is_topic else "broker"
                    return ApiError(ErrorCode.INVALID_CONFIG, f"unknown {kind} config {key!r}"), []
                if op == AlterConfigOp.SET:
                    if value is None:
                        return ApiError(ErrorCode.INVALID_REQUEST, f"SET {key} needs a value"), []
                    new[key] = value
                elif op == AlterConfigOp.DELETE:
                    new.pop(key, None)
                elif op in (AlterConfigOp.APPEND, AlterConfigOp.SUBTRACT):
                    error, items = self._list_value(res.resource_type, res.resource_name, key)
                    if error is not None:
                        return error, []
                    given = [v.strip() for v in (value or "").split(",") if v.strip()]
                    if op == AlterConfigOp.APPEND:
                        items += [v for v in given if v not in items]
                    else:
                        items = [v for v in items if v not in given]
                    new[key] = ",".join(items)
                else:
                    return ApiError(ErrorCode.INVALID_REQUEST, f"unknown operation {op}"), []
            return self._config_records(res.resource_type, res.resource_name, new)

        with self._lock:
            keys = [(r.resource_type, r.resource_name) for r in resources]
            return self._alter(keys, plan, validate_only)

    def _list_value(
        self, resource_type: int, name: str, key: str
    ) -> tuple[ApiError | None, list[str]]:
        """The current items of a LIST config (its override, else its effective value)."""
        definition: ConfigDef
        if resource_type == ConfigResourceType.TOPIC:
            definition = TOPIC_CONFIGS[key]
            current = self._image.topic_config(name)
        else:
            definition = BROKER_CONFIGS[key]
            current = self._image.broker_config(name)
        if definition.type is not ConfigType.LIST:
            return (
                ApiError(
                    ErrorCode.INVALID_CONFIG, f"{key} is not a list; APPEND and SUBTRACT need one"
                ),
                [],
            )
        if key in current:
            text = current[key]
        elif resource_type == ConfigResourceType.TOPIC:
            text = format_value(topic_config_value(self._config, {}, key)[0]) or ""
        else:
            text = format_value(self._config.get(key)) or ""
        return None, [item.strip() for item in text.split(",") if item.strip()]

    def describe_configs(
        self,
        resources: Sequence[DescribeConfigsResource],
        *,
        include_synonyms: bool = False,
        include_documentation: bool = False,
    ) -> list[DescribeConfigsResult]:
        """DescribeConfigs over the current image (see :func:`describe_configs`)."""
        return describe_configs(
            self._static,
            self._image,
            resources,
            include_synonyms=include_synonyms,
            include_documentation=include_documentation,
        )

    # -- producer ids ------------------------------------------------------------------

    def allocate_producer_ids(
        self, broker_id: int, broker_epoch: int | None = None
    ) -> ProducerIdBlock:
        """AllocateProducerIds: the next block of PRODUCER_ID_BLOCK_SIZE ids, written to
        the metadata log before it is handed out, so no id is ever given twice.

        ``broker_epoch`` None skips the epoch check (the co-located broker asking)."""
        with self._lock:
            registration = self._image.brokers.get(broker_id)
            if registration is None:
                return ProducerIdBlock(
                    ApiError(ErrorCode.STALE_BROKER_EPOCH, f"broker {broker_id} is not registered")
                )
            if broker_epoch is not None and broker_epoch != registration.epoch:
                return ProducerIdBlock(
                    ApiError(
                        ErrorCode.STALE_BROKER_EPOCH,
                        f"broker epoch {broker_epoch} is not the current {registration.epoch}",
                    )
                )
            start = self._image.next_producer_id
            if start > _MAX_PRODUCER_ID - PRODUCER_ID_BLOCK_SIZE:
                return ProducerIdBlock(
                    ApiError(ErrorCode.UNKNOWN_SERVER_ERROR, "producer ids are exhausted")
                )
            record = ProducerIdsRecord(
                broker_id, registration.epoch, start + PRODUCER_ID_BLOCK_SIZE
            )
            error = self._commit([record])
            if not error.ok:
                return ProducerIdBlock(error)
            return ProducerIdBlock(OK, start, PRODUCER_ID_BLOCK_SIZE)


def _consistent_replication(
    assignments: Iterable[Sequence[int]], factor: int, first: int = 0
) -> ApiError | None:
    for offset, replicas in enumerate(assignments):
        if len(replicas) != factor:
            return ApiError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"partition {first + offset} has {len(replicas)} replicas, "
                f"the topic's others have {factor}",
            )
    return None
