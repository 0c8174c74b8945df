"""A node that is one voter of a metadata quorum (``controller.quorum.voters`` set): the
asyncio side that joins its controller, its broker and its :class:`RaftDriver`.

* **loading** -- the node's :class:`~tidelog.metadata.loader.MetadataLoader` is fed by
  :meth:`RaftDriver.subscribe` only: committed entries (the latest snapshot first), on the
  event loop, on every node. The broker's publishers see each committed change from there.
* **committing** (:class:`QuorumCommit` of the controller) -- the node that leads the quorum,
  once it has loaded everything up to its own LeaderChange entry, is the active controller:
  an operation is checked against the committed image in a worker thread under the
  controller's lock, its records are proposed as one entry, and the reply is given once the
  loader has applied that entry. Any other node's controller refuses with
  :class:`~tidelog.metadata.controller.NotControllerError`.
* **forwarding** -- the admin APIs that change metadata, taken on a broker listener of a node
  that is not the active controller, are sent as they came (the client's request, same
  version) to the active controller's controller listener (its address from
  ``controller.quorum.voters``, its id from the driver) and its answer is relayed. The
  controller listener itself never forwards: a node there that is not active closes the
  connection without an answer (:meth:`QuorumNode.controller_handlers`), and the
  forwarding node finds the new leader and sends again, until the request's timeout. Clients never see
  NOT_CONTROLLER.
* **the broker's lifecycle** -- the node's broker registers (BrokerRegistration) with the
  active controller -- in process when it is this node, over the controller listener
  otherwise -- and heartbeats (BrokerHeartbeat) every ``broker.heartbeat.interval.ms`` with
  the offset it has applied, so that it is unfenced once caught up; the app serves clients
  only after that.
* **snapshots** -- every node snapshots its loader's image when Kafka's limits say so
  (:class:`~tidelog.metadata.controller.snapshots.SnapshotPolicy`:
  ``metadata.log.max.record.bytes.between.snapshots``, ``metadata.log.max.snapshot.interval.ms``)
  and its Raft log is deleted below it; a restart loads the snapshot and the log after it.
* **DescribeQuorum** on a broker listener is answered by the leader, forwarded like the
  admin APIs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from tidelog.broker.authorization import answer_forwarded
from tidelog.broker.connection import CloseConnection
from tidelog.broker.raft_driver import NotLeaderError, RaftDriver
from tidelog.broker.reply import Handler
from tidelog.client.connection import Connection as ClientConnection
from tidelog.client.errors import ClientError
from tidelog.metadata.controller import (
    Controller,
    CreateTopicResult,
    NewTopic,
    NotControllerError,
)
from tidelog.metadata.controller.cluster import HeartbeatRequest, RegistrationRequest
from tidelog.metadata.controller.producer_ids import ProducerIdBlock
from tidelog.metadata.controller.snapshots import SnapshotPolicy, SnapshotSettings
from tidelog.metadata.errors import ApiError
from tidelog.metadata.loader import MetadataLoader
from tidelog.metadata.node import MetadataNode, load_entries
from tidelog.metadata.raft import Entry, OffsetAndEpoch, Role
from tidelog.metadata.raft.wire import check_describe_quorum, describe_quorum_response
from tidelog.metadata.records import BrokerEndpoint, MetadataRecord, encode_record
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.runtime.system import random_uuid

_log = logging.getLogger(__name__)

#: The APIs whose changes only the active controller makes; a node that is not active
#: forwards them (Kafka forwards the same ones from brokers).
FORWARDED_APIS = frozenset(
    {
        ApiKey.CREATE_TOPICS,
        ApiKey.DELETE_TOPICS,
        ApiKey.CREATE_PARTITIONS,
        ApiKey.ALTER_CONFIGS,
        ApiKey.INCREMENTAL_ALTER_CONFIGS,
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        ApiKey.ALTER_CLIENT_QUOTAS,
        ApiKey.CREATE_ACLS,
        ApiKey.DELETE_ACLS,
        ApiKey.ELECT_LEADERS,
        ApiKey.ALTER_PARTITION_REASSIGNMENTS,
        # Read-only, answered from the active controller's image, which is never behind
        # (Kafka's brokers forward it too).
        ApiKey.LIST_PARTITION_REASSIGNMENTS,
    }
)
#: Kafka's security protocol ids, as BrokerRegistration carries them.
_PROTOCOL_IDS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}
_DEFAULT_TIMEOUT_MS = 30_000
_RETRY_MS = 100
# How long a committed entry may take to reach the loader (it is fed on the event loop
# right after the commit): beyond that the loop is stuck and the operation gives up.
_LOAD_WAIT_S = 60.0


class QuorumNode:
    """See the module docstring. Built and started by :mod:`tidelog.broker.app`."""

    def __init__(self, node: MetadataNode, driver: RaftDriver) -> None:
        self._node = node
        self._driver = driver
        self._loader: MetadataLoader = node.loader
        self._controller: Controller = node.controller
        self._config = node.config
        self._voters = node.config.quorum_voters
        # A registration or heartbeat waits no longer than a quorum request would.
        self._membership_timeout_ms = node.config.raft_config.request_timeout_ms
        self._applied = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connections: dict[int, ClientConnection] = {}
        self._caught_up = False
        self._clock = node.runtime.clock
        self._snapshot_settings = SnapshotSettings.from_config(node.config)
        self._snapshots: SnapshotPolicy | None = None
        self._snapshot_due = False
        self.broker_epoch = -1
        self.fenced = True
        #: The directory ids of this node's log dirs that went offline after an I/O error
        #: (the broker app sets it); every heartbeat carries them to the controller.
        self.offline_log_dirs: Callable[[], tuple[uuid.UUID, ...]] = lambda: ()

    @property
    def driver(self) -> RaftDriver:
        return self._driver

    # -- start and stop ----------------------------------------------------------------

    async def start(self) -> None:
        """Start the driver and feed the loader from it; the controller commits through it."""
        self._loop = asyncio.get_running_loop()
        await self._driver.start()
        started_from = self._driver.node.log.latest_snapshot_id()
        self._snapshots = SnapshotPolicy(
            self._snapshot_settings,
            self._clock(),
            last_end_offset=started_from.offset if started_from is not None else 0,
        )
        self._driver.subscribe(self._on_commit, on_snapshot=self._on_snapshot)
        self._controller.use_quorum(self)

    async def close(self) -> None:
        for connection in self._connections.values():
            with contextlib.suppress(Exception):
                await connection.close()
        self._connections.clear()
        await self._driver.close()

    def _on_commit(self, entries: Sequence[Entry]) -> None:
        load_entries(self._loader, entries)
        if self._snapshots is not None:
            for entry in entries:
                if not entry.control:
                    self._snapshots.committed(sum(len(record) for record in entry.records))
            self._schedule_snapshot()
        self._note_applied()

    def _on_snapshot(self, snapshot_id: OffsetAndEpoch, records: tuple[bytes, ...]) -> None:
        if snapshot_id.offset - 1 > self._loader.image.offset:
            self._loader.load_snapshot(snapshot_id.offset, snapshot_id.epoch, records)
        if self._snapshots is not None:
            self._snapshots.snapshot_done(snapshot_id.offset, self._clock())
        self._note_applied()

    def _schedule_snapshot(self) -> None:
        # After the driver has finished handing out entries: writing a snapshot deletes
        # the log below it.
        if not self._snapshot_due:
            self._snapshot_due = True
            self._running_loop().call_soon(self.maybe_snapshot)

    def maybe_snapshot(self) -> None:
        """Write the snapshot the policy asks for now, if any (also polled on a timer, for
        ``metadata.log.max.snapshot.interval.ms``)."""
        self._snapshot_due = False
        policy = self._snapshots
        if policy is None:
            return
        now = self._clock()
        request = policy.poll(self._loader.image, now)
        if request is None:
            return
        node = self._driver.node
        if request.end_offset > node.snapshot_limit():
            return  # not flushed here yet; asked again with the next commit or timer
        snapshot_id = node.create_snapshot(request.end_offset, request.records, timestamp=now)
        policy.snapshot_done(snapshot_id.offset, now)
        _log.info(
            "metadata snapshot %020d-%010d written (%s)",
            snapshot_id.offset,
            snapshot_id.epoch,
            request.reason,
        )

    def _note_applied(self) -> None:
        driver = self._driver
        if (
            not self._caught_up
            and driver.leader_id is not None
            and self._loader.image.offset + 1 >= driver.high_watermark
        ):
            self._caught_up = True
        with self._applied:
            self._applied.notify_all()

    def not_ready_reason(self) -> str | None:
        """Why this node does not serve clients yet (None: it does)."""
        if self._driver.leader_id is None and not self._caught_up:
            return "the metadata quorum has no leader yet"
        if not self._caught_up:
            return "the metadata log is being loaded up to the quorum's high watermark"
        if self.broker_epoch < 0:
            return "the broker is not registered with the active controller yet"
        if self.fenced:
            return "the broker is fenced by the active controller"
        return None

    # -- QuorumCommit (worker threads, under the controller's lock) -------------------

    def active_epoch(self) -> int:
        driver = self._driver
        node = driver.node
        epoch = node.epoch
        if node.role is not Role.LEADER:
            raise NotControllerError(
                driver.leader_id, f"node {driver.node_id} is not the active controller"
            )
        # The leader's first entry of its epoch (LeaderChange) is loaded only once every
        # entry before it is: from then on the image holds everything committed.
        if self._loader.image.epoch != epoch:
            raise NotControllerError(None, "the new active controller is still loading")
        return epoch

    def next_offset(self) -> int:
        return self._driver.node.log.end_offset()

    def commit(self, records: Sequence[MetadataRecord]) -> int:
        loop = self._running_loop()
        encoded = [encode_record(record) for record in records]
        last = asyncio.run_coroutine_threadsafe(self._propose(encoded), loop).result()
        with self._applied:
            if not self._applied.wait_for(
                lambda: self._loader.image.offset >= last, timeout=_LOAD_WAIT_S
            ):
                raise NotControllerError(None, f"offset {last} was committed but not loaded")
        return last

    async def _propose(self, encoded: list[bytes]) -> int:
        try:
            return await self._driver.propose(encoded)
        except NotLeaderError as exc:
            raise NotControllerError(exc.leader_id, str(exc)) from exc

    def create_topic_at_active(self, topic: NewTopic) -> CreateTopicResult:
        loop = self._running_loop()
        future = asyncio.run_coroutine_threadsafe(self._create_topic_at_active(topic), loop)
        return future.result()

    async def _create_topic_at_active(self, topic: NewTopic) -> CreateTopicResult:
        values = {
            "topics": [
                {
                    "name": topic.name,
                    "num_partitions": topic.num_partitions,
                    "replication_factor": topic.replication_factor,
                    "assignments": [],
                    "configs": [
                        {"name": key, "value": value} for key, value in topic.configs.items()
                    ],
                }
            ],
            "timeout": _DEFAULT_TIMEOUT_MS,
            "validate_only": False,
        }
        try:
            response = await self._to_active(ApiKey.CREATE_TOPICS, values, 7, _DEFAULT_TIMEOUT_MS)
        except NotControllerError as exc:
            return CreateTopicResult(topic.name, ApiError(ErrorCode.NOT_CONTROLLER, str(exc)))
        (result,) = response.topics
        error = ApiError(ErrorCode.from_wire(int(result.error_code)), result.error_message)
        if error.ok:
            await self._wait_loaded_topic(topic.name)
        return CreateTopicResult(topic.name, error)

    def producer_ids_at_active(self) -> ProducerIdBlock:
        loop = self._running_loop()
        return asyncio.run_coroutine_threadsafe(self._producer_ids_at_active(), loop).result()

    async def _producer_ids_at_active(self) -> ProducerIdBlock:
        values = {"broker_id": self._config.node_id, "broker_epoch": self.broker_epoch}
        try:
            response = await self._to_active(
                ApiKey.ALLOCATE_PRODUCER_IDS, values, 0, _DEFAULT_TIMEOUT_MS
            )
        except NotControllerError as exc:
            return ProducerIdBlock(ApiError(ErrorCode.NOT_CONTROLLER, str(exc)))
        error = ErrorCode.from_wire(int(response.error_code))
        if error is not ErrorCode.NONE:
            return ProducerIdBlock(ApiError(error, None))
        return ProducerIdBlock(
            ApiError(ErrorCode.NONE, None),
            int(response.producer_id_start),
            int(response.producer_id_len),
        )

    async def _wait_loaded_topic(self, name: str) -> None:
        """Until this node's image has the topic the active controller created."""
        deadline = self._running_loop().time() + _DEFAULT_TIMEOUT_MS / 1000
        while self._loader.image.topic(name) is None and self._running_loop().time() < deadline:
            await asyncio.sleep(_RETRY_MS / 1000)

    # -- forwarding (event loop) --------------------------------------------------------

    def describe_quorum_handler(self) -> Handler:
        """DescribeQuorum on a broker listener: answered by the quorum's leader, here or
        forwarded to its controller listener, as Kafka's brokers do (so that an admin
        client's describeMetadataQuorum works through any broker)."""

        async def handle(ctx: Any, request: Any) -> Any:
            version = int(request.__version__)
            error = check_describe_quorum(request)
            if error is not ErrorCode.NONE:
                return describe_quorum_response(version, None, error)
            description = self._driver.describe()
            if description is not None:
                return describe_quorum_response(version, description)
            values = {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}
            try:
                return await self._to_active(
                    ApiKey.DESCRIBE_QUORUM, values, version, self._membership_timeout_ms
                )
            except NotControllerError:
                return describe_quorum_response(version, None, ErrorCode.NOT_LEADER_OR_FOLLOWER)

        return handle

    def controller_handlers(self, base: Mapping[int, Handler]) -> dict[int, Handler]:
        """``base`` (a controller listener's table) with every refusal of a controller that
        is not the active one turned into a quiet close of the connection: the node that
        sent the request finds the new leader and sends it again."""

        def refusing(key: int, handler: Handler) -> Handler:
            async def handle(ctx: Any, request: Any) -> Any:
                try:
                    return await handler(ctx, request)
                except NotControllerError as exc:
                    raise CloseConnection(f"{ApiKey(key).name}: NOT_CONTROLLER ({exc})") from exc

            return handle

        return {key: refusing(key, handler) for key, handler in base.items()}

    def forwarding_handlers(self, base: Mapping[int, Handler]) -> dict[int, Handler]:
        """``base`` with the APIs of :data:`FORWARDED_APIS` handled here when this node is
        the active controller and forwarded to it otherwise."""
        handlers = dict(base)
        for key in FORWARDED_APIS:
            local = base.get(key)
            if local is not None:
                handlers[key] = self._forwarding(ApiKey(key), local)
        return handlers

    def _forwarding(self, key: ApiKey, local: Handler) -> Handler:
        async def handle(ctx: Any, request: Any) -> Any:
            # The client's ACLs are checked here: the active controller sees this node.
            return await answer_forwarded(ctx, key, request, local, send)

        async def send(ctx: Any, request: Any) -> Any:
            timeout_ms = int(getattr(request, "timeout_ms", 0) or _DEFAULT_TIMEOUT_MS)
            loop = self._running_loop()
            deadline = loop.time() + timeout_ms / 1000
            while True:
                if self._controller.is_active():
                    try:
                        return await local(ctx, request)
                    except NotControllerError:
                        pass
                else:
                    values = {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}
                    remaining_ms = max(int((deadline - loop.time()) * 1000), 1)
                    try:
                        return await self._to_active(
                            key, values, int(request.__version__), remaining_ms, once=True
                        )
                    except NotControllerError:
                        pass
                if loop.time() >= deadline:
                    # Kafka's client retries on a closed connection, as on a timeout.
                    raise CloseConnection(
                        f"{key.name}: no active controller answered within {timeout_ms} ms"
                    )
                await asyncio.sleep(_RETRY_MS / 1000)

        return handle

    async def _to_active(
        self,
        key: ApiKey,
        values: Mapping[str, Any],
        version: int,
        timeout_ms: int,
        *,
        once: bool = False,
    ) -> Any:
        """Send a request to the active controller's controller listener and return its
        answer; NotControllerError when none answered (once, or within ``timeout_ms``: a
        controller that stopped answering is not waited on longer)."""
        loop = self._running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            leader = self._driver.leader_id
            if leader == self._driver.node_id and self._controller.is_active():
                # Became the active controller meanwhile: the caller does it here.
                raise NotControllerError(leader, "this node is the active controller now")
            if leader is not None and leader != self._driver.node_id:
                remaining_ms = max(int((deadline - loop.time()) * 1000), 1)
                try:
                    connection = await self._connection(leader)
                    return await self._unless_leader_moves(
                        leader,
                        connection,
                        connection.call(key, values, version=version, timeout_ms=remaining_ms),
                    )
                except (ClientError, OSError) as exc:
                    _log.debug("%s to controller %d failed: %s", key.name, leader, exc)
                    self._connections.pop(leader, None)
            if once or loop.time() >= deadline:
                raise NotControllerError(leader, f"controller {leader} did not answer {key.name}")
            await asyncio.sleep(_RETRY_MS / 1000)

    async def _unless_leader_moves(
        self, leader: int, connection: ClientConnection, call: Coroutine[Any, Any, Any]
    ) -> Any:
        """The answer of ``call`` sent to controller ``leader``, or ClientError as soon as
        the quorum no longer has ``leader`` as its leader. A controller that lost the
        leadership, or was cut off from the quorum, may never answer; its successor must be
        asked instead of waiting out the whole request timeout (meanwhile clients, and
        this node's own heartbeats, would wait with it). The connection is dropped with the
        abandoned request: its late answer would belong to no one."""
        task = asyncio.ensure_future(call)
        while True:
            done, _ = await asyncio.wait({task}, timeout=_RETRY_MS / 1000)
            if done:
                return task.result()
            if self._driver.leader_id != leader:
                task.cancel()
                # Retrieved, so that an answer or error that beat the cancel is not reported.
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
                if self._connections.get(leader) is connection:
                    del self._connections[leader]
                await connection.close()
                raise ClientError(f"controller {leader} is no longer the quorum's leader")

    async def _connection(self, node_id: int) -> ClientConnection:
        connection = self._connections.get(node_id)
        if connection is not None and connection.usable:
            return connection
        host, port = self._voters[node_id]
        # Every call passes its own timeout; the connection's own applies to the ApiVersions
        # exchange that opens it. A controller cut off behind a link that accepts and then
        # stays silent must fail that within a quorum request's timeout, not 30 s: the
        # heartbeats, and so the fencing of brokers, wait on it.
        quorum_timeout_ms = self._config.raft_config.request_timeout_ms
        connection = ClientConnection(
            host,
            port,
            node_id=node_id,
            client_id=f"tidelog-node-{self._driver.node_id}",
            request_timeout_ms=quorum_timeout_ms,
            connect_timeout_ms=quorum_timeout_ms,
            max_in_flight=16,
        )
        await connection.connect()
        other = self._connections.get(node_id)
        if other is not None and other.usable:
            # Another request connected meanwhile; one connection per controller is enough.
            await connection.close()
            return other
        self._connections[node_id] = connection
        return connection

    # -- the broker's registration and heartbeats (event loop) --------------------------

    async def register(self, run_blocking: Callable[..., Any]) -> None:
        """Register this node's broker with the active controller, then heartbeat until it
        is unfenced; retried (with the same incarnation) until it is."""
        config = self._config
        endpoints = tuple(
            BrokerEndpoint(e.name, e.host, e.port, e.security_protocol)
            for e in config.advertised_listeners
        )
        request = RegistrationRequest(
            config.node_id,
            self._loader.image.cluster_id,
            random_uuid(self._node.runtime.random),
            endpoints,
            config.get_str("broker.rack"),
        )
        while self.broker_epoch < 0:
            self.broker_epoch = await self._register_once(request, run_blocking)
            if self.broker_epoch < 0:
                await asyncio.sleep(_RETRY_MS / 1000)
        while self.fenced:
            await self.heartbeat(run_blocking)
            if self.fenced:
                await asyncio.sleep(_RETRY_MS / 1000)

    async def _register_once(
        self, request: RegistrationRequest, run_blocking: Callable[..., Any]
    ) -> int:
        if self._controller.is_active():
            try:
                reply = await run_blocking(self._controller.register_broker, request)
            except NotControllerError:
                return -1
            code, epoch = reply.error.code, int(reply.broker_epoch)
        else:
            values = {
                "broker_id": request.broker_id,
                "cluster_id": request.cluster_id,
                "incarnation_id": request.incarnation_id,
                "listeners": [
                    {
                        "name": e.name,
                        "host": e.host,
                        "port": e.port,
                        "security_protocol": _PROTOCOL_IDS[e.security_protocol],
                    }
                    for e in request.listeners
                ],
                "features": [],
                "rack": request.rack,
            }
            try:
                response = await self._to_active(
                    ApiKey.BROKER_REGISTRATION, values, 0, self._membership_timeout_ms, once=True
                )
            except NotControllerError:
                return -1
            code = ErrorCode.from_wire(int(response.error_code))
            epoch = int(response.broker_epoch)
        if code is not ErrorCode.NONE:
            _log.warning("broker registration refused: %s; trying again", code.name)
            return -1
        _log.info("broker %d registered with epoch %d", request.broker_id, epoch)
        return epoch

    async def heartbeat(self, run_blocking: Callable[..., Any]) -> None:
        """One BrokerHeartbeat with the offset this node has applied; registers again when
        the controller no longer knows the registration."""
        if self.broker_epoch < 0:
            return
        request = HeartbeatRequest(
            self._config.node_id,
            self.broker_epoch,
            self._loader.image.offset,
            offline_log_dirs=self.offline_log_dirs(),
        )
        if self._controller.is_active():
            try:
                reply = await run_blocking(self._controller.heartbeat, request)
            except NotControllerError:
                return
            code, fenced = reply.error.code, reply.is_fenced
        else:
            values: dict[str, Any] = {
                "broker_id": request.broker_id,
                "broker_epoch": request.broker_epoch,
                "current_metadata_offset": request.current_metadata_offset,
                "want_fence": False,
                "want_shut_down": False,
            }
            version = 0
            if request.offline_log_dirs:
                # OfflineLogDirs is a tagged field of v1.
                values["offline_log_dirs"] = request.offline_log_dirs
                version = 1
            try:
                response = await self._to_active(
                    ApiKey.BROKER_HEARTBEAT,
                    values,
                    version,
                    self._membership_timeout_ms,
                    once=True,
                )
            except NotControllerError:
                return
            code, fenced = ErrorCode.from_wire(int(response.error_code)), bool(response.is_fenced)
        if code in (ErrorCode.STALE_BROKER_EPOCH, ErrorCode.BROKER_ID_NOT_REGISTERED):
            _log.warning("broker %d must register again: %s", request.broker_id, code.name)
            self.broker_epoch = -1
            self.fenced = True
            return
        if code is ErrorCode.NONE:
            self.fenced = fenced

    # -- helpers -------------------------------------------------------------------------

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the quorum node has not started"
        return self._loop
