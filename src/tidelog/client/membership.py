"""Consumer group membership over Kafka's classic group protocol.

Pieces:

- :class:`CoordinatorLink` finds the group's coordinator (FindCoordinator) and talks to it over
  two connections of its own: one for JoinGroup and SyncGroup, which the coordinator holds until
  the rebalance completes, and one for everything else (Heartbeat, OffsetCommit, OffsetFetch,
  LeaveGroup), so that neither waits behind the other or behind fetches. While the coordinator
  moves or loads (COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, a
  lost connection) a call looks it up again and retries with backoff until its deadline.
- :class:`GroupMembership` is the member: :meth:`GroupMembership.join` runs JoinGroup (with the
  KIP-394 retry: a first join without a member id is answered MEMBER_ID_REQUIRED and a member
  id, and is repeated with it) and SyncGroup until it holds an assignment; when this member
  leads, it runs the assignor the group chose over every member's subscription. A background
  task heartbeats every ``heartbeat.interval.ms`` while the member is stable; it only records
  what it learns, and the consumer acts on it in its next poll:

  - REBALANCE_IN_PROGRESS: ``need_rejoin``;
  - ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID: the partitions are ``lost`` (another member may
    own them already) and the member joins again (without its member id after UNKNOWN_MEMBER_ID);
  - FENCED_INSTANCE_ID (another process took our ``group.instance.id``): fatal, ``error``.

  When the consumer has not polled for ``max.poll.interval.ms`` the heartbeat task leaves the
  group (a static member only stops heartbeating, as Kafka's consumer does) and marks the
  partitions lost; the next poll joins again.

  When no heartbeat has been answered for ``session.timeout.ms`` (the coordinator is down or
  unreachable), the coordinator has expired this member by now, or will before it can answer:
  the member declares itself out of the group, its partitions ``lost`` (another member may be
  consuming them already, so they must not be committed for), forgets the coordinator and
  joins again — the member keeps its id, which the coordinator refuses with UNKNOWN_MEMBER_ID
  if it did expire it. Any answer, even an error, proves the coordinator alive.

States: UNJOINED -> JOINING -> STABLE; any failure or leave goes back to UNJOINED. The member's
generation and id are those of the last successful SyncGroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from tidelog.client.assignors import Assignor, GroupMember
from tidelog.client.cluster import BrokerInfo, ClusterClient, find_coordinator
from tidelog.client.config import Config
from tidelog.client.connection import Connection
from tidelog.client.errors import (
    BrokerConnectionError,
    ClientClosedError,
    ClientError,
    RequestTimeoutError,
    broker_error,
)
from tidelog.client.groups import (
    HIGHEST_CONSUMER_PROTOCOL_VERSION,
    Assignment,
    ConsumerProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from tidelog.client.types import TopicPartition
from tidelog.protocol import ApiKey, ErrorCode

log = logging.getLogger(__name__)

PROTOCOL_TYPE = "consumer"

# The coordinator is moving or loading: look it up again and retry.
COORDINATOR_RETRY_CODES = frozenset(
    {
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
# Kafka's retry.backoff.max.ms default: the backoff doubles up to this.
_MAX_BACKOFF_MS = 1000


class WakeupError(ClientError):
    """A blocking call was interrupted by :meth:`wakeup`."""


class CommitFailedError(ClientError):
    """A commit was refused because this member is no longer part of the group's current
    generation (the partitions may belong to another member by now)."""


class RebalanceListener:
    """Called by the consumer, from ``poll`` (and ``close``/``unsubscribe``), around rebalances.

    Methods may be plain functions or coroutines; they get the partitions sorted.
    ``on_revoked``: partitions taken away in an orderly rebalance (commit their offsets here).
    ``on_assigned``: partitions given to this member (positions are already the committed
    offsets; a seek here overrides them). ``on_lost``: partitions this member no longer owns
    and may not commit for (its membership ended); by default the same as ``on_revoked``.
    """

    def on_assigned(self, partitions: list[TopicPartition]) -> Any:
        return None

    def on_revoked(self, partitions: list[TopicPartition]) -> Any:
        return None

    def on_lost(self, partitions: list[TopicPartition]) -> Any:
        return self.on_revoked(partitions)


class State(enum.Enum):
    UNJOINED = "unjoined"
    JOINING = "joining"
    STABLE = "stable"


class Channel(Protocol):
    """How the membership reaches its coordinator (a fake one in tests)."""

    async def call(
        self,
        api_key: ApiKey,
        values: Mapping[str, Any],
        *,
        blocking: bool = False,
        timeout_ms: int | None = None,
        deadline: float | None = None,
    ) -> Any: ...

    async def mark_dead(self) -> None:
        """Forget the coordinator: the next call looks it up again."""

    async def close(self) -> None: ...


def _code(response: Any) -> ErrorCode:
    return ErrorCode.from_wire(int(getattr(response, "error_code", 0)))


class CoordinatorLink:
    """The connections to one group's coordinator (see the module docstring)."""

    def __init__(self, cluster: ClusterClient, group_id: str, config: Config) -> None:
        self.cluster = cluster
        self.group_id = group_id
        self.config = config
        self.coordinator: BrokerInfo | None = None
        self._lanes: dict[bool, Connection] = {}
        self._lookup = asyncio.Lock()
        self._opening = {True: asyncio.Lock(), False: asyncio.Lock()}
        self._closed = False

    async def _find(self) -> BrokerInfo:
        async with self._lookup:
            if self.coordinator is not None:
                return self.coordinator
            self.coordinator = await find_coordinator(self.cluster, self.group_id)
            return self.coordinator

    async def _connection(self, blocking: bool) -> Connection:
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        conn = self._lanes.get(blocking)
        if conn is not None and conn.usable:
            return conn
        # One connection per lane: concurrent callers wait for the one being opened.
        async with self._opening[blocking]:
            conn = self._lanes.get(blocking)
            if conn is not None and conn.usable:
                return conn
            return await self._open(blocking)

    async def _open(self, blocking: bool) -> Connection:
        coordinator = await self._find()
        c = self.config
        conn = Connection(
            coordinator.host,
            coordinator.port,
            node_id=coordinator.node_id,
            client_id=c["client.id"],
            request_timeout_ms=c["request.timeout.ms"],
            connect_timeout_ms=c["socket.connection.setup.timeout.ms"],
            max_in_flight=c["max.in.flight.requests.per.connection"],
            max_frame_size=c["receive.message.max.bytes"],
        )
        try:
            await conn.connect()
        except BrokerConnectionError:
            self.coordinator = None
            raise
        if self._closed:
            await conn.close()
            raise ClientClosedError("the consumer is closed")
        self._lanes[blocking] = conn
        return conn

    async def mark_dead(self) -> None:
        """Forget the coordinator; the next call looks it up again."""
        self.coordinator = None
        lanes, self._lanes = list(self._lanes.values()), {}
        for conn in lanes:
            await conn.close()

    async def version(self, api_key: ApiKey) -> int:
        return (await self._connection(False)).version(api_key)

    async def call(
        self,
        api_key: ApiKey,
        values: Mapping[str, Any],
        *,
        blocking: bool = False,
        timeout_ms: int | None = None,
        deadline: float | None = None,
        max_version: int | None = None,
        check: Callable[[Any], None] | None = None,
    ) -> Any:
        """``api_key`` to the coordinator; ``check`` may raise a ClientError for the response,
        which is retried like a top-level coordinator error when its code is one."""
        if deadline is None:
            deadline = time.monotonic() + self.config["default.api.timeout.ms"] / 1000
        attempt = 0
        while True:
            try:
                conn = await self._connection(blocking)
                version = conn.version(api_key)
                if max_version is not None:
                    version = min(version, max_version)
                response = await conn.call(api_key, values, version=version, timeout_ms=timeout_ms)
                code = _code(response)
                if code in COORDINATOR_RETRY_CODES:
                    raise broker_error(code, context=f"group {self.group_id!r}")
                if check is not None:
                    check(response)
                return response
            except ClientError as exc:
                if isinstance(exc, ClientClosedError) or self._closed:
                    raise
                # An unanswered request counts as a lost coordinator too: it may be hung or
                # cut off, and the next lookup may find another one.
                lost = isinstance(exc, (BrokerConnectionError, RequestTimeoutError))
                if not lost and exc.code not in COORDINATOR_RETRY_CODES:
                    raise
                await self.mark_dead()
                delay = min(self.config["retry.backoff.ms"] * 2**attempt, _MAX_BACKOFF_MS) / 1000
                if time.monotonic() + delay >= deadline:
                    raise
                await asyncio.sleep(delay)
                attempt += 1

    async def close(self) -> None:
        self._closed = True
        await self.mark_dead()


PartitionCounts = Callable[[Iterable[str]], Awaitable[Mapping[str, int]]]


class GroupMembership:
    """One consumer's membership of its group (see the module docstring)."""

    def __init__(
        self,
        channel: Channel,
        config: Config,
        assignors: Sequence[Assignor],
        partition_counts: PartitionCounts,
    ) -> None:
        if not assignors:
            raise ValueError("at least one assignor is required")
        self.channel = channel
        self.config = config
        self.group_id: str = config["group.id"]
        self.group_instance_id: str | None = config["group.instance.id"]
        self.assignors = list(assignors)
        self._partition_counts = partition_counts
        self.member_id = ""
        self.generation = -1
        self.protocol: str | None = None
        self.leader_id = ""
        self.state = State.UNJOINED
        self.need_rejoin = True
        self.lost = False
        self.error: ClientError | None = None
        self.poll_timed_out = False
        # When the coordinator last answered a heartbeat (or completed the join): the member
        # declares itself out of the group once this is session.timeout.ms old.
        self._last_answer = time.monotonic()
        # What the last assignment this member made as leader was based on.
        self.group_topics: frozenset[str] = frozenset()
        self.assigned_counts: dict[str, int] = {}
        self._last_poll = time.monotonic()
        self._in_poll = 0
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def is_leader(self) -> bool:
        return self.state is State.STABLE and self.member_id == self.leader_id != ""

    # -- poll timer ----------------------------------------------------------------------------

    def poll_started(self) -> None:
        self._in_poll += 1
        self._last_poll = time.monotonic()

    def poll_finished(self) -> None:
        self._in_poll -= 1
        self._last_poll = time.monotonic()

    def _poll_expired(self) -> bool:
        waited_ms = (time.monotonic() - self._last_poll) * 1000
        return self._in_poll == 0 and waited_ms > self.config["max.poll.interval.ms"]

    # -- joining -------------------------------------------------------------------------------

    def _protocols(
        self, topics: Sequence[str], owned: Sequence[TopicPartition]
    ) -> list[dict[str, Any]]:
        rack = self.config["client.rack"] or None
        return [
            {
                "name": assignor.name,
                "metadata": encode_subscription(
                    Subscription(
                        version=HIGHEST_CONSUMER_PROTOCOL_VERSION,
                        topics=tuple(sorted(topics)),
                        user_data=assignor.user_data(self.generation, owned),
                        owned_partitions=tuple(sorted(owned)),
                        generation_id=self.generation,
                        rack_id=rack,
                    )
                ),
            }
            for assignor in self.assignors
        ]

    async def _backoff(self, attempt: int) -> None:
        delay = min(self.config["retry.backoff.ms"] * 2**attempt, _MAX_BACKOFF_MS)
        await asyncio.sleep(delay / 1000)

    def _fatal(self, code: ErrorCode, what: str) -> ClientError:
        error = broker_error(code, context=f"group {self.group_id!r}: {what}")
        if code is ErrorCode.FENCED_INSTANCE_ID:
            self.error = error
        self.state = State.UNJOINED
        return error

    async def join(
        self, topics: Sequence[str], owned: Sequence[TopicPartition]
    ) -> list[TopicPartition]:
        """Join (or rejoin) with a subscription of ``topics`` while owning ``owned``; returns
        the assignment of the new generation."""
        if self.error is not None:
            raise self.error
        c = self.config
        rebalance_ms = c["max.poll.interval.ms"]
        # The coordinator answers JoinGroup when the rebalance completes, up to its timeout.
        join_timeout_ms = max(c["request.timeout.ms"], rebalance_ms + 5000)
        self.state = State.JOINING
        self.poll_timed_out = False
        attempt = 0
        while True:
            if self._closed:
                raise ClientClosedError("the consumer is closed")
            response = await self.channel.call(
                ApiKey.JOIN_GROUP,
                {
                    "group_id": self.group_id,
                    "session_timeout": c["session.timeout.ms"],
                    "rebalance_timeout": rebalance_ms,
                    "member_id": self.member_id,
                    "group_instance_id": self.group_instance_id,
                    "protocol_type": PROTOCOL_TYPE,
                    "protocols": self._protocols(topics, owned),
                    "reason": None,
                },
                blocking=True,
                timeout_ms=join_timeout_ms,
                deadline=time.monotonic() + join_timeout_ms / 1000,
            )
            code = _code(response)
            if code is ErrorCode.MEMBER_ID_REQUIRED:
                self.member_id = response.member_id
                continue
            if code is ErrorCode.UNKNOWN_MEMBER_ID:
                self.member_id = ""
                self.generation = -1
                await self._backoff(attempt)
                attempt += 1
                continue
            if code in (ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION):
                await self._backoff(attempt)
                attempt += 1
                continue
            if code is not ErrorCode.NONE:
                raise self._fatal(code, "JoinGroup")
            self.member_id = response.member_id
            self.leader_id = response.leader
            self.protocol = response.protocol_name
            generation = int(response.generation_id)
            assignments: list[dict[str, Any]] = []
            if self.member_id == response.leader and not getattr(
                response, "skip_assignment", False
            ):
                assignments = await self._assign(response.members)
            sync = await self.channel.call(
                ApiKey.SYNC_GROUP,
                {
                    "group_id": self.group_id,
                    "generation_id": generation,
                    "member_id": self.member_id,
                    "group_instance_id": self.group_instance_id,
                    "protocol_type": PROTOCOL_TYPE,
                    "protocol_name": self.protocol,
                    "assignments": assignments,
                },
                blocking=True,
                timeout_ms=join_timeout_ms,
                deadline=time.monotonic() + join_timeout_ms / 1000,
            )
            code = _code(sync)
            if code is ErrorCode.NONE:
                try:
                    assignment = decode_assignment(sync.assignment)
                except ConsumerProtocolError as exc:
                    self.state = State.UNJOINED
                    raise ClientError(f"group {self.group_id!r}: {exc}") from exc
                self.generation = generation
                self.state = State.STABLE
                self.need_rejoin = False
                self.lost = False
                self._last_answer = time.monotonic()
                self.ensure_heartbeat()
                return list(assignment.partitions)
            if code is ErrorCode.UNKNOWN_MEMBER_ID:
                self.member_id = ""
                self.generation = -1
            elif code is ErrorCode.ILLEGAL_GENERATION:
                self.generation = -1
            elif code is not ErrorCode.REBALANCE_IN_PROGRESS:
                raise self._fatal(code, "SyncGroup")
            await self._backoff(attempt)
            attempt += 1

    async def _assign(self, raw_members: Iterable[Any]) -> list[dict[str, Any]]:
        assignor = next((a for a in self.assignors if a.name == self.protocol), None)
        if assignor is None:
            raise ClientError(
                f"group {self.group_id!r} chose assignor {self.protocol!r}, which this "
                "consumer does not have"
            )
        members: list[GroupMember] = []
        for m in raw_members:
            try:
                subscription = decode_subscription(m.metadata)
            except ConsumerProtocolError as exc:
                raise ClientError(
                    f"group {self.group_id!r}: member {m.member_id}'s subscription: {exc}"
                ) from exc
            members.append(GroupMember(m.member_id, m.group_instance_id, subscription))
        topics = frozenset(t for m in members for t in m.subscription.topics)
        counts = dict(await self._partition_counts(sorted(topics)))
        plan = assignor.assign(counts, members)
        self.group_topics = topics
        self.assigned_counts = {t: counts.get(t, 0) for t in topics}
        versions = {m.member_id: m.subscription.version for m in members}
        return [
            {
                "member_id": member_id,
                "assignment": encode_assignment(
                    Assignment(
                        version=min(versions[member_id], HIGHEST_CONSUMER_PROTOCOL_VERSION),
                        partitions=tuple(partitions),
                    )
                ),
            }
            for member_id, partitions in plan.items()
        ]

    # -- heartbeats ----------------------------------------------------------------------------

    def ensure_heartbeat(self) -> None:
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    def reset(self, *, forget_member: bool) -> None:
        """This member's generation is over; its partitions count as lost."""
        if self.state is State.STABLE:
            self.lost = True
        self.state = State.UNJOINED
        self.generation = -1
        self.need_rejoin = True
        if forget_member:
            self.member_id = ""

    async def _heartbeat_loop(self) -> None:
        interval = self.config["heartbeat.interval.ms"] / 1000
        while not self._closed:
            await asyncio.sleep(interval)
            if self.state is not State.STABLE:
                continue
            if self._poll_expired():
                log.warning(
                    "group %r: no poll for max.poll.interval.ms (%d ms); leaving the group",
                    self.group_id,
                    self.config["max.poll.interval.ms"],
                )
                self.poll_timed_out = True
                await self.leave("consumer poll timeout has expired")
                continue
            if await self._session_expired():
                continue
            generation, member_id = self.generation, self.member_id
            try:
                response = await self.channel.call(
                    ApiKey.HEARTBEAT,
                    {
                        "group_id": self.group_id,
                        "generation_id": generation,
                        "member_id": member_id,
                        "group_instance_id": self.group_instance_id,
                    },
                    deadline=time.monotonic() + interval,
                )
            except ClientError as exc:
                log.debug("group %r: heartbeat failed: %s", self.group_id, exc)
                continue
            self._last_answer = time.monotonic()
            if self.state is not State.STABLE or (generation, member_id) != (
                self.generation,
                self.member_id,
            ):
                continue  # the answer is about a generation that is already over
            code = _code(response)
            if code is ErrorCode.REBALANCE_IN_PROGRESS:
                self.need_rejoin = True
            elif code is ErrorCode.ILLEGAL_GENERATION:
                self.reset(forget_member=False)
            elif code is ErrorCode.UNKNOWN_MEMBER_ID:
                self.reset(forget_member=True)
            elif code is ErrorCode.FENCED_INSTANCE_ID:
                self.reset(forget_member=True)
                self.error = broker_error(code, context=f"group {self.group_id!r}")
            elif code is not ErrorCode.NONE:
                log.warning("group %r: heartbeat answered %s", self.group_id, code.name)

    async def _session_expired(self) -> bool:
        """Out of the group after ``session.timeout.ms`` without an answer (module docstring)."""
        session_ms = self.config["session.timeout.ms"]
        if time.monotonic() - self._last_answer < session_ms / 1000:
            return False
        log.warning(
            "group %r: no heartbeat answered for session.timeout.ms (%d ms); "
            "partitions lost, joining again",
            self.group_id,
            session_ms,
        )
        self.reset(forget_member=False)
        await self.channel.mark_dead()
        return True

    # -- leaving -------------------------------------------------------------------------------

    async def leave(self, reason: str) -> None:
        """Leave the group now (a static member keeps its place: it only stops heartbeating)."""
        member_id = self.member_id
        self.reset(forget_member=self.group_instance_id is None)
        if self.group_instance_id is not None or not member_id:
            return
        try:
            await self.channel.call(
                ApiKey.LEAVE_GROUP,
                {
                    "group_id": self.group_id,
                    "member_id": member_id,
                    "members": [
                        {"member_id": member_id, "group_instance_id": None, "reason": reason}
                    ],
                },
                deadline=time.monotonic() + self.config["request.timeout.ms"] / 1000,
            )
        except ClientError as exc:
            log.warning("group %r: LeaveGroup failed: %s", self.group_id, exc)

    async def close(self) -> None:
        self._closed = True
        task, self._heartbeat_task = self._heartbeat_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


__all__ = [
    "COORDINATOR_RETRY_CODES",
    "PROTOCOL_TYPE",
    "Channel",
    "CommitFailedError",
    "CoordinatorLink",
    "GroupMembership",
    "RebalanceListener",
    "State",
    "WakeupError",
]
