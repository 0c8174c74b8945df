"""OffsetCommit, OffsetFetch and OffsetDelete: a group's committed offsets.

The coordinator keeps the offsets (``docs/groups.md`` §3); these handlers translate each
version's layout:

* OffsetCommit v2-v4 carry ``retention_time`` (-1: the broker's retention), v6+ a leader
  epoch per partition, v7+ ``group_instance_id``, v10 names topics by id. A partition of a
  topic the metadata does not have gets UNKNOWN_TOPIC_OR_PARTITION (the coordinator asks
  the metadata image); an unknown topic id gets UNKNOWN_TOPIC_ID and is not committed. The
  answer waits for the append to ``__consumer_offsets`` (a Deferred) and keeps the
  request's topics and partitions in order.
* OffsetFetch v1-v7 ask for one group, v8+ for several (answered in request order); a
  null topic list (v2+) means every partition the group has offsets for; v10 names topics
  by id (a topic id the metadata does not know gets UNKNOWN_TOPIC_ID). A group-level error
  (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, ...) is the top-level error from v2;
  v1 has none, so, as Kafka does, each requested partition carries it. A partition
  without an offset answers offset -1, leader epoch -1 and empty metadata.
* OffsetDelete: a group-level error leaves the topic list empty; otherwise one error per
  requested partition, in request order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidelog.broker.authorization import access
from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.groups import driver_of, ms
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE, make, response_module
from tidelog.coordinator import (
    FetchedOffset,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResult,
    OffsetDeleteResult,
    OffsetFetchResult,
    PartitionError,
)
from tidelog.metadata.acls import AclOperation
from tidelog.protocol import ApiKey, ErrorCode

_UNAVAILABLE = ErrorCode.COORDINATOR_NOT_AVAILABLE


# -- OffsetCommit --------------------------------------------------------------------------


@handles(ApiKey.OFFSET_COMMIT)
async def handle_offset_commit(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    module = response_module("offset_commit", version)
    by_id = version >= 10
    broker = ctx.broker

    checks = access(ctx)
    group_denied = checks.group_error(AclOperation.READ, request.group_id)
    # Per request topic: the error of all its partitions when it is not committed (the
    # group or the topic not authorized, an unknown topic id), and its partitions.
    topics: list[tuple[Any, ErrorCode | None, Sequence[Any]]] = []
    partitions: list[OffsetCommitPartition] = []
    for topic in request.topics:
        name = broker.topic_name_of(topic.topic_id) if by_id else topic.name
        refused = group_denied or (
            ErrorCode.UNKNOWN_TOPIC_ID
            if name is None
            else checks.topic_error(AclOperation.READ, name)
        )
        topics.append((topic.topic_id if by_id else topic.name, refused, topic.partitions))
        if name is None or refused is not None:
            continue
        for p in topic.partitions:
            partitions.append(
                OffsetCommitPartition(
                    topic=name,
                    partition=int(p.partition_index),
                    offset=int(p.committed_offset),
                    metadata=p.committed_metadata,
                    leader_epoch=int(getattr(p, "committed_leader_epoch", -1)),
                )
            )

    def build(result: OffsetCommitResult) -> object:
        errors = iter(result.partitions)
        answered = []
        for key, refused, requested in topics:
            if refused is not None:
                codes = [refused] * len(requested)
            else:
                codes = [next(errors).error for _ in requested]
            answered.append(
                make(
                    module.OffsetCommitResponseTopic,
                    topic_id=key,
                    name=key,
                    partitions=tuple(
                        module.OffsetCommitResponsePartition(
                            partition_index=p.partition_index, error_code=code.to_kio()
                        )
                        for p, code in zip(requested, codes, strict=True)
                    ),
                )
            )
        return make(
            module.OffsetCommitResponse, throttle_time=ZERO_THROTTLE, topics=tuple(answered)
        )

    fallback = OffsetCommitResult(
        tuple(PartitionError(p.topic, p.partition, _UNAVAILABLE) for p in partitions)
    )
    driver = driver_of(ctx)
    if driver is None or group_denied is not None:
        return build(fallback)
    retention = getattr(request, "retention_time", None)
    commit = OffsetCommitRequest(
        group_id=request.group_id,
        partitions=tuple(partitions),
        generation_id=int(request.generation_id_or_member_epoch),
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        retention_time_ms=-1 if retention is None else ms(retention),
        api_version=version,
    )
    coordinator = driver.coordinator
    return driver.respond(
        lambda token, now: coordinator.commit_offsets(token, now, commit), fallback, build
    )


# -- OffsetFetch ---------------------------------------------------------------------------


def _fetch_one(
    ctx: RequestContext,
    group_id: str,
    requested: Sequence[Any] | None,
    by_id: bool,
    require_stable: bool,
) -> tuple[OffsetFetchResult, dict[str, Any]]:
    """One group's offsets, and the topic key (name, or id for v10) of every name."""
    broker = ctx.broker
    checks = access(ctx)
    keys: dict[str, Any] = {}
    # Requested topics answered without the coordinator: (key, partitions, error).
    refused: list[tuple[Any, Sequence[int], ErrorCode]] = []
    wanted: list[tuple[str, int]] | None = None
    if requested is not None:
        wanted = []
        for topic in requested:
            if by_id:
                name = broker.topic_name_of(topic.topic_id)
                if name is None:
                    refused.append(
                        (topic.topic_id, topic.partition_indexes, ErrorCode.UNKNOWN_TOPIC_ID)
                    )
                    continue
                keys[name] = topic.topic_id
            else:
                name = topic.name
                keys[name] = name
            denied = checks.topic_error(AclOperation.DESCRIBE, name)
            if denied is not None:
                refused.append((keys.pop(name), topic.partition_indexes, denied))
                continue
            wanted.extend((name, int(p)) for p in topic.partition_indexes)
    driver = driver_of(ctx)
    group_denied = checks.group_error(AclOperation.DESCRIBE, group_id)
    if group_denied is not None:
        result = OffsetFetchResult(group_id, group_denied)
    elif driver is None:
        result = OffsetFetchResult(group_id, _UNAVAILABLE)
    else:
        result = driver.coordinator.fetch_offsets(group_id, wanted, require_stable=require_stable)
    if result.error is ErrorCode.NONE:
        if wanted is None:
            # Every topic of the group: those the principal may not describe are left out.
            visible = tuple(
                found
                for found in result.partitions
                if checks.topic(AclOperation.DESCRIBE, found.topic, audit=False)
            )
            result = OffsetFetchResult(result.group_id, result.error, visible)
            for found in visible:
                if found.topic not in keys:
                    keys[found.topic] = broker.topic_id_of(found.topic) if by_id else found.topic
        if refused:
            extra = tuple(
                FetchedOffset(str(key), int(p), -1, -1, "", error)
                for key, indexes, error in refused
                for p in indexes
            )
            for key, _, _ in refused:
                keys[str(key)] = key
            result = OffsetFetchResult(result.group_id, result.error, result.partitions + extra)
    return result, keys


def _topics(
    result: OffsetFetchResult, keys: dict[str, Any], topic_cls: Any, partition_cls: Any
) -> tuple[Any, ...]:
    grouped: dict[str, list[FetchedOffset]] = {}
    for found in result.partitions:
        if keys.get(found.topic) is None:
            continue  # v10: a topic deleted since the commit has no id to name it by
        grouped.setdefault(found.topic, []).append(found)
    return tuple(
        make(
            topic_cls,
            name=name,
            topic_id=keys[name],
            partitions=tuple(
                make(
                    partition_cls,
                    partition_index=f.partition,
                    committed_offset=f.offset,
                    committed_leader_epoch=f.leader_epoch,
                    metadata=f.metadata,
                    error_code=f.error.to_kio(),
                )
                for f in found
            ),
        )
        for name, found in grouped.items()
    )


@handles(ApiKey.OFFSET_FETCH)
async def handle_offset_fetch(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    module = response_module("offset_fetch", version)
    require_stable = bool(getattr(request, "require_stable", False))
    if version >= 8:
        groups = []
        for group in request.groups:
            result, keys = _fetch_one(
                ctx, group.group_id, group.topics, version >= 10, require_stable
            )
            groups.append(
                module.OffsetFetchResponseGroup(
                    group_id=group.group_id,
                    topics=_topics(
                        result,
                        keys,
                        module.OffsetFetchResponseTopics,
                        module.OffsetFetchResponsePartitions,
                    ),
                    error_code=result.error.to_kio(),
                )
            )
        return module.OffsetFetchResponse(throttle_time=ZERO_THROTTLE, groups=tuple(groups))
    result, keys = _fetch_one(ctx, request.group_id, request.topics, False, require_stable)
    if result.error is not ErrorCode.NONE and version < 2:
        # No top-level error before v2: each requested partition carries it.
        failed = tuple(
            FetchedOffset(t.name, int(p), -1, -1, "", result.error)
            for t in request.topics
            for p in t.partition_indexes
        )
        result = OffsetFetchResult(result.group_id, ErrorCode.NONE, failed)
    return make(
        module.OffsetFetchResponse,
        throttle_time=ZERO_THROTTLE,
        topics=_topics(
            result, keys, module.OffsetFetchResponseTopic, module.OffsetFetchResponsePartition
        ),
        error_code=result.error.to_kio(),
    )


# -- OffsetDelete --------------------------------------------------------------------------


@handles(ApiKey.OFFSET_DELETE)
async def handle_offset_delete(ctx: RequestContext, request: Any) -> object:
    module = response_module("offset_delete", ctx.api_version)
    checks = access(ctx)
    # Per request topic: TOPIC_AUTHORIZATION_FAILED when it may not be read, else None.
    denied = [checks.topic_error(AclOperation.READ, t.name) for t in request.topics]
    requested = [
        (t.name, int(p.partition_index))
        for t, refused in zip(request.topics, denied, strict=True)
        if refused is None
        for p in t.partitions
    ]

    def build(result: OffsetDeleteResult) -> object:
        topics: tuple[Any, ...] = ()
        if result.error is ErrorCode.NONE:
            errors = iter(result.partitions)
            topics = tuple(
                module.OffsetDeleteResponseTopic(
                    name=t.name,
                    partitions=tuple(
                        module.OffsetDeleteResponsePartition(
                            partition_index=p.partition_index,
                            error_code=(refused or next(errors).error).to_kio(),
                        )
                        for p in t.partitions
                    ),
                )
                for t, refused in zip(request.topics, denied, strict=True)
            )
        return module.OffsetDeleteResponse(
            error_code=result.error.to_kio(), throttle_time=ZERO_THROTTLE, topics=topics
        )

    group_denied = checks.group_error(AclOperation.DELETE, request.group_id)
    if group_denied is not None:
        return build(OffsetDeleteResult(group_denied))
    fallback = OffsetDeleteResult(_UNAVAILABLE)
    driver = driver_of(ctx)
    if driver is None:
        return build(fallback)
    coordinator = driver.coordinator
    return driver.respond(
        lambda token, now: coordinator.delete_offsets(token, now, request.group_id, requested),
        fallback,
        build,
    )
