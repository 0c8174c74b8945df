"""A simulated disk for one Raft node: what was not flushed is gone after a crash."""

from __future__ import annotations

from collections.abc import Sequence

from tidelog.metadata.raft.messages import Entry, OffsetAndEpoch
from tidelog.metadata.raft.store import QuorumState

# Bytes a record batch header adds to a payload, so that max_bytes limits behave roughly as
# they would on a real log.
_ENTRY_OVERHEAD = 70


class SimRaftLog:
    """An in-memory :class:`~tidelog.metadata.raft.store.RaftLog` with a leader-epoch cache.

    The log has no snapshot, so it starts at offset 0.
    """

    def __init__(self) -> None:
        self._entries: list[Entry] = []
        self._flushed = 0
        # (epoch, first offset of that epoch), epochs increasing: Kafka's leader-epoch cache.
        self._epoch_starts: list[tuple[int, int]] = []

    def start_offset(self) -> int:
        return 0

    def end_offset(self) -> int:
        return len(self._entries)

    def flushed_end_offset(self) -> int:
        return self._flushed

    def last_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else 0

    def entry_epoch(self, offset: int) -> int:
        return self._entries[offset].epoch

    def entry(self, offset: int) -> Entry:
        return self._entries[offset]

    def read(self, start: int, max_bytes: int) -> Sequence[Entry]:
        out: list[Entry] = []
        size = 0
        for entry in self._entries[start:]:
            size += len(entry.payload) + _ENTRY_OVERHEAD
            if out and size > max_bytes:
                break
            out.append(entry)
        return out

    def append(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            assert entry.offset == len(self._entries), (entry.offset, len(self._entries))
            assert entry.epoch >= self.last_epoch(), (entry.epoch, self.last_epoch())
            if entry.epoch > self.last_epoch() or not self._epoch_starts:
                self._epoch_starts.append((entry.epoch, entry.offset))
            self._entries.append(entry)

    def truncate_to(self, end_offset: int) -> None:
        del self._entries[end_offset:]
        self._flushed = min(self._flushed, end_offset)
        while self._epoch_starts and self._epoch_starts[-1][1] >= end_offset:
            self._epoch_starts.pop()

    def flush(self) -> None:
        self._flushed = len(self._entries)

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        for i in range(len(self._epoch_starts) - 1, -1, -1):
            found, _ = self._epoch_starts[i]
            if found <= epoch:
                end = (
                    self._epoch_starts[i + 1][1]
                    if i + 1 < len(self._epoch_starts)
                    else len(self._entries)
                )
                return OffsetAndEpoch(end, found)
        return OffsetAndEpoch(0, 0)

    def latest_snapshot_id(self) -> OffsetAndEpoch | None:
        return None

    def crash(self) -> None:
        """Lose every entry that was not flushed."""
        self.truncate_to(self._flushed)


class SimQuorumStateStore:
    """The quorum-state file in memory: a write is durable only once flushed."""

    def __init__(self) -> None:
        self._written: QuorumState | None = None
        self._durable: QuorumState | None = None

    def read(self) -> QuorumState | None:
        return self._durable

    def write(self, state: QuorumState) -> None:
        self._written = state

    def flush(self) -> None:
        self._durable = self._written

    def crash(self) -> None:
        self._written = self._durable
