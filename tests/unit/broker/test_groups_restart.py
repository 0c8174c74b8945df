"""The group coordinator's state survives a broker restart: it is replayed from
``__consumer_offsets`` (committed offsets, the last group state, deletions), and records
that cannot be read do not keep a partition from loading."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidelog.broker.broker import Broker
from tidelog.broker.groups import GroupDriver
from tidelog.broker.partitions import Partitions
from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.controller import OFFSETS_TOPIC, NewTopic
from tidelog.metadata.log import METADATA_PARTITION, METADATA_TOPIC
from tidelog.metadata.node import build_metadata_node
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.records import BatchBuilder, build_end_txn_marker_batch
from tidelog.runtime.system import Runtime
from tidelog.storage import LogManager

from .admin_fixtures import schema
from .conftest import FakeClock
from .test_groups import (
    GROUP_CONFIG,
    call,
    commit_request,
    fetch_request,
    fetched,
    heartbeat_request,
    make_ready,
    stable_group,
)

E = ErrorCode


def open_broker(path: Path, clock: FakeClock) -> tuple[Broker, Callable[[], None]]:
    """A broker with a real controller on ``path`` (as the app builds it), and its closer."""
    values = {"log.dirs": str(path / "data"), **GROUP_CONFIG}
    node = build_metadata_node(BrokerConfig(values), Runtime.system(clock))
    controller = node.controller
    config = controller.config
    logs = LogManager(
        config.log_dirs,
        clock=clock,
        default_config=config.default_log_config,
        reserved_dirs={f"{METADATA_TOPIC}-{METADATA_PARTITION}"},
    )
    logs.open()
    broker = Broker(
        node_id=config.node_id, partitions=Partitions(logs), clock=clock, controller=controller
    )
    broker.apply_metadata(controller.image, None)
    node.loader.add_publisher(broker.apply_metadata)

    def close() -> None:
        broker.partitions.close()
        logs.close()
        node.close()

    return broker, close


async def start_groups(broker: Broker) -> GroupDriver:
    broker.groups = GroupDriver(broker)
    await broker.groups.start()
    await broker.groups.wait_loaded()
    return broker.groups


def describe(broker: Broker, group: str) -> Any:
    request = schema("describe_groups", 5).DescribeGroupsRequest(
        groups=(group,), include_authorized_operations=False
    )
    return call(broker, ApiKey.DESCRIBE_GROUPS, 5, request)


def test_offsets_and_group_state_come_back_after_a_restart(
    tmp_path: Path, clock: FakeClock
) -> None:
    async def before() -> tuple[int, str, list[str], Any]:
        broker, close = open_broker(tmp_path, clock)
        try:
            groups = await start_groups(broker)
            await make_ready(broker)
            assert broker.controller is not None
            broker.controller.create_topics([NewTopic("orders", 2, 1)])
            generation, leader, ids = await stable_group(clock, broker, "g", members=2)
            member_commit = commit_request(
                8,
                "g",
                {("orders", 0): 7, ("orders", 1): 8},
                generation=generation,
                member_id=leader,
            )
            committed = await call(broker, ApiKey.OFFSET_COMMIT, 8, member_commit)
            assert {p.error_code for t in committed.topics for p in t.partitions} == {E.NONE}
            for group, offset in (("solo", 3), ("gone", 4)):
                request = commit_request(8, group, {("orders", 0): offset})
                answer = await call(broker, ApiKey.OFFSET_COMMIT, 8, request)
                assert answer.topics[0].partitions[0].error_code == E.NONE
            # A newer commit replaces an older one of the same partition.
            again = await call(
                broker, ApiKey.OFFSET_COMMIT, 8, commit_request(8, "solo", {("orders", 0): 5})
            )
            assert again.topics[0].partitions[0].error_code == E.NONE
            deleted = await call(
                broker,
                ApiKey.DELETE_GROUPS,
                2,
                schema("delete_groups", 2).DeleteGroupsRequest(groups_names=("gone",)),
            )
            assert deleted.results[0].error_code == E.NONE
            state = (await describe(broker, "g")).groups[0]
            await groups.stop()
            return generation, leader, ids, state
        finally:
            close()

    async def after(generation: int, leader: str, ids: list[str], state: Any) -> None:
        broker, close = open_broker(tmp_path, clock)
        try:
            groups = await start_groups(broker)
            try:
                assert groups.coordinator.owned_partitions() == frozenset(range(3))
                answer = await call(
                    broker, ApiKey.OFFSET_FETCH, 7, fetch_request(7, "g", {"orders": [0, 1]})
                )
                assert fetched(7, answer.topics, broker) == {
                    ("orders", 0): (7, "m7", E.NONE),
                    ("orders", 1): (8, "m8", E.NONE),
                }
                solo = await call(broker, ApiKey.OFFSET_FETCH, 7, fetch_request(7, "solo", None))
                assert fetched(7, solo.topics, broker) == {("orders", 0): (5, "m5", E.NONE)}
                gone = await call(broker, ApiKey.OFFSET_FETCH, 7, fetch_request(7, "gone", None))
                assert gone.topics == ()

                restored = (await describe(broker, "g")).groups[0]
                assert restored == state
                assert restored.group_state == "Stable"
                listed = await call(
                    broker, ApiKey.LIST_GROUPS, 4, schema("list_groups", 4).ListGroupsRequest()
                )
                assert [(g.group_id, g.group_state) for g in listed.groups] == [
                    ("g", "Stable"),
                    ("solo", "Empty"),
                ]
                # The members' sessions start at load time: they carry on where they were.
                for member in ids:
                    beat = await call(
                        broker, ApiKey.HEARTBEAT, 4, heartbeat_request(4, "g", generation, member)
                    )
                    assert beat.error_code == E.NONE
            finally:
                await groups.stop()
        finally:
            close()

    asyncio.run(after(*asyncio.run(before())))


def test_unreadable_records_and_control_batches_are_skipped_when_loading(
    tmp_path: Path, clock: FakeClock
) -> None:
    async def before() -> int:
        broker, close = open_broker(tmp_path, clock)
        try:
            groups = await start_groups(broker)
            await make_ready(broker)
            assert broker.controller is not None
            broker.controller.create_topics([NewTopic("orders", 1, 1)])
            answer = await call(
                broker, ApiKey.OFFSET_COMMIT, 8, commit_request(8, "g", {("orders", 0): 42})
            )
            assert answer.topics[0].partitions[0].error_code == E.NONE
            index = groups.coordinator.partition_for("g")
            await groups.stop()
            partition = broker.partitions.get(OFFSETS_TOPIC, index)
            assert partition is not None
            garbage = BatchBuilder()
            garbage.append(b"\x00", b"not a group record", timestamp=clock())
            garbage.append(b"\x00\x05\x00", None, timestamp=clock())
            partition.append(bytearray(garbage.close()))
            marker = build_end_txn_marker_batch(
                commit=True, producer_id=7, producer_epoch=0, coordinator_epoch=0, timestamp=0
            )
            partition.append(bytearray(marker))
            return index
        finally:
            close()

    async def after() -> None:
        broker, close = open_broker(tmp_path, clock)
        try:
            groups = await start_groups(broker)
            try:
                assert groups.coordinator.owned_partitions() == frozenset(range(3))
                answer = await call(
                    broker, ApiKey.OFFSET_FETCH, 7, fetch_request(7, "g", {"orders": [0]})
                )
                assert fetched(7, answer.topics, broker) == {("orders", 0): (42, "m42", E.NONE)}
            finally:
                await groups.stop()
        finally:
            close()

    asyncio.run(before())
    asyncio.run(after())
