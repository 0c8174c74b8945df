"""Group coordinator APIs through the handlers and the group driver, against a real
controller: FindCoordinator, JoinGroup/SyncGroup/Heartbeat/LeaveGroup, ListGroups,
DescribeGroups, DeleteGroups, OffsetCommit/OffsetFetch/OffsetDelete, loading and shutdown.

Each test runs inside one ``asyncio.run``: requests that the coordinator answers later
(JoinGroup, SyncGroup, writes) are tasks; time is the fake clock, and deadlines fire when
the test calls ``run_due_timers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import struct
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from kio.static.primitive import i32Timedelta, i64Timedelta

from tidelog.broker.broker import Broker
from tidelog.broker.groups import GroupDriver
from tidelog.broker.handlers.registry import HANDLERS
from tidelog.broker.reply import Deferred
from tidelog.metadata.controller import OFFSETS_TOPIC, NewTopic
from tidelog.protocol import ApiKey, ErrorCode, decode_response, encode_response

from .admin_fixtures import schema, versions
from .conftest import FakeClock, context

E = ErrorCode
GROUP_CONFIG = {"offsets.topic.num.partitions": "3"}


# -- helpers -------------------------------------------------------------------------------


def subscription(topics: Sequence[str]) -> bytes:
    """A ConsumerProtocolSubscription v0 for ``topics``."""
    out = bytearray(struct.pack(">hi", 0, len(topics)))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic.encode()
    return bytes(out + struct.pack(">i", -1))


def ms32(value: int) -> Any:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


async def send(broker: Broker, api_key: ApiKey, version: int, request: Any) -> asyncio.Task[Any]:
    """Run the handler now; a task that resolves to the response as a client decodes it."""
    ctx = context(broker, api_key, version)
    reply = await HANDLERS[api_key](ctx, request)

    async def finish() -> Any:
        response = reply.waiter if isinstance(reply, Deferred) else None
        answer = await response if response is not None else reply
        frame = encode_response(ctx.header, answer)
        _, decoded = decode_response(
            memoryview(frame)[4:], api_key=int(api_key), api_version=version, correlation_id=1
        )
        return decoded

    return asyncio.ensure_future(finish())


async def call(broker: Broker, api_key: ApiKey, version: int, request: Any) -> Any:
    return await (await send(broker, api_key, version, request))


def driver(broker: Broker) -> GroupDriver:
    assert broker.groups is not None
    return broker.groups


async def settle(rounds: int = 20) -> None:
    """Let background work (fsync threads, write reports) run."""
    for _ in range(rounds):
        await asyncio.sleep(0.001)


@contextlib.asynccontextmanager
async def running(
    start: Any, extra: dict[str, str] | None = None, *, create: bool = True
) -> AsyncIterator[Broker]:
    """A broker with a started group driver (and, with ``create``, a ready offsets topic
    and a topic "orders" with 2 partitions)."""
    broker = start({**GROUP_CONFIG, **(extra or {})})
    broker.groups = GroupDriver(broker)
    await broker.groups.start()
    try:
        if create:
            await make_ready(broker)
            if broker.image.topic("orders") is None:
                assert broker.controller is not None
                (created,) = broker.controller.create_topics([NewTopic("orders", 2, 1)])
                assert created.error.ok
        yield broker
    finally:
        await broker.groups.stop()


async def make_ready(broker: Broker) -> None:
    request = schema("find_coordinator", 3).FindCoordinatorRequest(key="g", key_type=0)
    await call(broker, ApiKey.FIND_COORDINATOR, 3, request)
    await driver(broker).wait_loaded()
    response = await call(broker, ApiKey.FIND_COORDINATOR, 3, request)
    assert response.error_code == E.NONE


def join_request(
    version: int,
    group: str,
    member_id: str = "",
    *,
    session_ms: int = 10_000,
    rebalance_ms: int = 30_000,
    topics: Sequence[str] = ("orders",),
    instance_id: str | None = None,
) -> Any:
    module = schema("join_group", version)
    values: dict[str, Any] = {
        "group_id": group,
        "session_timeout": ms32(session_ms),
        "member_id": member_id,
        "protocol_type": "consumer",
        "protocols": (
            module.JoinGroupRequestProtocol(name="range", metadata=subscription(topics)),
        ),
    }
    if version >= 1:
        values["rebalance_timeout"] = ms32(rebalance_ms)
    if version >= 5:
        values["group_instance_id"] = instance_id
    return module.JoinGroupRequest(**values)


async def join_new_member(broker: Broker, version: int, group: str, **kw: Any) -> asyncio.Task[Any]:
    """JoinGroup as a new member; from v4 the first answer is MEMBER_ID_REQUIRED and the
    member joins again with the id it got (KIP-394)."""
    first = await send(broker, ApiKey.JOIN_GROUP, version, join_request(version, group, **kw))
    if version < 4:
        return first
    response = await first
    assert response.error_code == E.MEMBER_ID_REQUIRED
    assert response.member_id.startswith("test-")
    request = join_request(version, group, response.member_id, **kw)
    return await send(broker, ApiKey.JOIN_GROUP, version, request)


async def until_done(clock: FakeClock, broker: Broker, tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Advance time by rebalance delays until every task is answered."""
    for _ in range(20):
        if all(t.done() for t in tasks):
            return
        clock.advance(3000)
        driver(broker).run_due_timers()
        await settle(3)
    raise AssertionError("the rebalance never completed")


def sync_request(
    version: int, group: str, generation: int, member_id: str, assignments: dict[str, bytes]
) -> Any:
    module = schema("sync_group", version)
    values: dict[str, Any] = {
        "group_id": group,
        "generation_id": generation,
        "member_id": member_id,
        "assignments": tuple(
            module.SyncGroupRequestAssignment(member_id=m, assignment=a)
            for m, a in assignments.items()
        ),
    }
    if version >= 5:
        values["protocol_type"] = "consumer"
        values["protocol_name"] = "range"
    return module.SyncGroupRequest(**values)


def heartbeat_request(version: int, group: str, generation: int, member_id: str) -> Any:
    return schema("heartbeat", version).HeartbeatRequest(
        group_id=group, generation_id=generation, member_id=member_id
    )


async def stable_group(
    clock: FakeClock,
    broker: Broker,
    group: str,
    *,
    members: int = 3,
    join_version: int = 9,
    sync_version: int = 5,
    topics: Sequence[str] = ("orders",),
) -> tuple[int, str, list[str]]:
    """Form a Stable group; (generation, leader, member ids)."""
    joins = [
        await join_new_member(broker, join_version, group, topics=topics) for _ in range(members)
    ]
    await until_done(clock, broker, joins)
    responses = [t.result() for t in joins]
    assert [r.error_code for r in responses] == [E.NONE] * members
    generation = responses[0].generation_id
    leader = responses[0].leader
    ids = [r.member_id for r in responses]
    syncs = [
        await send(
            broker,
            ApiKey.SYNC_GROUP,
            sync_version,
            sync_request(
                sync_version,
                group,
                generation,
                m,
                {x: x.encode() for x in ids} if m == leader else {},
            ),
        )
        for m in ids
    ]
    answers = await asyncio.gather(*syncs)
    assert [a.error_code for a in answers] == [E.NONE] * members
    return generation, leader, ids


# -- FindCoordinator -----------------------------------------------------------------------


def find_request(version: int, keys: Sequence[str], key_type: int = 0) -> Any:
    module = schema("find_coordinator", version)
    if version >= 4:
        return module.FindCoordinatorRequest(key_type=key_type, coordinator_keys=tuple(keys))
    if version == 0:
        return module.FindCoordinatorRequest(key=keys[0])
    return module.FindCoordinatorRequest(key=keys[0], key_type=key_type)


def coordinators(version: int, response: Any, keys: Sequence[str]) -> list[tuple[Any, ...]]:
    """(key, error, node, host, port) per key, whatever the version's layout."""
    if version >= 4:
        return [(c.key, c.error_code, c.node_id, c.host, c.port) for c in response.coordinators]
    r = response
    return [(keys[0], r.error_code, r.node_id, r.host, r.port)]


@pytest.mark.parametrize("version", versions(ApiKey.FIND_COORDINATOR))
def test_find_coordinator_creates_the_offsets_topic_then_answers(
    start_admin_broker: Any, version: int
) -> None:
    keys = ["group-a", "group-b", ""] if version >= 4 else ["group-a"]

    async def scenario() -> None:
        async with running(start_admin_broker, create=False) as broker:
            assert broker.image.topic(OFFSETS_TOPIC) is None
            first = await call(
                broker, ApiKey.FIND_COORDINATOR, version, find_request(version, keys)
            )
            # Kafka's answer while the topic is being created; the client asks again.
            assert coordinators(version, first, keys) == [
                (k, E.COORDINATOR_NOT_AVAILABLE, -1, "", -1) for k in keys
            ]
            topic = broker.image.topic(OFFSETS_TOPIC)
            assert topic is not None and topic.num_partitions == 3
            assert broker.image.topic_config(OFFSETS_TOPIC)["cleanup.policy"] == "compact"
            await driver(broker).wait_loaded()
            again = await call(
                broker, ApiKey.FIND_COORDINATOR, version, find_request(version, keys)
            )
            here = (broker.node_id, broker.advertised_host, broker.advertised_port)
            assert coordinators(version, again, keys) == [(k, E.NONE, *here) for k in keys]
            if version >= 1:
                failed = first.coordinators[0] if version >= 4 else first
                assert failed.error_message  # the reason, for the client's log
                assert (again.coordinators[0] if version >= 4 else again).error_message is None
                txn = await call(
                    broker,
                    ApiKey.FIND_COORDINATOR,
                    version,
                    find_request(version, keys, key_type=1),
                )
                assert {c[1] for c in coordinators(version, txn, keys)} == {
                    E.COORDINATOR_NOT_AVAILABLE
                }
                bad = await call(
                    broker,
                    ApiKey.FIND_COORDINATOR,
                    version,
                    find_request(version, keys, key_type=7),
                )
                assert {c[1] for c in coordinators(version, bad, keys)} == {E.INVALID_REQUEST}

    asyncio.run(scenario())


def test_offsets_topic_has_the_configured_partition_count_and_is_internal(
    start_admin_broker: Any,
) -> None:
    async def scenario() -> None:
        async with running(start_admin_broker, {"offsets.topic.num.partitions": "50"}) as broker:
            topic = broker.image.topic(OFFSETS_TOPIC)
            assert topic is not None and topic.num_partitions == 50
            assert len(broker.partitions.of_topic(OFFSETS_TOPIC)) == 50
            assert driver(broker).coordinator.owned_partitions() == frozenset(range(50))
            request = schema("metadata", 12).MetadataRequest(
                topics=(
                    schema("metadata", 12).MetadataRequestTopic(name=OFFSETS_TOPIC, topic_id=None),
                ),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
            metadata = await call(broker, ApiKey.METADATA, 12, request)
            assert metadata.topics[0].is_internal

    asyncio.run(scenario())


# -- the membership protocol ---------------------------------------------------------------


@pytest.mark.parametrize(("join_version", "sync_version"), [(0, 0), (3, 2), (5, 3), (7, 4), (9, 5)])
def test_three_members_join_and_sync_to_stable(
    start_admin_broker: Any, clock: FakeClock, join_version: int, sync_version: int
) -> None:
    async def scenario() -> None:
        async with running(start_admin_broker) as broker:
            joins = [await join_new_member(broker, join_version, "g1") for _ in range(3)]
            await settle()
            # The initial rebalance delay holds the first generation back.
            assert not any(t.done() for t in joins)
            await until_done(clock, broker, joins)
            responses = [t.result() for t in joins]
            assert {r.error_code for r in responses} == {E.NONE}
            assert {r.generation_id for r in responses} == {1}
            assert {r.protocol_name for r in responses} == {"range"}
            leader = responses[0].leader
            ids = [r.member_id for r in responses]
            assert leader in ids and len(set(ids)) == 3
            for r in responses:
                if r.member_id == leader:
                    assert sorted(m.member_id for m in r.members) == sorted(ids)
                    assert {bytes(m.metadata) for m in r.members} == {subscription(["orders"])}
                else:
                    assert r.members == ()
            if join_version >= 7:
                assert {r.protocol_type for r in responses} == {"consumer"}

            # Followers wait for the leader's assignment; every member gets its own.
            followers = [m for m in ids if m != leader]
            waiting = [
                await send(
                    broker,
                    ApiKey.SYNC_GROUP,
                    sync_version,
                    sync_request(sync_version, "g1", 1, m, {}),
                )
                for m in followers
            ]
            await settle()
            assert not any(t.done() for t in waiting)
            assignments = {m: f"partitions-of-{m}".encode() for m in ids}
            leader_sync = await send(
                broker,
                ApiKey.SYNC_GROUP,
                sync_version,
                sync_request(sync_version, "g1", 1, leader, assignments),
            )
            answers = await asyncio.gather(leader_sync, *waiting)
            for member, answer in zip([leader, *followers], answers, strict=True):
                assert answer.error_code == E.NONE
                assert bytes(answer.assignment) == assignments[member]
                if sync_version >= 5:
                    assert (answer.protocol_type, answer.protocol_name) == ("consumer", "range")

            described = await call(
                broker,
                ApiKey.DESCRIBE_GROUPS,
                5,
                schema("describe_groups", 5).DescribeGroupsRequest(
                    groups=("g1",), include_authorized_operations=True
                ),
            )
            (group,) = described.groups
            assert (group.error_code, group.group_state, group.protocol_type) == (
                E.NONE,
                "Stable",
                "consumer",
            )
            assert group.protocol_data == "range"
            assert group.authorized_operations == (1 << 3) | (1 << 6) | (1 << 8)
            by_id = {m.member_id: m for m in group.members}
            assert set(by_id) == set(ids)
            for m in ids:
                assert bytes(by_id[m].member_assignment) == assignments[m]
                assert (by_id[m].client_id, by_id[m].client_host) == ("test", "/test")

    asyncio.run(scenario())


@pytest.mark.parametrize("version", versions(ApiKey.HEARTBEAT))
def test_heartbeats_and_session_expiry(
    start_admin_broker: Any, clock: FakeClock, version: int
) -> None:
    async def scenario() -> None:
        async with running(start_admin_broker) as broker:
            generation, _, ids = await stable_group(clock, broker, "g", members=2)

            async def beat(member: str, gen: int = generation, group: str = "g") -> Any:
                request = heartbeat_request(version, group, gen, member)
                return (await call(broker, ApiKey.HEARTBEAT, version, request)).error_code

            assert await beat(ids[0]) == E.NONE
            assert await beat(ids[0], generation + 1) == E.ILLEGAL_GENERATION
            assert await beat("nobody") == E.UNKNOWN_MEMBER_ID
            assert await beat(ids[0], group="") == E.INVALID_GROUP_ID
            # Only ids[0] keeps beating: ids[1]'s session (10 s) runs out.
            for _ in range(4):
                clock.advance(3000)
                assert await beat(ids[0]) in (E.NONE, E.REBALANCE_IN_PROGRESS)
                driver(broker).run_due_timers()
            assert await beat(ids[0]) == E.REBALANCE_IN_PROGRESS
            assert await beat(ids[1]) == E.UNKNOWN_MEMBER_ID

    asyncio.run(scenario())


@pytest.mark.parametrize("version", versions(ApiKey.LEAVE_GROUP))
def test_leave_group_starts_a_rebalance(
    start_admin_broker: Any, clock: FakeClock, version: int
) -> None:
    async def scenario() -> None:
        async with running(start_admin_broker) as broker:
            generation, _, ids = await stable_group(clock, broker, "g", members=2)
            module = schema("leave_group", version)
            if version < 3:
                request = module.LeaveGroupRequest(group_id="g", member_id=ids[1])
                unknown = module.LeaveGroupRequest(group_id="g", member_id="nobody")
            else:
                request = module.LeaveGroupRequest(
                    group_id="g", members=(module.MemberIdentity(member_id=ids[1]),)
                )
                unknown = module.LeaveGroupRequest(
                    group_id="g",
                    members=(
                        module.MemberIdentity(member_id="nobody"),
                        module.MemberIdentity(member_id=ids[0]),
                    ),
                )
            left = await call(broker, ApiKey.LEAVE_GROUP, version, request)
            assert left.error_code == E.NONE
            if version >= 3:
                assert [(m.member_id, m.error_code) for m in left.members] == [(ids[1], E.NONE)]
            beat = await call(
                broker, ApiKey.HEARTBEAT, 1, heartbeat_request(1, "g", generation, ids[0])
            )
            assert beat.error_code == E.REBALANCE_IN_PROGRESS
            answer = await call(broker, ApiKey.LEAVE_GROUP, version, unknown)
            if version < 3:
                assert answer.error_code == E.UNKNOWN_MEMBER_ID
            else:
                assert answer.error_code == E.NONE
                assert [(m.member_id, m.error_code) for m in answer.members] == [
                    ("nobody", E.UNKNOWN_MEMBER_ID),
                    (ids[0], E.NONE),
                ]

    asyncio.run(scenario())


def test_member_id_required_and_pending_member_expiry(
    start_admin_broker: Any, clock: FakeClock
) -> None:
    async def scenario() -> None:
        async with running(start_admin_broker) as broker:
            first = await call(broker, ApiKey.JOIN_GROUP, 9, join_request(9, "g"))
            assert first.error_code == E.MEMBER_ID_REQUIRED
            assert first.generation_id == -1 and first.member_id
            # A second member joins for real; the first never comes back with its id.
            second = await join_new_member(broker, 9, "g")
            await until_done(clock, broker, [second])
            answer = second.result()
            assert answer.error_code == E.NONE
            assert [m.member_id for m in answer.members] == [answer.member_id]
            # The initial delay completed the join without the pending member; its id is
            # unknown once its session timeout (10 s) has passed.
            clock.advance(10_000)
            driver(broker).run_due_timers()
            group = driver(broker).coordinator.group("g")
            assert group is not None and group.pending_members == set()
            late = await call(broker, ApiKey.JOIN_GROUP, 9, join_request(9, "g", first.member_id))
            assert late.error_code == E.UNKNOWN_MEMBER_ID

    asyncio.run(scenario())


def test_join_group_checks_group_id_and_session_timeout_bounds(
    start_admin_broker: Any,
) -> None:
    async def scenario() -> None:
        extra = {"group.min.session.timeout.ms": "7000", "group.max.session.timeout.ms": "9000"}
        async with running(start_admin_broker, extra) as broker:
            empty = await call(broker, ApiKey.JOIN_GROUP, 5, join_request(5, "", session_ms=8000))
            assert empty.error_code == E.INVALID_GROUP_ID
            for session in (6999, 9001):
                answer = await call(
                    broker, ApiKey.JOIN_GROUP, 5, join_request(5, "g", session_ms=session)
                )
                assert answer.error_code == E.INVALID_SESSION_TIMEOUT
            ok = await call(broker, ApiKey.JOIN_GROUP, 5, join_request(5, "g", session_ms=8000))
            assert ok.error_code == E.MEMBER_ID_REQUIRED

    asyncio.run(scenario())


# -- ListGroups / DescribeGroups / DeleteGroups --------------------------------------------


def commit_request(
    version: int,
    group: str,
    offsets: dict[tuple[str, int], int],
    *,
    generation: int = -1,
    member_id: str = "",
    broker: Broker | None = None,
) -> Any:
    module = schema("offset_commit", version)
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), offset in offsets.items():
        values: dict[str, Any] = {
            "partition_index": partition,
            "committed_offset": offset,
            "committed_metadata": f"m{offset}",
        }
        if version >= 6:
            values["committed_leader_epoch"] = 0
        by_topic.setdefault(topic, []).append(module.OffsetCommitRequestPartition(**values))
    topics = []
    for topic, partitions in by_topic.items():
        if version >= 10:
            assert broker is not None
            topic_id = broker.topic_id_of(topic)
            topics.append(
                module.OffsetCommitRequestTopic(topic_id=topic_id, partitions=tuple(partitions))
            )
        else:
            topics.append(module.OffsetCommitRequestTopic(name=topic, partitions=tuple(partitions)))
    values = {
        "group_id": group,
        "generation_id_or_member_epoch": generation,
        "member_id": member_id,
        "topics": tuple(topics),
    }
    if 2 <= version <= 4:
        values["retention_time"] = i64Timedelta.parse(datetime.timedelta(milliseconds=-1))
    return module.OffsetCommitRequest(**values)


def test_list_describe_and_delete_groups(start_admin_broker: Any, clock: FakeClock) -> None:
    async def scenario() -> None:
        async with running(start_admin_broker) as broker:
            await stable_group(clock, broker, "busy", members=1)
            committed = await call(
                broker, ApiKey.OFFSET_COMMIT, 8, commit_request(8, "idle", {("orders", 0): 5})
            )
            assert committed.topics[0].partitions[0].error_code == E.NONE

            for version in versions(ApiKey.LIST_GROUPS):
                module = schema("list_groups", version)
                request = module.ListGroupsRequest()
                listed = await call(broker, ApiKey.LIST_GROUPS, version, request)
                assert listed.error_code == E.NONE
                assert [(g.group_id, g.protocol_type) for g in listed.groups] == [
                    ("busy", "consumer"),
                    ("idle", ""),
                ]
                if version >= 4:
                    assert [g.group_state for g in listed.groups] == ["Stable", "Empty"]
                    only = await call(
                        broker,
                        ApiKey.LIST_GROUPS,
                        version,
                        module.ListGroupsRequest(states_filter=("stable",)),
                    )
                    assert [g.group_id for g in only.groups] == ["busy"]
                if version >= 5:
                    assert {g.group_type for g in listed.groups} == {"classic"}

            for version in versions(ApiKey.DESCRIBE_GROUPS):
                module = schema("describe_groups", version)
                values: dict[str, Any] = {"groups": ("idle", "missing")}
                if version >= 3:
                    values["include_authorized_operations"] = False
                described = await call(
                    broker, ApiKey.DESCRIBE_GROUPS, version, module.DescribeGroupsRequest(**values)
                )
                idle, missing = described.groups
                assert (idle.error_code, idle.group_state, idle.members) == (E.NONE, "Empty", ())
                expected = E.GROUP_ID_NOT_FOUND if version >= 6 else E.NONE
                assert (missing.error_code, missing.group_state) == (expected, "Dead")
                if version >= 3:
                    assert idle.authorized_operations == -(2**31)

            for version in versions(ApiKey.DELETE_GROUPS):
                module = schema("delete_groups", version)
                request = module.DeleteGroupsRequest(groups_names=("busy", "nope"))
                deleted = await call(broker, ApiKey.DELETE_GROUPS, version, request)
                assert [(r.group_id, r.error_code) for r in deleted.results] == [
                    ("busy", E.NON_EMPTY_GROUP),
                    ("nope", E.GROUP_ID_NOT_FOUND),
                ]
            deleted = await call(
                broker,
                ApiKey.DELETE_GROUPS,
                2,
                schema("delete_groups", 2).DeleteGroupsRequest(groups_names=("idle", "idle")),
            )
            assert [(r.group_id, r.error_code) for r in deleted.results] == [("idle", E.NONE)]
            listed = await call(
                broker, ApiKey.LIST_GROUPS, 3, schema("list_groups", 3).ListGroupsRequest()
            )
            assert [g.group_id for g in listed.groups] == ["busy"]
            fetched = await call(broker, ApiKey.OFFSET_FETCH, 7, fetch_request(7, "idle", None))
            assert fetched.topics == ()

    asyncio.run(scenario())


# -- offsets -------------------------------------------------------------------------------


def fetch_request(
    version: int, group: str, wanted: dict[str, list[int]] | None, broker: Broker | None = None
) -> Any:
    module = schema("offset_fetch", version)
    if version >= 8:
        return module.OffsetFetchRequest(groups=(fetch_group(version, group, wanted, broker),))
    topics = (
        None
        if wanted is None
        else tuple(
            module.OffsetFetchRequestTopic(name=t, partition_indexes=tuple(ps))
            for t, ps in wanted.items()
        )
    )
    return module.OffsetFetchRequest(group_id=group, topics=topics)


def fetch_group(
    version: int, group: str, wanted: dict[str, list[int]] | None, broker: Broker | None
) -> Any:
    module = schema("offset_fetch", version)
    topics = None
    if wanted is not None:
        if version >= 10:
            assert broker is not None
            topics = tuple(
                module.OffsetFetchRequestTopics(
                    topic_id=broker.topic_id_of(t), partition_indexes=tuple(ps)
                )
                for t, ps in wanted.items()
            )
        else:
            topics = tuple(
                module.OffsetFetchRequestTopics(name=t, partition_indexes=tuple(ps))
                for t, ps in wanted.items()
            )
    return module.OffsetFetchRequestGroup(group_id=group, topics=topics)


def fetched(
    version: int, topics: Sequence[Any], broker: Broker
) -> dict[tuple[str, int], tuple[int, str | None, int]]:
    out = {}
    for t in topics:
        name = broker.topic_name_of(t.topic_id) if version >= 10 else t.name
        for p in t.partitions:
            out[(name, p.partition_index)] = (p.committed_offset, p.metadata, p.error_code)
    return out


@pytest.mark.parametrize("version", versions(ApiKey.OFFSET_COMMIT))
def test_commit_then_fetch_offsets(start_admin_broker: Any, version: int) -> None:
    async def scenario() -> None:
        async with running(start_admin_broker) as broker:
            offsets = {("orders", 0): 10, ("orders", 1): 20}
            request = commit_request(version, "g", offsets, broker=broker)
            response = await call(broker, ApiKey.OFFSET_COMMIT, version, request)
            assert [
                (p.partition_index, p.error_code) for t in response.topics for p in t.partitions
            ] == [(0, E.NONE), (1, E.NONE)]
            # Unknown partitions are refused one by one; the others are committed.
            mixed = await call(
                broker,
                ApiKey.OFFSET_COMMIT,
                version,
                commit_request(version, "g", {("orders", 0): 11, ("orders", 7): 1}, broker=broker),
            )
            assert [p.error_code for t in mixed.topics for p in t.partitions] == [
                E.NONE,
                E.UNKNOWN_TOPIC_OR_PARTITION,
            ]
            for fetch_version in versions(ApiKey.OFFSET_FETCH):
                wanted = {"orders": [0, 1, 5]}
                answer = await call(
                    broker,
                    ApiKey.OFFSET_FETCH,
                    fetch_version,
                    fetch_request(fetch_version, "g", wanted, broker),
                )
                topics = answer.groups[0].topics if fetch_version >= 8 else answer.topics
                assert fetched(fetch_version, topics, broker) == {
                    ("orders", 0): (11, "m11", E.NONE),
                    ("orders", 1): (20, "m20", E.NONE),
                    ("orders", 5): (-1, "", E.NONE),
                }
                if fetch_version >= 2:
                    every = await call(
                        broker,
                        ApiKey.OFFSET_FETCH,
                        fetch_version,
                        fetch_request(fetch_version, "g", None, broker),
                    )
                    topics = every.groups[0].topics if fetch_version >= 8 else every.topics
                    assert set(fetched(fetch_version, topics, broker)) == {
                        ("orders", 0),
                        ("orders", 1),
                    }

    asyncio.run(scenario())


@pytest.mark.parametrize("version", [8, 9, 10])
def test_offset_fetch_of_several_groups(start_admin_broker: Any, version: int) -> None:
    async def scenario() -> None:
        async with running(start_admin_broker) as broker:
            for group, offset in (("a", 1), ("b", 2)):
                request = commit_request(8, group, {("orders", 0): offset})
                response = await call(broker, ApiKey.OFFSET_COMMIT, 8, request)
                assert response.topics[0].partitions[0].error_code == E.NONE
            module = schema("offset_fetch", version)
            request = module.OffsetFetchRequest(
                groups=tuple(
                    fetch_group(version, g, {"orders": [0]}, broker) for g in ("b", "a", "c")
                )
            )
            answer = await call(broker, ApiKey.OFFSET_FETCH, version, request)
            assert [g.group_id for g in answer.groups] == ["b", "a", "c"]
            assert [
                fetched(version, g.topics, broker)[("orders", 0)][0] for g in answer.groups
            ] == [2, 1, -1]
            assert {g.error_code for g in answer.groups} == {E.NONE}

    asyncio.run(scenario())


def test_commit_by_unknown_topic_id(start_admin_broker: Any) -> None:
    import uuid

    async def scenario() -> None:
        async with running(start_admin_broker) as broker:
            module = schema("offset_commit", 10)
            part = module.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=3, committed_metadata=None
            )
            request = module.OffsetCommitRequest(
                group_id="g",
                member_id="",
                topics=(
                    module.OffsetCommitRequestTopic(topic_id=uuid.uuid4(), partitions=(part,)),
                    module.OffsetCommitRequestTopic(
                        topic_id=broker.topic_id_of("orders"), partitions=(part,)
                    ),
                ),
            )
            answer = await call(broker, ApiKey.OFFSET_COMMIT, 10, request)
            assert [t.partitions[0].error_code for t in answer.topics] == [
                E.UNKNOWN_TOPIC_ID,
                E.NONE,
            ]

    asyncio.run(scenario())


def test_commits_from_members_and_offset_delete(start_admin_broker: Any, clock: FakeClock) -> None:
    async def scenario() -> None:
        async with running(start_admin_broker) as broker:
            assert broker.controller is not None
            broker.controller.create_topics([NewTopic("other", 1, 1)])
            generation, leader, _ = await stable_group(clock, broker, "g", members=1)
            offsets = {("orders", 0): 4, ("other", 0): 9}
            stale = await call(
                broker,
                ApiKey.OFFSET_COMMIT,
                8,
                commit_request(8, "g", offsets, generation=generation + 1, member_id=leader),
            )
            assert {p.error_code for t in stale.topics for p in t.partitions} == {
                E.ILLEGAL_GENERATION
            }
            ok = await call(
                broker,
                ApiKey.OFFSET_COMMIT,
                8,
                commit_request(8, "g", offsets, generation=generation, member_id=leader),
            )
            assert {p.error_code for t in ok.topics for p in t.partitions} == {E.NONE}

            module = schema("offset_delete", 0)
            request = module.OffsetDeleteRequest(
                group_id="g",
                topics=tuple(
                    module.OffsetDeleteRequestTopic(
                        name=t, partitions=(module.OffsetDeleteRequestPartition(partition_index=0),)
                    )
                    for t in ("orders", "other")
                ),
            )
            deleted = await call(broker, ApiKey.OFFSET_DELETE, 0, request)
            assert deleted.error_code == E.NONE
            # The member subscribes to "orders": its offset stays.
            assert [(t.name, t.partitions[0].error_code) for t in deleted.topics] == [
                ("orders", E.GROUP_SUBSCRIBED_TO_TOPIC),
                ("other", E.NONE),
            ]
            answer = await call(
                broker, ApiKey.OFFSET_FETCH, 7, fetch_request(7, "g", {"orders": [0], "other": [0]})
            )
            assert fetched(7, answer.topics, broker) == {
                ("orders", 0): (4, "m4", E.NONE),
                ("other", 0): (-1, "", E.NONE),
            }
            missing = await call(
                broker,
                ApiKey.OFFSET_DELETE,
                0,
                module.OffsetDeleteRequest(group_id="nope", topics=request.topics),
            )
            assert (missing.error_code, missing.topics) == (E.GROUP_ID_NOT_FOUND, ())

    asyncio.run(scenario())


# -- loading and shutdown ------------------------------------------------------------------


def test_requests_during_loading(start_admin_broker: Any) -> None:
    async def scenario() -> None:
        async with running(start_admin_broker) as broker:
            pass
        # A second driver on the same broker: its partitions load in the background.
        broker.groups = GroupDriver(broker)
        await broker.groups.start()
        try:
            beat = await call(broker, ApiKey.HEARTBEAT, 4, heartbeat_request(4, "g", 1, "m"))
            assert beat.error_code == E.COORDINATOR_LOAD_IN_PROGRESS
            found = await call(broker, ApiKey.FIND_COORDINATOR, 6, find_request(6, ["g"]))
            assert found.coordinators[0].error_code == E.COORDINATOR_NOT_AVAILABLE
            listed = await call(
                broker, ApiKey.LIST_GROUPS, 4, schema("list_groups", 4).ListGroupsRequest()
            )
            assert listed.error_code == E.COORDINATOR_LOAD_IN_PROGRESS
            await broker.groups.wait_loaded()
            found = await call(broker, ApiKey.FIND_COORDINATOR, 6, find_request(6, ["g"]))
            assert found.coordinators[0].error_code == E.NONE
        finally:
            await broker.groups.stop()

    asyncio.run(scenario())


def test_stop_answers_waiting_requests(start_admin_broker: Any) -> None:
    async def scenario() -> None:
        async with running(start_admin_broker) as broker:
            waiting = await join_new_member(broker, 9, "g")
            await settle()
            assert not waiting.done()
            await driver(broker).stop()
            answer = await waiting
            assert answer.error_code == E.NOT_COORDINATOR
            # Requests after the stop are refused, so clients look for the coordinator again.
            late = await call(broker, ApiKey.JOIN_GROUP, 9, join_request(9, "g"))
            assert late.error_code == E.COORDINATOR_NOT_AVAILABLE
            found = await call(broker, ApiKey.FIND_COORDINATOR, 3, find_request(3, ["g"]))
            assert found.error_code == E.COORDINATOR_NOT_AVAILABLE

    asyncio.run(scenario())


def test_handlers_without_a_driver_answer_coordinator_not_available(
    start_admin_broker: Any,
) -> None:
    async def scenario() -> None:
        broker = start_admin_broker(GROUP_CONFIG)
        found = await call(broker, ApiKey.FIND_COORDINATOR, 6, find_request(6, ["g"]))
        assert found.coordinators[0].error_code == E.COORDINATOR_NOT_AVAILABLE
        joined = await call(broker, ApiKey.JOIN_GROUP, 9, join_request(9, "g"))
        assert joined.error_code == E.COORDINATOR_NOT_AVAILABLE
        committed = await call(
            broker, ApiKey.OFFSET_COMMIT, 8, commit_request(8, "g", {("orders", 0): 1})
        )
        assert committed.topics[0].partitions[0].error_code == E.COORDINATOR_NOT_AVAILABLE

    asyncio.run(scenario())
