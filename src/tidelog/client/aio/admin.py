"""AIOAdmin: topics, partitions, configs, offsets, consumer groups and the cluster, over asyncio.

Requests that change topics go to the controller named by Metadata (any broker forwards them in
a KRaft cluster, but the controller answers without a hop). Broker configs are asked of the
broker they belong to. Every multi-item call either succeeds for every item or raises
:class:`~tidelog.client.errors.PartialFailureError` naming each failed item with its Kafka error
code and message (the items that succeeded have taken effect).

Group requests go to the group's coordinator, found with FindCoordinator. While a coordinator
moves or loads (COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, or a
lost connection) the call looks the coordinator up again and retries with exponential backoff
until ``default.api.timeout.ms`` has passed, as Kafka's admin client does. OffsetFetch and
OffsetCommit are sent at most at v9: v10 names topics by id only.

Transactions (KIP-664): ListTransactions goes to every broker, DescribeTransactions to the
transactional id's coordinator (FindCoordinator key type 1, retried as for groups),
DescribeProducers to each partition's leader, and an abort (WriteTxnMarkers with ABORT, as
Kafka's ``abortTransaction`` sends it) to the partition's leader.

Replicas: ElectLeaders (KIP-460), AlterPartitionReassignments and ListPartitionReassignments
(KIP-455) go to the controller like topic changes. An unclean election needs ElectLeaders
v1: v0 has no election type and would elect the preferred replica instead, so it is
refused on a broker that only serves v0.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import hashlib
import os
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tidelog.client.cluster import (
    GROUP_KEY,
    TRANSACTION_KEY,
    BrokerInfo,
    ClusterClient,
    TopicInfo,
    find_coordinator,
)
from tidelog.client.config import parse_config
from tidelog.client.connection import Connection
from tidelog.client.errors import (
    BrokerConnectionError,
    ClientError,
    PartialFailureError,
    UnsupportedApiError,
    broker_error,
)
from tidelog.client.groups import (
    ConsumerProtocolError,
    GroupDescription,
    GroupListing,
    MemberDescription,
    OffsetAndMetadata,
    Subscription,
    decode_assignment,
    decode_subscription,
)
from tidelog.client.offsets import OffsetSpec, list_offsets
from tidelog.client.types import (
    AlterConfigOp,
    ConfigEntry,
    ConfigResource,
    ListOffsetsResult,
    LogDirDescription,
    NewTopic,
    PartitionReassignment,
    ProducerState,
    QuorumInfo,
    QuorumReplica,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.protocol.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

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
# ElectLeaders' election types (v1+; v0 elects the preferred replica only).
ELECTION_TYPES = {"preferred": 0, "unclean": 1}

# The coordinator of a group is moving or loading: look it up again and retry.
COORDINATOR_RETRY_CODES = frozenset(
    {
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
# What a commit without a generation meets when the group has active members.
_ACTIVE_GROUP_CODES = frozenset(
    {
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.ILLEGAL_GENERATION,
        ErrorCode.REBALANCE_IN_PROGRESS,
        ErrorCode.FENCED_INSTANCE_ID,
    }
)
# Kafka's retry.backoff.max.ms default: the backoff doubles up to this.
_MAX_BACKOFF_MS = 1000
# v10 of these names topics only by id.
_MAX_OFFSET_FETCH_VERSION = 9
_MAX_OFFSET_COMMIT_VERSION = 9
# The highest DescribeQuorum the client reads (v2 adds the voters' directory ids and nodes).
_MAX_DESCRIBE_QUORUM_VERSION = 2
# Why an address did not describe the quorum when it does not serve DescribeQuorum at all.
_NOT_SERVED = "does not serve DescribeQuorum (not a controller listener)"
# The metadata quorum's log, the one partition DescribeQuorum describes.
METADATA_TOPIC = "__cluster_metadata"

T = TypeVar("T")


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


def _describe_error(answer: ErrorCode | str) -> str:
    return f"{answer.name} ({answer.message})" if isinstance(answer, ErrorCode) else answer


def _check(errors: Mapping[object, ClientError], what: str) -> None:
    if errors:
        raise PartialFailureError(what, errors)


def _item_error(code: Any, message: str | None, item: str) -> ClientError | None:
    error = ErrorCode.from_wire(int(code))
    if error is ErrorCode.NONE:
        return None
    return broker_error(error, message, context=item)


def _by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[int]]:
    """Partition numbers grouped under their topic, as requests list them."""
    grouped: dict[str, list[int]] = defaultdict(list)
    for tp in partitions:
        grouped[tp.topic].append(tp.partition)
    return grouped


def _answer_for(answers: Iterable[Any], key_field: str, key: str, item: str) -> Any:
    """The entry of a batched response that answers ``key``; its error, or a missing
    entry (UNKNOWN_SERVER_ERROR), raised."""
    answer = next((a for a in answers if getattr(a, key_field) == key), None)
    if answer is None:
        raise broker_error(
            ErrorCode.UNKNOWN_SERVER_ERROR, "the coordinator did not answer for it", context=item
        )
    err = _item_error(answer.error_code, getattr(answer, "error_message", None), item)
    if err is not None:
        raise err
    return answer


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

    async def _call(
        self,
        conn: Connection,
        api_key: ApiKey,
        values: Mapping[str, Any],
        *,
        version: int | None = None,
    ) -> Any:
        try:
            return await conn.call(
                api_key,
                values,
                version=version,
                timeout_ms=max(self._timeout_ms, self.config["request.timeout.ms"]),
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

    # -- replicas: leader elections and reassignments (KIP-460, KIP-455) ---------------------

    async def elect_leaders(
        self,
        election_type: str,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, ClientError | None]:
        """Elect the preferred (or, with ``"unclean"``, any live) replica of ``partitions``,
        or of every partition when None; each partition's outcome, None for an election
        that took place. ELECTION_NOT_NEEDED is an outcome, not a failure of the call: the
        caller decides whether "already elected" is fine (Kafka's tool says it is)."""
        try:
            kind = ELECTION_TYPES[election_type]
        except KeyError:
            raise ValueError(
                f"election type {election_type!r}: expected one of {', '.join(ELECTION_TYPES)}"
            ) from None
        wanted = None if partitions is None else list(partitions)
        conn = await self.cluster.controller_connection()
        served = conn.broker_ranges.get(ApiKey.ELECT_LEADERS)
        if served is None or (kind != ELECTION_TYPES["preferred"] and served[1] < 1):
            raise UnsupportedApiError(
                f"broker {conn.address} cannot run {election_type} elections (ElectLeaders "
                f"{'not served' if served is None else f'v{served[1]} at most'})"
            )
        response = await self._call(
            conn,
            ApiKey.ELECT_LEADERS,
            {
                "election_type": kind,
                "topic_partitions": None
                if wanted is None
                else [{"topic": t, "partitions": ps} for t, ps in _by_topic(wanted).items()],
                "timeout": self._timeout_ms if timeout_ms is None else timeout_ms,
            },
        )
        err = _item_error(response.error_code, None, "elect leaders")
        if err is not None:
            raise err
        return {
            TopicPartition(r.topic, int(p.partition_id)): _item_error(
                p.error_code, p.error_message, f"partition {r.topic}-{int(p.partition_id)}"
            )
            for r in response.replica_election_results
            for p in r.partition_result
        }

    async def alter_partition_reassignments(
        self,
        targets: Mapping[TopicPartition, Iterable[int] | None],
        *,
        timeout_ms: int | None = None,
    ) -> None:
        """Move each partition to the given replicas (the first is the preferred leader), or
        cancel its reassignment under way when the value is None. Raises
        :class:`PartialFailureError` naming every partition the controller refused."""
        by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for tp, replicas in targets.items():
            by_topic[tp.topic].append(
                {
                    "partition_index": tp.partition,
                    "replicas": None if replicas is None else list(replicas),
                }
            )
        response = await self._call_controller(
            ApiKey.ALTER_PARTITION_REASSIGNMENTS,
            {
                "timeout": self._timeout_ms if timeout_ms is None else timeout_ms,
                "allow_replication_factor_change": True,
                "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()],
            },
        )
        err = _item_error(response.error_code, response.error_message, "alter reassignments")
        if err is not None:
            raise err
        errors: dict[object, ClientError] = {}
        for t in response.responses:
            for p in t.partitions:
                tp = TopicPartition(t.name, int(p.partition_index))
                item = _item_error(p.error_code, p.error_message, f"partition {tp}")
                if item is not None:
                    errors[tp] = item
        _check(errors, "alter partition reassignments")

    async def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, PartitionReassignment]:
        """The reassignments under way, of ``partitions`` or of the whole cluster; a
        partition not being reassigned is left out."""
        topics = None
        if partitions is not None:
            grouped = _by_topic(partitions).items()
            topics = [{"name": t, "partition_indexes": ps} for t, ps in grouped]
        response = await self._call_controller(
            ApiKey.LIST_PARTITION_REASSIGNMENTS,
            {"timeout": self._timeout_ms, "topics": topics},
        )
        err = _item_error(response.error_code, response.error_message, "list reassignments")
        if err is not None:
            raise err
        return {
            TopicPartition(t.name, int(p.partition_index)): PartitionReassignment(
                tuple(int(b) for b in p.replicas),
                tuple(int(b) for b in p.adding_replicas),
                tuple(int(b) for b in p.removing_replicas),
            )
            for t in response.topics
            for p in t.partitions
        }

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

    async def describe_cluster(self, *, include_fenced_brokers: bool = False) -> ClusterDescription:
        """The cluster's id, controller and brokers; fenced brokers too when asked (and the
        broker serves DescribeCluster v2), each marked ``fenced``."""
        conn = await self.cluster.any_connection()
        if conn.supports(ApiKey.DESCRIBE_CLUSTER):
            response = await self._call(
                conn,
                ApiKey.DESCRIBE_CLUSTER,
                {
                    "include_cluster_authorized_operations": False,
                    "endpoint_type": 1,
                    "include_fenced_brokers": include_fenced_brokers,
                },
            )
            err = _item_error(response.error_code, response.error_message, "describe cluster")
            if err is not None:
                raise err
            brokers = tuple(
                sorted(
                    (
                        BrokerInfo(
                            int(b.broker_id),
                            b.host,
                            int(b.port),
                            b.rack,
                            bool(getattr(b, "is_fenced", False)),
                        )
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

    async def describe_quorum(self) -> QuorumInfo:
        """The metadata quorum as its leader describes it (DescribeQuorum).

        Only the quorum's leader answers; every other node says NOT_LEADER_OR_FOLLOWER. So
        each address of ``bootstrap.servers`` is asked in turn (controller listeners, or
        brokers that pass DescribeQuorum on) until one answers, as Kafka's admin client
        reaches the active controller."""
        failures: list[str] = []
        not_leaders = not_served = 0
        for host, port in self.config["bootstrap.servers"]:
            address = f"{host}:{port}"
            try:
                conn = await self.cluster.open_connection(host, port)
            except BrokerConnectionError as exc:
                failures.append(str(exc))
                continue
            try:
                answer = await self._describe_quorum_at(conn)
            except BrokerConnectionError as exc:
                failures.append(str(exc))
                continue
            finally:
                await conn.close()
            if isinstance(answer, QuorumInfo):
                return answer
            not_leaders += answer is ErrorCode.NOT_LEADER_OR_FOLLOWER
            not_served += answer == _NOT_SERVED
            failures.append(f"{address}: {_describe_error(answer)}")
        code: ErrorCode | None = None
        if not_leaders == len(failures):
            code = ErrorCode.NOT_LEADER_OR_FOLLOWER
        elif not_served == len(failures):
            # Nobody asked serves the API (a single node without a quorum, or brokers
            # that do not pass it on): UNSUPPORTED_VERSION, as Kafka's admin reports it.
            code = ErrorCode.UNSUPPORTED_VERSION
        raise ClientError("DescribeQuorum: " + "; ".join(failures), code=code)

    async def _describe_quorum_at(self, conn: Connection) -> QuorumInfo | ErrorCode | str:
        """The quorum, or why this address did not describe it (an error code it answered,
        or a sentence)."""
        served = conn.broker_ranges.get(ApiKey.DESCRIBE_QUORUM)
        if served is None:
            return _NOT_SERVED
        version = min(served[1], _MAX_DESCRIBE_QUORUM_VERSION)
        response = await self._call(
            conn,
            ApiKey.DESCRIBE_QUORUM,
            {"topics": [{"topic_name": METADATA_TOPIC, "partitions": [{"partition_index": 0}]}]},
            version=version,
        )
        code = ErrorCode.from_wire(int(response.error_code))
        partition = next(
            (p for t in response.topics if t.topic_name == METADATA_TOPIC for p in t.partitions),
            None,
        )
        if code is ErrorCode.NONE and partition is None:
            code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if code is ErrorCode.NONE and partition is not None:
            code = ErrorCode.from_wire(int(partition.error_code))
        if code is not ErrorCode.NONE or partition is None:
            return code

        def replica(r: Any) -> QuorumReplica:
            return QuorumReplica(
                int(r.replica_id),
                int(r.log_end_offset),
                int(getattr(r, "last_fetch_timestamp", -1)),
                int(getattr(r, "last_caught_up_timestamp", -1)),
            )

        return QuorumInfo(
            int(partition.leader_id),
            int(partition.leader_epoch),
            int(partition.high_watermark),
            tuple(replica(r) for r in partition.current_voters),
            tuple(replica(r) for r in partition.observers),
        )

    async def describe_log_dirs(self, node_id: int) -> list[LogDirDescription]:
        """The log dirs of broker ``node_id`` with the size of every partition each holds.

        A dir the broker cannot read is returned with its error, not raised: the other dirs
        of the same broker are still worth showing."""
        conn = await self.cluster.connection(node_id)
        response = await self._call(conn, ApiKey.DESCRIBE_LOG_DIRS, {"topics": None})
        err = _item_error(getattr(response, "error_code", 0), None, f"broker {node_id}")
        if err is not None:
            raise err
        dirs = []
        for r in response.results:
            code = ErrorCode.from_wire(int(r.error_code))
            dirs.append(
                LogDirDescription(
                    path=r.log_dir,
                    partition_sizes={
                        TopicPartition(t.name, int(p.partition_index)): int(p.partition_size)
                        for t in r.topics
                        for p in t.partitions
                    },
                    total_bytes=int(getattr(r, "total_bytes", -1)),
                    usable_bytes=int(getattr(r, "usable_bytes", -1)),
                    error=None if code is ErrorCode.NONE else f"{code.name}: {code.message}",
                )
            )
        return dirs

    # -- consumer groups ---------------------------------------------------------------------

    async def _backoff(self, attempt: int, deadline: float) -> bool:
        """Sleep before retry number ``attempt``; False when the deadline leaves no time."""
        delay = min(self.config["retry.backoff.ms"] * 2**attempt, _MAX_BACKOFF_MS) / 1000
        if time.monotonic() + delay >= deadline:
            return False
        await asyncio.sleep(delay)
        return True

    async def find_coordinator(self, group: str) -> BrokerInfo:
        """The broker coordinating ``group``, retried while no coordinator is available."""
        deadline = time.monotonic() + self._timeout_ms / 1000
        attempt = 0
        while True:
            try:
                return await self._find_coordinator_once(group)
            except ClientError as exc:
                retriable = exc.code in COORDINATOR_RETRY_CODES or isinstance(
                    exc, BrokerConnectionError
                )
                if not retriable or not await self._backoff(attempt, deadline):
                    raise
            attempt += 1

    async def _find_coordinator_once(self, key: str, key_type: int = GROUP_KEY) -> BrokerInfo:
        return await find_coordinator(
            self.cluster,
            key,
            key_type,
            timeout_ms=max(self._timeout_ms, self.config["request.timeout.ms"]),
        )

    async def _coordinated(
        self,
        key: str,
        attempt_call: Callable[[Connection], Awaitable[T]],
        key_type: int = GROUP_KEY,
    ) -> T:
        """``attempt_call`` on the connection to the coordinator of ``key`` (a group, or a
        transactional id with ``TRANSACTION_KEY``); the coordinator is looked up again and
        the call repeated while it moves or loads."""
        deadline = time.monotonic() + self._timeout_ms / 1000
        attempt = 0
        while True:
            try:
                coordinator = await self._find_coordinator_once(key, key_type)
                if coordinator.node_id not in self.cluster.metadata.brokers:
                    await self.cluster.refresh([])
                conn = await self.cluster.connection(coordinator.node_id)
                return await attempt_call(conn)
            except ClientError as exc:
                retriable = exc.code in COORDINATOR_RETRY_CODES or isinstance(
                    exc, BrokerConnectionError
                )
                if not retriable or not await self._backoff(attempt, deadline):
                    raise
            attempt += 1

    async def list_groups(self, states: Iterable[str] | None = None) -> list[GroupListing]:
        """Every group of every broker, optionally only those in ``states`` (e.g. "Empty")."""
        wanted = None if states is None else {s.lower() for s in states}
        await self.cluster.refresh([])
        nodes = sorted(self.cluster.metadata.brokers)
        found: dict[str, GroupListing] = {}
        errors: dict[object, ClientError] = {}
        for node in nodes:
            try:
                for listing in await self._list_groups_of(node, states):
                    found[listing.group_id] = listing
            except ClientError as exc:
                errors[f"broker {node}"] = exc
        _check(errors, "list groups")
        return sorted(
            (g for g in found.values() if wanted is None or g.state.lower() in wanted),
            key=lambda g: g.group_id,
        )

    async def _list_groups_of(self, node: int, states: Iterable[str] | None) -> list[GroupListing]:
        deadline = time.monotonic() + self._timeout_ms / 1000
        attempt = 0
        while True:
            conn = await self.cluster.connection(node)
            response = await self._call(
                conn,
                ApiKey.LIST_GROUPS,
                {"states_filter": list(states or ()), "types_filter": []},
            )
            code = ErrorCode.from_wire(int(response.error_code))
            if code is ErrorCode.NONE:
                return [
                    GroupListing(
                        group_id=g.group_id,
                        state=getattr(g, "group_state", ""),
                        protocol_type=g.protocol_type,
                        group_type=getattr(g, "group_type", ""),
                    )
                    for g in response.groups
                ]
            if code not in COORDINATOR_RETRY_CODES or not await self._backoff(attempt, deadline):
                raise broker_error(code, context=f"broker {node}")
            attempt += 1

    async def describe_groups(self, group_ids: Iterable[str]) -> dict[str, GroupDescription]:
        """State, protocol and members (with decoded assignments) of each group.

        A group that does not exist is described with state "Dead" by brokers that answer
        DescribeGroups below v6, and fails with GROUP_ID_NOT_FOUND from those at v6.
        """
        results: dict[str, GroupDescription] = {}
        errors: dict[object, ClientError] = {}
        for group in dict.fromkeys(group_ids):
            try:
                results[group] = await self._coordinated(
                    group, functools.partial(self._describe_group, group=group)
                )
            except ClientError as exc:
                errors[group] = exc
        _check(errors, "describe groups")
        return results

    async def _describe_group(self, conn: Connection, group: str) -> GroupDescription:
        response = await self._call(
            conn,
            ApiKey.DESCRIBE_GROUPS,
            {"groups": [group], "include_authorized_operations": False},
        )
        answer = _answer_for(response.groups, "group_id", group, f"group {group!r}")
        is_consumer = answer.protocol_type in ("consumer", "")
        members = []
        for m in answer.members:
            assignment: tuple[TopicPartition, ...] = ()
            subscription: Subscription | None = None
            if is_consumer:
                context = f"group {group!r} member {m.member_id!r}"
                try:
                    assignment = decode_assignment(m.member_assignment).partitions
                    if m.member_metadata:
                        subscription = decode_subscription(m.member_metadata)
                except ConsumerProtocolError as exc:
                    raise ConsumerProtocolError(f"{context}: {exc}") from None
            members.append(
                MemberDescription(
                    member_id=m.member_id,
                    group_instance_id=getattr(m, "group_instance_id", None),
                    client_id=m.client_id,
                    host=m.client_host,
                    assignment=assignment,
                    subscription=subscription,
                )
            )
        return GroupDescription(
            group_id=group,
            state=answer.group_state,
            protocol_type=answer.protocol_type,
            protocol=answer.protocol_data,
            members=tuple(members),
            coordinator=conn.node_id,
        )

    async def list_consumer_group_offsets(
        self, group: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The committed offsets of ``group``: of every partition it has committed for, or of
        ``partitions`` (None for those without a committed offset)."""
        wanted = None if partitions is None else [TopicPartition(*tp) for tp in partitions]
        return await self._coordinated(group, lambda conn: self._fetch_offsets(conn, group, wanted))

    async def _fetch_offsets(
        self, conn: Connection, group: str, wanted: list[TopicPartition] | None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        version = min(conn.version(ApiKey.OFFSET_FETCH), _MAX_OFFSET_FETCH_VERSION)
        if wanted is None and version < 2:
            raise ClientError(
                f"broker {conn.address} cannot list every offset of a group (OffsetFetch v{version})"
            )
        topics: list[dict[str, Any]] | None = None
        if wanted is not None:
            topics = [{"name": t, "partition_indexes": p} for t, p in _by_topic(wanted).items()]
        response = await conn.call(
            ApiKey.OFFSET_FETCH,
            {
                "group_id": group,
                "topics": topics,
                "groups": [{"group_id": group, "topics": topics}],
                "require_stable": False,
            },
            version=version,
            timeout_ms=self.config["request.timeout.ms"],
        )
        if hasattr(response, "groups"):
            answer = next((g for g in response.groups if g.group_id == group), None)
            if answer is None:
                raise broker_error(
                    ErrorCode.UNKNOWN_SERVER_ERROR,
                    "the coordinator did not answer for it",
                    context=f"group {group!r}",
                )
        else:
            answer = response
        err = _item_error(getattr(answer, "error_code", 0), None, f"group {group!r}")
        if err is not None:
            raise err
        out: dict[TopicPartition, OffsetAndMetadata | None] = {}
        errors: dict[object, ClientError] = {}
        for t in answer.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, int(p.partition_index))
                err = _item_error(p.error_code, None, f"group {group!r} {tp}")
                if err is not None:
                    if err.code in COORDINATOR_RETRY_CODES:
                        raise err
                    errors[tp] = err
                    continue
                offset = int(p.committed_offset)
                # -1: nothing committed for this partition.
                out[tp] = (
                    None
                    if offset < 0
                    else OffsetAndMetadata(
                        offset, p.metadata, int(getattr(p, "committed_leader_epoch", -1))
                    )
                )
        _check(errors, f"list offsets of group {group!r}")
        if wanted is not None:
            return {tp: out.get(tp) for tp in wanted}
        return {tp: o for tp, o in sorted(out.items()) if o is not None}

    async def alter_consumer_group_offsets(
        self, group: str, offsets: Mapping[TopicPartition, OffsetAndMetadata | int]
    ) -> None:
        """Commit ``offsets`` for ``group`` from outside it (generation -1, no member id).

        The group must have no active member: the coordinator refuses the commit otherwise
        (UNKNOWN_MEMBER_ID and similar), which is raised with that explanation.
        """
        commits = {
            TopicPartition(*tp): (o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(o))
            for tp, o in offsets.items()
        }
        for tp, o in commits.items():
            if o.offset < 0:
                raise ValueError(f"offset {o.offset} for {tp}: offsets are not negative")
        await self._coordinated(group, lambda conn: self._commit_offsets(conn, group, commits))

    async def _commit_offsets(
        self, conn: Connection, group: str, commits: Mapping[TopicPartition, OffsetAndMetadata]
    ) -> None:
        version = min(conn.version(ApiKey.OFFSET_COMMIT), _MAX_OFFSET_COMMIT_VERSION)
        by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for tp, o in commits.items():
            by_topic[tp.topic].append(
                {
                    "partition_index": tp.partition,
                    "committed_offset": o.offset,
                    "committed_leader_epoch": o.leader_epoch,
                    "committed_metadata": o.metadata,
                }
            )
        response = await conn.call(
            ApiKey.OFFSET_COMMIT,
            {
                "group_id": group,
                "generation_id_or_member_epoch": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
            },
            version=version,
            timeout_ms=self.config["request.timeout.ms"],
        )
        errors: dict[object, ClientError] = {}
        for t in response.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, int(p.partition_index))
                code = ErrorCode.from_wire(int(p.error_code))
                if code is ErrorCode.NONE:
                    continue
                if code in COORDINATOR_RETRY_CODES:
                    raise broker_error(code, context=f"group {group!r}")
                if code in _ACTIVE_GROUP_CODES:
                    errors[tp] = broker_error(
                        code,
                        f"group {group!r} has active members; offsets can be altered only "
                        "when the group is empty",
                    )
                else:
                    errors[tp] = broker_error(code)
        _check(errors, f"alter offsets of group {group!r}")

    async def delete_consumer_group_offsets(
        self, group: str, partitions: Iterable[TopicPartition]
    ) -> None:
        """Forget the committed offsets of ``partitions`` (the group must not be consuming
        those topics: GROUP_SUBSCRIBED_TO_TOPIC)."""
        wanted = [TopicPartition(*tp) for tp in partitions]
        await self._coordinated(group, lambda conn: self._delete_offsets(conn, group, wanted))

    async def _delete_offsets(
        self, conn: Connection, group: str, wanted: list[TopicPartition]
    ) -> None:
        by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for tp in wanted:
            by_topic[tp.topic].append({"partition_index": tp.partition})
        response = await self._call(
            conn,
            ApiKey.OFFSET_DELETE,
            {
                "group_id": group,
                "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
            },
        )
        err = _item_error(response.error_code, None, f"group {group!r}")
        if err is not None:
            raise err
        errors: dict[object, ClientError] = {}
        for t in response.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, int(p.partition_index))
                err = _item_error(p.error_code, None, "")
                if err is not None:
                    errors[tp] = err
        _check(errors, f"delete offsets of group {group!r}")

    async def delete_groups(self, group_ids: Iterable[str]) -> None:
        """Delete groups with no active member, with their committed offsets."""
        errors: dict[object, ClientError] = {}
        for group in dict.fromkeys(group_ids):
            try:
                await self._coordinated(group, functools.partial(self._delete_group, group=group))
            except ClientError as exc:
                errors[group] = exc
        _check(errors, "delete groups")

    async def _delete_group(self, conn: Connection, group: str) -> None:
        response = await self._call(conn, ApiKey.DELETE_GROUPS, {"groups_names": [group]})
        _answer_for(response.results, "group_id", group, f"group {group!r}")

    # -- transactions (KIP-664, Kafka's abortTransaction) -------------------------------------

    async def list_transactions(
        self,
        *,
        states: Iterable[str] | None = None,
        producer_ids: Iterable[int] | None = None,
        duration_filter_ms: int = -1,
    ) -> list[TransactionListing]:
        """The transactional ids every broker coordinates, each with its coordinator;
        only those in ``states``, of ``producer_ids``, and (ListTransactions v1+) whose
        transaction has been open longer than ``duration_filter_ms``, when given."""
        state_filter = list(states or ())
        producer_filter = list(producer_ids or ())
        await self.cluster.refresh([])
        found: list[TransactionListing] = []
        errors: dict[object, ClientError] = {}
        for node in sorted(self.cluster.metadata.brokers):
            try:
                found.extend(
                    await self._list_transactions_of(
                        node, state_filter, producer_filter, duration_filter_ms
                    )
                )
            except ClientError as exc:
                errors[f"broker {node}"] = exc
        _check(errors, "list transactions")
        return sorted(found, key=lambda t: (t.transactional_id, t.coordinator_id))

    async def _list_transactions_of(
        self, node: int, states: list[str], producer_ids: list[int], duration_filter_ms: int
    ) -> list[TransactionListing]:
        deadline = time.monotonic() + self._timeout_ms / 1000
        attempt = 0
        while True:
            conn = await self.cluster.connection(node)
            if duration_filter_ms >= 0 and conn.version(ApiKey.LIST_TRANSACTIONS) < 1:
                raise UnsupportedApiError(
                    f"broker {conn.address} cannot filter transactions by duration "
                    "(it serves ListTransactions below v1)"
                )
            response = await self._call(
                conn,
                ApiKey.LIST_TRANSACTIONS,
                {
                    "state_filters": states,
                    "producer_id_filters": producer_ids,
                    "duration_filter": duration_filter_ms,
                    "transactional_id_pattern": None,
                },
            )
            code = ErrorCode.from_wire(int(response.error_code))
            if code is ErrorCode.NONE:
                return [
                    TransactionListing(
                        t.transactional_id, int(t.producer_id), t.transaction_state, node
                    )
                    for t in response.transaction_states
                ]
            if code not in COORDINATOR_RETRY_CODES or not await self._backoff(attempt, deadline):
                raise broker_error(code, context=f"broker {node}")
            attempt += 1

    async def describe_transactions(
        self, transactional_ids: Iterable[str]
    ) -> dict[str, TransactionDescription]:
        """Each id as its coordinator (found with FindCoordinator key type 1) describes it;
        an unknown id fails with TRANSACTIONAL_ID_NOT_FOUND in the PartialFailureError."""
        results: dict[str, TransactionDescription] = {}
        errors: dict[object, ClientError] = {}
        for tid in dict.fromkeys(transactional_ids):
            try:
                results[tid] = await self._coordinated(
                    tid,
                    functools.partial(self._describe_transaction, tid=tid),
                    TRANSACTION_KEY,
                )
            except ClientError as exc:
                errors[tid] = exc
        _check(errors, "describe transactions")
        return results

    async def _describe_transaction(self, conn: Connection, tid: str) -> TransactionDescription:
        response = await self._call(
            conn, ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": [tid]}
        )
        answer = _answer_for(
            response.transaction_states, "transactional_id", tid, f"transactional id {tid!r}"
        )
        start = answer.transaction_start_time
        return TransactionDescription(
            transactional_id=tid,
            coordinator_id=conn.node_id,
            state=answer.transaction_state,
            producer_id=int(answer.producer_id),
            producer_epoch=int(answer.producer_epoch),
            transaction_timeout_ms=_millis(answer.transaction_timeout),
            transaction_start_ms=round(start.timestamp() * 1000),
            partitions=tuple(
                TopicPartition(t.topic, int(p)) for t in answer.topics for p in t.partitions
            ),
        )

    async def describe_producers(
        self, partitions: Iterable[TopicPartition], *, broker_id: int | None = None
    ) -> dict[TopicPartition, list[ProducerState]]:
        """The producers each partition's leader (or the replica on ``broker_id``) keeps
        state for (DescribeProducers), with the start offset of each one's open transaction
        there."""
        wanted = list(dict.fromkeys(TopicPartition(*tp) for tp in partitions))
        await self.cluster.refresh(sorted({tp.topic for tp in wanted}))
        by_leader: dict[int, list[TopicPartition]] = defaultdict(list)
        errors: dict[object, ClientError] = {}
        for tp in wanted:
            leader = self.cluster.metadata.leader(tp.topic, tp.partition)
            if broker_id is not None:
                by_leader[broker_id].append(tp)
            elif leader is None:
                known = tp.topic in self.cluster.metadata.topics
                code = (
                    ErrorCode.LEADER_NOT_AVAILABLE
                    if known
                    else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                )
                errors[tp] = broker_error(code, context=str(tp))
            else:
                by_leader[leader].append(tp)
        out: dict[TopicPartition, list[ProducerState]] = {}
        for leader, tps in sorted(by_leader.items()):
            by_topic: dict[str, list[int]] = defaultdict(list)
            for tp in tps:
                by_topic[tp.topic].append(tp.partition)
            conn = await self.cluster.connection(leader)
            response = await self._call(
                conn,
                ApiKey.DESCRIBE_PRODUCERS,
                {"topics": [{"name": t, "partition_indexes": p} for t, p in by_topic.items()]},
            )
            for t in response.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.name, int(p.partition_index))
                    err = _item_error(p.error_code, getattr(p, "error_message", None), str(tp))
                    if err is not None:
                        errors[tp] = err
                        continue
                    out[tp] = [
                        ProducerState(
                            producer_id=int(s.producer_id),
                            producer_epoch=int(s.producer_epoch),
                            last_sequence=int(s.last_sequence),
                            last_timestamp=int(s.last_timestamp),
                            coordinator_epoch=int(s.coordinator_epoch),
                            current_txn_start_offset=int(s.current_txn_start_offset),
                        )
                        for s in p.active_producers
                    ]
        _check(errors, "describe producers")
        return {tp: out[tp] for tp in wanted}

    async def abort_transaction(
        self,
        partition: TopicPartition,
        *,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
    ) -> None:
        """End the open transaction of a producer on one partition with an ABORT marker,
        sent to the partition's leader as a coordinator sends it (WriteTxnMarkers), as
        Kafka's ``Admin.abortTransaction`` does: the way out of a hanging transaction
        that no coordinator will ever end."""
        tp = TopicPartition(*partition)
        conn = await self.cluster.leader_connection(tp.topic, tp.partition)
        response = await self._call(
            conn,
            ApiKey.WRITE_TXN_MARKERS,
            {
                "markers": [
                    {
                        "producer_id": producer_id,
                        "producer_epoch": producer_epoch,
                        "transaction_result": False,
                        "topics": [{"name": tp.topic, "partition_indexes": [tp.partition]}],
                        "coordinator_epoch": coordinator_epoch,
                    }
                ]
            },
        )
        for marker in response.markers:
            for t in marker.topics:
                for p in t.partitions:
                    err = _item_error(p.error_code, None, f"abort the transaction on {tp}")
                    if err is not None:
                        raise err

    # -- SCRAM credentials (KIP-554) ---------------------------------------------------------

    async def alter_user_scram_credentials(
        self,
        upsertions: Iterable[tuple[str, str, int, str]] = (),
        deletions: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Set (user, mechanism, iterations, password) and delete (user, mechanism)
        credentials. The password never leaves this process: the broker is sent a random
        salt and the salted password, as Kafka's admin client sends them."""
        upserts = []
        for user, mechanism, iterations, password in upsertions:
            type_id, hash_name = _scram_mechanism(mechanism)
            salt = os.urandom(32)
            salted = hashlib.pbkdf2_hmac(hash_name, password.encode("utf-8"), salt, iterations)
            upserts.append(
                {"name": user, "mechanism": type_id, "iterations": iterations, "salt": salt,
                 "salted_password": salted}
            )  # fmt: skip
        deletes = [
            {"name": user, "mechanism": _scram_mechanism(mechanism)[0]}
            for user, mechanism in deletions
        ]
        response = await self._call_controller(
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS, {"deletions": deletes, "upsertions": upserts}
        )
        errors: dict[object, ClientError] = {}
        for r in response.results:
            err = _item_error(r.error_code, r.error_message, f"user {r.user!r}")
            if err is not None:
                errors[r.user] = err
        _check(errors, "alter SCRAM credentials")

    async def describe_user_scram_credentials(
        self, users: Iterable[str] | None = None
    ) -> dict[str, list[tuple[str, int]]]:
        """user -> [(mechanism, iterations)]; every user with credentials when ``users``
        is None."""
        wanted = None if users is None else [{"name": user} for user in users]
        response = await self._call_controller(
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, {"users": wanted}
        )
        err = _item_error(response.error_code, response.error_message, "describe SCRAM users")
        if err is not None:
            raise err
        names = {type_id: name for name, (type_id, _) in _SCRAM_MECHANISMS.items()}
        out: dict[str, list[tuple[str, int]]] = {}
        errors: dict[object, ClientError] = {}
        for r in response.results:
            item_err = _item_error(r.error_code, r.error_message, f"user {r.user!r}")
            if item_err is not None:
                errors[r.user] = item_err
                continue
            out[r.user] = [
                (names.get(int(c.mechanism), str(c.mechanism)), int(c.iterations))
                for c in r.credential_infos
            ]
        _check(errors, "describe SCRAM credentials")
        return out

    # -- client quotas (KIP-546) -------------------------------------------------------------

    async def alter_client_quotas(
        self,
        alterations: Iterable[tuple[Mapping[str, str | None], Mapping[str, float | None]]],
        *,
        validate_only: bool = False,
    ) -> None:
        """Set or remove quotas: (entity, {key: value, or None to remove}) per entity, an
        entity being {entity type: name, or None for the type's default}."""
        entries = [
            {
                "entity": [{"entity_type": t, "entity_name": n} for t, n in entity.items()],
                "ops": [
                    {"key": k, "value": 0.0 if v is None else float(v), "remove": v is None}
                    for k, v in ops.items()
                ],
            }
            for entity, ops in alterations
        ]
        response = await self._call_controller(
            ApiKey.ALTER_CLIENT_QUOTAS, {"entries": entries, "validate_only": validate_only}
        )
        errors: dict[object, ClientError] = {}
        for r in response.entries:
            name = ", ".join(f"{e.entity_type}={e.entity_name}" for e in r.entity)
            err = _item_error(r.error_code, r.error_message, f"quota entity {name}")
            if err is not None:
                errors[name] = err
        _check(errors, "alter client quotas")

    async def describe_client_quotas(
        self, components: Iterable[tuple[str, int, str | None]] = (), *, strict: bool = False
    ) -> list[tuple[dict[str, str | None], dict[str, float]]]:
        """(entity, quotas) of the entities matching every (entity type, match type, name)
        component: match type 0 exact name, 1 the default, 2 any name."""
        wanted = [{"entity_type": t, "match_type": m, "match": n} for t, m, n in components]
        response = await self._call_controller(
            ApiKey.DESCRIBE_CLIENT_QUOTAS, {"components": wanted, "strict": strict}
        )
        err = _item_error(response.error_code, response.error_message, "describe client quotas")
        if err is not None:
            raise err
        return [
            (
                {e.entity_type: e.entity_name for e in entry.entity},
                {v.key: float(v.value) for v in entry.values},
            )
            for entry in response.entries or ()
        ]

    # -- ACLs (KIP-140) ----------------------------------------------------------------------

    async def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        """Create ``bindings`` (one that exists already is accepted); PartialFailureError
        keyed by binding for those refused (INVALID_REQUEST, SECURITY_DISABLED...)."""
        wanted = list(bindings)
        creations = [
            {"resource_type": b.resource_type, "resource_name": b.resource_name,
             "resource_pattern_type": b.pattern_type, "principal": b.principal,
             "host": b.host, "operation": b.operation, "permission_type": b.permission}
            for b in wanted
        ]  # fmt: skip
        response = await self._call_controller(ApiKey.CREATE_ACLS, {"creations": creations})
        errors: dict[object, ClientError] = {}
        for binding, result in zip(wanted, response.results, strict=True):
            err = _item_error(result.error_code, result.error_message, "create ACL")
            if err is not None:
                errors[binding] = err
        _check(errors, "create ACLs")

    async def describe_acls(self, acl_filter: AclBindingFilter | None = None) -> list[AclBinding]:
        """The ACLs ``acl_filter`` matches (every ACL when None)."""
        response = await self._call_controller(
            ApiKey.DESCRIBE_ACLS, _filter_fields(acl_filter or AclBindingFilter())
        )
        err = _item_error(response.error_code, response.error_message, "describe ACLs")
        if err is not None:
            raise err
        return [
            _binding(r.resource_type, r.resource_name, r.pattern_type, acl)
            for r in response.resources
            for acl in r.acls
        ]

    async def delete_acls(self, filters: Iterable[AclBindingFilter]) -> list[list[AclBinding]]:
        """Delete the ACLs each filter matches; per filter, the ACLs it deleted.
        PartialFailureError keyed by filter for the filters refused."""
        wanted = list(filters)
        response = await self._call_controller(
            ApiKey.DELETE_ACLS, {"filters": [_filter_fields(f) for f in wanted]}
        )
        deleted: list[list[AclBinding]] = []
        errors: dict[object, ClientError] = {}
        for acl_filter, result in zip(wanted, response.filter_results, strict=True):
            err = _item_error(result.error_code, result.error_message, "delete ACLs")
            if err is not None:
                errors[acl_filter] = err
            deleted.append(
                [
                    _binding(m.resource_type, m.resource_name, m.pattern_type, m)
                    for m in result.matching_acls
                ]
            )
        _check(errors, "delete ACLs")
        return deleted


def _millis(value: Any) -> int:
    """kio reads millisecond durations as timedelta."""
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)


def _filter_fields(acl_filter: AclBindingFilter) -> dict[str, Any]:
    """The fields DescribeAcls and a DeleteAcls filter share."""
    return {
        "resource_type_filter": acl_filter.resource_type,
        "resource_name_filter": acl_filter.resource_name,
        "pattern_type_filter": acl_filter.pattern_type,
        "principal_filter": acl_filter.principal,
        "host_filter": acl_filter.host,
        "operation": acl_filter.operation,
        "permission_type": acl_filter.permission,
    }


def _binding(resource_type: Any, name: str, pattern_type: Any, entry: Any) -> AclBinding:
    return AclBinding(
        ResourceType(int(resource_type)),
        name,
        PatternType(int(pattern_type)),
        entry.principal,
        entry.host,
        AclOperation(int(entry.operation)),
        AclPermissionType(int(entry.permission_type)),
    )


# Kafka's SCRAM mechanism type ids and their hashes (the client cannot use the broker's table).
_SCRAM_MECHANISMS = {"SCRAM-SHA-256": (1, "sha256"), "SCRAM-SHA-512": (2, "sha512")}


def _scram_mechanism(name: str) -> tuple[int, str]:
    found = _SCRAM_MECHANISMS.get(name.upper())
    if found is None:
        raise ValueError(f"SCRAM mechanism {name!r}: expected {' or '.join(_SCRAM_MECHANISMS)}")
    return found


__all__ = ["AIOAdmin", "ClusterDescription"]
