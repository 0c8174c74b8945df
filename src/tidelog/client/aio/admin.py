"""AIOAdmin: topics, partitions, configs, offsets and the cluster, over asyncio.

Requests that change topics go to the controller named by Metadata (any broker forwards them in
a KRaft cluster, but the controller answers without a hop). Broker configs are asked of the
broker they belong to. Every multi-item call either succeeds for every item or raises
:class:`~tidelog.client.errors.PartialFailureError` naming each failed item with its Kafka error
code and message (the items that succeeded have taken effect).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tidelog.client.cluster import BrokerInfo, ClusterClient, TopicInfo
from tidelog.client.config import parse_config
from tidelog.client.connection import Connection
from tidelog.client.errors import (
    BrokerConnectionError,
    ClientError,
    PartialFailureError,
    broker_error,
)
from tidelog.client.offsets import OffsetSpec, list_offsets
from tidelog.client.types import (
    AlterConfigOp,
    ConfigEntry,
    ConfigResource,
    ListOffsetsResult,
    NewTopic,
    TopicPartition,
)
from tidelog.protocol import ApiKey, ErrorCode

RESOURCE_TYPES = {"topic": 2, "broker": 4, "broker_logger": 8}
_RESOURCE_NAMES = {v: k for k, v in RESOURCE_TYPES.items()}
CONFIG_SOURCES = {
    -1: "UNKNOWN",
    1: "DYNAMIC_TOPIC_CONFIG",
    2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
    6: "DYNAMIC_BROKER_LOGGER_CONFIG",
    7: "CLIENT_METRICS_CONFIG",
    8: "GROUP_CONFIG",
}
CONFIG_OPS = {"set": 0, "delete": 1, "append": 2, "subtract": 3}


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    cluster_id: str | None
    controller_id: int
    brokers: tuple[BrokerInfo, ...]


def _resource_type(resource: ConfigResource) -> int:
    try:
        return RESOURCE_TYPES[resource.type]
    except KeyError:
        raise ValueError(
            f"config resource type {resource.type!r}: expected one of {', '.join(RESOURCE_TYPES)}"
        ) from None


def _check(errors: Mapping[object, ClientError], what: str) -> None:
    if errors:
        raise PartialFailureError(what, errors)


def _item_error(code: Any, message: str | None, item: str) -> ClientError | None:
    error = ErrorCode.from_wire(int(code))
    if error is ErrorCode.NONE:
        return None
    return broker_error(error, message, context=item)


class AIOAdmin:
    """Administrative operations; ``config`` takes Kafka's admin client property names."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.config = parse_config("admin", config, **kwargs)
        self.cluster = ClusterClient(self.config)
        self._timeout_ms: int = self.config["default.api.timeout.ms"]

    async def __aenter__(self) -> AIOAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.cluster.close()

    async def _call_controller(self, api_key: ApiKey, values: Mapping[str, Any]) -> Any:
        conn = await self.cluster.controller_connection()
        return await self._call(conn, api_key, values)

    async def _call(self, conn: Connection, api_key: ApiKey, values: Mapping[str, Any]) -> Any:
        try:
            return await conn.call(
                api_key, values, timeout_ms=max(self._timeout_ms, self.config["request.timeout.ms"])
            )
        except BrokerConnectionError:
            await self.cluster.forget(conn)
            raise

    # -- topics ------------------------------------------------------------------------------

    async def create_topics(
        self,
        topics: Iterable[NewTopic],
        *,
        validate_only: bool = False,
        timeout_ms: int | None = None,
    ) -> None:
        new = list(topics)
        response = await self._call_controller(
            ApiKey.CREATE_TOPICS,
            {
                "topics": [
                    {
                        "name": t.name,
                        "num_partitions": t.num_partitions,
                        "replication_factor": t.replication_factor,
                        "assignments": [],
                        "configs": [{"name": k, "value": v} for k, v in t.configs.items()],
                    }
                    for t in new
                ],
                "timeout": self._timeout_ms if timeout_ms is None else timeout_ms,
                "validate_only": validate_only,
            },
        )
        errors: dict[object, ClientError] = {}
        for r in response.topics:
            err = _item_error(r.error_code, getattr(r, "error_message", None), f"topic {r.name!r}")
            if err is not None:
                errors[r.name] = err
        _check(errors, "create topics")
        if not validate_only:
            await self.cluster.refresh([t.name for t in new])

    async def delete_topics(self, names: Iterable[str], *, timeout_ms: int | None = None) -> None:
        wanted = list(names)
        response = await self._call_controller(
            ApiKey.DELETE_TOPICS,
            {
                "topic_names": wanted,
                "topics": [{"name": n, "topic_id": None} for n in wanted],
                "timeout": self._timeout_ms if timeout_ms is None else timeout_ms,
            },
        )
        errors: dict[object, ClientError] = {}
        for r in response.responses:
            err = _item_error(r.error_code, getattr(r, "error_message", None), f"topic {r.name!r}")
            if err is not None:
                errors[r.name] = err
        _check(errors, "delete topics")
        await self.cluster.refresh(wanted)

    async def list_topics(self, *, include_internal: bool = False) -> list[str]:
        await self.cluster.refresh()
        return sorted(
            name
            for name, info in self.cluster.metadata.topics.items()
            if include_internal or not info.is_internal
        )

    async def describe_topics(self, names: Iterable[str] | None = None) -> dict[str, TopicInfo]:
        """Partitions (leader, replicas, ISR) of ``names``, or of every topic when None."""
        wanted = None if names is None else list(names)
        errors = await self.cluster.refresh(wanted)
        topics = self.cluster.metadata.topics
        if wanted is None:
            return dict(sorted(topics.items()))
        failed: dict[object, ClientError] = {}
        for name in wanted:
            if name not in topics:
                code = errors.get(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                failed[name] = broker_error(code, context=f"topic {name!r}")
        _check(failed, "describe topics")
        return {name: topics[name] for name in wanted}

    async def create_partitions(
        self,
        new_totals: Mapping[str, int],
        *,
        validate_only: bool = False,
        timeout_ms: int | None = None,
    ) -> None:
        """Grow each topic to the given total number of partitions."""
        response = await self._call_controller(
            ApiKey.CREATE_PARTITIONS,
            {
                "topics": [
                    {"name": name, "count": count, "assignments": None}
                    for name, count in new_totals.items()
                ],
                "timeout": self._timeout_ms if timeout_ms is None else timeout_ms,
                "validate_only": validate_only,
            },
        )
        errors: dict[object, ClientError] = {}
        for r in response.results:
            err = _item_error(r.error_code, getattr(r, "error_message", None), f"topic {r.name!r}")
            if err is not None:
                errors[r.name] = err
        _check(errors, "create partitions")
        if not validate_only:
            await self.cluster.refresh(list(new_totals))

    # -- configs -----------------------------------------------------------------------------

    async def _conn_for(self, resource: ConfigResource) -> Connection:
        if resource.type in ("broker", "broker_logger") and resource.name.strip():
            try:
                node = int(resource.name)
            except ValueError:
                raise ValueError(
                    f"broker config names are node ids, got {resource.name!r}"
                ) from None
            return await self.cluster.connection(node)
        return await self.cluster.any_connection()

    async def describe_configs(
        self, resources: Iterable[ConfigResource], *, keys: Iterable[str] | None = None
    ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        wanted = list(resources)
        names = None if keys is None else list(keys)
        results: dict[ConfigResource, dict[str, ConfigEntry]] = {}
        errors: dict[object, ClientError] = {}
        for resource in wanted:
            conn = await self._conn_for(resource)
            response = await self._call(
                conn,
                ApiKey.DESCRIBE_CONFIGS,
                {
                    "resources": [
                        {
                            "resource_type": _resource_type(resource),
                            "resource_name": resource.name,
                            "configuration_keys": names,
                        }
                    ],
                    "include_synonyms": False,
                    "include_documentation": False,
                },
            )
            for r in response.results:
                err = _item_error(r.error_code, r.error_message, str(resource))
                if err is not None:
                    errors[resource] = err
                    continue
                entries = {}
                for c in r.configs:
                    source = int(getattr(c, "config_source", -1))
                    is_default = bool(getattr(c, "is_default", source == 5))
                    entries[c.name] = ConfigEntry(
                        name=c.name,
                        value=c.value,
                        source=CONFIG_SOURCES.get(source, str(source)),
                        is_default=is_default,
                        read_only=bool(c.read_only),
                        is_sensitive=bool(c.is_sensitive),
                    )
                results[resource] = dict(sorted(entries.items()))
        _check(errors, "describe configs")
        return results

    async def alter_configs(
        self,
        changes: Mapping[ConfigResource, Iterable[AlterConfigOp]],
        *,
        validate_only: bool = False,
    ) -> None:
        """IncrementalAlterConfigs: set, delete, append to or subtract from single keys."""
        errors: dict[object, ClientError] = {}
        for resource, ops in changes.items():
            configs = []
            for op in ops:
                if op.op not in CONFIG_OPS:
                    raise ValueError(
                        f"config operation {op.op!r}: expected one of {', '.join(CONFIG_OPS)}"
                    )
                configs.append(
                    {"name": op.name, "config_operation": CONFIG_OPS[op.op], "value": op.value}
                )
            conn = await self._conn_for(resource)
            response = await self._call(
                conn,
                ApiKey.INCREMENTAL_ALTER_CONFIGS,
                {
                    "resources": [
                        {
                            "resource_type": _resource_type(resource),
                            "resource_name": resource.name,
                            "configs": configs,
                        }
                    ],
                    "validate_only": validate_only,
                },
            )
            for r in response.responses:
                err = _item_error(r.error_code, r.error_message, str(resource))
                if err is not None:
                    errors[resource] = err
        _check(errors, "alter configs")

    # -- offsets and cluster -----------------------------------------------------------------

    async def list_offsets(
        self,
        specs: Mapping[TopicPartition, OffsetSpec],
        *,
        isolation_level: str = "read_uncommitted",
    ) -> dict[TopicPartition, ListOffsetsResult]:
        """Offsets for ``{partition: "earliest" | "latest" | timestamp_ms}``."""
        level = 1 if isolation_level == "read_committed" else 0
        answers = await list_offsets(self.cluster, specs, isolation_level=level)
        errors: dict[object, ClientError] = {
            tp: a for tp, a in answers.items() if isinstance(a, ClientError)
        }
        _check(errors, "list offsets")
        return {tp: a for tp, a in answers.items() if isinstance(a, ListOffsetsResult)}

    async def describe_cluster(self) -> ClusterDescription:
        conn = await self.cluster.any_connection()
        if conn.supports(ApiKey.DESCRIBE_CLUSTER):
            response = await self._call(
                conn,
                ApiKey.DESCRIBE_CLUSTER,
                {"include_cluster_authorized_operations": False, "endpoint_type": 1},
            )
            err = _item_error(response.error_code, response.error_message, "describe cluster")
            if err is not None:
                raise err
            brokers = tuple(
                sorted(
                    (
                        BrokerInfo(int(b.broker_id), b.host, int(b.port), b.rack)
                        for b in response.brokers
                    ),
                    key=lambda b: b.node_id,
                )
            )
            return ClusterDescription(response.cluster_id, int(response.controller_id), brokers)
        await self.cluster.refresh([])
        md = self.cluster.metadata
        return ClusterDescription(
            md.cluster_id,
            md.controller_id,
            tuple(sorted(md.brokers.values(), key=lambda b: b.node_id)),
        )


__all__ = ["AIOAdmin", "ClusterDescription"]
