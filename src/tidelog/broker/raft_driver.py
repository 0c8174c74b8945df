"""The asyncio driver of one metadata-quorum node: sockets, timers and futures around a
sans-io :class:`~tidelog.metadata.raft.node.RaftNode`.

Every decision is the node's; the driver only moves things:

* **time** -- the node is ticked when :meth:`RaftNode.next_deadline` comes (one timer, moved
  after every call), never polled;
* **inbound** -- requests arriving on a controller listener (Vote, BeginQuorumEpoch,
  EndQuorumEpoch, FetchSnapshot, Fetch of ``__cluster_metadata``) are read by
  :mod:`tidelog.metadata.raft.wire`, stepped into the node, and answered when the node's
  effects carry the reply: at once, or later for a Fetch the leader holds (long poll). A held
  Fetch the node forgets (it stopped leading) is answered NOT_LEADER_OR_FOLLOWER, so that a
  connection never waits on a reply that will not come;
* **outbound** -- requests from the node go to the voter they name over one client connection
  per voter (:class:`tidelog.client.connection.Connection`, the project's framing), opened
  from ``controller.quorum.voters`` and opened again with a growing back-off after a failure.
  A message for a voter that cannot be reached is dropped: Raft sends it again when it has
  to. Responses are stepped into the node as they come;
* **effects** -- applied in the order the node gave them. The node writes and flushes the
  quorum-state file and the log itself before it returns a message that depends on them
  (a granted vote, a fetch offset), so sending in order is all that is left;
* **proposals** -- :meth:`RaftDriver.propose` appends one entry on the leader and returns a
  future resolved with the entry's last offset once the high watermark passes it, or failed
  with :class:`NotLeaderError` (NOT_LEADER_OR_FOLLOWER) when this node does not lead, or
  stops leading the epoch before the entry commits;
* **committed entries** -- :meth:`RaftDriver.subscribe` hands every committed entry, in
  offset order, to a listener (the metadata loader), starting from the latest snapshot;
* **the listener** -- :meth:`RaftDriver.listener_handlers` is the handler table of a
  controller listener: the broker's, plus the quorum's APIs, DescribeQuorum answered from
  the leader's view (:meth:`RaftDriver.describe`), and ApiVersions listing them.

The node's calls run on the event loop thread: with an on-disk log, a flush holds the loop
for one fsync of the metadata log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kio.static.protocol import RequestPayload, ResponsePayload

from tidelog.broker.reply import Deferred, Handler
from tidelog.client.connection import Connection as ClientConnection
from tidelog.client.errors import ClientError
from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.raft import (
    Effects,
    Entry,
    Envelope,
    FetchRequest,
    FetchResponse,
    OffsetAndEpoch,
    QuorumStateStore,
    RaftConfig,
    RaftLog,
    RaftNode,
    RandomSource,
    Role,
)
from tidelog.metadata.raft.wire import (
    Inbound,
    QuorumDescription,
    ReplicaDescription,
    api_key_of,
    check_describe_quorum,
    describe_quorum_response,
    error_reply,
    fetch_names_metadata,
    is_request,
    read_request,
    read_response,
    write_request,
    write_response,
)
from tidelog.protocol import ApiKey, ErrorCode, api_versions_response
from tidelog.protocol.versions import CONTROLLER_VERSIONS

_log = logging.getLogger(__name__)

#: Committed entries, in offset order; the loader applies them.
CommitListener = Callable[[Sequence[Entry]], None]
#: The latest snapshot (its id and records), given to a listener before the entries after it.
SnapshotListener = Callable[[OffsetAndEpoch, tuple[bytes, ...]], None]

_RECONNECT_BACKOFF_MS = 50
_RECONNECT_BACKOFF_MAX_MS = 1000
# Committed entries read per step while feeding listeners, so one listener that is far
# behind does not hold the loop for its whole backlog at once.
_ENTRIES_PER_READ = 1000


class NotLeaderError(Exception):
    """A proposal this node cannot commit: it does not lead (or stopped leading its epoch).
    ``leader_id`` is the leader it knows, if any."""

    code = ErrorCode.NOT_LEADER_OR_FOLLOWER

    def __init__(self, leader_id: int | None, epoch: int) -> None:
        where = f"the leader is {leader_id}" if leader_id is not None else "no leader is known"
        super().__init__(f"node is not the quorum leader in epoch {epoch}; {where}")
        self.leader_id = leader_id
        self.epoch = epoch


@dataclass
class _Held:
    """An inbound request waiting for the node's reply."""

    future: asyncio.Future[ResponsePayload]
    key: ApiKey
    version: int
    source: int
    #: the (epoch, role) in which the node took it: a Fetch held by a leader is forgotten
    #: when that leadership ends.
    epoch: int
    role: Role


@dataclass
class _Proposal:
    epoch: int
    last_offset: int
    future: asyncio.Future[int]
    #: ``time.monotonic()`` when proposed, for the commit latency
    proposed_at: float = 0.0


@dataclass
class _Subscriber:
    on_commit: CommitListener
    on_snapshot: SnapshotListener | None
    position: int


@dataclass
class _ReplicaFetches:
    """What DescribeQuorum reports of a replica, from the Fetch requests the leader saw."""

    log_end_offset: int = -1
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1
    leader_end_at_last_fetch: int = -1


class _Peer:
    """The outbound side towards one voter: a queue and the task that sends it."""

    def __init__(self, node_id: int, host: str, port: int) -> None:
        self.node_id = node_id
        self.host = host
        self.port = port
        self.queue: asyncio.Queue[Envelope] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.connection: ClientConnection | None = None
        self.exchanges: set[asyncio.Task[None]] = set()


class RaftDriver:
    """Runs one :class:`RaftNode` on the event loop. See the module docstring.

    ``voters`` maps every voter's id to its controller listener address; a ``node_id`` not
    in it runs as an observer. The node's ``now`` is the event loop's monotonic clock in
    milliseconds (timers are the loop's); ``wall_clock`` gives the timestamps DescribeQuorum
    reports; ``rng`` draws the election timeouts.

    Use: ``await driver.start()``; serve ``driver.listener_handlers(HANDLERS)`` with
    :data:`~tidelog.protocol.versions.CONTROLLER_VERSIONS` on the controller listener;
    ``await driver.propose(records)`` (or keep the future); ``driver.subscribe(on_commit)``;
    ``await driver.close()``.
    """

    def __init__(
        self,
        *,
        node_id: int,
        voters: Mapping[int, tuple[str, int]],
        cluster_id: str,
        log: RaftLog,
        store: QuorumStateStore,
        config: RaftConfig | None = None,
        rng: RandomSource | None = None,
        wall_clock: Callable[[], int] | None = None,
    ) -> None:
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.config = config or RaftConfig()
        self._voters = dict(voters)
        self._log = log
        self._store = store
        self._rng: RandomSource = rng if rng is not None else random.Random()
        self._wall_clock = wall_clock or (lambda: int(time.time() * 1000))
        self._node: RaftNode | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_now = 0
        self._peers: dict[int, _Peer] = {}
        self._held: dict[int, _Held] = {}
        self._next_inbound = 0
        self._proposals: list[_Proposal] = []
        self._subscribers: list[_Subscriber] = []
        self._replicas: dict[int, _ReplicaFetches] = {}
        self._replicas_epoch = -1
        self._closed = False
        #: Observers of the commit latency of this node's proposals and of each stretch
        #: without a known leader (seconds), for the broker's metrics; None: not observed.
        self.on_commit_latency: Callable[[float], None] | None = None
        self.on_election: Callable[[float], None] | None = None
        self._leaderless_since: float | None = time.monotonic()

    @classmethod
    def from_config(
        cls, config: BrokerConfig, *, cluster_id: str, log: RaftLog, store: QuorumStateStore
    ) -> RaftDriver:
        """The driver of the node ``config`` describes: ``node.id``, the voters of
        ``controller.quorum.voters`` and the ``controller.quorum.*.ms`` timers."""
        return cls(
            node_id=config.node_id,
            voters=config.quorum_voters,
            cluster_id=cluster_id,
            log=log,
            store=store,
            config=config.raft_config,
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Build the node from the log and the quorum-state file, open the connections to
        the other voters and start its timer."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._node = RaftNode(
            self.node_id,
            self._voters,
            self.config,
            self._log,
            self._store,
            self._rng,
            self._now(),
        )
        for voter, (host, port) in sorted(self._voters.items()):
            if voter == self.node_id:
                continue
            peer = _Peer(voter, host, port)
            peer.task = loop.create_task(self._run_peer(peer), name=f"raft peer {voter}")
            self._peers[voter] = peer
        self._apply(Effects())

    async def close(self) -> None:
        """Stop: no more ticks, connections closed, every pending proposal failed and every
        held request answered. The log and quorum-state file stay as they are."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        epoch = self._node.epoch if self._node is not None else 0
        leader = self.leader_id if self._node is not None else None
        for proposal in self._proposals:
            if not proposal.future.done():
                proposal.future.set_exception(NotLeaderError(leader, epoch))
                proposal.future.exception()
        self._proposals.clear()
        for held in list(self._held.values()):
            self._answer_forgotten(held, ErrorCode.BROKER_NOT_AVAILABLE)
        self._held.clear()
        tasks: list[asyncio.Task[None]] = []
        for peer in self._peers.values():
            if peer.task is not None:
                peer.task.cancel()
                tasks.append(peer.task)
            tasks.extend(peer.exchanges)
            for exchange in peer.exchanges:
                exchange.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        for peer in self._peers.values():
            if peer.connection is not None:
                await peer.connection.close()
                peer.connection = None

    async def resign(self) -> None:
        """Step down if this node leads (before a planned stop): the voters hear it with
        EndQuorumEpoch and elect the next leader without waiting for a timeout."""
        self._apply(self.node.resign(self._now()))

    # ------------------------------------------------------------------ state

    @property
    def node(self) -> RaftNode:
        assert self._node is not None, "the driver has not started"
        return self._node

    @property
    def role(self) -> Role:
        return self.node.role

    @property
    def epoch(self) -> int:
        return self.node.epoch

    @property
    def leader_id(self) -> int | None:
        """The leader of the current epoch, if known (this node included)."""
        node = self.node
        if node.role is Role.LEADER:
            return node.node_id
        if node.leader_id == node.node_id:
            return None
        return node.leader_id

    @property
    def high_watermark(self) -> int:
        return self.node.high_watermark

    @property
    def waiting_on(self) -> frozenset[int]:
        """The nodes with a request waiting for this node's answer (Fetches the leader
        holds until it has something new)."""
        return frozenset(held.source for held in self._held.values())

    def describe(self) -> QuorumDescription | None:
        """What DescribeQuorum answers, or None when this node does not lead."""
        node = self.node
        if node.role is not Role.LEADER:
            return None
        now = self._wall_clock()
        self._track_epoch()
        voters: list[ReplicaDescription] = []
        observers: list[ReplicaDescription] = []
        for replica in sorted(node.voters | set(self._replicas)):
            if replica == self.node_id:
                voters.append(ReplicaDescription(replica, node.log.end_offset(), now, now))
                continue
            state = self._replicas.get(replica, _ReplicaFetches())
            description = ReplicaDescription(
                replica, state.log_end_offset, state.last_fetch_ms, state.last_caught_up_ms
            )
            (voters if replica in node.voters else observers).append(description)
        return QuorumDescription(
            node.node_id, node.epoch, node.high_watermark, tuple(voters), tuple(observers)
        )

    # ------------------------------------------------------------------ proposals

    def propose(self, records: Sequence[bytes]) -> asyncio.Future[int]:
        """Append ``records`` as one entry if this node leads; the future gives the entry's
        last offset once it is committed, or fails with :class:`NotLeaderError`."""
        loop = self._running_loop()
        future: asyncio.Future[int] = loop.create_future()
        node = self.node
        if self._closed:
            future.set_exception(NotLeaderError(None, node.epoch))
            return future
        result = node.propose(records, self._now())
        if result.error is not ErrorCode.NONE:
            future.set_exception(NotLeaderError(result.leader_id, result.epoch))
            return future
        self._proposals.append(
            _Proposal(result.epoch, result.last_offset, future, time.monotonic())
        )
        # The node flushes and offers the entry on its next tick, which is due now.
        self._apply(Effects())
        return future

    async def commit(self, records: Sequence[bytes]) -> int:
        """:meth:`propose` and wait for the commit; the entry's last offset."""
        return await self.propose(records)

    def subscribe(
        self,
        on_commit: CommitListener,
        *,
        on_snapshot: SnapshotListener | None = None,
        start: int = 0,
    ) -> None:
        """Give ``on_commit`` every committed entry from ``start`` on, in order, as the high
        watermark moves (the ones already committed at once). Entries a snapshot replaced are
        given as that snapshot, to ``on_snapshot``, first; without one they are skipped."""
        self._subscribers.append(_Subscriber(on_commit, on_snapshot, start))
        self._feed_subscribers()

    # ------------------------------------------------------------------ inbound requests

    def handle_request(
        self, request: RequestPayload
    ) -> ResponsePayload | asyncio.Future[ResponsePayload]:
        """The answer to a quorum request received on a controller listener: a response
        now, or a future of one (a Fetch the leader holds)."""
        result = read_request(request, cluster_id=self.cluster_id, node_id=self.node_id)
        if not isinstance(result, Inbound):
            return result.response
        key = ApiKey(int(request.__api_key__))
        version = int(request.__version__)
        node = self.node
        loop = self._running_loop()
        future: asyncio.Future[ResponsePayload] = loop.create_future()
        if self._closed:
            future.set_result(
                write_response(
                    self._forgotten_reply(key, ErrorCode.BROKER_NOT_AVAILABLE), key, version
                )
            )
            return future
        self._next_inbound = (self._next_inbound + 1) & 0x7FFFFFFF
        correlation = self._next_inbound
        self._held[correlation] = _Held(future, key, version, result.source, node.epoch, node.role)
        if isinstance(result.message, FetchRequest):
            self._observe_fetch(result.message)
        envelope = Envelope(result.source, self.node_id, correlation, result.message)
        try:
            effects = node.step(envelope, self._now())
        except BaseException:
            # The connection that brought it closes (the dispatcher's rule for a failed
            # handler); nothing is left waiting for it here.
            del self._held[correlation]
            raise
        self._apply(effects)
        return future

    def listener_handlers(self, base: Mapping[int, Handler]) -> dict[int, Handler]:
        """The handler table of a controller listener served by this node: ``base`` (the
        broker's handlers) with the quorum's APIs added. A Fetch of ``__cluster_metadata``
        goes to the quorum, any other Fetch to ``base``'s handler, as before. Pair it with
        :data:`~tidelog.protocol.versions.CONTROLLER_VERSIONS` as the accepted versions."""
        base_fetch = base.get(ApiKey.FETCH)

        async def quorum(ctx: Any, request: RequestPayload) -> Any:
            return self._answer(request)

        async def fetch(ctx: Any, request: RequestPayload) -> Any:
            if base_fetch is not None and not fetch_names_metadata(request):
                return await base_fetch(ctx, request)
            return self._answer(request)

        async def describe_quorum(ctx: Any, request: RequestPayload) -> Any:
            version = int(request.__version__)
            error = check_describe_quorum(request)
            if error is not ErrorCode.NONE:
                return describe_quorum_response(version, None, error)
            return describe_quorum_response(version, self.describe())

        base_api_versions = base.get(ApiKey.API_VERSIONS)

        async def api_versions(ctx: Any, request: RequestPayload) -> Any:
            # The broker's handler checks the request; the answer lists this listener's
            # table, so that Kafka's tools see the quorum's APIs here.
            answer = await base_api_versions(ctx, request) if base_api_versions else None
            if answer is not None and int(answer.error_code) != ErrorCode.NONE:
                return answer
            return api_versions_response(
                int(request.__version__), api_keys=handlers.keys(), supported=CONTROLLER_VERSIONS
            )

        handlers = dict(base)
        handlers[ApiKey.API_VERSIONS] = api_versions
        for key in (
            ApiKey.VOTE,
            ApiKey.BEGIN_QUORUM_EPOCH,
            ApiKey.END_QUORUM_EPOCH,
            ApiKey.FETCH_SNAPSHOT,
        ):
            handlers[key] = quorum
        handlers[ApiKey.FETCH] = fetch
        handlers[ApiKey.DESCRIBE_QUORUM] = describe_quorum
        return handlers

    def _answer(self, request: RequestPayload) -> Any:
        answer = self.handle_request(request)
        return Deferred(answer) if isinstance(answer, asyncio.Future) else answer

    def _observe_fetch(self, request: FetchRequest) -> None:
        """Kafka's replica state for DescribeQuorum: the fetch offset is the replica's log
        end; it was caught up at this fetch if it asked from the leader's end, or at its
        previous fetch if it now asks from where the leader's log ended then."""
        node = self.node
        if node.role is not Role.LEADER or request.current_leader_epoch != node.epoch:
            return
        self._track_epoch()
        now = self._wall_clock()
        state = self._replicas.setdefault(request.replica_id, _ReplicaFetches())
        leader_end = node.log.end_offset()
        if request.fetch_offset >= leader_end:
            state.last_caught_up_ms = max(state.last_caught_up_ms, now)
        elif 0 < state.leader_end_at_last_fetch <= request.fetch_offset:
            state.last_caught_up_ms = max(state.last_caught_up_ms, state.last_fetch_ms)
        state.log_end_offset = request.fetch_offset
        state.last_fetch_ms = now
        state.leader_end_at_last_fetch = leader_end

    def _track_epoch(self) -> None:
        if self._replicas_epoch != self.node.epoch:
            self._replicas_epoch = self.node.epoch
            self._replicas.clear()

    # ------------------------------------------------------------------ effects

    def _apply(self, effects: Effects) -> None:
        """Carry out ``effects`` in order, then everything that follows from the node's new
        state: held requests it forgot, proposals, subscribers, the next tick."""
        for envelope in effects.messages:
            if is_request(envelope.message):
                peer = self._peers.get(envelope.destination)
                if peer is not None and not self._closed:
                    peer.queue.put_nowait(envelope)
            else:
                self._reply(envelope)
        node = self.node
        for correlation, held in list(self._held.items()):
            if (held.epoch, held.role) != (node.epoch, node.role):
                # Only a leader holds a request past the call that took it, and it lets go
                # of every held Fetch when its leadership ends.
                del self._held[correlation]
                self._answer_forgotten(held, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self._settle_proposals()
        self._note_leader()
        self._feed_subscribers()
        self._schedule()

    def _note_leader(self) -> None:
        """Time each stretch without a known leader (start, lost leader) until one is
        known: an election, as this node saw it."""
        if self.leader_id is None:
            if self._leaderless_since is None:
                self._leaderless_since = time.monotonic()
        elif self._leaderless_since is not None:
            if self.on_election is not None:
                self.on_election(time.monotonic() - self._leaderless_since)
            self._leaderless_since = None

    def _reply(self, envelope: Envelope) -> None:
        held = self._held.pop(envelope.correlation_id, None)
        if held is None or held.future.done():
            return
        try:
            response = write_response(envelope.message, held.key, held.version)
        except (TypeError, ValueError) as exc:
            _log.error("cannot write %s for node %d: %s", held.key.name, held.source, exc)
            response = write_response(
                self._forgotten_reply(held.key, ErrorCode.UNKNOWN_SERVER_ERROR),
                held.key,
                held.version,
            )
        held.future.set_result(response)

    def _forgotten_reply(self, key: ApiKey, error: ErrorCode) -> Any:
        node = self._node
        epoch = node.epoch if node is not None else -1
        leader = self.leader_id if node is not None else None
        if key == ApiKey.FETCH and node is not None:
            return FetchResponse(error, leader, epoch, node.high_watermark, node.log.start_offset())
        return error_reply(key, error, leader, epoch)

    def _answer_forgotten(self, held: _Held, error: ErrorCode) -> None:
        if held.future.done():
            return
        held.future.set_result(
            write_response(self._forgotten_reply(held.key, error), held.key, held.version)
        )

    def _settle_proposals(self) -> None:
        if not self._proposals:
            return
        node = self.node
        hw = node.high_watermark
        leading = node.role is Role.LEADER
        kept: list[_Proposal] = []
        for proposal in self._proposals:
            if proposal.future.done():
                continue
            if proposal.last_offset < hw and self._holds(proposal):
                proposal.future.set_result(proposal.last_offset)
                if self.on_commit_latency is not None:
                    self.on_commit_latency(time.monotonic() - proposal.proposed_at)
            elif not leading or node.epoch != proposal.epoch:
                proposal.future.set_exception(NotLeaderError(self.leader_id, node.epoch))
            else:
                kept.append(proposal)
        self._proposals = kept

    def _holds(self, proposal: _Proposal) -> bool:
        """Whether the committed entry at the proposal's last offset is the one proposed (a
        leader's own entries are never replaced while it leads its epoch)."""
        log = self.node.log
        if not log.start_offset() <= proposal.last_offset < log.end_offset():
            return self.node.role is Role.LEADER and self.node.epoch == proposal.epoch
        return log.entry_epoch(proposal.last_offset) == proposal.epoch

    def _feed_subscribers(self) -> None:
        if not self._subscribers:
            return
        node = self.node
        for subscriber in self._subscribers:
            start = node.log.start_offset()
            if subscriber.position < start:
                snapshot = node.latest_snapshot()
                if snapshot is not None and subscriber.on_snapshot is not None:
                    subscriber.on_snapshot(snapshot[0], snapshot[1])
                subscriber.position = start
            while subscriber.position < node.high_watermark:
                entries = node.read_committed(subscriber.position, _ENTRIES_PER_READ)
                if not entries:
                    break
                subscriber.on_commit(entries)
                subscriber.position = entries[-1].end_offset

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._closed:
            return
        deadline = self.node.next_deadline()
        if deadline is None:
            return
        loop = self._running_loop()
        self._timer = loop.call_at(deadline / 1000, self._on_timer, deadline)

    def _on_timer(self, deadline: int) -> None:
        self._timer = None
        if self._closed:
            return
        # The loop may run a timer a clock tick early; the node's deadline has come.
        self._last_now = max(self._last_now, deadline)
        self._apply(self.node.tick(self._now()))

    # ------------------------------------------------------------------ outbound

    async def _run_peer(self, peer: _Peer) -> None:
        backoff = _RECONNECT_BACKOFF_MS
        while not self._closed:
            connection = ClientConnection(
                peer.host,
                peer.port,
                node_id=peer.node_id,
                client_id=f"raft-client-{self.node_id}",
                request_timeout_ms=self.config.request_timeout_ms,
                connect_timeout_ms=self.config.request_timeout_ms,
                max_in_flight=64,
            )
            try:
                await connection.connect()
            except (ClientError, OSError) as exc:
                _log.debug("voter %d at %s:%d: %s", peer.node_id, peer.host, peer.port, exc)
                self._drop_queued(peer)
                await asyncio.sleep(backoff / 1000)
                backoff = min(backoff * 2, _RECONNECT_BACKOFF_MAX_MS)
                continue
            backoff = _RECONNECT_BACKOFF_MS
            peer.connection = connection
            try:
                while connection.usable:
                    envelope = await peer.queue.get()
                    if not connection.usable:
                        break
                    task = asyncio.create_task(self._exchange(connection, envelope))
                    peer.exchanges.add(task)
                    task.add_done_callback(peer.exchanges.discard)
            finally:
                peer.connection = None
                await connection.close()
            self._drop_queued(peer)

    @staticmethod
    def _drop_queued(peer: _Peer) -> None:
        while not peer.queue.empty():
            peer.queue.get_nowait()

    async def _exchange(self, connection: ClientConnection, envelope: Envelope) -> None:
        key = api_key_of(envelope.message)
        try:
            request = write_request(
                envelope.message, cluster_id=self.cluster_id, destination=envelope.destination
            )
            values = {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}
            response = await connection.call(key, values, version=int(request.__version__))
        except (ClientError, OSError) as exc:
            # Lost with the connection; the node asks again when its own timers say so.
            _log.debug("%s to voter %d failed: %s", key.name, envelope.destination, exc)
            return
        if self._closed:
            return
        message = read_response(response)
        reply = Envelope(envelope.destination, self.node_id, envelope.correlation_id, message)
        self._apply(self.node.step(reply, self._now()))

    # ------------------------------------------------------------------ helpers

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the driver has not started"
        return self._loop

    def _now(self) -> int:
        loop = self._loop or asyncio.get_running_loop()
        # Never behind a deadline already given to the node (see _on_timer).
        self._last_now = max(self._last_now, int(loop.time() * 1000))
        return self._last_now
