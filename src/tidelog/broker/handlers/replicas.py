"""ElectLeaders, AlterPartitionReassignments, ListPartitionReassignments and AlterPartition:
partition leadership and replica sets, decided by the controller.

Each request becomes one controller operation (:mod:`tidelog.metadata.controller.elections`,
``.reassignment``, ``.isr``) run in a worker thread (it commits metadata), answered once
its records are committed. The handlers only translate between kio and the controller:

* ElectLeaders: an election type other than 0 (preferred) or 1 (unclean) -> top-level
  INVALID_REQUEST, repeated on every partition, as Kafka's error response does. v0 has
  no election type: preferred. A null topic list elects over every partition.
* AlterPartitionReassignments: null replicas cancel. v0 always allows replication factor
  changes; v1 carries the choice.
* ListPartitionReassignments: a null topic list lists every reassignment under way.
* AlterPartition (v2 ISR as broker ids, v3 with each member's broker epoch) is served on
  controller listeners only: partition leaders send it, clients never do.

``timeout`` is not used: a change is complete when its records commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from tidelog.broker.authorization import access
from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE, controller, make, response_module
from tidelog.metadata.acls import AclOperation
from tidelog.metadata.controller.elections import ElectionType
from tidelog.metadata.controller.isr import (
    AlterPartitionItem,
    AlterPartitionRequest,
    IsrMember,
)
from tidelog.metadata.controller.reassignment import ReassignmentRequest
from tidelog.metadata.errors import ApiError
from tidelog.protocol import ApiKey, ErrorCode

K = TypeVar("K")


def _grouped(entries: Iterable[tuple[K, Any]]) -> dict[K, tuple[Any, ...]]:
    """(topic, partition entry) pairs as each topic's entries, topics in first-seen order."""
    groups: dict[K, list[Any]] = {}
    for topic, entry in entries:
        groups.setdefault(topic, []).append(entry)
    return {topic: tuple(items) for topic, items in groups.items()}


# -- ElectLeaders ----------------------------------------------------------------------------


def _election_type(request: Any) -> ElectionType | None:
    try:
        return ElectionType(int(getattr(request, "election_type", ElectionType.PREFERRED)))
    except ValueError:
        return None


def _election_results(module: Any, outcomes: list[tuple[str, int, ApiError]]) -> tuple[Any, ...]:
    by_topic = _grouped(
        (
            topic,
            make(
                module.PartitionResult,
                partition_id=partition,
                error_code=error.code.to_kio(),
                error_message=None if error.ok else error.message,
            ),
        )
        for topic, partition, error in outcomes
    )
    return tuple(
        make(module.ReplicaElectionResult, topic=topic, partition_result=results)
        for topic, results in by_topic.items()
    )


@handles(ApiKey.ELECT_LEADERS)
async def handle_elect_leaders(ctx: RequestContext, request: Any) -> object:
    module = response_module("elect_leaders", ctx.api_version)
    wanted = (
        None
        if request.topic_partitions is None
        else [
            (entry.topic, int(partition))
            for entry in request.topic_partitions
            for partition in entry.partitions
        ]
    )
    election_type = _election_type(request)
    denied = access(ctx).cluster_error(AclOperation.ALTER)
    if election_type is None or denied is not None:
        error = (
            ApiError(denied, denied.message)
            if denied is not None
            else ApiError(
                ErrorCode.INVALID_REQUEST, f"unknown election type {int(request.election_type)}"
            )
        )
        return make(
            module.ElectLeadersResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=error.code.to_kio(),
            replica_election_results=_election_results(
                module, [(topic, partition, error) for topic, partition in wanted or ()]
            ),
        )
    results = await ctx.broker.run_blocking(controller(ctx).elect_leaders, election_type, wanted)
    return make(
        module.ElectLeadersResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=ErrorCode.NONE.to_kio(),
        replica_election_results=_election_results(
            module, [(r.topic, r.partition, r.error) for r in results]
        ),
    )


# -- AlterPartitionReassignments / ListPartitionReassignments ----------------------------------


@handles(ApiKey.ALTER_PARTITION_REASSIGNMENTS)
async def handle_alter_partition_reassignments(ctx: RequestContext, request: Any) -> object:
    module = response_module("alter_partition_reassignments", ctx.api_version)
    allow = bool(getattr(request, "allow_replication_factor_change", True))
    if (denied := access(ctx).cluster_error(AclOperation.ALTER)) is not None:
        return make(
            module.AlterPartitionReassignmentsResponse,
            throttle_time=ZERO_THROTTLE,
            allow_replication_factor_change=allow,
            error_code=denied.to_kio(),
            error_message=denied.message,
            responses=(),
        )
    wanted = [
        ReassignmentRequest(
            topic.name,
            int(entry.partition_index),
            None if entry.replicas is None else tuple(int(b) for b in entry.replicas),
        )
        for topic in request.topics
        for entry in topic.partitions
    ]
    results = await ctx.broker.run_blocking(
        controller(ctx).alter_partition_reassignments,
        wanted,
        allow_replication_factor_change=allow,
    )
    by_topic = _grouped(
        (
            result.topic,
            make(
                module.ReassignablePartitionResponse,
                partition_index=result.partition,
                error_code=result.error.code.to_kio(),
                error_message=None if result.error.ok else result.error.message,
            ),
        )
        for result in results
    )
    return make(
        module.AlterPartitionReassignmentsResponse,
        throttle_time=ZERO_THROTTLE,
        allow_replication_factor_change=allow,
        error_code=ErrorCode.NONE.to_kio(),
        error_message=None,
        responses=tuple(
            make(module.ReassignableTopicResponse, name=name, partitions=partitions)
            for name, partitions in by_topic.items()
        ),
    )


@handles(ApiKey.LIST_PARTITION_REASSIGNMENTS)
async def handle_list_partition_reassignments(ctx: RequestContext, request: Any) -> object:
    module = response_module("list_partition_reassignments", ctx.api_version)
    if (denied := access(ctx).cluster_error(AclOperation.DESCRIBE)) is not None:
        return make(
            module.ListPartitionReassignmentsResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=denied.to_kio(),
            error_message=denied.message,
            topics=(),
        )
    wanted = (
        None
        if request.topics is None
        else [(topic.name, [int(p) for p in topic.partition_indexes]) for topic in request.topics]
    )
    ongoing = controller(ctx).list_partition_reassignments(wanted)
    by_topic = _grouped(
        (
            entry.topic,
            make(
                module.OngoingPartitionReassignment,
                partition_index=entry.partition,
                replicas=entry.replicas,
                adding_replicas=entry.adding_replicas,
                removing_replicas=entry.removing_replicas,
            ),
        )
        for entry in ongoing
    )
    return make(
        module.ListPartitionReassignmentsResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=ErrorCode.NONE.to_kio(),
        error_message=None,
        topics=tuple(
            make(module.OngoingTopicReassignment, name=name, partitions=partitions)
            for name, partitions in by_topic.items()
        ),
    )


# -- AlterPartition (controller listener) -----------------------------------------------------


def _isr_members(entry: Any) -> tuple[IsrMember, ...]:
    with_epochs = getattr(entry, "new_isr_with_epochs", None)
    if with_epochs is not None:
        return tuple(IsrMember(int(m.broker_id), int(m.broker_epoch)) for m in with_epochs)
    return tuple(IsrMember(int(b)) for b in entry.new_isr)


@handles(ApiKey.ALTER_PARTITION, controller_only=True)
async def handle_alter_partition(ctx: RequestContext, request: Any) -> object:
    module = response_module("alter_partition", ctx.api_version)
    # Only partition leaders send it: ClusterAction, as Kafka requires.
    if (denied := access(ctx).cluster_error(AclOperation.CLUSTER_ACTION)) is not None:
        return make(
            module.AlterPartitionResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=denied.to_kio(),
            topics=(),
        )
    items = []
    for topic in request.topics:
        for entry in topic.partitions:
            items.append(
                AlterPartitionItem(
                    topic.topic_id,
                    int(entry.partition_index),
                    int(entry.leader_epoch),
                    int(entry.partition_epoch),
                    _isr_members(entry),
                )
            )
    if any(item.topic_id is None for item in items):
        return make(
            module.AlterPartitionResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=ErrorCode.INVALID_REQUEST.to_kio(),
            topics=(),
        )
    reply = await ctx.broker.run_blocking(
        controller(ctx).alter_partition,
        AlterPartitionRequest(int(request.broker_id), int(request.broker_epoch), tuple(items)),
    )
    by_topic = _grouped(
        (
            result.topic_id,
            make(
                module.PartitionData,
                partition_index=result.partition,
                error_code=result.error.code.to_kio(),
                leader_id=result.leader,
                leader_epoch=result.leader_epoch,
                isr=result.isr,
                leader_recovery_state=0,
                partition_epoch=result.partition_epoch,
            ),
        )
        for result in reply.results
    )
    return make(
        module.AlterPartitionResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=reply.error.code.to_kio(),
        topics=tuple(
            make(module.TopicData, topic_id=topic_id, partitions=partitions)
            for topic_id, partitions in by_topic.items()
        ),
    )
