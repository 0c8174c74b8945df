"""Failed log dirs reach the controller: the ids a broker's heartbeat reports (BrokerHeartbeat
v1 OfflineLogDirs, KIP-858) are recorded per broker, for the controller to move leadership
off them, and a broker names its dirs by the ``directory.id`` of their meta.properties."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

from test_metadata_cluster import Quorum

from tidelog.metadata.controller.cluster import HeartbeatRequest
from tidelog.metadata.meta_properties import (
    directory_uuids,
    ensure_meta_properties,
    read_meta_properties,
)


def beat(quorum: Quorum, broker_id: int, offline: tuple[uuid.UUID, ...]) -> None:
    registration = quorum.image.brokers[broker_id]
    request = HeartbeatRequest(
        broker_id, registration.epoch, quorum.image.offset, offline_log_dirs=offline
    )
    assert quorum.commit(quorum.control.heartbeat(quorum.view(), request, quorum.now))


def test_heartbeats_record_each_brokers_offline_log_dirs() -> None:
    quorum = Quorum()
    quorum.join(1)
    quorum.join(2)
    failed, later = uuid.uuid4(), uuid.uuid4()
    assert quorum.control.offline_log_dirs == {}
    beat(quorum, 1, (failed,))
    assert quorum.control.offline_log_dirs == {1: {failed}}
    # Every heartbeat repeats the set; only a dir not reported before is news.
    assert quorum.control.note_offline_log_dirs(1, (failed, later)) == {later}
    assert quorum.control.note_offline_log_dirs(1, (failed, later)) == set()
    beat(quorum, 2, ())
    assert quorum.control.offline_log_dirs == {1: {failed, later}}
    # A restarted broker, its dirs back, reports none.
    beat(quorum, 1, ())
    assert quorum.control.offline_log_dirs == {}


def test_directory_uuids_are_the_meta_properties_directory_ids(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b", tmp_path / "unformatted"]
    for directory in dirs:
        directory.mkdir()
    ensure_meta_properties(dirs[:2], node_id=1, cluster_id=None)
    ids = directory_uuids(dirs)
    assert set(ids) == set(dirs[:2])
    for directory in dirs[:2]:
        props = read_meta_properties(directory)
        assert props is not None and props.directory_id is not None
        text = base64.urlsafe_b64encode(ids[directory].bytes).decode("ascii").rstrip("=")
        assert text == props.directory_id
    assert ids[dirs[0]] != ids[dirs[1]]
