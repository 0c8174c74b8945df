"""The membership state machine and the consumer's rebalance handling, against an in-memory
coordinator that follows Kafka's classic protocol closely enough to drive them: KIP-394 member
ids, joins answered when every member has joined, the leader's assignment handed out by
SyncGroup, heartbeats answering REBALANCE_IN_PROGRESS while a rebalance is under way."""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable, Coroutine, Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from tidelog.client.aio.consumer import AIOConsumer
from tidelog.client.assignors import assignors_for
from tidelog.client.config import parse_config
from tidelog.client.errors import BrokerConnectionError
from tidelog.client.groups import OffsetAndMetadata, decode_assignment, decode_subscription
from tidelog.client.membership import (
    CommitFailedError,
    GroupMembership,
    RebalanceListener,
    State,
    WakeupError,
)
from tidelog.client.types import TopicPartition as TP
from tidelog.protocol import ApiKey, ErrorCode


def synchronous(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Run an async test on a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


TOPIC_PARTITIONS = {"t": 6}


class FakeCoordinator:
    def __init__(self, first_members: int = 1) -> None:
        # The first rebalance waits for this many members (as the initial delay would).
        self.first_members = first_members
        self.members: dict[str, dict[str, Any]] = {}
        self.pending: set[str] = set()
        self.generation = 0
        self.leader = ""
        self.protocol: str | None = None
        self.rebalancing = False
        self.joins: dict[str, asyncio.Future[Any]] = {}
        self.syncs: dict[str, asyncio.Future[Any]] = {}
        self.assignments: dict[str, bytes] = {}
        # Every partition has a committed offset: the consumers here never reach a broker
        # (the fetcher finds none and retries), so positions must come from the coordinator.
        self.committed: dict[TP, OffsetAndMetadata] = {
            TP(t, p): OffsetAndMetadata(0, "")
            for t, n in TOPIC_PARTITIONS.items()
            for p in range(n)
        }
        self.calls: list[tuple[ApiKey, dict[str, Any]]] = []
        self.heartbeat_error: ErrorCode | None = None
        # The coordinator is unreachable: heartbeats fail as a lost connection does.
        self.unreachable = False
        self.forgotten = 0
        self._ids = itertools.count(1)

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
        self.calls.append((api_key, dict(values)))
        handler = {
            ApiKey.JOIN_GROUP: self._join,
            ApiKey.SYNC_GROUP: self._sync,
            ApiKey.HEARTBEAT: self._heartbeat,
            ApiKey.LEAVE_GROUP: self._leave,
            ApiKey.OFFSET_COMMIT: self._commit,
            ApiKey.OFFSET_FETCH: self._fetch,
        }[api_key]
        response = await handler(values)
        if check is not None:
            check(response)
        return response

    async def mark_dead(self) -> None:
        self.forgotten += 1

    async def close(self) -> None:
        pass

    def names(self, api_key: ApiKey) -> list[dict[str, Any]]:
        return [v for k, v in self.calls if k == api_key]

    # -- the group ------------------------------------------------------------------------------

    def _complete_join(self) -> None:
        self.generation += 1
        self.rebalancing = False
        joined = list(self.joins)
        if self.leader not in joined:
            self.leader = joined[0]
        leader_protocols = [p["name"] for p in self.members[self.leader]["protocols"]]
        self.protocol = next(
            n
            for n in leader_protocols
            if all(n in [p["name"] for p in m["protocols"]] for m in self.members.values())
        )
        self.assignments = {}
        for member_id, future in self.joins.items():
            members = []
            if member_id == self.leader:
                for mid, m in self.members.items():
                    metadata = next(
                        p["metadata"] for p in m["protocols"] if p["name"] == self.protocol
                    )
                    members.append(
                        SimpleNamespace(member_id=mid, group_instance_id=None, metadata=metadata)
                    )
            future.set_result(
                SimpleNamespace(
                    error_code=0,
                    generation_id=self.generation,
                    protocol_name=self.protocol,
                    leader=self.leader,
                    skip_assignment=False,
                    member_id=member_id,
                    members=members,
                )
            )
        self.joins = {}

    def start_rebalance(self) -> None:
        self.rebalancing = True

    async def _join(self, v: Mapping[str, Any]) -> Any:
        member_id = v["member_id"]
        if member_id == "":
            member_id = f"member-{next(self._ids)}"
            self.pending.add(member_id)
            return SimpleNamespace(
                error_code=ErrorCode.MEMBER_ID_REQUIRED.value, member_id=member_id
            )
        if member_id not in self.pending and member_id not in self.members:
            return SimpleNamespace(error_code=ErrorCode.UNKNOWN_MEMBER_ID.value, member_id="")
        self.pending.discard(member_id)
        self.members[member_id] = {"protocols": list(v["protocols"])}
        self.rebalancing = True
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.joins[member_id] = future
        everyone = set(self.joins) == set(self.members) and not self.pending
        if everyone and (self.generation > 0 or len(self.joins) >= self.first_members):
            self._complete_join()
        return await future

    async def _sync(self, v: Mapping[str, Any]) -> Any:
        if v["generation_id"] != self.generation:
            return SimpleNamespace(error_code=ErrorCode.ILLEGAL_GENERATION.value, assignment=b"")
        member_id = v["member_id"]
        if member_id == self.leader:
            self.assignments = {a["member_id"]: a["assignment"] for a in v["assignments"]}
            for mid, future in self.syncs.items():
                future.set_result(self.assignments.get(mid, b""))
            self.syncs = {}
        if self.assignments:
            data = self.assignments.get(member_id, b"")
        else:
            future = asyncio.get_running_loop().create_future()
            self.syncs[member_id] = future
            data = await future
        return SimpleNamespace(error_code=0, assignment=data)

    async def _heartbeat(self, v: Mapping[str, Any]) -> Any:
        if self.unreachable:
            raise BrokerConnectionError("connection to the coordinator lost")
        if self.heartbeat_error is not None:
            code = self.heartbeat_error
        elif v["member_id"] not in self.members:
            code = ErrorCode.UNKNOWN_MEMBER_ID
        elif v["generation_id"] != self.generation:
            code = ErrorCode.ILLEGAL_GENERATION
        elif self.rebalancing:
            code = ErrorCode.REBALANCE_IN_PROGRESS
        else:
            code = ErrorCode.NONE
        return SimpleNamespace(error_code=code.value)

    async def _leave(self, v: Mapping[str, Any]) -> Any:
        for m in v["members"]:
            self.members.pop(m["member_id"], None)
        if self.members:
            self.rebalancing = True
        return SimpleNamespace(error_code=0, members=[])

    async def _commit(self, v: Mapping[str, Any]) -> Any:
        ok = v["member_id"] == "" or (
            v["member_id"] in self.members and v["generation_id_or_member_epoch"] == self.generation
        )
        code = 0 if ok else ErrorCode.ILLEGAL_GENERATION.value
        topics = []
        for t in v["topics"]:
            parts = []
            for p in t["partitions"]:
                if ok:
                    self.committed[TP(t["name"], p["partition_index"])] = OffsetAndMetadata(
                        p["committed_offset"], p["committed_metadata"]
                    )
                parts.append(SimpleNamespace(partition_index=p["partition_index"], error_code=code))
            topics.append(SimpleNamespace(name=t["name"], partitions=parts))
        return SimpleNamespace(error_code=0, topics=topics)

    async def _fetch(self, v: Mapping[str, Any]) -> Any:
        topics = []
        for t in v["topics"]:
            parts = []
            for p in t["partition_indexes"]:
                found = self.committed.get(TP(t["name"], p))
                parts.append(
                    SimpleNamespace(
                        partition_index=p,
                        committed_offset=-1 if found is None else found.offset,
                        metadata=None if found is None else found.metadata,
                        error_code=0,
                    )
                )
            topics.append(SimpleNamespace(name=t["name"], partitions=parts))
        return SimpleNamespace(error_code=0, topics=topics)


def config(**extra: Any) -> Any:
    values = {
        "bootstrap.servers": "127.0.0.1:1",
        "group.id": "g",
        "heartbeat.interval.ms": 10,
        "retry.backoff.ms": 1,
        "socket.connection.setup.timeout.ms": 200,
        "partition.assignment.strategy": "range",
    }
    values.update(extra)
    return parse_config("consumer", values)


async def partition_counts(topics: Any) -> dict[str, int]:
    return {t: TOPIC_PARTITIONS[t] for t in topics if t in TOPIC_PARTITIONS}


def membership(fake: FakeCoordinator, **extra: Any) -> GroupMembership:
    c = config(**extra)
    return GroupMembership(
        fake, c, assignors_for(c["partition.assignment.strategy"]), partition_counts
    )


async def settle(condition: Callable[[], bool], limit: float = 5.0) -> None:
    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(wait(), limit)


# -- the membership alone ---------------------------------------------------------------------


@synchronous
async def test_first_join_retries_with_the_member_id_the_coordinator_requires() -> None:
    fake = FakeCoordinator()
    m = membership(fake)
    assigned = await m.join(["t"], [])
    joins = fake.names(ApiKey.JOIN_GROUP)
    assert [j["member_id"] for j in joins] == ["", "member-1"]
    assert m.state is State.STABLE and m.member_id == "member-1" and m.generation == 1
    assert assigned == [TP("t", p) for p in range(6)]
    sub = decode_subscription(joins[-1]["protocols"][0]["metadata"])
    assert joins[-1]["protocols"][0]["name"] == "range"
    assert sub.topics == ("t",) and sub.version == 3
    await m.close()


@synchronous
async def test_three_members_get_kafkas_range_layout_from_the_leader() -> None:
    fake = FakeCoordinator(first_members=3)
    members = [membership(fake) for _ in range(3)]
    results = await asyncio.gather(*(m.join(["t"], []) for m in members))
    by_member = {m.member_id: r for m, r in zip(members, results, strict=True)}
    assert by_member == {
        "member-1": [TP("t", 0), TP("t", 1)],
        "member-2": [TP("t", 2), TP("t", 3)],
        "member-3": [TP("t", 4), TP("t", 5)],
    }
    leader_syncs = [s for s in fake.names(ApiKey.SYNC_GROUP) if s["assignments"]]
    assert len(leader_syncs) == 1
    sent = {
        a["member_id"]: decode_assignment(a["assignment"]).partitions
        for a in leader_syncs[0]["assignments"]
    }
    assert sent["member-2"] == (TP("t", 2), TP("t", 3))
    for m in members:
        await m.close()


@synchronous
async def test_heartbeat_outcomes_become_flags_for_the_next_poll() -> None:
    fake = FakeCoordinator()
    m = membership(fake)
    await m.join(["t"], [])
    fake.start_rebalance()
    await settle(lambda: m.need_rejoin)
    assert m.state is State.STABLE and not m.lost
    fake.rebalancing = False
    m.need_rejoin = False
    fake.members.clear()  # expired: heartbeats now meet UNKNOWN_MEMBER_ID
    await settle(lambda: m.state is State.UNJOINED)
    assert m.lost and m.need_rejoin and m.member_id == "" and m.generation == -1
    await m.join(["t"], [])
    assert m.member_id == "member-2" and not m.lost
    fake.heartbeat_error = ErrorCode.FENCED_INSTANCE_ID
    await settle(lambda: m.error is not None)
    assert m.error is not None and m.error.code is ErrorCode.FENCED_INSTANCE_ID
    await m.close()


@synchronous
async def test_no_heartbeat_answer_within_the_session_timeout_means_partitions_lost() -> None:
    fake = FakeCoordinator()
    m = membership(fake, **{"session.timeout.ms": 200, "heartbeat.interval.ms": 20})
    await m.join(["t"], [])
    await asyncio.sleep(0.3)  # answered heartbeats keep the member in for longer than a session
    assert m.state is State.STABLE and not m.lost and fake.forgotten == 0
    fake.unreachable = True
    await settle(lambda: m.state is State.UNJOINED)
    assert m.lost and m.need_rejoin and fake.forgotten == 1
    assert m.member_id == "member-1"  # kept: the coordinator says if it expired it
    fake.unreachable = False
    await m.join(["t"], [])
    assert m.state is State.STABLE and not m.lost and m.member_id == "member-1"
    await m.close()


@synchronous
async def test_no_poll_within_max_poll_interval_leaves_the_group() -> None:
    fake = FakeCoordinator()
    m = membership(fake, **{"max.poll.interval.ms": 50})
    await m.join(["t"], [])
    m.poll_started()
    await asyncio.sleep(0.1)
    assert fake.names(ApiKey.LEAVE_GROUP) == []  # inside a poll the timer does not run
    m.poll_finished()
    await settle(lambda: bool(fake.names(ApiKey.LEAVE_GROUP)))
    assert m.poll_timed_out and m.lost and m.state is State.UNJOINED
    assert fake.names(ApiKey.LEAVE_GROUP)[0]["members"][0]["member_id"] == "member-1"
    await m.close()


@synchronous
async def test_a_static_member_does_not_send_leave_group() -> None:
    fake = FakeCoordinator()
    m = membership(fake, **{"group.instance.id": "instance-1"})
    await m.join(["t"], [])
    assert fake.names(ApiKey.JOIN_GROUP)[-1]["group_instance_id"] == "instance-1"
    await m.leave("closing")
    assert fake.names(ApiKey.LEAVE_GROUP) == [] and m.state is State.UNJOINED
    await m.close()


# -- the consumer's rebalance handling ------------------------------------------------------


class Recorder(RebalanceListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, list[TP]]] = []

    def on_assigned(self, partitions: list[TP]) -> None:
        self.events.append(("assigned", partitions))

    def on_revoked(self, partitions: list[TP]) -> None:
        self.events.append(("revoked", partitions))

    def on_lost(self, partitions: list[TP]) -> None:
        self.events.append(("lost", partitions))


def consumer(fake: FakeCoordinator, **extra: Any) -> AIOConsumer:
    values = dict(config(**extra))
    values["bootstrap.servers"] = "127.0.0.1:1"
    c = AIOConsumer(values)
    assert c._membership is not None
    c._membership.channel = fake
    c._membership._partition_counts = partition_counts
    c._link = fake  # type: ignore[assignment]
    return c


async def poll_until(c: AIOConsumer, condition: Callable[[], bool], rounds: int = 200) -> None:
    for _ in range(rounds):
        if condition():
            return
        await c.poll(10)
    raise AssertionError("condition not reached")


@synchronous
async def test_consumer_assigns_at_committed_offsets_and_calls_the_listener() -> None:
    fake = FakeCoordinator()
    fake.committed[TP("t", 3)] = OffsetAndMetadata(42, "m")
    c = consumer(fake, **{"enable.auto.commit": False})
    listener = Recorder()
    c.subscribe(["t"], listener=listener)
    await poll_until(c, lambda: bool(c.assignment()))
    assert listener.events == [("assigned", [TP("t", p) for p in range(6)])]
    assert c._positions[TP("t", 3)] == 42
    committed = await c.commit({TP("t", 1): OffsetAndMetadata(7, "meta")})
    assert committed == {TP("t", 1): OffsetAndMetadata(7, "meta")}
    assert (await c.committed([TP("t", 1)]))[TP("t", 1)] == OffsetAndMetadata(7, "meta")
    assert fake.names(ApiKey.OFFSET_COMMIT)[-1]["generation_id_or_member_epoch"] == 1
    await c.close()
    assert listener.events[-1] == ("revoked", [TP("t", p) for p in range(6)])
    assert fake.names(ApiKey.LEAVE_GROUP)


@synchronous
async def test_eager_rebalance_revokes_everything_before_rejoining() -> None:
    fake = FakeCoordinator()
    c = consumer(fake, **{"enable.auto.commit": False})
    listener = Recorder()
    c.subscribe(["t"], listener=listener)
    await poll_until(c, lambda: bool(c.assignment()))
    fake.start_rebalance()
    await poll_until(c, lambda: len(listener.events) >= 3)
    assert [e[0] for e in listener.events[:3]] == ["assigned", "revoked", "assigned"]
    assert listener.events[1][1] == [TP("t", p) for p in range(6)]
    await c.close()


@synchronous
async def test_cooperative_rebalance_revokes_only_what_moves() -> None:
    fake = FakeCoordinator()
    strategy = {"partition.assignment.strategy": "cooperative-sticky", "enable.auto.commit": False}
    first, second = consumer(fake, **strategy), consumer(fake, **strategy)
    one, two = Recorder(), Recorder()
    first.subscribe(["t"], listener=one)
    await poll_until(first, lambda: len(first.assignment()) == 6)
    second.subscribe(["t"], listener=two)

    async def both() -> None:
        for _ in range(400):
            if len(first.assignment()) == 3 and len(second.assignment()) == 3:
                return
            await asyncio.gather(first.poll(10), second.poll(10))
        raise AssertionError(f"not balanced: {first.assignment()} {second.assignment()}")

    await both()
    kinds = [e[0] for e in one.events]
    assert kinds == ["assigned", "revoked"]  # never everything, never lost
    assert len(one.events[1][1]) == 3
    assert set(one.events[1][1]) == second.assignment()
    assert two.events == [("assigned", sorted(second.assignment()))]
    await first.close()
    await second.close()


@synchronous
async def test_lost_partitions_are_not_committed_and_go_to_on_lost() -> None:
    fake = FakeCoordinator()
    c = consumer(fake, **{"enable.auto.commit": True})
    listener = Recorder()
    c.subscribe(["t"], listener=listener)
    await poll_until(c, lambda: bool(c.assignment()))
    commits_before = len(fake.names(ApiKey.OFFSET_COMMIT))
    fake.members.clear()  # the coordinator expired us
    await poll_until(c, lambda: any(e[0] == "lost" for e in listener.events))
    assert ("revoked", [TP("t", p) for p in range(6)]) not in listener.events
    assert len(fake.names(ApiKey.OFFSET_COMMIT)) == commits_before
    await poll_until(c, lambda: bool(c.assignment()))
    fake.generation += 1  # a rebalance this member has not taken part in
    with pytest.raises(CommitFailedError):
        await c.commit({TP("t", 0): 1})
    assert c._membership is not None and c._membership.need_rejoin
    await c.close()


@synchronous
async def test_wakeup_interrupts_a_waiting_poll_and_is_cleared() -> None:
    fake = FakeCoordinator()
    c = consumer(fake)
    c.assign([TP("t", 0)])
    c.pause(TP("t", 0))
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, c.wakeup)
    with pytest.raises(WakeupError):
        await c.poll(5000)
    assert await c.poll(0) == []
    c.wakeup()
    with pytest.raises(WakeupError):
        await c.poll(0)
    await c.close()


def test_subscribe_needs_a_group_and_excludes_assign() -> None:
    plain = AIOConsumer({"bootstrap.servers": "127.0.0.1:1"})
    with pytest.raises(Exception, match=r"group\.id"):
        plain.subscribe(["t"])
    grouped = AIOConsumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g"})
    grouped.subscribe("^t.*")
    assert grouped._pattern is not None and grouped._pattern.pattern == "^t.*"
    with pytest.raises(Exception, match="assign"):
        grouped.assign([TP("t", 0)])
    with pytest.raises(ValueError):
        grouped.subscribe(["a"], pattern="b")
