"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs handlers with a real controller."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tidelog.metadata.configs import ConfigSource, ConfigType
from tidelog.protocol import ApiKey, ErrorCode

from .admin_fixtures import call, create_topic, edge_versions, schema, versions

TOPIC, BROKER = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def build(cls: Any, **values: Any) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def describe(
    broker: Any,
    version: int,
    resources: list[tuple[int, str, list[str] | None]],
    *,
    synonyms: bool = False,
    documentation: bool = False,
) -> Any:
    module = schema("describe_configs", version)
    request = build(
        module.DescribeConfigsRequest,
        resources=tuple(
            module.DescribeConfigsResource(
                resource_type=rtype,
                resource_name=name,
                configuration_keys=None if keys is None else tuple(keys),
            )
            for rtype, name, keys in resources
        ),
        include_synonyms=synonyms,
        include_documentation=documentation,
    )
    return call(broker, ApiKey.DESCRIBE_CONFIGS, version, request).results


def topic_configs(broker: Any, topic: str, version: int = 4, **kwargs: Any) -> dict[str, Any]:
    (result,) = describe(broker, version, [(TOPIC, topic, None)], **kwargs)
    assert result.error_code == 0
    return {entry.name: entry for entry in result.configs}


def alter(
    broker: Any,
    version: int,
    resources: list[tuple[int, str, dict[str, str | None]]],
    *,
    validate_only: bool = False,
) -> Any:
    module = schema("alter_configs", version)
    request = module.AlterConfigsRequest(
        resources=tuple(
            module.AlterConfigsResource(
                resource_type=rtype,
                resource_name=name,
                configs=tuple(module.AlterableConfig(name=k, value=v) for k, v in configs.items()),
            )
            for rtype, name, configs in resources
        ),
        validate_only=validate_only,
    )
    return call(broker, ApiKey.ALTER_CONFIGS, version, request).responses


def incremental(
    broker: Any,
    version: int,
    resources: list[tuple[int, str, list[tuple[str, int, str | None]]]],
    *,
    validate_only: bool = False,
) -> Any:
    module = schema("incremental_alter_configs", version)
    request = module.IncrementalAlterConfigsRequest(
        resources=tuple(
            module.AlterConfigsResource(
                resource_type=rtype,
                resource_name=name,
                configs=tuple(
                    module.AlterableConfig(name=k, config_operation=op, value=v)
                    for k, op, v in changes
                ),
            )
            for rtype, name, changes in resources
        ),
        validate_only=validate_only,
    )
    return call(broker, ApiKey.INCREMENTAL_ALTER_CONFIGS, version, request).responses


# -- DescribeConfigs -----------------------------------------------------------------------


@pytest.mark.parametrize("version", versions(ApiKey.DESCRIBE_CONFIGS))
def test_describe_topic_configs_every_version(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "t", configs={"retention.ms": "1000"})
    (plain,) = describe(admin_broker, version, [(TOPIC, "t", None)])
    assert (plain.error_code, plain.error_message) == (0, None)
    assert (plain.resource_type, plain.resource_name) == (TOPIC, "t")
    entries = {e.name: e for e in plain.configs}
    retention = entries["retention.ms"]
    assert (retention.value, retention.config_source) == ("1000", ConfigSource.TOPIC_CONFIG)
    assert (retention.read_only, retention.is_sensitive, retention.synonyms) == (False, False, ())
    cleanup = entries["cleanup.policy"]
    assert (cleanup.value, cleanup.config_source) == ("delete", ConfigSource.DEFAULT_CONFIG)
    if version >= 3:
        assert retention.config_type == ConfigType.LONG
        assert cleanup.config_type == ConfigType.LIST
        assert retention.documentation is None
    (rich,) = describe(
        admin_broker, version, [(TOPIC, "t", None)], synonyms=True, documentation=True
    )
    retention = next(e for e in rich.configs if e.name == "retention.ms")
    synonyms = [(s.name, s.value, s.source) for s in retention.synonyms]
    assert synonyms[0] == ("retention.ms", "1000", ConfigSource.TOPIC_CONFIG)
    assert ("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG) in synonyms
    if version >= 3:
        assert retention.documentation


@pytest.mark.parametrize("version", edge_versions(ApiKey.DESCRIBE_CONFIGS))
def test_describe_requested_keys_only(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "t")
    (result,) = describe(admin_broker, version, [(TOPIC, "t", ["segment.bytes", "no.such.key"])])
    assert [e.name for e in result.configs] == ["segment.bytes"]
    (every,) = describe(admin_broker, version, [(TOPIC, "t", [])])
    assert len(every.configs) > 20


@pytest.mark.parametrize("version", edge_versions(ApiKey.DESCRIBE_CONFIGS))
def test_describe_broker_configs(start_admin_broker: Any, version: int) -> None:
    broker = start_admin_broker({"num.partitions": "6"})
    results = describe(
        broker, version, [(BROKER, "1", ["num.partitions", "node.id"]), (BROKER, "", None)]
    )
    assert [r.error_code for r in results] == [0, 0]
    node = {e.name: e for e in results[0].configs}
    assert (node["num.partitions"].value, node["num.partitions"].config_source) == (
        "6",
        ConfigSource.STATIC_BROKER_CONFIG,
    )
    assert node["num.partitions"].read_only is False
    assert node["node.id"].read_only is True
    assert len(results[1].configs) > 50


@pytest.mark.parametrize("version", edge_versions(ApiKey.DESCRIBE_CONFIGS))
def test_describe_configs_errors(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "t")
    results = describe(
        admin_broker,
        version,
        [(TOPIC, "missing", None), (3, "x", None), (BROKER, "7", None), (TOPIC, "t", None)],
    )
    assert [r.error_code for r in results] == [
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.NONE,
    ]
    assert all(r.error_message and r.configs == () for r in results[:3])
    assert [(r.resource_type, r.resource_name) for r in results] == [
        (TOPIC, "missing"),
        (3, "x"),
        (BROKER, "7"),
        (TOPIC, "t"),
    ]


# -- AlterConfigs (legacy: full replacement) -----------------------------------------------


@pytest.mark.parametrize("version", versions(ApiKey.ALTER_CONFIGS))
def test_alter_configs_replaces_the_whole_set(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "t", configs={"retention.ms": "1000", "cleanup.policy": "compact"})
    (response,) = alter(admin_broker, version, [(TOPIC, "t", {"segment.bytes": "1048576"})])
    assert (response.error_code, response.error_message) == (0, None)
    assert (response.resource_type, response.resource_name) == (TOPIC, "t")
    entries = topic_configs(admin_broker, "t", synonyms=True)
    segment = entries["segment.bytes"]
    assert (segment.value, segment.config_source) == ("1048576", ConfigSource.TOPIC_CONFIG)
    assert segment.synonyms[0].source == ConfigSource.TOPIC_CONFIG
    assert any(s.name == "log.segment.bytes" for s in segment.synonyms)
    # Keys the request did not list lost their overrides.
    assert entries["retention.ms"].config_source == ConfigSource.DEFAULT_CONFIG
    assert entries["retention.ms"].value == "604800000"
    assert entries["cleanup.policy"].value == "delete"
    assert admin_broker.image.topic_config("t") == {"segment.bytes": "1048576"}
    # The partition logs took the new config.
    assert admin_broker.partitions.get("t", 0).log.config.segment_bytes == 1048576


@pytest.mark.parametrize("version", edge_versions(ApiKey.ALTER_CONFIGS))
def test_alter_configs_errors_and_validate_only(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "t", configs={"retention.ms": "1000"})
    responses = alter(
        admin_broker,
        version,
        [
            (TOPIC, "missing", {"retention.ms": "1"}),
            (TOPIC, "t", {"retention.ms": "soon"}),
            (BROKER, "", {"node.id": "3"}),
            (5, "x", {}),
        ],
    )
    # A read-only broker key is INVALID_REQUEST, as Kafka answers for every broker config
    # it refuses; a bad topic value is INVALID_CONFIG.
    assert [r.error_code for r in responses] == [
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.INVALID_CONFIG,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_REQUEST,
    ]
    assert all(r.error_message for r in responses)
    (null_value,) = alter(admin_broker, version, [(TOPIC, "t", {"retention.ms": None})])
    assert null_value.error_code == ErrorCode.INVALID_REQUEST
    (dry,) = alter(admin_broker, version, [(TOPIC, "t", {"retention.ms": "5"})], validate_only=True)
    assert dry.error_code == 0
    assert admin_broker.image.topic_config("t") == {"retention.ms": "1000"}
    assert topic_configs(admin_broker, "t")["retention.ms"].value == "1000"


@pytest.mark.parametrize("version", edge_versions(ApiKey.ALTER_CONFIGS))
def test_alter_broker_configs(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "t")
    responses = alter(
        admin_broker,
        version,
        [(BROKER, "", {"log.retention.ms": "7000"}), (BROKER, "1", {"num.partitions": "5"})],
    )
    assert [r.error_code for r in responses] == [0, 0]
    assert admin_broker.config.num_partitions == 5
    retention = topic_configs(admin_broker, "t")["retention.ms"]
    assert (retention.value, retention.config_source) == (
        "7000",
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
    )
    assert admin_broker.partitions.get("t", 0).log.config.retention_ms == 7000
    (node,) = describe(admin_broker, 4, [(BROKER, "1", ["num.partitions"])])
    assert (node.configs[0].value, node.configs[0].config_source) == (
        "5",
        ConfigSource.DYNAMIC_BROKER_CONFIG,
    )


# -- IncrementalAlterConfigs ---------------------------------------------------------------


@pytest.mark.parametrize("version", versions(ApiKey.INCREMENTAL_ALTER_CONFIGS))
def test_incremental_alter_configs_every_version(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "t", configs={"retention.ms": "1000", "segment.ms": "60000"})
    (response,) = incremental(
        admin_broker,
        version,
        [
            (
                TOPIC,
                "t",
                [
                    ("max.message.bytes", SET, "2048"),
                    ("segment.ms", DELETE, None),
                    ("cleanup.policy", APPEND, "compact"),
                ],
            )
        ],
    )
    assert (response.error_code, response.error_message) == (0, None)
    entries = topic_configs(admin_broker, "t")
    assert entries["retention.ms"].value == "1000"  # untouched keys stay
    assert (entries["max.message.bytes"].value, entries["max.message.bytes"].config_source) == (
        "2048",
        ConfigSource.TOPIC_CONFIG,
    )
    assert entries["segment.ms"].config_source == ConfigSource.DEFAULT_CONFIG
    assert entries["cleanup.policy"].value == "delete,compact"
    (response,) = incremental(
        admin_broker, version, [(TOPIC, "t", [("cleanup.policy", SUBTRACT, "delete")])]
    )
    assert response.error_code == 0
    assert topic_configs(admin_broker, "t")["cleanup.policy"].value == "compact"


@pytest.mark.parametrize("version", edge_versions(ApiKey.INCREMENTAL_ALTER_CONFIGS))
def test_incremental_alter_configs_errors_and_validate_only(
    admin_broker: Any, version: int
) -> None:
    create_topic(admin_broker, "t")
    responses = incremental(
        admin_broker,
        version,
        [
            (TOPIC, "t", [("retention.ms", APPEND, "5")]),
            (TOPIC, "missing", [("retention.ms", SET, "5")]),
            (BROKER, "1", [("num.partitions", 9, "5")]),
            (BROKER, "", [("no.such.key", SET, "1")]),
            (8, "root", [("kafka", SET, "DEBUG")]),
        ],
    )
    assert [r.error_code for r in responses] == [
        ErrorCode.INVALID_CONFIG,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_CONFIG,
        ErrorCode.INVALID_REQUEST,
    ]
    assert all(r.error_message for r in responses)
    (dry,) = incremental(
        admin_broker, version, [(TOPIC, "t", [("retention.ms", SET, "5")])], validate_only=True
    )
    assert dry.error_code == 0
    assert admin_broker.image.topic_config("t") == {}
    (broker_set,) = incremental(
        admin_broker, version, [(BROKER, "", [("num.partitions", SET, "2")])]
    )
    assert broker_set.error_code == 0
    assert admin_broker.config.num_partitions == 2
