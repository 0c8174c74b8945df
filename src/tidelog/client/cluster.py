"""The cluster as a client sees it: connections per broker and a cache of metadata.

:class:`ClusterClient` is shared by the producer, consumer and admin cores. It bootstraps from
``bootstrap.servers`` (trying each address in turn), keeps one :class:`Connection` per broker
node id (opened on first use, reopened after a failure), and caches the last Metadata answer
as an immutable :class:`ClusterMetadata`. Metadata is refreshed on demand
(:meth:`ClusterClient.refresh`), when it is older than ``metadata.max.age.ms``, and by the
callers when a broker answers NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION or
LEADER_NOT_AVAILABLE. A refresh for some topics merges into the cache; a refresh of all topics
replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tidelog.client.config import Config
from tidelog.client.connection import Connection
from tidelog.client.errors import (
    BrokerConnectionError,
    ClientClosedError,
    ClientError,
    broker_error,
)
from tidelog.client.messages import ZERO_UUID
from tidelog.protocol import ApiKey, ErrorCode

# Codes after which the cached leader of a partition is not to be trusted.
STALE_METADATA_CODES = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.NOT_CONTROLLER,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.KAFKA_STORAGE_ERROR,
    }
)


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None
    #: fenced by the controller (only DescribeCluster asked with include_fenced_brokers says)
    fenced: bool = False


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    error: ErrorCode = ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID | None
    is_internal: bool
    partitions: tuple[PartitionInfo, ...]
    error: ErrorCode = ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    cluster_id: str | None = None
    controller_id: int = -1
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    topics: dict[str, TopicInfo] = field(default_factory=dict)

    def leader(self, topic: str, partition: int) -> int | None:
        info = self.topics.get(topic)
        if info is None or not 0 <= partition < len(info.partitions):
            return None
        leader = info.partitions[partition].leader
        return leader if leader >= 0 and leader in self.brokers else None

    def topic_id(self, topic: str) -> uuid.UUID | None:
        info = self.topics.get(topic)
        if info is None or info.topic_id in (None, ZERO_UUID):
            return None
        return info.topic_id

    def available_partitions(self, topic: str) -> list[int]:
        info = self.topics.get(topic)
        if info is None:
            return []
        return [p.partition for p in info.partitions if p.leader >= 0]


def _parse_metadata(response: Any) -> tuple[ClusterMetadata, dict[str, ErrorCode]]:
    brokers = {
        int(b.node_id): BrokerInfo(int(b.node_id), b.host, int(b.port), getattr(b, "rack", None))
        for b in response.brokers
    }
    topics: dict[str, TopicInfo] = {}
    errors: dict[str, ErrorCode] = {}
    for t in response.topics:
        name = t.name
        if name is None:
            continue
        code = ErrorCode.from_wire(int(t.error_code))
        if code is not ErrorCode.NONE:
            errors[name] = code
            continue
        parts = sorted(
            (
                PartitionInfo(
                    topic=name,
                    partition=int(p.partition_index),
                    leader=int(p.leader_id),
                    leader_epoch=int(getattr(p, "leader_epoch", -1)),
                    replicas=tuple(int(r) for r in p.replica_nodes),
                    isr=tuple(int(r) for r in p.isr_nodes),
                    offline_replicas=tuple(int(r) for r in getattr(p, "offline_replicas", ())),
                    error=ErrorCode.from_wire(int(p.error_code)),
                )
                for p in t.partitions
            ),
            key=lambda p: p.partition,
        )
        topics[name] = TopicInfo(
            name=name,
            topic_id=getattr(t, "topic_id", None),
            is_internal=bool(getattr(t, "is_internal", False)),
            partitions=tuple(parts),
        )
    metadata = ClusterMetadata(
        cluster_id=getattr(response, "cluster_id", None),
        controller_id=int(getattr(response, "controller_id", -1)),
        brokers=brokers,
        topics=topics,
    )
    return metadata, errors


class ClusterClient:
    """Connections to the brokers of one cluster plus its metadata cache."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.metadata = ClusterMetadata()
        self._updated_at = 0.0
        self._all_topics_known = False
        self._connections: dict[int, Connection] = {}
        self._bootstrap: Connection | None = None
        self._connecting: dict[int, asyncio.Future[Connection]] = {}
        self._refresh_lock = asyncio.Lock()
        self._closed = False

    def _new_connection(self, host: str, port: int, node_id: int) -> Connection:
        c = self.config
        return Connection(
            host,
            port,
            node_id=node_id,
            client_id=c["client.id"],
            request_timeout_ms=c["request.timeout.ms"],
            connect_timeout_ms=c["socket.connection.setup.timeout.ms"],
            max_in_flight=c["max.in.flight.requests.per.connection"],
            max_frame_size=c["receive.message.max.bytes"],
        )

    async def open_connection(self, host: str, port: int) -> Connection:
        """A new connection to ``host:port`` outside the cluster's own (a controller listener,
        say); the caller closes it."""
        self._check_open()
        conn = self._new_connection(host, port, -1)
        await conn.connect()
        return conn

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the client is closed")

    async def any_connection(self) -> Connection:
        """A usable connection to some broker: a known one, else a bootstrap server."""
        self._check_open()
        for conn in self._connections.values():
            if conn.usable:
                return conn
        for node_id in list(self.metadata.brokers):
            with contextlib.suppress(BrokerConnectionError):
                return await self.connection(node_id)
        if self._bootstrap is not None and self._bootstrap.usable:
            return self._bootstrap
        errors = []
        for host, port in self.config["bootstrap.servers"]:
            conn = self._new_connection(host, port, -1)
            try:
                await conn.connect()
            except BrokerConnectionError as exc:
                errors.append(str(exc))
                continue
            self._bootstrap = conn
            return conn
        raise BrokerConnectionError("no bootstrap server answered: " + "; ".join(errors))

    async def connection(self, node_id: int) -> Connection:
        """The connection to broker ``node_id`` (opened if needed)."""
        self._check_open()
        conn = self._connections.get(node_id)
        if conn is not None and conn.usable:
            return conn
        waiting = self._connecting.get(node_id)
        if waiting is not None:
            return await asyncio.shield(waiting)
        broker = self.metadata.brokers.get(node_id)
        if broker is None:
            await self.refresh()
            broker = self.metadata.brokers.get(node_id)
            if broker is None:
                raise BrokerConnectionError(f"broker {node_id} is not in the cluster metadata")
        future: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._connecting[node_id] = future
        try:
            conn = self._new_connection(broker.host, broker.port, node_id)
            await conn.connect()
            self._connections[node_id] = conn
            future.set_result(conn)
            return conn
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            del self._connecting[node_id]

    async def leader_connection(self, topic: str, partition: int) -> Connection:
        leader = self.metadata.leader(topic, partition)
        if leader is None:
            await self.refresh([topic])
            leader = self.metadata.leader(topic, partition)
            if leader is None:
                raise ClientError(
                    f"no leader known for {topic}-{partition}",
                    code=ErrorCode.LEADER_NOT_AVAILABLE,
                )
        return await self.connection(leader)

    async def controller_connection(self) -> Connection:
        if (
            self.metadata.controller_id < 0
            or self.metadata.controller_id not in self.metadata.brokers
        ):
            await self.refresh([])
        controller = self.metadata.controller_id
        if controller in self.metadata.brokers:
            return await self.connection(controller)
        return await self.any_connection()

    def stale(self) -> bool:
        age_ms = (time.monotonic() - self._updated_at) * 1000
        return bool(age_ms > self.config["metadata.max.age.ms"])

    async def refresh(
        self, topics: Iterable[str] | None = None, *, allow_auto_create: bool = False
    ) -> dict[str, ErrorCode]:
        """Fetch metadata (for ``topics``, or every topic when None); return per-topic errors."""
        wanted = None if topics is None else sorted(set(topics))
        async with self._refresh_lock:
            conn = await self.any_connection()
            version = conn.version(ApiKey.METADATA)
            if wanted is None:
                # v0 reads an empty list as "all topics"; later versions use null.
                request_topics: list[dict[str, Any]] | None = [] if version == 0 else None
            elif not wanted and version == 0:
                request_topics = [{"name": "__no_such_topic_requested__"}]
            else:
                request_topics = [{"name": t, "topic_id": None} for t in wanted]
            try:
                response = await conn.call(
                    ApiKey.METADATA,
                    {
                        "topics": request_topics,
                        "allow_auto_topic_creation": allow_auto_create,
                        "include_topic_authorized_operations": False,
                        "include_cluster_authorized_operations": False,
                    },
                )
            except BrokerConnectionError:
                await self._drop(conn)
                raise
            fresh, errors = _parse_metadata(response)
            if wanted is None:
                topics_map = fresh.topics
                self._all_topics_known = True
            else:
                topics_map = dict(self.metadata.topics)
                for name in wanted:
                    topics_map.pop(name, None)
                topics_map.update(fresh.topics)
            self.metadata = ClusterMetadata(
                cluster_id=fresh.cluster_id,
                controller_id=fresh.controller_id,
                brokers=fresh.brokers or self.metadata.brokers,
                topics=topics_map,
            )
            self._updated_at = time.monotonic()
            return errors

    async def topic(self, name: str, *, allow_auto_create: bool = False) -> TopicInfo:
        """Metadata of one topic, refreshed when missing or stale.

        :raises ClientError: the broker reports an error for the topic (e.g.
            UNKNOWN_TOPIC_OR_PARTITION).
        """
        info = self.metadata.topics.get(name)
        if info is not None and not self.stale():
            return info
        errors = await self.refresh([name], allow_auto_create=allow_auto_create)
        info = self.metadata.topics.get(name)
        if info is None:
            code = errors.get(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            raise ClientError(f"topic {name!r}: {code.message}", code=code)
        return info

    async def _drop(self, conn: Connection) -> None:
        if self._connections.get(conn.node_id) is conn:
            del self._connections[conn.node_id]
        if self._bootstrap is conn:
            self._bootstrap = None
        await conn.close()

    async def forget(self, conn: Connection) -> None:
        """Close ``conn`` after a failure; the next call opens a new one."""
        await self._drop(conn)

    async def close(self) -> None:
        self._closed = True
        conns = list(self._connections.values())
        if self._bootstrap is not None:
            conns.append(self._bootstrap)
        self._connections.clear()
        self._bootstrap = None
        for conn in conns:
            await conn.close()


#: FindCoordinator key types: a consumer group, a transactional id.
GROUP_KEY = 0
TRANSACTION_KEY = 1


async def find_coordinator(
    cluster: ClusterClient, key: str, key_type: int = GROUP_KEY, *, timeout_ms: int | None = None
) -> BrokerInfo:
    """The broker coordinating ``key`` (one FindCoordinator to any broker); the answer's
    error raised as a :class:`ClientError` (COORDINATOR_NOT_AVAILABLE while it loads...)."""
    conn = await cluster.any_connection()
    try:
        response = await conn.call(
            ApiKey.FIND_COORDINATOR,
            {"key": key, "key_type": key_type, "coordinator_keys": [key]},
            timeout_ms=timeout_ms,
        )
    except BrokerConnectionError:
        await cluster.forget(conn)
        raise
    # v4+ answers a list (one entry per key asked); earlier versions answer inline.
    answer = response.coordinators[0] if hasattr(response, "coordinators") else response
    code = ErrorCode.from_wire(int(answer.error_code))
    if code is not ErrorCode.NONE:
        what = "group" if key_type == GROUP_KEY else "transactional id"
        raise broker_error(code, getattr(answer, "error_message", None), context=f"{what} {key!r}")
    return BrokerInfo(int(answer.node_id), answer.host, int(answer.port))
