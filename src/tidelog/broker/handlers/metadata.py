"""Metadata and DescribeCluster: brokers, controller, topics, partitions and their leaders.

Both answer from the broker's current :class:`~tidelog.metadata.image.MetadataImage`.
They list the unfenced brokers only, as Kafka lists its alive ones: a broker that has not
caught up since it registered, or whose session ran out, is given to no client. Each is
listed at its endpoint on the listener the request came in on, this node first.

Metadata, per requested topic (``topics`` null from v1, or an empty list in v0, means
every topic, and then nothing is auto-created):

* known topic: its partitions with leader, leader epoch (v7+), replicas, ISR and offline
  replicas (replicas whose broker is fenced or not registered); a partition without a
  leader gets LEADER_NOT_AVAILABLE;
* by topic id (from v10): an unknown id gets UNKNOWN_TOPIC_ID (name null from v12, ""
  before, where the field is not nullable). Kafka refuses ids in v10-11 requests with
  INVALID_REQUEST; Tidelog answers them as v12 would, which no client relies on;
* unknown name: an invalid name gets INVALID_TOPIC_EXCEPTION; otherwise, when
  ``auto.create.topics.enable`` is true and the request allows it
  (``allow_auto_topic_creation`` from v4, always before), the controller creates it and the
  answer is LEADER_NOT_AVAILABLE without partitions, as Kafka answers for a topic created
  by that very request (clients retry and see it on their next request); else
  UNKNOWN_TOPIC_OR_PARTITION. A failed creation reports the controller's error.

Authorization (``docs/security.md``): Describe on each topic; a topic the principal may
not describe is left out of an every-topic answer and answered TOPIC_AUTHORIZATION_FAILED
when named (by id: the id without the name); auto-creation needs Create on the cluster or
the topic. Authorized operations, when asked: the bits of the operations the principal
may do on each topic, and on the cluster (0 without Describe on it); without an authorizer
every operation the resource type supports. When not asked, Kafka's "not requested"
value (INT32_MIN). The same goes for DescribeCluster.

DescribeCluster serves only the broker endpoint type (1); any other type gets
UNSUPPORTED_ENDPOINT_TYPE, as a Kafka broker answers. From v2 a client may ask for the
fenced brokers too (``include_fenced_brokers``); each broker says whether it is fenced.
"""

from __future__ import annotations

import uuid
from typing import Any

from tidelog.broker.authorization import (
    AUTHORIZED_OPERATIONS_NOT_REQUESTED,
    SUPPORTED_OPERATIONS,
    Access,
    access,
    operation_bits,
)
from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE, make, response_module
from tidelog.metadata.acls import AclOperation, ResourceType
from tidelog.metadata.controller import INTERNAL_TOPICS, validate_topic_name
from tidelog.metadata.image import MetadataImage, TopicImage
from tidelog.protocol import ApiKey, ErrorCode

#: Every operation a topic supports (what Kafka reports when no authorizer is configured).
TOPIC_OPERATIONS = operation_bits(SUPPORTED_OPERATIONS[ResourceType.TOPIC])
#: Every operation the cluster resource supports.
CLUSTER_OPERATIONS = operation_bits(SUPPORTED_OPERATIONS[ResourceType.CLUSTER])

#: DescribeCluster endpoint types.
ENDPOINT_TYPE_BROKER = 1


def listed_brokers(
    ctx: RequestContext, *, include_fenced: bool = False
) -> list[tuple[int, str, int, str | None, bool]]:
    """(node id, host, port, rack, fenced) of every unfenced broker (every registered one
    with ``include_fenced``), this node first, each at its address on the listener the
    request came in on. As in Kafka, a broker without that listener is left out: the
    client could not reach it the way it reached us."""
    broker = ctx.broker
    listed: list[tuple[int, str, int, str | None, bool]] = []
    for node_id, registration in sorted(broker.image.brokers.items()):
        if registration.fenced and not include_fenced:
            continue
        if node_id == broker.node_id:
            host, port = broker.endpoint(ctx.listener)
            listed.insert(0, (node_id, host, port, registration.rack, registration.fenced))
            continue
        for endpoint in registration.endpoints:
            if endpoint.name == ctx.listener:
                listed.append(
                    (node_id, endpoint.host, endpoint.port, registration.rack, registration.fenced)
                )
                break
    return listed


# -- Metadata ------------------------------------------------------------------------------


class _TopicAnswer:
    """One topic of the response, before it becomes the version's class."""

    __slots__ = ("error", "name", "topic", "topic_id")

    def __init__(
        self,
        error: ErrorCode,
        name: str | None,
        topic: TopicImage | None = None,
        topic_id: uuid.UUID | None = None,
    ) -> None:
        self.error = error
        self.name = name
        self.topic = topic
        self.topic_id = topic_id


def _partitions(
    module: Any, image: MetadataImage, topic: TopicImage, broker: Any
) -> tuple[Any, ...]:
    cls = module.MetadataResponsePartition
    live = {b for b, registration in image.brokers.items() if not registration.fenced}
    node_id = broker.node_id
    out = []
    for index, part in sorted(topic.partitions.items()):
        leader = part.leader
        offline_replicas = tuple(r for r in part.replicas if r not in live)
        if leader == node_id:
            hosted = broker.partitions.get(topic.name, index)
            if hosted is not None and hosted.offline:
                # This node's replica is on a failed log dir: it leads nothing there. Until
                # the controller moves the leadership (a replicated partition), clients see
                # no leader, as Kafka shows a partition whose only replica is offline.
                leader = -1
                offline_replicas = (*offline_replicas, node_id)
        error = ErrorCode.LEADER_NOT_AVAILABLE if leader < 0 else ErrorCode.NONE
        out.append(
            make(
                cls,
                error_code=error.to_kio(),
                partition_index=index,
                leader_id=leader,
                leader_epoch=part.leader_epoch,
                replica_nodes=part.replicas,
                isr_nodes=part.isr,
                offline_replicas=offline_replicas,
            )
        )
    return tuple(out)


async def _answer_by_name(
    ctx: RequestContext, checks: Access, name: str, allow_auto_create: bool
) -> _TopicAnswer:
    broker = ctx.broker
    if not checks.topic(AclOperation.DESCRIBE, name):
        return _TopicAnswer(ErrorCode.TOPIC_AUTHORIZATION_FAILED, name)
    topic = broker.image.topic(name)
    if topic is not None:
        return _TopicAnswer(ErrorCode.NONE, name, topic)
    if validate_topic_name(name) is not None:
        return _TopicAnswer(ErrorCode.INVALID_TOPIC_EXCEPTION, name)
    if not allow_auto_create:
        return _TopicAnswer(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name)
    if not checks.may_create_topic(name):
        return _TopicAnswer(ErrorCode.TOPIC_AUTHORIZATION_FAILED, name)
    controller = broker.controller
    assert controller is not None, "broker built without a controller"
    result = await broker.run_blocking(controller.auto_create_topic, name)
    if result.error.ok:
        return _TopicAnswer(ErrorCode.LEADER_NOT_AVAILABLE, name)
    if result.error.code is ErrorCode.TOPIC_ALREADY_EXISTS:
        # Someone else created it meanwhile.
        topic = broker.image.topic(name)
        if topic is not None:
            return _TopicAnswer(ErrorCode.NONE, name, topic)
    return _TopicAnswer(result.error.code, name)


@handles(ApiKey.METADATA)
async def handle_metadata(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    module = response_module("metadata", version)
    broker = ctx.broker
    requested = request.topics
    every_topic = requested is None or (version == 0 and not requested)
    allow_auto_create = (
        not every_topic
        and (version < 4 or bool(request.allow_auto_topic_creation))
        and broker.config.auto_create_topics_enable
    )
    checks = access(ctx)
    answers: list[_TopicAnswer] = []
    if every_topic:
        image = broker.image
        # Topics the principal may not describe are left out, as Kafka leaves them out.
        answers = [
            _TopicAnswer(ErrorCode.NONE, name, image.topics_by_name[name])
            for name in sorted(image.topics_by_name)
            if checks.topic(AclOperation.DESCRIBE, name, audit=False)
        ]
    else:
        seen_names: set[str] = set()
        seen_ids: set[uuid.UUID] = set()
        for entry in requested:
            topic_id = getattr(entry, "topic_id", None)
            if topic_id is not None:
                if topic_id in seen_ids:
                    continue
                seen_ids.add(topic_id)
                found = broker.image.topic_by_id(topic_id)
                if found is None:
                    answers.append(_TopicAnswer(ErrorCode.UNKNOWN_TOPIC_ID, None, None, topic_id))
                elif not checks.topic(AclOperation.DESCRIBE, found.name):
                    # Kafka does not count an id as secret: the id is echoed, the name not.
                    denied = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    answers.append(_TopicAnswer(denied, None, None, topic_id))
                else:
                    answers.append(_TopicAnswer(ErrorCode.NONE, found.name, found))
                continue
            name = entry.name
            if name is None:
                answers.append(_TopicAnswer(ErrorCode.INVALID_REQUEST, None))
                continue
            if name in seen_names:
                continue
            seen_names.add(name)
            answers.append(await _answer_by_name(ctx, checks, name, allow_auto_create))
    return _metadata_response(ctx, checks, module, version, request, answers)


def _metadata_response(
    ctx: RequestContext,
    checks: Access,
    module: Any,
    version: int,
    request: Any,
    answers: list[_TopicAnswer],
) -> object:
    broker = ctx.broker
    image = broker.image
    topic_ops_asked = bool(getattr(request, "include_topic_authorized_operations", False))
    cluster_ops = (
        checks.cluster_operations()
        if getattr(request, "include_cluster_authorized_operations", False)
        else AUTHORIZED_OPERATIONS_NOT_REQUESTED
    )
    # The name is not nullable before v12.
    null_name = None if version >= 12 else ""
    topic_cls = module.MetadataResponseTopic
    topics = []
    for answer in answers:
        topic = answer.topic
        name = answer.name if answer.name is not None else null_name
        topics.append(
            make(
                topic_cls,
                error_code=answer.error.to_kio(),
                name=name,
                topic_id=topic.topic_id if topic is not None else answer.topic_id,
                is_internal=answer.name in INTERNAL_TOPICS,
                partitions=_partitions(module, image, topic, broker) if topic is not None else (),
                topic_authorized_operations=(
                    checks.operations(ResourceType.TOPIC, answer.name)
                    if topic_ops_asked and answer.name is not None
                    else AUTHORIZED_OPERATIONS_NOT_REQUESTED
                ),
            )
        )
    broker_cls = module.MetadataResponseBroker
    brokers = tuple(
        make(broker_cls, node_id=node_id, host=host, port=port, rack=rack)
        for node_id, host, port, rack, _ in listed_brokers(ctx)
    )
    return make(
        module.MetadataResponse,
        throttle_time=ZERO_THROTTLE,
        brokers=brokers,
        cluster_id=broker.cluster_id or None,
        controller_id=broker.node_id,
        topics=tuple(topics),
        cluster_authorized_operations=cluster_ops,
        error_code=ErrorCode.NONE.to_kio(),
    )


# -- DescribeCluster -----------------------------------------------------------------------


@handles(ApiKey.DESCRIBE_CLUSTER)
async def handle_describe_cluster(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    module = response_module("describe_cluster", version)
    broker = ctx.broker
    endpoint_type = int(getattr(request, "endpoint_type", ENDPOINT_TYPE_BROKER))
    cluster_ops = (
        access(ctx).cluster_operations()
        if request.include_cluster_authorized_operations
        else AUTHORIZED_OPERATIONS_NOT_REQUESTED
    )
    if endpoint_type != ENDPOINT_TYPE_BROKER:
        return make(
            module.DescribeClusterResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=ErrorCode.UNSUPPORTED_ENDPOINT_TYPE.to_kio(),
            error_message=f"endpoint type {endpoint_type} is not served; only brokers (1) are",
            endpoint_type=endpoint_type,
            cluster_id=broker.cluster_id,
            controller_id=-1,
            brokers=(),
            cluster_authorized_operations=AUTHORIZED_OPERATIONS_NOT_REQUESTED,
        )
    broker_cls = module.DescribeClusterBroker
    include_fenced = bool(getattr(request, "include_fenced_brokers", False))
    brokers = tuple(
        make(broker_cls, broker_id=node_id, host=host, port=port, rack=rack, is_fenced=fenced)
        for node_id, host, port, rack, fenced in listed_brokers(ctx, include_fenced=include_fenced)
    )
    return make(
        module.DescribeClusterResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=ErrorCode.NONE.to_kio(),
        error_message=None,
        endpoint_type=endpoint_type,
        cluster_id=broker.cluster_id,
        controller_id=broker.node_id,
        brokers=brokers,
        cluster_authorized_operations=cluster_ops,
    )
