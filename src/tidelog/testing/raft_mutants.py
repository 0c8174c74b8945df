"""Raft nodes that break one rule on purpose, used only by the tests that prove the
simulation's checker catches each broken rule."""

from __future__ import annotations

from collections.abc import Sequence

from tidelog.metadata.raft.messages import Entry, OffsetAndEpoch
from tidelog.metadata.raft.node import ProposeResult, RaftNode, Role
from tidelog.protocol.error_codes import ErrorCode


class DoubleVoteNode(RaftNode):
    """Grants a vote to any candidate of its epoch, even after voting for another."""

    def _may_vote_for(self, candidate_id: int) -> bool:
        return self._role is not Role.LEADER


class CommitOldEpochNode(RaftNode):
    """Commits entries of earlier epochs by counting replicas (Raft's figure 8 mistake)."""

    def _may_commit_to(self, offset: int) -> bool:
        return True


class UnflushedFetchNode(RaftNode):
    """Reports its log end in Fetch without flushing what it appended."""

    def _fetch_position(self) -> OffsetAndEpoch:
        return OffsetAndEpoch(self._log.end_offset(), self._log.last_epoch())


class VoteForStaleLogNode(RaftNode):
    """Votes for a candidate whose log is behind its own."""

    def _candidate_log_is_up_to_date(self, last_epoch: int, end_offset: int) -> bool:
        return True


class UnflushedVoteNode(RaftNode):
    """Grants votes and acknowledges epochs without flushing the quorum-state file."""

    def _flush_quorum_state(self) -> None:
        pass


class SnapshotPastCommitNode(RaftNode):
    """Lets a snapshot summarise flushed entries that are not committed yet."""

    def snapshot_limit(self) -> int:
        return self._log.flushed_end_offset()


class SplitOperationNode(RaftNode):
    """Appends each record of an operation as an entry of its own, so that the operation
    can commit in part."""

    def propose(self, records: Sequence[bytes], now: int) -> ProposeResult:
        if self._role is not Role.LEADER:
            return super().propose(records, now)
        base = self._log.end_offset()
        self._log.append(
            [Entry(base + i, self.epoch, (bytes(record),)) for i, record in enumerate(records)]
        )
        self._flush_at = now
        return ProposeResult(
            ErrorCode.NONE, self.epoch, self.node_id, base, base + len(records) - 1
        )


MUTANTS: dict[str, type[RaftNode]] = {
    "double-vote": DoubleVoteNode,
    "commit-old-epoch": CommitOldEpochNode,
    "unflushed-fetch": UnflushedFetchNode,
    "vote-for-stale-log": VoteForStaleLogNode,
    "unflushed-vote": UnflushedVoteNode,
    "snapshot-past-commit": SnapshotPastCommitNode,
    "split-operation": SplitOperationNode,
}
