"""The broker over a failing log dir: the request that hit the I/O error and every later one
for the partitions there get KAFKA_STORAGE_ERROR; Fetch serves nothing from it; Metadata and
DescribeLogDirs show it; the partitions of the other dir carry on. A BrokerHeartbeat's
OfflineLogDirs reaches the controller."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from kio.schema.broker_heartbeat.v1.request import BrokerHeartbeatRequest
from kio.schema.types import BrokerId
from kio.static.primitive import i64

from tidelog.broker.handlers.fetch import handle_fetch
from tidelog.broker.handlers.registry import CONTROLLER_HANDLERS
from tidelog.broker.metrics import BrokerMetrics
from tidelog.broker.reply import Deferred, join_parts
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.runtime.failing_disk import FailingDirs

from .admin_fixtures import create_topic
from .conftest import context, make_batch, produce_request
from .test_admin_log_dirs import describe_log_dirs, held
from .test_admin_metadata import metadata
from .test_fetch_helpers import Want, decode_body, fetch, fetch_request
from .test_produce import call as call_produce

STORAGE_ERROR = ErrorCode.KAFKA_STORAGE_ERROR


class Setup:
    def __init__(self, broker: Any, dirs: list[Path], failing: set[str]) -> None:
        self.broker = broker
        self.dirs = dirs
        self.failing = failing

    def fail(self, directory: Path) -> None:
        self.failing.add(str(directory))


@pytest.fixture
def setup(start_admin_broker: Any, tmp_path: Path) -> Setup:
    dirs = [tmp_path / "a", tmp_path / "b"]
    failing: set[str] = set()
    broker = start_admin_broker(
        {"log.dirs": ",".join(map(str, dirs))}, fsync=FailingDirs(os.fsync, lambda: failing)
    )
    create_topic(broker, "t", partitions=2)
    # A new log goes to the dir with fewest logs: t-0 in a, t-1 in b.
    for index, directory in enumerate(dirs):
        assert broker.partitions.get("t", index).log.directory.parent == directory
    return Setup(broker, dirs, failing)


def produce(broker: Any, partitions: dict[int, bytes], acks: int) -> dict[int, Any]:
    response = call_produce(broker, 9, produce_request(9, {"t": partitions}, acks=acks))
    return {p.index: p for p in response.responses[0].partition_responses}


def test_failed_fsync_answers_storage_error_then_the_partition_stays_offline(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    broker = setup.broker
    assert (
        produce(broker, {0: make_batch([b"a0"]), 1: make_batch([b"b0"])}, acks=-1)[1].error_code
        == 0
    )
    setup.fail(setup.dirs[1])
    with caplog.at_level(logging.ERROR):
        answers = produce(broker, {0: make_batch([b"a1"]), 1: make_batch([b"b1"])}, acks=-1)
    assert answers[0].error_code == ErrorCode.NONE
    assert answers[1].error_code == STORAGE_ERROR
    # The log line names the directory and the cause.
    offline_lines = [r.getMessage() for r in caplog.records if "offline" in r.getMessage()]
    assert any(
        str(setup.dirs[1]) in line and "injected I/O error" in line for line in offline_lines
    )
    partition = broker.partitions.get("t", 1)
    assert partition.offline
    end = partition.log.log_end_offset
    # Later requests: refused before anything is written, acks=1 included.
    later = produce(broker, {1: make_batch([b"b2"])}, acks=1)[1]
    assert later.error_code == STORAGE_ERROR
    assert str(setup.dirs[1]) in later.error_message
    assert partition.log.log_end_offset == end
    # Fetch serves nothing from the offline dir; the other partition still reads.
    response, _ = fetch(broker, fetch_request(broker, 12, [Want("t", 0), Want("t", 1)]))
    by_index = {p.partition_index: p for p in response.responses[0].partitions}
    assert by_index[1].error_code == STORAGE_ERROR and not by_index[1].records
    assert by_index[0].error_code == ErrorCode.NONE and b"a1" in by_index[0].records
    # t-1 is not recreated, empty, in the dir that works.
    again = broker.partitions.ensure(
        "t", 1, config=partition.log.config, topic_id=partition.topic_id, leader_epoch=0
    )
    assert again is partition
    assert not (setup.dirs[0] / "t-1").exists()


def test_metadata_and_describe_log_dirs_show_the_offline_dir(setup: Setup) -> None:
    broker = setup.broker
    logs = broker.partitions.logs
    logs.mark_offline(setup.dirs[1], OSError(errno.EIO, "Input/output error"))
    topic = metadata(broker, 12, ["t"]).topics[0]
    by_index = {p.partition_index: p for p in topic.partitions}
    assert by_index[0].error_code == ErrorCode.NONE and by_index[0].leader_id == broker.node_id
    assert by_index[1].error_code == ErrorCode.LEADER_NOT_AVAILABLE
    assert by_index[1].leader_id == -1
    assert tuple(by_index[1].offline_replicas) == (broker.node_id,)
    results = {r.log_dir: r for r in describe_log_dirs(broker, 4, None).results}
    offline = results[os.path.abspath(setup.dirs[1])]
    online = results[os.path.abspath(setup.dirs[0])]
    assert offline.error_code == STORAGE_ERROR and offline.topics == ()
    assert (offline.total_bytes, offline.usable_bytes) == (-1, -1)
    assert online.error_code == ErrorCode.NONE and sorted(held(online)) == [("t", 0)]
    metrics = BrokerMetrics()
    scraped = metrics.render(metrics.gather(broker)).decode()
    assert "\nkafka_log_manager_offline_log_directory_count 1.0\n" in scraped
    assert "\nkafka_controller_offline_partitions 1.0\n" in scraped


def test_a_waiting_fetch_is_answered_when_its_dir_goes_offline(setup: Setup) -> None:
    broker = setup.broker
    request = fetch_request(broker, 12, [Want("t", 1)], max_wait_ms=60_000)

    async def go() -> Any:
        reply = await handle_fetch(context(broker, ApiKey.FETCH, 12), request)
        assert isinstance(reply, Deferred)
        waiting = asyncio.ensure_future(reply.waiter)
        await asyncio.sleep(0)
        assert not waiting.done()
        broker.partitions.logs.mark_offline(setup.dirs[1], OSError(errno.EIO, "EIO"))
        broker.partitions.wake_offline()
        # Bounded only so that a broken wake-up fails instead of hanging.
        return await asyncio.wait_for(waiting, 30)

    encoded = asyncio.run(go())

    response = decode_body(ApiKey.FETCH, 12, join_parts(encoded.parts))
    encoded.close()
    assert response.responses[0].partitions[0].error_code == STORAGE_ERROR


def test_broker_heartbeat_v1_hands_the_offline_log_dirs_to_the_controller(setup: Setup) -> None:
    broker = setup.broker
    controller = broker.controller
    registration = controller.image.brokers[broker.node_id]
    failed = uuid.uuid4()
    request = BrokerHeartbeatRequest(
        broker_id=BrokerId(broker.node_id),
        broker_epoch=i64(registration.epoch),
        current_metadata_offset=i64(controller.image.offset),
        want_fence=False,
        want_shut_down=False,
        offline_log_dirs=(failed,),
    )
    ctx = context(broker, ApiKey.BROKER_HEARTBEAT, 1)
    response = asyncio.run(CONTROLLER_HANDLERS[ApiKey.BROKER_HEARTBEAT](ctx, request))
    assert response.error_code == ErrorCode.NONE
    # ClusterControl is the controller's membership part; its record is the hook's input.
    assert controller._cluster.offline_log_dirs == {broker.node_id: {failed}}
