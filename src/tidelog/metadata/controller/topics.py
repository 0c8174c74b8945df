"""Topics and partitions: CreateTopics, DeleteTopics, CreatePartitions, auto-creation.

Each operation checks every item of its request against the committed image and turns
the items that pass into records (Topic, Config, Partition, RemoveTopic); an item that
fails gets its :class:`~tidelog.metadata.errors.ApiError` and writes nothing. Error codes
and their conditions follow Kafka's controller (its ReplicationControlManager); messages
are our own.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tidelog.metadata.configs import ConfigEntry, describe_topic_configs, validate_topic_configs
from tidelog.metadata.controller.base import (
    MAX_RECORDS_PER_BATCH,
    ControllerResult,
    ControllerView,
    per_item,
)
from tidelog.metadata.controller.placement import assign_replicas
from tidelog.metadata.errors import OK, ApiError
from tidelog.metadata.image import TOPIC_RESOURCE, TopicImage
from tidelog.metadata.log import METADATA_TOPIC
from tidelog.metadata.records import (
    ConfigRecord,
    MetadataRecord,
    PartitionRecord,
    RemoveTopicRecord,
    TopicRecord,
)
from tidelog.protocol.error_codes import ErrorCode
from tidelog.runtime.system import random_uuid

__all__ = [
    "INTERNAL_TOPICS",
    "OFFSETS_TOPIC",
    "TRANSACTION_STATE_TOPIC",
    "CreatePartitionsResult",
    "CreateTopicResult",
    "DeleteTopicResult",
    "NewPartitions",
    "NewTopic",
    "auto_create_topic",
    "create_partitions",
    "create_topics",
    "delete_topics",
    "replication_limit_error",
    "validate_topic_name",
]

OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})
MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
# Ids Kafka reserves: the zero UUID (no id) and 1 (the metadata topic).
_RESERVED_IDS = frozenset({uuid.UUID(int=0), uuid.UUID(int=1)})


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


def _new_topic_id(view: ControllerView, taken: Collection[uuid.UUID]) -> uuid.UUID:
    while True:
        candidate = random_uuid(view.random)
        if candidate in _RESERVED_IDS or candidate in taken:
            continue
        if candidate in view.image.topics_by_id:
            continue
        # Kafka avoids ids whose base64 text starts with '-' (read as an option).
        if (candidate.bytes[0] >> 2) == 62:
            continue
        return candidate


def _check_replicas(
    partition: int, replicas: Sequence[int], brokers: Collection[int], live: Collection[int]
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
    if not any(b in live for b in replicas):
        # No replica could lead it (Kafka's rule for manual assignments).
        return ApiError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"every broker of partition {partition} is fenced or in controlled shutdown",
        )
    return None


def replication_limit_error(view: ControllerView, factor: int) -> ApiError | None:
    """INVALID_REPLICATION_FACTOR for a factor this cluster cannot serve yet."""
    limit = view.max_replication_factor
    if limit is not None and factor > limit:
        return ApiError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"replication factor {factor} is not supported yet: partitions are not "
            f"replicated between the nodes of a cluster, use {limit}",
        )
    return None


def _internal_replication_factor(view: ControllerView, configured: int) -> int:
    factor = min(configured, len(view.live_brokers()))
    limit = view.max_replication_factor
    return factor if limit is None else min(factor, limit)


def _placement(
    view: ControllerView,
    start: int,
    count: int,
    replication_factor: int,
    start_broker: int | None = None,
) -> list[list[int]]:
    """Replicas for partitions ``start`` .. ``start + count - 1`` on the active brokers
    (see :mod:`.placement`)."""
    brokers = view.live_brokers()
    racks = {b: view.image.brokers[b].rack for b in brokers}
    return assign_replicas(
        brokers,
        racks,
        count,
        replication_factor,
        rng=view.random,
        start_broker=start_broker,
        first_partition=start,
    )


def _partition_records(
    view: ControllerView, topic_id: uuid.UUID, start: int, assignments: Sequence[Sequence[int]]
) -> list[MetadataRecord]:
    live = set(view.live_brokers())
    records: list[MetadataRecord] = []
    for offset, replicas in enumerate(assignments):
        isr = tuple(b for b in replicas if b in live)
        leader = isr[0] if isr else -1
        records.append(
            PartitionRecord(topic_id, start + offset, tuple(replicas), isr, leader, 0, 0)
        )
    return records


def _plan_topic(
    view: ControllerView,
    topic: NewTopic,
    taken_names: Mapping[str, str],
    taken_ids: Collection[uuid.UUID],
) -> tuple[ApiError, list[MetadataRecord], CreateTopicResult | None]:
    """Check one new topic; its records and its success result when it passes."""
    error = validate_topic_name(topic.name)
    if error is not None:
        return error, [], None
    if topic.name in view.image.topics_by_name or topic.name in taken_names.values():
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
    brokers = view.live_brokers()
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
            error = _check_replicas(p, replicas, view.registered_brokers(), brokers)
            if error is not None:
                return error, [], None
        error = _consistent_replication(assignments, len(assignments[0]))
        if error is None:
            error = replication_limit_error(view, len(assignments[0]))
        if error is not None:
            return error, [], None
    else:
        count = topic.num_partitions
        if count == -1:
            count = view.config.num_partitions
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
            factor = view.config.default_replication_factor
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
        error = replication_limit_error(view, factor)
        if error is not None:
            return error, [], None
        if factor > len(brokers):
            return (
                ApiError(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"replication factor {factor} is larger than the {len(brokers)} "
                    "unfenced broker(s)",
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
        assignments = _placement(view, 0, count, factor)
    error = validate_topic_configs(topic.configs)
    if error is not None:
        return error, [], None
    overrides = {k: v for k, v in topic.configs.items() if v is not None}
    topic_id = _new_topic_id(view, taken_ids)
    records: list[MetadataRecord] = [TopicRecord(topic.name, topic_id)]
    records += [
        ConfigRecord(TOPIC_RESOURCE, topic.name, key, value)
        for key, value in sorted(overrides.items())
    ]
    records += _partition_records(view, topic_id, 0, assignments)
    result = CreateTopicResult(
        topic.name,
        OK,
        topic_id,
        len(assignments),
        len(assignments[0]),
        tuple(describe_topic_configs(view.config, overrides)),
    )
    return OK, records, result


def create_topics(
    view: ControllerView, topics: Sequence[NewTopic], *, validate_only: bool = False
) -> ControllerResult[list[CreateTopicResult]]:
    """CreateTopics: one result per requested topic, in request order."""
    counts: dict[str, int] = {}
    for topic in topics:
        counts[topic.name] = counts.get(topic.name, 0) + 1
    taken_names = {_collision_key(name): name for name in view.image.topics_by_name}
    taken_ids: set[uuid.UUID] = set()
    results: list[CreateTopicResult] = []
    planned: list[tuple[int, list[MetadataRecord]]] = []
    for index, topic in enumerate(topics):
        if counts[topic.name] > 1:
            error = ApiError(ErrorCode.INVALID_REQUEST, f"topic {topic.name!r} is listed twice")
            results.append(CreateTopicResult(topic.name, error))
            continue
        error, records, result = _plan_topic(view, topic, taken_names, taken_ids)
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
        return ControllerResult(
            [
                CreateTopicResult(
                    r.name, r.error, None, r.num_partitions, r.replication_factor, r.configs
                )
                if r.error.ok
                else r
                for r in results
            ]
        )
    return per_item(results, planned, lambda r, error: CreateTopicResult(r.name, error))


def auto_create_topic(view: ControllerView, name: str) -> ControllerResult[CreateTopicResult]:
    """Create ``name`` for a Metadata request that allows auto-creation.

    Off with ``auto.create.topics.enable=false`` (UNKNOWN_TOPIC_OR_PARTITION), except
    for the internal topics, which are created with their own settings whenever a
    coordinator needs them. An existing topic gives TOPIC_ALREADY_EXISTS.
    """
    topic = auto_create_spec(view, name)
    if isinstance(topic, CreateTopicResult):
        return ControllerResult(topic)
    created = create_topics(view, [topic])
    failed = created.failed
    return ControllerResult(
        created.response[0],
        created.items,
        None if failed is None else lambda errors: failed(errors)[0],
    )


def auto_create_spec(view: ControllerView, name: str) -> NewTopic | CreateTopicResult:
    """The topic auto-creation of ``name`` asks for (what a node that is not the active
    controller sends it in a CreateTopics), or the failed result when it is off."""
    if name == OFFSETS_TOPIC:
        topic = NewTopic(
            name,
            view.config.offsets_topic_num_partitions,
            _internal_replication_factor(view, view.config.offsets_topic_replication_factor),
            configs={
                "cleanup.policy": "compact",
                "compression.type": "producer",
                "segment.bytes": str(view.config.get_int("offsets.topic.segment.bytes")),
            },
        )
    elif name == TRANSACTION_STATE_TOPIC:
        topic = NewTopic(
            name,
            view.config.get_int("transaction.state.log.num.partitions"),
            _internal_replication_factor(
                view, view.config.get_int("transaction.state.log.replication.factor")
            ),
            configs={
                "cleanup.policy": "compact",
                "compression.type": "uncompressed",
                "min.insync.replicas": str(view.config.get_int("transaction.state.log.min.isr")),
                "segment.bytes": str(view.config.get_int("transaction.state.log.segment.bytes")),
            },
        )
    elif not view.config.auto_create_topics_enable:
        return CreateTopicResult(
            name,
            ApiError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {name!r} does not exist and auto.create.topics.enable is false",
            ),
        )
    else:
        topic = NewTopic(name)
    return topic


def delete_topics(
    view: ControllerView, names: Sequence[str] = (), topic_ids: Sequence[uuid.UUID] = ()
) -> ControllerResult[list[DeleteTopicResult]]:
    """DeleteTopics by name and/or id: results for names first, then ids."""
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
            topic = view.image.topic(name)
            duplicate = name_counts[name] > 1
            missing = ApiError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
            )
        else:
            assert topic_id is not None
            topic = view.image.topic_by_id(topic_id)
            duplicate = id_counts[topic_id] > 1
            missing = ApiError(ErrorCode.UNKNOWN_TOPIC_ID, f"no topic has id {topic_id}")
        if duplicate:
            error = ApiError(ErrorCode.INVALID_REQUEST, "the topic is listed twice")
        elif not view.config.delete_topic_enable:
            error = ApiError(ErrorCode.TOPIC_DELETION_DISABLED, "delete.topic.enable is false")
        elif topic is None:
            error = missing
        elif topic.topic_id in seen:
            error = ApiError(ErrorCode.INVALID_REQUEST, "the topic is listed by name and by id")
            first = seen[topic.topic_id]
            results[first] = DeleteTopicResult(results[first].name, results[first].topic_id, error)
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
    return per_item(
        results, planned, lambda old, error: DeleteTopicResult(old.name, old.topic_id, error)
    )


def create_partitions(
    view: ControllerView, requests: Sequence[NewPartitions], *, validate_only: bool = False
) -> ControllerResult[list[CreatePartitionsResult]]:
    """CreatePartitions: one result per requested topic."""
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
            error, records = _plan_partitions(view, request)
        results.append(CreatePartitionsResult(request.name, error))
        if error.ok:
            planned.append((index, records))
    if validate_only:
        return ControllerResult(results)
    return per_item(results, planned, lambda r, error: CreatePartitionsResult(r.name, error))


def _plan_partitions(
    view: ControllerView, request: NewPartitions
) -> tuple[ApiError, list[MetadataRecord]]:
    topic = view.image.topic(request.name)
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
    error = replication_limit_error(view, factor)
    if error is not None:
        return error, []
    if request.assignments is not None:
        if len(request.assignments) != added:
            return (
                ApiError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"{len(request.assignments)} assignments given for {added} new partitions",
                ),
                [],
            )
        registered, live = view.registered_brokers(), view.live_brokers()
        assignments = [list(replicas) for replicas in request.assignments]
        for offset, replicas in enumerate(assignments):
            error = _check_replicas(current + offset, replicas, registered, live)
            if error is not None:
                return error, []
        error = _consistent_replication(assignments, factor, current)
        if error is not None:
            return error, []
    else:
        if factor > len(view.live_brokers()):
            return (
                ApiError(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"replication factor {factor} is larger than the unfenced brokers",
                ),
                [],
            )
        first = topic.partitions.get(0)
        assignments = _placement(
            view, current, added, factor, first.replicas[0] if first is not None else None
        )
    return OK, _partition_records(view, topic.topic_id, current, assignments)


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
