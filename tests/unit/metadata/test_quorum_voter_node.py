"""A node's metadata side in quorum mode (``controller.quorum.voters`` set): what
build_metadata_node opens, that a single node's metadata log opens as the Raft log, and that
the controller refuses to change anything until it is the active controller."""

from __future__ import annotations

from pathlib import Path

import pytest
from metadata_helpers import ControllerFactory, FakeClock

from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.controller import AlterConfigsResource, NewTopic, NotControllerError
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.loader import MetadataLoader
from tidelog.metadata.node import build_metadata_node, load_entries
from tidelog.metadata.raft_log import FileRaftLog
from tidelog.protocol.error_codes import ErrorCode
from tidelog.runtime.system import Runtime


def _voter_config(data_dir: Path) -> BrokerConfig:
    return BrokerConfig(
        {
            "log.dirs": str(data_dir),
            "node.id": "1",
            "listeners": "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "controller.quorum.voters": "1@127.0.0.1:9093,2@127.0.0.1:9193,3@127.0.0.1:9293",
        }
    )


def test_a_single_nodes_metadata_log_opens_as_the_raft_log(
    start_controller: ControllerFactory, data_dir: Path, clock: FakeClock
) -> None:
    controller = start_controller()
    [created] = controller.create_topics([NewTopic("orders", 3, 1)])
    assert created.error.ok
    [altered] = controller.alter_configs(
        [AlterConfigsResource(2, "orders", {"retention.ms": "60000"})]
    )
    assert altered.error.ok
    written = controller.image
    controller.close()

    raft_log = FileRaftLog.open(data_dir, clock=clock)
    try:
        assert (raft_log.start_offset(), raft_log.end_offset()) == (0, written.offset + 1)
        entries = raft_log.read(0, 1 << 30)
    finally:
        raft_log.close()
    loader = MetadataLoader(MetadataImage.empty(written.cluster_id))
    load_entries(loader, entries)
    # Replayed as committed Raft entries, the log gives the image the single node had.
    assert loader.image == written


def test_a_voter_opens_the_raft_log_and_changes_nothing_until_it_is_active(
    data_dir: Path, clock: FakeClock
) -> None:
    node = build_metadata_node(_voter_config(data_dir), Runtime.system(clock))
    try:
        assert node.raft_log is not None and node.quorum_state is not None
        assert node.quorum_state.read() is None  # no epoch, no vote yet
        controller = node.controller
        # Nothing is registered or committed before the quorum runs: the broker registers
        # over the quorum once a leader is known.
        assert node.loader.image.offset == -1 and not node.loader.image.brokers
        assert not controller.is_active()
        with pytest.raises(NotControllerError) as info:
            controller.create_topics([NewTopic("orders", 1, 1)])
        assert info.value.code is ErrorCode.NOT_CONTROLLER
        assert node.raft_log.end_offset() == 0
    finally:
        node.close()
