"""The production Raft node on its real disk stores: a single voter elects itself, commits
operations, snapshots, and after a restart from the files keeps its epoch, its vote and
every committed entry."""

from __future__ import annotations

import random
from pathlib import Path

from tidelog.metadata.quorum_state import FileQuorumStateStore
from tidelog.metadata.raft import Entry, OffsetAndEpoch, QuorumState, RaftConfig, RaftNode, Role
from tidelog.metadata.raft.batches import decode_leader_change
from tidelog.metadata.raft_log import FileRaftLog
from tidelog.protocol.error_codes import ErrorCode

CONFIG = RaftConfig()


class DiskNode:
    """Node 1, the only voter, over files under ``root``; ``now`` is a fake clock."""

    def __init__(self, root: Path, now: int, seed: int) -> None:
        self.log = FileRaftLog.open(root, clock=lambda: 1_700_000_000_000 + now)
        self.store = FileQuorumStateStore.open(root, [1])
        self.now = now
        self.node = RaftNode(1, [1], CONFIG, self.log, self.store, random.Random(seed), now)

    def run_until_leader(self) -> None:
        for _ in range(10):
            if self.node.role is Role.LEADER:
                return
            deadline = self.node.next_deadline()
            assert deadline is not None
            self.now = max(self.now, deadline)
            assert self.node.tick(self.now).messages == []  # nobody else to ask
        raise AssertionError(f"no leader: {self.node.role}")

    def commit(self, records: list[bytes]) -> int:
        result = self.node.propose(records, self.now)
        assert result.error is ErrorCode.NONE
        effects = self.node.tick(self.now)  # the flush, then the commit
        assert effects.high_watermark == result.last_offset + 1
        return result.base_offset

    def committed(self) -> list[Entry]:
        return self.node.read_committed(0, 1000)

    def close(self) -> None:
        self.log.close()


def test_a_single_voter_on_disk_restarts_with_its_epoch_vote_and_committed_entries(
    tmp_path: Path,
) -> None:
    first = DiskNode(tmp_path, now=0, seed=1)
    assert first.node.epoch == 0
    first.run_until_leader()
    assert (first.node.epoch, first.store.read()) == (1, QuorumState(1, 1, 1))
    assert first.commit([b"create topic", b"partition 0", b"partition 1"]) == 1
    assert first.commit([b"alter config"]) == 4
    committed = first.committed()
    assert [(e.offset, e.epoch, e.control) for e in committed] == [
        (0, 1, True),
        (1, 1, False),
        (4, 1, False),
    ]
    assert decode_leader_change(committed[0].records[0]).leader_id == 1
    first.close()

    second = DiskNode(tmp_path, now=first.now, seed=2)
    # The quorum state came back from the file: a leader that restarts waits for the next
    # epoch rather than leading the same one again.
    assert (second.node.epoch, second.node.voted_for, second.node.leader_id) == (1, 1, 1)
    assert second.node.role is Role.RESIGNED
    assert list(second.log.read(0, 1 << 20)) == committed
    second.run_until_leader()
    assert second.node.epoch == 2
    assert second.store.read() == QuorumState(2, 1, 1)
    # The new epoch's LeaderChange commits everything before it.
    assert second.committed()[:3] == committed
    snapshot_end = second.node.high_watermark
    assert second.node.create_snapshot(snapshot_end, [b"image"]) == OffsetAndEpoch(snapshot_end, 2)
    assert second.commit([b"after the snapshot"]) == snapshot_end
    second.close()

    third = DiskNode(tmp_path, now=second.now, seed=3)
    assert (third.node.epoch, third.node.high_watermark) == (2, snapshot_end)
    assert third.node.latest_snapshot() == (OffsetAndEpoch(snapshot_end, 2), (b"image",))
    assert third.log.start_offset() == snapshot_end
    third.run_until_leader()
    assert third.node.epoch == 3
    records = [r for e in third.committed() if not e.control for r in e.records]
    assert records == [b"after the snapshot"]
    third.close()
