"""CreateTopics, DeleteTopics and CreatePartitions handlers against a real controller."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tidelog.metadata.configs import ConfigSource
from tidelog.protocol import ApiKey, ErrorCode

from .admin_fixtures import (
    call,
    create_topic,
    create_topics_request,
    edge_versions,
    schema,
    timeout,
    versions,
)
from .conftest import make_batch, produce_request, stored_batches


def produce_one(broker: Any, topic: str, partition: int) -> Any:
    request = produce_request(9, {topic: {partition: make_batch([b"a", b"b"])}}, acks=1)
    response = call(broker, ApiKey.PRODUCE, 9, request)
    return response.responses[0].partition_responses[0]


def partition_dirs(tmp_path: Path, topic: str) -> list[str]:
    return sorted(p.name for p in (tmp_path / "data").glob(f"{topic}-*"))


# -- CreateTopics --------------------------------------------------------------------------


@pytest.mark.parametrize("version", versions(ApiKey.CREATE_TOPICS))
def test_create_topics_every_version(admin_broker: Any, tmp_path: Path, version: int) -> None:
    request = create_topics_request(
        version,
        [
            {
                "name": "orders",
                "partitions": 3,
                "replication": 1,
                "configs": [("retention.ms", "1000")],
            }
        ],
    )
    response = call(admin_broker, ApiKey.CREATE_TOPICS, version, request)
    (result,) = response.topics
    assert (result.name, result.error_code, result.error_message) == ("orders", 0, None)
    topic_id = admin_broker.topic_id_of("orders")
    assert topic_id is not None
    assert [p.index for p in admin_broker.partitions.of_topic("orders")] == [0, 1, 2]
    assert partition_dirs(tmp_path, "orders") == ["orders-0", "orders-1", "orders-2"]
    assert admin_broker.log_config_of("orders").retention_ms == 1000
    if version >= 5:
        assert (result.num_partitions, result.replication_factor) == (3, 1)
        configs = {c.name: c for c in result.configs}
        retention = configs["retention.ms"]
        assert (retention.value, retention.config_source) == ("1000", ConfigSource.TOPIC_CONFIG)
        assert not retention.read_only and not retention.is_sensitive
        cleanup = configs["cleanup.policy"]
        assert (cleanup.value, cleanup.config_source) == ("delete", ConfigSource.DEFAULT_CONFIG)
    if version >= 7:
        assert result.topic_id == topic_id
    # The new partitions take writes at once.
    assert produce_one(admin_broker, "orders", 2).error_code == 0
    assert [h.record_count for h in stored_batches(admin_broker, "orders", 2)] == [2]


def test_create_topics_defaults_come_from_the_broker_config(start_admin_broker: Any) -> None:
    broker = start_admin_broker({"num.partitions": "4", "log.retention.ms": "5000"})
    result = create_topic(broker, "t", partitions=-1)
    assert (result.num_partitions, result.replication_factor) == (4, 1)
    retention = next(c for c in result.configs if c.name == "retention.ms")
    assert (retention.value, retention.config_source) == (
        "5000",
        ConfigSource.STATIC_BROKER_CONFIG,
    )
    assert len(broker.partitions.of_topic("t")) == 4


def test_create_topics_with_explicit_assignments(admin_broker: Any) -> None:
    version = 7
    request = create_topics_request(
        version,
        [
            {"name": "ok", "assignments": [(0, [1]), (1, [1])]},
            {"name": "twice", "assignments": [(0, [1]), (0, [1])]},
            {"name": "stranger", "assignments": [(0, [7])]},
            {"name": "both", "partitions": 2, "assignments": [(0, [1])]},
        ],
    )
    results = call(admin_broker, ApiKey.CREATE_TOPICS, version, request).topics
    codes = {r.name: r.error_code for r in results}
    assert codes == {
        "ok": ErrorCode.NONE,
        "twice": ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        "stranger": ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        "both": ErrorCode.INVALID_REQUEST,
    }
    assert results[0].num_partitions == 2
    assert [p.index for p in admin_broker.partitions.of_topic("ok")] == [0, 1]
    for failed in results[1:]:
        assert failed.error_message
        assert (failed.num_partitions, failed.replication_factor) == (-1, -1)
        assert failed.topic_id is None
        assert admin_broker.image.topic(failed.name) is None


@pytest.mark.parametrize("version", edge_versions(ApiKey.CREATE_TOPICS))
def test_create_topics_errors(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "exists")
    request = create_topics_request(
        version,
        [
            {"name": "exists"},
            {"name": "bad name!"},
            {"name": "zero", "partitions": 0},
            {"name": "too-replicated", "replication": 3},
            {"name": "unknown-config", "configs": [("no.such.config", "1")]},
            {"name": "bad-value", "configs": [("retention.ms", "soon")]},
            {"name": "dup"},
            {"name": "dup"},
            {"name": "fine"},
        ],
    )
    results = call(admin_broker, ApiKey.CREATE_TOPICS, version, request).topics
    assert [(r.name, r.error_code) for r in results] == [
        ("exists", ErrorCode.TOPIC_ALREADY_EXISTS),
        ("bad name!", ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("zero", ErrorCode.INVALID_PARTITIONS),
        ("too-replicated", ErrorCode.INVALID_REPLICATION_FACTOR),
        ("unknown-config", ErrorCode.INVALID_CONFIG),
        ("bad-value", ErrorCode.INVALID_CONFIG),
        ("dup", ErrorCode.INVALID_REQUEST),
        ("dup", ErrorCode.INVALID_REQUEST),
        ("fine", ErrorCode.NONE),
    ]
    assert all(r.error_message for r in results[:-1])
    assert sorted(admin_broker.image.topics_by_name) == ["exists", "fine"]


@pytest.mark.parametrize("version", edge_versions(ApiKey.CREATE_TOPICS))
def test_create_topics_validate_only_creates_nothing(
    admin_broker: Any, tmp_path: Path, version: int
) -> None:
    request = create_topics_request(
        version,
        [{"name": "dry", "partitions": 2, "configs": [("cleanup.policy", "compact")]}],
        validate_only=True,
    )
    (result,) = call(admin_broker, ApiKey.CREATE_TOPICS, version, request).topics
    assert result.error_code == 0
    if version >= 5:
        assert result.num_partitions == 2
        cleanup = next(c for c in result.configs if c.name == "cleanup.policy")
        assert cleanup.value == "compact"
    if version >= 7:
        assert result.topic_id is None
    assert admin_broker.image.topic("dry") is None
    assert admin_broker.partitions.of_topic("dry") == []
    assert partition_dirs(tmp_path, "dry") == []


# -- DeleteTopics --------------------------------------------------------------------------


def delete_request(version: int, entries: list[str | uuid.UUID | tuple[Any, Any]]) -> Any:
    module = schema("delete_topics", version)
    if version < 6:
        return module.DeleteTopicsRequest(topic_names=tuple(entries), timeout=timeout())
    states = []
    for entry in entries:
        if isinstance(entry, tuple):
            name, topic_id = entry
        elif isinstance(entry, uuid.UUID):
            name, topic_id = None, entry
        else:
            name, topic_id = entry, None
        states.append(module.DeleteTopicState(name=name, topic_id=topic_id))
    return module.DeleteTopicsRequest(topics=tuple(states), timeout=timeout())


@pytest.mark.parametrize("version", versions(ApiKey.DELETE_TOPICS))
def test_delete_topics_by_name_every_version(
    admin_broker: Any, tmp_path: Path, version: int
) -> None:
    create_topic(admin_broker, "doomed", partitions=2)
    create_topic(admin_broker, "kept")
    produce_one(admin_broker, "doomed", 0)
    assert partition_dirs(tmp_path, "doomed") == ["doomed-0", "doomed-1"]
    response = call(
        admin_broker, ApiKey.DELETE_TOPICS, version, delete_request(version, ["doomed", "nope"])
    )
    results = [(r.name, r.error_code) for r in response.responses]
    assert results == [("doomed", 0), ("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
    if version >= 5:
        assert response.responses[0].error_message is None
        assert response.responses[1].error_message
    assert admin_broker.partitions.of_topic("doomed") == []
    assert admin_broker.partitions.get("doomed", 0) is None
    assert partition_dirs(tmp_path, "doomed") == []
    assert admin_broker.image.topic("doomed") is None
    assert len(admin_broker.partitions.of_topic("kept")) == 1


def test_delete_topics_by_id_and_malformed_entries(admin_broker: Any) -> None:
    a = create_topic(admin_broker, "a").topic_id
    create_topic(admin_broker, "b")
    missing = uuid.uuid4()
    request = delete_request(6, [a, "b", missing, ("b", a), (None, None), "gone"])
    responses = call(admin_broker, ApiKey.DELETE_TOPICS, 6, request).responses
    assert [(r.name, r.topic_id, r.error_code) for r in responses] == [
        ("a", a, ErrorCode.NONE),
        ("b", responses[1].topic_id, ErrorCode.NONE),
        (None, missing, ErrorCode.UNKNOWN_TOPIC_ID),
        (None, None, ErrorCode.INVALID_REQUEST),
        (None, None, ErrorCode.INVALID_REQUEST),
        ("gone", None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    assert responses[1].topic_id is not None
    assert admin_broker.image.topics_by_name == {}
    assert len(admin_broker.partitions) == 0


@pytest.mark.parametrize("version", edge_versions(ApiKey.DELETE_TOPICS))
def test_delete_topics_disabled(start_admin_broker: Any, tmp_path: Path, version: int) -> None:
    broker = start_admin_broker({"delete.topic.enable": "false"})
    create_topic(broker, "stays")
    responses = call(
        broker, ApiKey.DELETE_TOPICS, version, delete_request(version, ["stays"])
    ).responses
    assert responses[0].error_code == ErrorCode.TOPIC_DELETION_DISABLED
    assert broker.partitions.get("stays", 0) is not None
    assert partition_dirs(tmp_path, "stays") == ["stays-0"]


# -- CreatePartitions ----------------------------------------------------------------------


def partitions_request(
    version: int,
    topics: list[tuple[str, int, list[list[int]] | None]],
    *,
    validate_only: bool = False,
) -> Any:
    module = schema("create_partitions", version)
    return module.CreatePartitionsRequest(
        topics=tuple(
            module.CreatePartitionsTopic(
                name=name,
                count=count,
                assignments=(
                    None
                    if assignments is None
                    else tuple(
                        module.CreatePartitionsAssignment(broker_ids=tuple(a)) for a in assignments
                    )
                ),
            )
            for name, count, assignments in topics
        ),
        timeout=timeout(),
        validate_only=validate_only,
    )


@pytest.mark.parametrize("version", versions(ApiKey.CREATE_PARTITIONS))
def test_create_partitions_every_version(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "grow")
    create_topic(admin_broker, "assigned")
    request = partitions_request(version, [("grow", 3, None), ("assigned", 3, [[1], [1]])])
    results = call(admin_broker, ApiKey.CREATE_PARTITIONS, version, request).results
    assert [(r.name, r.error_code, r.error_message) for r in results] == [
        ("grow", 0, None),
        ("assigned", 0, None),
    ]
    for topic in ("grow", "assigned"):
        assert [p.index for p in admin_broker.partitions.of_topic(topic)] == [0, 1, 2]
        assert admin_broker.image.topic(topic).num_partitions == 3
    # New partitions are writable and readable at once.
    assert produce_one(admin_broker, "grow", 2).error_code == 0
    assert [h.record_count for h in stored_batches(admin_broker, "grow", 2)] == [2]


@pytest.mark.parametrize("version", edge_versions(ApiKey.CREATE_PARTITIONS))
def test_create_partitions_errors_and_validate_only(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "two", partitions=2)
    request = partitions_request(
        version,
        [
            ("two", 2, None),
            ("two-less", 1, None),
            ("missing", 4, None),
        ],
    )
    create_topic(admin_broker, "two-less", partitions=2)
    results = call(admin_broker, ApiKey.CREATE_PARTITIONS, version, request).results
    assert [(r.name, r.error_code) for r in results] == [
        ("two", ErrorCode.INVALID_PARTITIONS),
        ("two-less", ErrorCode.INVALID_PARTITIONS),
        ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    assert all(r.error_message for r in results)
    wrong = partitions_request(version, [("two", 4, [[1]])])
    (result,) = call(admin_broker, ApiKey.CREATE_PARTITIONS, version, wrong).results
    assert result.error_code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    dry = partitions_request(version, [("two", 5, None)], validate_only=True)
    (result,) = call(admin_broker, ApiKey.CREATE_PARTITIONS, version, dry).results
    assert result.error_code == 0
    assert admin_broker.image.topic("two").num_partitions == 2
    assert len(admin_broker.partitions.of_topic("two")) == 2
