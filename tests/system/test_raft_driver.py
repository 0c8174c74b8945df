"""Three quorum drivers in one event loop, talking KRaft's Kafka APIs over loopback sockets.

Each member is a real controller listener (the broker's :class:`BrokerServer` with the
driver's handler table and the controller version table) and a :class:`RaftDriver` with its
own in-memory log and quorum-state file from the test kit. Nothing is mocked between them:
votes, BeginQuorumEpoch, Fetch long polls and their responses go through the project's
framing on TCP. Tests wait for the state they need, never for a fixed time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tidelog.broker.broker import Broker
from tidelog.broker.handlers import HANDLERS
from tidelog.broker.partitions import Partitions
from tidelog.broker.raft_driver import NotLeaderError, RaftDriver
from tidelog.broker.reply import Handler
from tidelog.broker.server import BrokerServer
from tidelog.client.connection import Connection as ClientConnection
from tidelog.metadata.configs import parse_quorum_voters
from tidelog.metadata.errors import ConfigError
from tidelog.metadata.quorum_state import FileQuorumStateStore
from tidelog.metadata.raft import Entry, OffsetAndEpoch, RaftConfig, Role
from tidelog.metadata.raft.messages import FetchRequest, FetchResponse
from tidelog.metadata.raft.store import QuorumStateStore, RaftLog
from tidelog.metadata.raft.wire import (
    METADATA_TOPIC,
    read_describe_quorum,
    read_response,
    write_request,
)
from tidelog.metadata.raft_log import FileRaftLog
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.protocol.versions import CONTROLLER_VERSIONS
from tidelog.storage import LogManager
from tidelog.testing.sim_disk import SimQuorumStateStore, SimRaftLog

CLUSTER = "q1ZL3LDRQXC5nDmM0mTuUQ"
# Short timeouts keep elections quick on loopback; the rules do not depend on them.
CONFIG = RaftConfig(
    election_timeout_ms=300,
    fetch_timeout_ms=600,
    election_backoff_max_ms=300,
    request_timeout_ms=500,
    retry_backoff_ms=20,
    fetch_max_wait_ms=200,
    # Small enough that a snapshot of a few hundred KiB comes in several FetchSnapshot chunks.
    fetch_max_bytes=64 * 1024,
)
TIMEOUT_S = 20.0


async def eventually(check: Callable[[], object], what: str, timeout: float = TIMEOUT_S) -> None:
    """Wait until ``check()`` is true, yielding to the loop between looks."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


class Member:
    """One voter: its controller listener, its driver, and the disk it keeps across restarts."""

    def __init__(self, node_id: int, data_dir: Path, disk: Disk) -> None:
        self.node_id = node_id
        self.disk = disk
        self.logs = LogManager([data_dir], clock=lambda: 0)
        self.logs.open()
        self.broker = Broker(node_id=node_id, partitions=Partitions(self.logs), clock=lambda: 0)
        self.handlers: dict[int, Handler] = {}
        self.server: BrokerServer | None = None
        self.driver: RaftDriver | None = None
        self.port = 0
        self.committed: list[Entry] = []
        self.snapshots: list[tuple[OffsetAndEpoch, tuple[bytes, ...]]] = []

    async def listen(self) -> None:
        # The table is filled once the driver exists; the server reads it per request.
        self.server = BrokerServer(
            self.broker,
            "127.0.0.1",
            self.port,
            self.handlers,
            CONTROLLER_VERSIONS,
            max_frame_size=1 << 24,
            max_in_flight=64,
            shutdown_grace_s=2.0,
            listener="CONTROLLER",
        )
        await self.server.start()
        self.port = self.server.port

    async def start(self, voters: dict[int, tuple[str, int]]) -> None:
        self.committed = []
        self.snapshots = []
        log, store = self.disk.open(self.node_id, voters)
        self.driver = RaftDriver(
            node_id=self.node_id,
            voters=voters,
            cluster_id=CLUSTER,
            log=log,
            store=store,
            config=CONFIG,
        )
        self.handlers.clear()
        self.handlers.update(self.driver.listener_handlers(HANDLERS))
        await self.driver.start()
        self.driver.subscribe(
            self.committed.extend,
            on_snapshot=lambda snapshot_id, records: self.snapshots.append((snapshot_id, records)),
        )

    async def stop(self) -> None:
        """Close the driver and the listener with every socket (a node going away)."""
        if self.driver is not None:
            await self.driver.close()
        if self.server is not None:
            await self.server.shutdown()
            self.server = None
        self.disk.close()

    def records(self) -> list[bytes]:
        return [record for entry in self.committed if not entry.control for record in entry.records]

    @property
    def d(self) -> RaftDriver:
        assert self.driver is not None
        return self.driver


class Quorum:
    def __init__(self, tmp_path: Path, disk: Callable[[Path], Disk]) -> None:
        self.members = {
            n: Member(n, tmp_path / f"node{n}", disk(tmp_path / f"node{n}")) for n in (1, 2, 3)
        }
        self.voters: dict[int, tuple[str, int]] = {}

    async def start(self) -> None:
        for member in self.members.values():
            await member.listen()
        self.voters = {n: ("127.0.0.1", m.port) for n, m in self.members.items()}
        for member in self.members.values():
            await member.start(self.voters)

    async def stop(self) -> None:
        for member in self.members.values():
            await member.stop()
        for member in self.members.values():
            member.logs.close()

    def running(self) -> list[Member]:
        return [m for m in self.members.values() if m.server is not None]

    def leader(self, among: list[Member] | None = None) -> Member | None:
        """The one member that leads, if the running members agree on it."""
        members = among if among is not None else self.running()
        leaders = [m for m in members if m.d.role is Role.LEADER]
        if len(leaders) != 1:
            return None
        leader = leaders[0]
        if all(m.d.leader_id == leader.node_id and m.d.epoch == leader.d.epoch for m in members):
            return leader
        return None

    async def elected(self, among: list[Member] | None = None) -> Member:
        await eventually(lambda: self.leader(among) is not None, "a leader all members follow")
        leader = self.leader(among)
        assert leader is not None
        return leader


class Disk:
    """What a member keeps across its restarts: its Raft log and quorum-state file."""

    def open(
        self, node_id: int, voters: dict[int, tuple[str, int]]
    ) -> tuple[RaftLog, QuorumStateStore]:
        raise NotImplementedError

    def close(self) -> None:
        """The process goes away: files are closed, memory is kept (it stands for a disk)."""


class InMemoryDisk(Disk):
    """The test kit's log and quorum-state file; the same objects after a restart."""

    def __init__(self, _: Path) -> None:
        self.log = SimRaftLog()
        self.store = SimQuorumStateStore()

    def open(
        self, node_id: int, voters: dict[int, tuple[str, int]]
    ) -> tuple[RaftLog, QuorumStateStore]:
        return self.log, self.store


class FileDisk(Disk):
    """The production files under ``<dir>/metadata``: reopened from disk on every start."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory / "metadata"
        self.log: FileRaftLog | None = None

    def open(
        self, node_id: int, voters: dict[int, tuple[str, int]]
    ) -> tuple[RaftLog, QuorumStateStore]:
        self.log = FileRaftLog.open(self.directory, clock=lambda: int(time.time() * 1000))
        store = FileQuorumStateStore.open(self.directory, voters, cluster_id=CLUSTER)
        return self.log, store

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None


def run_quorum(
    tmp_path: Path,
    scenario: Callable[[Quorum], Awaitable[None]],
    disk: Callable[[Path], Disk] | None = None,
) -> None:
    async def main() -> None:
        quorum = Quorum(tmp_path, disk or InMemoryDisk)
        await quorum.start()
        try:
            await scenario(quorum)
        finally:
            await quorum.stop()

    asyncio.run(main())


async def commit_on(leader: Member, values: list[bytes]) -> int:
    """Propose each value as its own entry; the last offset once all are committed."""
    offsets = await asyncio.gather(*(leader.d.propose([v]) for v in values))
    # A future resolves once the entry is committed: below the leader's high watermark.
    assert leader.d.high_watermark > max(offsets)
    return max(offsets)


def test_a_leader_is_elected_and_proposals_commit_on_all_three(tmp_path: Path) -> None:
    async def scenario(quorum: Quorum) -> None:
        leader = await quorum.elected()
        assert leader.d.epoch >= 1
        values = [f"record-{i}".encode() for i in range(20)]
        last = await commit_on(leader, values)
        # Committed on the leader means held by a majority; all three catch up.
        await eventually(
            lambda: all(m.d.high_watermark > last for m in quorum.running()),
            "every member's high watermark past the last proposal",
        )
        await eventually(
            lambda: all(m.records() == values for m in quorum.running()),
            "every subscriber to see the records in order",
        )
        # A batch proposed together is one entry, committed whole.
        batch = [b"a", b"b", b"c"]
        end = await leader.d.propose(batch)
        await eventually(
            lambda: all(m.records()[-3:] == batch for m in quorum.running()),
            "the batch on every member",
        )
        entry = next(e for e in quorum.members[1].committed if e.records == tuple(batch))
        assert entry.offset + 2 == end

    run_quorum(tmp_path, scenario)


def test_a_proposal_on_a_follower_fails_with_not_leader_or_follower(tmp_path: Path) -> None:
    async def scenario(quorum: Quorum) -> None:
        leader = await quorum.elected()
        follower = next(m for m in quorum.running() if m is not leader)
        with pytest.raises(NotLeaderError) as caught:
            await follower.d.propose([b"nope"])
        assert caught.value.code is ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert caught.value.leader_id == leader.node_id
        assert b"nope" not in leader.records()

    run_quorum(tmp_path, scenario)


@pytest.mark.parametrize("disk", [InMemoryDisk, FileDisk], ids=["in-memory", "on-disk"])
def test_the_others_elect_a_new_leader_and_the_old_one_catches_up(
    tmp_path: Path, disk: Callable[[Path], Disk]
) -> None:
    async def scenario(quorum: Quorum) -> None:
        first = await quorum.elected()
        old_epoch = first.d.epoch
        before = [f"before-{i}".encode() for i in range(10)]
        last_before = await commit_on(first, before)
        # A proposal still waiting when its leader goes away is failed, not left hanging.
        pending = first.d.propose([b"maybe"])
        durable_end = first.d.node.log.flushed_end_offset()
        await first.stop()
        with pytest.raises(NotLeaderError):
            await pending

        rest = quorum.running()
        second = await quorum.elected(rest)
        assert second is not first
        assert second.d.epoch > old_epoch
        after = [f"after-{i}".encode() for i in range(10)]
        last = await commit_on(second, after)
        await eventually(lambda: all(m.d.high_watermark > last for m in rest), "the two to commit")
        for member in rest:
            assert [r for r in member.records() if r != b"maybe"] == before + after

        # The old leader comes back on its address with the log it had.
        await first.listen()
        await first.start(quorum.voters)
        # What it had flushed and the epoch it was in came back from its disk.
        assert first.d.node.log.end_offset() >= durable_end > last_before
        assert first.d.epoch >= old_epoch
        await eventually(
            lambda: first.d.role is Role.FOLLOWER and first.d.leader_id == second.node_id,
            "the restarted node to follow the new leader",
        )
        await eventually(
            lambda: first.d.high_watermark >= second.d.high_watermark > last,
            "the restarted node to catch up",
        )
        assert first.records() == second.records()
        # It takes part again: a new entry commits on all three.
        final = await second.d.propose([b"final"])
        await eventually(
            lambda: all(m.d.high_watermark > final for m in quorum.running()),
            "the last entry on all three",
        )
        assert all(m.records()[-1] == b"final" for m in quorum.running())

    run_quorum(tmp_path, scenario, disk)


def test_a_node_behind_the_leaders_snapshot_fetches_it_over_the_wire(tmp_path: Path) -> None:
    async def scenario(quorum: Quorum) -> None:
        leader = await quorum.elected()
        await commit_on(leader, [f"early-{i}".encode() for i in range(5)])
        lagging = next(m for m in quorum.running() if m is not leader)
        await lagging.stop()
        last = await commit_on(leader, [f"middle-{i}".encode() for i in range(5)])
        # The state at the high watermark, big enough for several chunks; the log before it
        # is deleted, so the lagging node cannot fetch its way there.
        state = tuple(bytes([i]) * 100_000 for i in range(3))
        end = leader.d.high_watermark
        assert end > last
        snapshot_id = leader.d.node.create_snapshot(end, state)
        assert leader.d.node.log.start_offset() == end

        await lagging.listen()
        await lagging.start(quorum.voters)
        await eventually(lambda: lagging.snapshots, "the lagging node to load the snapshot")
        assert lagging.snapshots == [(snapshot_id, state)]
        assert lagging.d.node.log.start_offset() == end
        later = [f"late-{i}".encode() for i in range(5)]
        final = await commit_on(leader, later)
        await eventually(
            lambda: lagging.d.high_watermark > final, "the lagging node to fetch after it"
        )
        assert lagging.records() == later

    run_quorum(tmp_path, scenario)


def test_describe_quorum_is_answered_over_a_socket(tmp_path: Path) -> None:
    async def scenario(quorum: Quorum) -> None:
        leader = await quorum.elected()
        last = await commit_on(leader, [b"x", b"y", b"z"])
        await eventually(
            lambda: all(m.d.high_watermark > last for m in quorum.running()),
            "all three to hold the entries",
        )
        describe = {
            "topics": [{"topic_name": METADATA_TOPIC, "partitions": [{"partition_index": 0}]}]
        }

        async def ask(member: Member) -> Any:
            connection = ClientConnection("127.0.0.1", member.port, client_id="admin")
            await connection.connect()
            try:
                return await connection.call(ApiKey.DESCRIBE_QUORUM, describe, version=2)
            finally:
                await connection.close()

        hw = leader.d.high_watermark

        async def settled() -> Any:
            # The followers' fetch offsets reach the leader with their next Fetch.
            while True:
                answer = read_describe_quorum(await ask(leader))
                assert not isinstance(answer, ErrorCode), answer
                if all(v.log_end_offset == hw for v in answer.voters):
                    return answer
                await asyncio.sleep(0.01)

        answer = await asyncio.wait_for(settled(), TIMEOUT_S)
        assert answer.leader_id == leader.node_id
        assert answer.leader_epoch == leader.d.epoch
        assert answer.high_watermark == hw
        assert sorted(v.replica_id for v in answer.voters) == [1, 2, 3]
        assert all(v.last_caught_up_timestamp > 0 for v in answer.voters)
        assert answer.observers == ()

        # A node outside the voters (a broker) fetches as an observer: it finds the leader,
        # catches up, and is listed apart from the voters.
        observer = Member(4, tmp_path / "node4", InMemoryDisk(tmp_path / "node4"))
        quorum.members[4] = observer
        await observer.listen()
        await observer.start(quorum.voters)
        await eventually(
            lambda: observer.records() == leader.records() and observer.d.high_watermark == hw,
            "the observer to catch up",
        )
        assert observer.d.role is Role.FOLLOWER and observer.d.leader_id == leader.node_id
        answer = read_describe_quorum(await ask(leader))
        assert not isinstance(answer, ErrorCode)
        assert [o.replica_id for o in answer.observers] == [4]
        assert sorted(v.replica_id for v in answer.voters) == [1, 2, 3]
        with pytest.raises(NotLeaderError):
            await observer.d.propose([b"observers never lead"])
        follower = next(m for m in quorum.running() if m is not leader)
        assert read_describe_quorum(await ask(follower)) is ErrorCode.NOT_LEADER_OR_FOLLOWER

    run_quorum(tmp_path, scenario)


def test_a_held_fetch_is_answered_when_its_leader_steps_down(tmp_path: Path) -> None:
    async def scenario(quorum: Quorum) -> None:
        leader = await quorum.elected()
        await commit_on(leader, [b"x"])
        connection = ClientConnection("127.0.0.1", leader.port, client_id="observer-9")
        await connection.connect()

        async def fetch() -> FetchResponse:
            log = leader.d.node.log
            request = write_request(
                FetchRequest(
                    replica_id=9,
                    current_leader_epoch=leader.d.epoch,
                    fetch_offset=log.end_offset(),
                    last_fetched_epoch=log.last_epoch(),
                    max_bytes=1 << 20,
                    # Longer than the test waits: only the step-down can answer it in time.
                    max_wait_ms=60_000,
                ),
                cluster_id=CLUSTER,
                destination=leader.node_id,
            )
            values = {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}
            response = await connection.call(
                ApiKey.FETCH, values, version=int(request.__version__), timeout_ms=120_000
            )
            message = read_response(response)
            assert isinstance(message, FetchResponse)
            return message

        try:
            # An observer's first Fetch is answered at once (it learns the high watermark);
            # the second has nothing new and is held.
            assert (await fetch()).error is ErrorCode.NONE
            held = asyncio.create_task(fetch())
            await eventually(lambda: 9 in leader.d.waiting_on, "the leader to hold the Fetch")
            assert 9 in _observers(leader)
            await leader.d.resign()
            answer = await asyncio.wait_for(held, TIMEOUT_S)
            assert answer.error is ErrorCode.NOT_LEADER_OR_FOLLOWER
        finally:
            await connection.close()

    run_quorum(tmp_path, scenario)


def _observers(member: Member) -> set[int]:
    description = member.d.describe()
    return {o.replica_id for o in description.observers} if description is not None else set()


def test_the_controller_listener_advertises_the_quorum_apis(tmp_path: Path) -> None:
    async def scenario(quorum: Quorum) -> None:
        connection = ClientConnection("127.0.0.1", quorum.members[1].port, client_id="tool")
        await connection.connect()  # negotiates with ApiVersions
        await connection.close()
        ranges = connection.broker_ranges
        for key, low, high in [
            (ApiKey.VOTE, 0, 2),
            (ApiKey.BEGIN_QUORUM_EPOCH, 0, 1),
            (ApiKey.END_QUORUM_EPOCH, 0, 1),
            (ApiKey.DESCRIBE_QUORUM, 0, 2),
            (ApiKey.FETCH_SNAPSHOT, 0, 1),
        ]:
            assert ranges[key] == (low, high)
        # The broker's APIs are still there (one node serves both on this listener).
        assert ApiKey.FETCH in ranges and ApiKey.METADATA in ranges

    run_quorum(tmp_path, scenario)


def test_other_fetches_on_the_controller_listener_still_reach_the_partitions(
    tmp_path: Path,
) -> None:
    async def scenario(quorum: Quorum) -> None:
        await quorum.elected()
        member = quorum.members[1]
        connection = ClientConnection("127.0.0.1", member.port, client_id="consumer")
        await connection.connect()
        try:
            response = await connection.call(
                ApiKey.FETCH,
                {
                    "max_wait": 0,
                    "topics": [
                        {
                            "topic": "orders",
                            "partitions": [{"partition": 0, "fetch_offset": 0}],
                        }
                    ],
                },
                version=12,
            )
        finally:
            await connection.close()
        partition = response.responses[0].partitions[0]
        # The broker's Fetch handler answered: this node hosts no such partition.
        assert (
            ErrorCode.from_wire(int(partition.error_code)) is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        )

    run_quorum(tmp_path, scenario)


def test_quorum_voters_are_read_as_kafka_writes_them() -> None:
    assert parse_quorum_voters("1@localhost:9093,2@10.0.0.2:9093, 3@[::1]:9094") == {
        1: ("localhost", 9093),
        2: ("10.0.0.2", 9093),
        3: ("::1", 9094),
    }
    for bad in ("1@localhost", "x@host:1", "1@host:1,1@other:2", "1@host:99999", ""):
        with pytest.raises(ConfigError, match=r"controller\.quorum\.voters"):
            parse_quorum_voters(bad)


def test_the_metrics_hooks_time_each_commit_and_each_election(tmp_path: Path) -> None:
    """The broker's metrics observe the driver through two hooks: every committed proposal
    of the leader, and every stretch a member knew no leader until it knew one."""

    async def scenario(quorum: Quorum) -> None:
        first = await quorum.elected()
        commits: dict[int, list[float]] = {n: [] for n in quorum.members}
        elections: dict[int, list[float]] = {n: [] for n in quorum.members}
        for n, member in quorum.members.items():
            member.d.on_commit_latency = commits[n].append
            member.d.on_election = elections[n].append
        await commit_on(first, [f"v{i}".encode() for i in range(5)])
        assert len(commits[first.node_id]) == 5 and min(commits[first.node_id]) >= 0
        # Followers propose nothing: they time no commit, and no election happened.
        assert all(not commits[n] for n in quorum.members if n != first.node_id)
        assert all(not e for e in elections.values())

        await first.stop()
        rest = quorum.running()
        second = await quorum.elected(rest)
        # Each survivor lost the leader and then knew the next one: one election each.
        for member in rest:
            assert len(elections[member.node_id]) == 1, member.node_id
            assert elections[member.node_id][0] > 0
        await commit_on(second, [b"after"])
        assert len(commits[second.node_id]) == 1

    run_quorum(tmp_path, scenario)
