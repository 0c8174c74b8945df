"""The quorum-state file (tidelog.metadata.quorum_state): Kafka's JSON, replaced durably,
and never silently reset."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from tidelog.metadata.quorum_state import FileQuorumStateStore, QuorumStateError
from tidelog.metadata.raft import QuorumState, RaftConfig, RaftNode
from tidelog.testing.sim_disk import SimRaftLog

PARTITION = "__cluster_metadata-0"


def test_a_missing_file_is_epoch_zero_and_a_flushed_state_reads_back(tmp_path: Path) -> None:
    store = FileQuorumStateStore.open(tmp_path, [3, 1, 2], cluster_id="abc")
    assert store.path == tmp_path / PARTITION / "quorum-state"
    assert store.read() is None
    store.write(QuorumState(epoch=5, voted_for=2, leader_id=None))
    assert store.read() is None  # written, not flushed: not on disk yet
    store.flush()
    assert store.read() == QuorumState(5, 2, None)
    assert json.loads(store.path.read_text()) == {
        "clusterId": "abc",
        "leaderId": -1,
        "leaderEpoch": 5,
        "votedId": 2,
        "appliedOffset": 0,
        "currentVoters": [{"voterId": 1}, {"voterId": 2}, {"voterId": 3}],
        "data_version": 0,
    }
    store.write(QuorumState(epoch=6, voted_for=None, leader_id=3))
    store.flush()
    reopened = FileQuorumStateStore.open(tmp_path, [1, 2, 3])
    assert reopened.read() == QuorumState(6, None, 3)
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / PARTITION).iterdir())


def test_the_new_state_is_fsynced_before_the_rename_and_the_directory_after(
    tmp_path: Path,
) -> None:
    store = FileQuorumStateStore.open(tmp_path, [1])
    store.write(QuorumState(1, 1, None))
    store.flush()
    calls: list[tuple[str, str]] = []

    def recording_fsync(fd: int) -> None:
        # Which file is being synced, and what the quorum-state file holds at that moment.
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), store.path.read_text()))
        os.fsync(fd)

    store = FileQuorumStateStore.open(tmp_path, [1], fsync=recording_fsync)
    store.write(QuorumState(2, 1, 1))
    store.flush()
    old = '"leaderEpoch":1'
    new = '"leaderEpoch":2'
    assert len(calls) == 2
    (temp, content_then), (directory, content_after) = calls
    assert temp == str(store.path) + ".tmp" and old in content_then
    assert directory == str(store.path.parent) and new in content_after


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "is not JSON"),
        (b'{"leaderEpoch": 3, "votedId"', "is not JSON"),
        (b"[1, 2]", "does not hold a JSON object"),
        (b'{"leaderId":1,"leaderEpoch":3,"votedId":-1,"data_version":1}', "data_version 1"),
        (b'{"leaderId":1,"votedId":-1,"data_version":0}', "leaderEpoch None"),
        (b'{"leaderId":1,"leaderEpoch":"3","votedId":-1,"data_version":0}', "leaderEpoch '3'"),
        (b'{"leaderId":1,"leaderEpoch":-2,"votedId":-1,"data_version":0}', "leaderEpoch -2"),
        (b'{"leaderId":1,"leaderEpoch":3,"votedId":true,"data_version":0}', "votedId True"),
        (b'{"leaderId":1,"leaderEpoch":3,"votedId":-7,"data_version":0}', "votedId -7"),
        (b"\xff\xfe", "is not JSON"),
    ],
)
def test_a_corrupt_file_is_refused_with_one_line(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    store = FileQuorumStateStore.open(tmp_path, [1, 2, 3])
    store.path.write_bytes(content)
    with pytest.raises(QuorumStateError) as caught:
        store.read()
    message = str(caught.value)
    assert problem in message and str(store.path) in message
    assert "\n" not in message
    # A node refuses to start on it rather than starting afresh at epoch 0.
    with pytest.raises(QuorumStateError):
        RaftNode(1, [1, 2, 3], RaftConfig(), SimRaftLog(), store, random.Random(0), 0)
