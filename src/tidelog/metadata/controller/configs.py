"""Configs: AlterConfigs, IncrementalAlterConfigs, and DescribeConfigs (read-only).

Alter operations check each resource against the committed image and turn its new
dynamic configs into Config records (one per key set or deleted); a resource that fails
gets its error and writes nothing. Describe reads an image and needs no controller.
Error codes follow Kafka's ConfigurationControlManager; messages are our own.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

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
from tidelog.metadata.controller.base import ControllerResult, ControllerView, per_item
from tidelog.metadata.errors import OK, ApiError
from tidelog.metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE, MetadataImage
from tidelog.metadata.records import ConfigRecord, MetadataRecord
from tidelog.protocol.error_codes import ErrorCode

__all__ = [
    "AlterConfigOp",
    "AlterConfigsResource",
    "ConfigResourceResult",
    "DescribeConfigsResource",
    "DescribeConfigsResult",
    "IncrementalAlterConfigsResource",
    "alter_configs",
    "describe_configs",
    "effective_broker_config",
    "incremental_alter_configs",
]


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


def _resource_error(view: ControllerView, resource_type: int, name: str) -> ApiError | None:
    if resource_type == ConfigResourceType.TOPIC:
        if view.image.topic(name) is None:
            return ApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        return None
    if resource_type == ConfigResourceType.BROKER:
        if name == "" or name.isdigit():
            return None
        return ApiError(ErrorCode.INVALID_REQUEST, f"broker resource name {name!r} is not an id")
    return ApiError(ErrorCode.INVALID_REQUEST, f"resource type {resource_type} is not supported")


def _current(view: ControllerView, resource_type: int, name: str) -> Mapping[str, str]:
    if resource_type == ConfigResourceType.TOPIC:
        return view.image.topic_config(name)
    return view.image.broker_config(name)


def _config_records(
    view: ControllerView, resource_type: int, name: str, new: Mapping[str, str]
) -> tuple[ApiError, list[MetadataRecord]]:
    """Validate a resource's complete new dynamic configs; the records reaching them."""
    if resource_type == ConfigResourceType.TOPIC:
        error = validate_topic_configs(new)
    else:
        error = validate_broker_config_changes(new, per_broker=name != "")
    if error is not None:
        return error, []
    record_type = TOPIC_RESOURCE if resource_type == ConfigResourceType.TOPIC else BROKER_RESOURCE
    current = _current(view, resource_type, name)
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
    view: ControllerView,
    resources: Sequence[tuple[int, str]],
    plan: Callable[[int], tuple[ApiError, list[MetadataRecord]]],
    validate_only: bool,
) -> ControllerResult[list[ConfigResourceResult]]:
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
            problem = _resource_error(view, rtype, rname)
            if problem is None:
                error, records = plan(index)
            else:
                error = problem
        results.append(ConfigResourceResult(rtype, rname, error))
        if error.ok and records:
            planned.append((index, records))
    if validate_only:
        return ControllerResult(results)
    return per_item(
        results,
        planned,
        lambda old, error: ConfigResourceResult(old.resource_type, old.resource_name, error),
    )


def alter_configs(
    view: ControllerView, resources: Sequence[AlterConfigsResource], *, validate_only: bool = False
) -> ControllerResult[list[ConfigResourceResult]]:
    """AlterConfigs: each resource's dynamic configs become exactly those given."""

    def plan(index: int) -> tuple[ApiError, list[MetadataRecord]]:
        res = resources[index]
        nulls = [key for key, value in res.configs.items() if value is None]
        if nulls:
            return ApiError(ErrorCode.INVALID_REQUEST, f"config {nulls[0]} has no value"), []
        new = {key: value for key, value in res.configs.items() if value is not None}
        return _config_records(view, res.resource_type, res.resource_name, new)

    keys = [(r.resource_type, r.resource_name) for r in resources]
    return _alter(view, keys, plan, validate_only)


def incremental_alter_configs(
    view: ControllerView,
    resources: Sequence[IncrementalAlterConfigsResource],
    *,
    validate_only: bool = False,
) -> ControllerResult[list[ConfigResourceResult]]:
    """IncrementalAlterConfigs: SET, DELETE, APPEND, SUBTRACT per key."""

    def plan(index: int) -> tuple[ApiError, list[MetadataRecord]]:
        res = resources[index]
        new = dict(_current(view, res.resource_type, res.resource_name))
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
                error, items = _list_value(view, res.resource_type, res.resource_name, key)
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
        return _config_records(view, res.resource_type, res.resource_name, new)

    keys = [(r.resource_type, r.resource_name) for r in resources]
    return _alter(view, keys, plan, validate_only)


def _list_value(
    view: ControllerView, resource_type: int, name: str, key: str
) -> tuple[ApiError | None, list[str]]:
    """The current items of a LIST config (its override, else its effective value)."""
    definition: ConfigDef
    if resource_type == ConfigResourceType.TOPIC:
        definition = TOPIC_CONFIGS[key]
        current = view.image.topic_config(name)
    else:
        definition = BROKER_CONFIGS[key]
        current = view.image.broker_config(name)
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
        text = format_value(topic_config_value(view.config, {}, key)[0]) or ""
    else:
        text = format_value(view.config.get(key)) or ""
    return None, [item.strip() for item in text.split(",") if item.strip()]
