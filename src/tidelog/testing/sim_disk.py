"""A simulated disk for one Raft node: what was not flushed is gone after a crash.

Snapshots and truncations are durable when they return, as an fsynced rename is.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from tidelog.metadata.raft.messages import Entry, OffsetAndEpoch
from tidelog.metadata.raft.store import QuorumState

# Bytes a record batch header adds to an entry's records, so that max_bytes limits behave
# roughly as they would on a real log.
_ENTRY_OVERHEAD = 70


class SimRaftLog:
    """An in-memory :class:`~tidelog.metadata.raft.store.RaftLog` with a leader-epoch cache
    and one snapshot (the latest). Entries span several offsets; every offset it is given
    where an entry boundary is due is checked to be one."""

    def __init__(self) -> None:
        self._start = 0
        self._entries: list[Entry] = []  # each starting where the one before ends
        self._offsets: list[int] = []  # the entries' first offsets, for bisecting
        self._end = 0
        self._flushed = 0  # an offset
        # (epoch, first offset of that epoch in the log), epochs increasing: Kafka's
        # leader-epoch cache.
        self._epoch_starts: list[tuple[int, int]] = []
        self._snapshot: tuple[OffsetAndEpoch, bytes] | None = None

    def start_offset(self) -> int:
        return self._start

    def end_offset(self) -> int:
        return self._end

    def flushed_end_offset(self) -> int:
        return self._flushed

    def _snapshot_epoch(self) -> int:
        return self._snapshot[0].epoch if self._snapshot is not None else 0

    def last_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else self._snapshot_epoch()

    def entry_epoch(self, offset: int) -> int:
        return self.entry(offset).epoch

    def entry_start(self, offset: int) -> int:
        return self.entry(offset).offset

    def _index(self, offset: int) -> int:
        """The index of the entry holding ``offset``."""
        assert self._start <= offset < self._end, (offset, self._start, self._end)
        return bisect.bisect_right(self._offsets, offset) - 1

    def _boundary_index(self, offset: int) -> int:
        """The index of the entry starting at the boundary ``offset`` (len at the end)."""
        if offset == self._end:
            return len(self._entries)
        index = self._index(offset)
        assert self._offsets[index] == offset, f"offset {offset} is inside an entry"
        return index

    def entry(self, offset: int) -> Entry:
        """The entry holding ``offset``."""
        return self._entries[self._index(offset)]

    def entries(self) -> list[Entry]:
        return list(self._entries)

    def read(self, start: int, max_bytes: int) -> Sequence[Entry]:
        assert start >= self._start, (start, self._start)
        out: list[Entry] = []
        size = 0
        for entry in self._entries[self._boundary_index(start) :]:
            size += entry.size + _ENTRY_OVERHEAD
            if out and size > max_bytes:
                break
            out.append(entry)
        return out

    def append(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            assert entry.offset == self._end, (entry.offset, self._end)
            assert entry.epoch >= self.last_epoch(), (entry.epoch, self.last_epoch())
            if not self._epoch_starts or entry.epoch > self._epoch_starts[-1][0]:
                self._epoch_starts.append((entry.epoch, entry.offset))
            self._entries.append(entry)
            self._offsets.append(entry.offset)
            self._end = entry.end_offset

    def truncate_to(self, end_offset: int) -> None:
        assert end_offset >= self._start, f"truncation to {end_offset} below {self._start}"
        if end_offset >= self._end:
            return
        index = self._boundary_index(end_offset)
        del self._entries[index:]
        del self._offsets[index:]
        self._end = end_offset
        self._flushed = min(self._flushed, end_offset)
        while self._epoch_starts and self._epoch_starts[-1][1] >= end_offset:
            self._epoch_starts.pop()

    def flush(self) -> None:
        self._flushed = self._end

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        for i in range(len(self._epoch_starts) - 1, -1, -1):
            found, _ = self._epoch_starts[i]
            if found <= epoch:
                end = self._epoch_starts[i + 1][1] if i + 1 < len(self._epoch_starts) else self._end
                return OffsetAndEpoch(end, found)
        return OffsetAndEpoch(self._start, self._snapshot_epoch())

    def latest_snapshot_id(self) -> OffsetAndEpoch | None:
        return self._snapshot[0] if self._snapshot is not None else None

    def read_snapshot(self) -> tuple[OffsetAndEpoch, bytes] | None:
        return self._snapshot

    def write_snapshot(self, snapshot_id: OffsetAndEpoch, payload: bytes) -> None:
        offset = snapshot_id.offset
        assert self._start < offset <= self._flushed, (self._start, offset, self._flushed)
        assert self.entry_epoch(offset - 1) == snapshot_id.epoch
        index = self._boundary_index(offset)
        self._snapshot = (snapshot_id, payload)
        del self._entries[:index]
        del self._offsets[:index]
        self._start = offset
        # The epochs that ended before the snapshot leave the cache; the one it ends in now
        # starts at the log start.
        kept = [
            (e, max(o, offset))
            for i, (e, o) in enumerate(self._epoch_starts)
            if i + 1 == len(self._epoch_starts) or self._epoch_starts[i + 1][1] > offset
        ]
        self._epoch_starts = [(e, o) for e, o in kept if o < self._end]

    def install_snapshot(self, snapshot_id: OffsetAndEpoch, payload: bytes) -> None:
        self._snapshot = (snapshot_id, payload)
        self._entries = []
        self._offsets = []
        self._epoch_starts = []
        self._start = self._end = self._flushed = snapshot_id.offset

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
