"""Metadata and DescribeCluster handlers against a real controller."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from tidelog.broker.handlers.metadata import (
    AUTHORIZED_OPERATIONS_NOT_REQUESTED,
    CLUSTER_OPERATIONS,
    TOPIC_OPERATIONS,
)
from tidelog.protocol import ApiKey, ErrorCode

from .admin_fixtures import call, create_topic, edge_versions, schema, timeout, versions

NOT_REQUESTED = AUTHORIZED_OPERATIONS_NOT_REQUESTED


def build(cls: Any, **values: Any) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def metadata_request(
    version: int,
    topics: list[str | uuid.UUID] | None,
    *,
    allow_auto: bool = True,
    authorized_operations: bool = False,
) -> Any:
    module = schema("metadata", version)
    entries = None
    if topics is not None:
        entries = tuple(
            build(module.MetadataRequestTopic, topic_id=t, name=None)
            if isinstance(t, uuid.UUID)
            else build(module.MetadataRequestTopic, name=t, topic_id=None)
            for t in topics
        )
    return build(
        module.MetadataRequest,
        topics=entries,
        allow_auto_topic_creation=allow_auto,
        include_cluster_authorized_operations=authorized_operations,
        include_topic_authorized_operations=authorized_operations,
    )


def metadata(broker: Any, version: int, topics: list[Any] | None, **kwargs: Any) -> Any:
    return call(broker, ApiKey.METADATA, version, metadata_request(version, topics, **kwargs))


def all_topics(version: int) -> list[Any] | None:
    return [] if version == 0 else None


@pytest.mark.parametrize("version", versions(ApiKey.METADATA))
def test_metadata_all_topics_every_version(admin_broker: Any, version: int) -> None:
    admin_broker.advertised_host, admin_broker.advertised_port = "broker.example", 19092
    create_topic(admin_broker, "orders", partitions=2)
    create_topic(admin_broker, "__consumer_offsets")
    response = metadata(admin_broker, version, all_topics(version))
    (node,) = response.brokers
    assert (node.node_id, node.host, node.port) == (1, "broker.example", 19092)
    if version >= 1:
        assert node.rack is None
        assert response.controller_id == 1
    if version >= 2:
        assert response.cluster_id == admin_broker.image.cluster_id
        assert response.cluster_id
    topics = {t.name: t for t in response.topics}
    assert sorted(topics) == ["__consumer_offsets", "orders"]
    orders = topics["orders"]
    assert orders.error_code == 0
    assert [p.partition_index for p in orders.partitions] == [0, 1]
    for partition in orders.partitions:
        assert partition.error_code == 0
        assert (partition.leader_id, partition.replica_nodes, partition.isr_nodes) == (
            1,
            (1,),
            (1,),
        )
        if version >= 5:
            assert partition.offline_replicas == ()
        if version >= 7:
            assert partition.leader_epoch == 0
    if version >= 1:
        assert (orders.is_internal, topics["__consumer_offsets"].is_internal) == (False, True)
    if version >= 8:
        assert orders.topic_authorized_operations == NOT_REQUESTED
    if 8 <= version <= 10:
        assert response.cluster_authorized_operations == NOT_REQUESTED
    if version >= 10:
        assert orders.topic_id == admin_broker.topic_id_of("orders")
    if version >= 13:
        assert response.error_code == 0


@pytest.mark.parametrize("version", versions(ApiKey.METADATA))
def test_metadata_unknown_and_invalid_topics_without_auto_creation(
    start_admin_broker: Any, version: int
) -> None:
    broker = start_admin_broker({"auto.create.topics.enable": "false"})
    create_topic(broker, "known")
    response = metadata(broker, version, ["known", "missing", "bad name!", "known"])
    assert [(t.name, t.error_code) for t in response.topics] == [
        ("known", ErrorCode.NONE),
        ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ("bad name!", ErrorCode.INVALID_TOPIC_EXCEPTION),
    ]
    assert response.topics[1].partitions == ()
    assert broker.image.topic("missing") is None


@pytest.mark.parametrize("version", [v for v in versions(ApiKey.METADATA) if v >= 1])
def test_metadata_empty_topic_list_means_none(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "t")
    assert metadata(admin_broker, version, []).topics == ()


@pytest.mark.parametrize("version", versions(ApiKey.METADATA))
def test_metadata_auto_creates_when_allowed(start_admin_broker: Any, version: int) -> None:
    broker = start_admin_broker({"num.partitions": "3"})
    first = metadata(broker, version, ["fresh"])
    (topic,) = first.topics
    assert (topic.name, topic.error_code, topic.partitions) == (
        "fresh",
        ErrorCode.LEADER_NOT_AVAILABLE,
        (),
    )
    assert [p.index for p in broker.partitions.of_topic("fresh")] == [0, 1, 2]
    (again,) = metadata(broker, version, ["fresh"]).topics
    assert again.error_code == 0
    assert len(again.partitions) == 3


@pytest.mark.parametrize("version", [4, 13])
def test_metadata_request_can_refuse_auto_creation(admin_broker: Any, version: int) -> None:
    (topic,) = metadata(admin_broker, version, ["fresh"], allow_auto=False).topics
    assert topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert admin_broker.image.topic("fresh") is None


@pytest.mark.parametrize("version", edge_versions(ApiKey.METADATA))
def test_metadata_auto_creation_disabled_by_config(start_admin_broker: Any, version: int) -> None:
    broker = start_admin_broker({"auto.create.topics.enable": "false"})
    (topic,) = metadata(broker, version, ["fresh"]).topics
    assert topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert broker.image.topic("fresh") is None
    assert broker.partitions.of_topic("fresh") == []


def test_metadata_all_topics_never_auto_creates(admin_broker: Any) -> None:
    assert metadata(admin_broker, 12, None).topics == ()
    assert admin_broker.image.topics_by_name == {}


@pytest.mark.parametrize("version", [10, 11, 12, 13])
def test_metadata_by_topic_id(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "by-id", partitions=2)
    known = admin_broker.topic_id_of("by-id")
    unknown = uuid.uuid4()
    response = metadata(admin_broker, version, [known, unknown])
    found, missing = response.topics
    assert (found.name, found.topic_id, found.error_code) == ("by-id", known, 0)
    assert len(found.partitions) == 2
    assert missing.error_code == ErrorCode.UNKNOWN_TOPIC_ID
    assert missing.topic_id == unknown
    assert missing.name == (None if version >= 12 else "")
    assert admin_broker.image.topic_by_id(unknown) is None


@pytest.mark.parametrize("version", [8, 10, 11, 13])
def test_metadata_authorized_operations_when_asked(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "t")
    response = metadata(admin_broker, version, ["t"], authorized_operations=True)
    assert response.topics[0].topic_authorized_operations == TOPIC_OPERATIONS
    if version <= 10:
        assert response.cluster_authorized_operations == CLUSTER_OPERATIONS
    # READ (3), WRITE (4), DESCRIBE (8), ALTER_CONFIGS (11) are among the topic's.
    for operation in (3, 4, 8, 11):
        assert TOPIC_OPERATIONS & (1 << operation)
    assert not TOPIC_OPERATIONS & (1 << 9)  # CLUSTER_ACTION is a cluster operation


@pytest.mark.parametrize("version", edge_versions(ApiKey.METADATA))
def test_metadata_after_create_partitions_shows_them(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "grow")
    module = schema("create_partitions", 3)
    request = module.CreatePartitionsRequest(
        topics=(module.CreatePartitionsTopic(name="grow", count=4, assignments=None),),
        timeout=timeout(),
        validate_only=False,
    )
    assert call(admin_broker, ApiKey.CREATE_PARTITIONS, 3, request).results[0].error_code == 0
    (topic,) = metadata(admin_broker, version, ["grow"]).topics
    assert [p.partition_index for p in topic.partitions] == [0, 1, 2, 3]
    assert all(p.leader_id == 1 for p in topic.partitions)


# -- DescribeCluster -----------------------------------------------------------------------


def describe_cluster(
    broker: Any, version: int, *, operations: bool = False, endpoint_type: int = 1
) -> Any:
    module = schema("describe_cluster", version)
    request = build(
        module.DescribeClusterRequest,
        include_cluster_authorized_operations=operations,
        endpoint_type=endpoint_type,
        include_fenced_brokers=True,
    )
    return call(broker, ApiKey.DESCRIBE_CLUSTER, version, request)


@pytest.mark.parametrize("version", versions(ApiKey.DESCRIBE_CLUSTER))
def test_describe_cluster_every_version(admin_broker: Any, version: int) -> None:
    admin_broker.advertised_host, admin_broker.advertised_port = "node1", 9093
    response = describe_cluster(admin_broker, version)
    assert (response.error_code, response.error_message) == (0, None)
    assert response.cluster_id == admin_broker.image.cluster_id
    assert response.controller_id == 1
    (node,) = response.brokers
    assert (node.broker_id, node.host, node.port, node.rack) == (1, "node1", 9093, None)
    assert response.cluster_authorized_operations == NOT_REQUESTED
    if version >= 1:
        assert response.endpoint_type == 1
    if version >= 2:
        assert node.is_fenced is False
    asked = describe_cluster(admin_broker, version, operations=True)
    assert asked.cluster_authorized_operations == CLUSTER_OPERATIONS


@pytest.mark.parametrize("version", [1, 2])
def test_describe_cluster_refuses_controller_endpoints(admin_broker: Any, version: int) -> None:
    response = describe_cluster(admin_broker, version, endpoint_type=2)
    assert response.error_code == ErrorCode.UNSUPPORTED_ENDPOINT_TYPE
    assert response.error_message
    assert response.brokers == ()
