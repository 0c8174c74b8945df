"""CreateTopics, DeleteTopics and CreatePartitions: topic administration via the controller.

Each handler turns the request into the controller's request objects, runs the controller
operation in a worker thread (it fsyncs the metadata log) and copies every item's error
code and message into the version's response. Checks and their error codes are the
controller's (see ``docs/metadata.md``); the handlers add only what the request layout
itself can get wrong:

* CreateTopics: a partition assigned twice in one topic -> INVALID_REPLICA_ASSIGNMENT.
  Config keys given twice: the last value wins, as in Kafka;
* DeleteTopics v6: an entry with both a name and an id, or neither -> INVALID_REQUEST.

Every metadata change is applied to this broker's partitions before the controller call
returns to the handler (see :mod:`tidelog.broker.broker`), so a successful CreateTopics
or CreatePartitions answer means the new partitions already take writes and reads, and
a successful DeleteTopics answer means the logs are gone.

``timeout`` is not used: on a single node every change is complete when the call
returns. ``validate_only`` runs every check and writes nothing; CreateTopics then answers
without a topic id, as Kafka does.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from tidelog.broker.authorization import Access, access, in_request_order
from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE, controller, make, response_module
from tidelog.metadata.acls import AclOperation
from tidelog.metadata.controller import (
    CreatePartitionsResult,
    CreateTopicResult,
    DeleteTopicResult,
    NewPartitions,
    NewTopic,
)
from tidelog.metadata.errors import ApiError
from tidelog.protocol import ApiKey, ErrorCode

#: The answer for a topic the principal may not change (no name: it may be a secret).
_DENIED = ApiError(
    ErrorCode.TOPIC_AUTHORIZATION_FAILED, ErrorCode.TOPIC_AUTHORIZATION_FAILED.message
)


# -- CreateTopics --------------------------------------------------------------------------


def _new_topic(entry: Any) -> NewTopic | ApiError:
    assignments: dict[int, tuple[int, ...]] | None = None
    if entry.assignments:
        assignments = {}
        for assignment in entry.assignments:
            index = int(assignment.partition_index)
            if index in assignments:
                return ApiError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"partition {index} is assigned twice"
                )
            assignments[index] = tuple(int(b) for b in assignment.broker_ids)
    return NewTopic(
        name=entry.name,
        num_partitions=int(entry.num_partitions),
        replication_factor=int(entry.replication_factor),
        assignments=assignments,
        configs={config.name: config.value for config in entry.configs},
    )


def _create_topic_result(module: Any, result: CreateTopicResult, configs_visible: bool) -> Any:
    """The version's entry for ``result``; its configs only when the principal may
    describe them (else, as in Kafka, none and TOPIC_AUTHORIZATION_FAILED for them)."""
    config_cls = getattr(module, "CreatableTopicConfigs", None)
    configs = ()
    if config_cls is not None and result.error.ok and configs_visible:
        configs = tuple(
            config_cls(
                name=entry.name,
                value=entry.value,
                read_only=entry.read_only,
                config_source=int(entry.config_source),
                is_sensitive=entry.is_sensitive,
            )
            for entry in result.configs
        )
    return make(
        module.CreatableTopicResult,
        name=result.name,
        topic_id=result.topic_id,
        error_code=result.error.code.to_kio(),
        error_message=result.error.message,
        num_partitions=result.num_partitions if result.error.ok else -1,
        replication_factor=result.replication_factor if result.error.ok else -1,
        configs=configs,
        topic_config_error_code=(
            ErrorCode.NONE if configs_visible else ErrorCode.TOPIC_AUTHORIZATION_FAILED
        ).to_kio(),
    )


@handles(ApiKey.CREATE_TOPICS)
async def handle_create_topics(ctx: RequestContext, request: Any) -> object:
    module = response_module("create_topics", ctx.api_version)
    checks = access(ctx)
    planned: list[NewTopic | ApiError] = [
        _new_topic(entry) if checks.may_create_topic(entry.name) else _DENIED
        for entry in request.topics
    ]
    new_topics = [item for item in planned if isinstance(item, NewTopic)]
    created: list[CreateTopicResult] = []
    if new_topics:
        created = await ctx.broker.run_blocking(
            controller(ctx).create_topics, new_topics, validate_only=bool(request.validate_only)
        )
    results = iter(created)
    topics = []
    for entry, item in zip(request.topics, planned, strict=True):
        result = (
            CreateTopicResult(entry.name, item) if isinstance(item, ApiError) else next(results)
        )
        visible = checks.topic(AclOperation.DESCRIBE_CONFIGS, entry.name, audit=False)
        topics.append(_create_topic_result(module, result, visible))
    return make(module.CreateTopicsResponse, throttle_time=ZERO_THROTTLE, topics=tuple(topics))


# -- DeleteTopics --------------------------------------------------------------------------


@handles(ApiKey.DELETE_TOPICS)
async def handle_delete_topics(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    module = response_module("delete_topics", version)
    # Each requested entry: a name, an id, or the error of a malformed entry.
    entries: list[str | uuid.UUID | ApiError | _Refused]
    if version >= 6:
        entries = []
        for state in request.topics:
            if state.name is not None and state.topic_id is not None:
                entries.append(
                    ApiError(ErrorCode.INVALID_REQUEST, "give a topic's name or its id, not both")
                )
            elif state.name is not None:
                entries.append(state.name)
            elif state.topic_id is not None:
                entries.append(state.topic_id)
            else:
                entries.append(ApiError(ErrorCode.INVALID_REQUEST, "neither name nor id given"))
    else:
        entries = list(request.topic_names)
    checks = access(ctx)
    entries = [_deletable(ctx, checks, entry) for entry in entries]
    names = [e for e in entries if isinstance(e, str)]
    ids = [e for e in entries if isinstance(e, uuid.UUID)]
    deleted: list[DeleteTopicResult] = []
    if names or ids:
        deleted = await ctx.broker.run_blocking(controller(ctx).delete_topics, names, ids)
    # The controller answers names first, then ids, each in request order.
    by_name = iter(deleted[: len(names)])
    by_id = iter(deleted[len(names) :])
    responses = []
    for entry in entries:
        if isinstance(entry, _Refused):
            result = DeleteTopicResult(entry.name, entry.topic_id, entry.error)
        elif isinstance(entry, ApiError):
            result = DeleteTopicResult(None, None, entry)
        elif isinstance(entry, str):
            result = next(by_name)
        else:
            result = next(by_id)
        responses.append(
            make(
                module.DeletableTopicResult,
                # Before v6 the name is not nullable and always given.
                name=result.name if version >= 6 else str(result.name or entry),
                topic_id=result.topic_id,
                error_code=result.error.code.to_kio(),
                error_message=result.error.message,
            )
        )
    return make(
        module.DeleteTopicsResponse, throttle_time=ZERO_THROTTLE, responses=tuple(responses)
    )


@dataclass(frozen=True, slots=True)
class _Refused:
    """A DeleteTopics entry the principal may not delete."""

    name: str | None
    topic_id: uuid.UUID | None
    error: ApiError


def _deletable(
    ctx: RequestContext, checks: Access, entry: str | uuid.UUID | ApiError | _Refused
) -> str | uuid.UUID | ApiError | _Refused:
    """``entry`` when the principal may delete the topic (or it names none: the controller
    answers that), else why not. An id the principal may not delete is answered with the
    id only, a name with the name only, as Kafka answers them."""
    if isinstance(entry, ApiError | _Refused):
        return entry
    name = ctx.broker.topic_name_of(entry) if isinstance(entry, uuid.UUID) else entry
    if name is None or checks.topic(AclOperation.DELETE, name):
        return entry
    if isinstance(entry, uuid.UUID):
        return _Refused(None, entry, _DENIED)
    return _Refused(name, None, _DENIED)


# -- CreatePartitions ----------------------------------------------------------------------


@handles(ApiKey.CREATE_PARTITIONS)
async def handle_create_partitions(ctx: RequestContext, request: Any) -> object:
    module = response_module("create_partitions", ctx.api_version)
    checks = access(ctx)
    allowed = [checks.topic(AclOperation.ALTER, topic.name) for topic in request.topics]
    wanted = [
        NewPartitions(
            name=topic.name,
            count=int(topic.count),
            assignments=(
                None
                if topic.assignments is None
                else [[int(b) for b in a.broker_ids] for a in topic.assignments]
            ),
        )
        for topic, ok in zip(request.topics, allowed, strict=True)
        if ok
    ]
    created: list[CreatePartitionsResult] = []
    if wanted:
        created = await ctx.broker.run_blocking(
            controller(ctx).create_partitions, wanted, validate_only=bool(request.validate_only)
        )
    results = in_request_order(
        request.topics,
        allowed,
        created,
        lambda topic: CreatePartitionsResult(topic.name, _DENIED),
    )
    return make(
        module.CreatePartitionsResponse,
        throttle_time=ZERO_THROTTLE,
        results=tuple(
            module.CreatePartitionsTopicResult(
                name=result.name,
                error_code=result.error.code.to_kio(),
                error_message=result.error.message,
            )
            for result in results
        ),
    )
