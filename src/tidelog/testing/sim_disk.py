"""Simulated disks: what was not flushed is gone after a crash.

:class:`SimRaftLog` and :class:`SimQuorumStateStore` for one Raft node (snapshots and
truncations are durable when they return, as an fsynced rename is), :class:`SimReplicaLog`
for one partition replica of the replication simulation.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tidelog.metadata.raft.messages import Entry, OffsetAndEpoch
from tidelog.metadata.raft.store import QuorumState
from tidelog.records.batch import (
    BatchHeader,
    iter_batches,
    parse_header,
    set_base_offset,
    set_partition_leader_epoch,
)
from tidelog.replication.log import ReplicaLog

if TYPE_CHECKING:
    from tidelog.storage.log import Log

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


class _EpochStarts:
    """The leader-epoch cache of :class:`SimReplicaLog` (the rules of
    :class:`tidelog.storage.epoch.LeaderEpochCache`, durable at once as its checkpoint is)."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, int]] = []  # (epoch, start offset), both increasing

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else -1

    def assign(self, epoch: int, start_offset: int) -> bool:
        if epoch < 0 or (self.entries and epoch <= self.entries[-1][0]):
            return False
        while self.entries and self.entries[-1][1] >= start_offset:
            self.entries.pop()
        self.entries.append((epoch, start_offset))
        return True

    def end_offset_for(self, requested: int, log_end_offset: int) -> tuple[int, int]:
        if requested < 0 or not self.entries:
            return -1, -1
        if requested == self.entries[-1][0]:
            return requested, log_end_offset
        higher = bisect.bisect_right([e for e, _ in self.entries], requested)
        if higher == len(self.entries):
            return -1, -1
        if higher == 0:
            return requested, self.entries[0][1]
        return self.entries[higher - 1][0], self.entries[higher][1]

    def truncate_from_end(self, end_offset: int) -> None:
        while self.entries and self.entries[-1][1] >= end_offset:
            self.entries.pop()


class SimReplicaLog:
    """A partition log in memory that honours
    :class:`~tidelog.replication.log.ReplicaLog`: record batches in Kafka's format, whole-batch
    truncation, a leader-epoch cache, and a crash that loses whatever was not fsynced.

    The high watermark is checkpointed (as ``replication-offset-checkpoint`` would be) on
    every flush, so after a crash a replica starts from a stale one. ``on_append`` is called
    with ``(base offset, leader epoch, batch)`` for every batch written, so a checker can
    compare replicas as they write.
    """

    def __init__(self) -> None:
        self._batches: list[tuple[int, int, int, bytes]] = []  # (base, next, epoch, batch)
        self._bases: list[int] = []
        self._end = 0
        self._flushed = 0
        self._hw = 0
        self._hw_checkpoint = 0
        self.epoch_cache = _EpochStarts()
        self.on_append: Callable[[int, int, bytes], None] | None = None

    @property
    def log_start_offset(self) -> int:
        return 0

    @property
    def log_end_offset(self) -> int:
        return self._end

    @property
    def recovery_point(self) -> int:
        return self._flushed

    @property
    def high_watermark(self) -> int:
        return self._hw

    def update_high_watermark(self, offset: int) -> int:
        self._hw = min(max(offset, 0), self._end)
        return self._hw

    @property
    def latest_epoch(self) -> int:
        return self.epoch_cache.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.epoch_cache.end_offset_for(epoch, self._end)

    def batches(self) -> list[tuple[int, int, int, bytes]]:
        """``(base offset, next offset, leader epoch, batch)`` of every batch held."""
        return list(self._batches)

    def batch_at(self, offset: int) -> tuple[int, int, int, bytes] | None:
        """The batch holding ``offset``, if any."""
        index = bisect.bisect_right(self._bases, offset) - 1
        if index < 0:
            return None
        batch = self._batches[index]
        return batch if offset < batch[1] else None

    def _store(
        self, position: int, header: BatchHeader, buf: bytes | bytearray | memoryview
    ) -> None:
        batch = bytes(buf[position : position + header.size])
        base, epoch = header.base_offset, header.partition_leader_epoch
        self._batches.append((base, header.next_offset, epoch, batch))
        self._bases.append(base)
        self._end = header.next_offset
        if self.on_append is not None:
            self.on_append(base, epoch, batch)

    def append(
        self,
        batches: bytes | bytearray | memoryview,
        *,
        leader_epoch: int = -1,
        durable: bool = False,
    ) -> object:
        buf = bytearray(batches)
        first = self._end
        for position, _header in list(iter_batches(buf, verify_crc=False)):
            set_base_offset(buf, position, self._end)
            set_partition_leader_epoch(buf, position, leader_epoch)
            self._store(position, parse_header(buf, position), buf)
        self.epoch_cache.assign(leader_epoch, first)
        if durable:
            self.flush()
        return first

    def append_as_follower(
        self, batches: bytes | bytearray | memoryview, *, durable: bool = False
    ) -> object:
        first = self._end
        for position, header in iter_batches(batches, verify_crc=False):
            assert header.base_offset >= self._end, (header.base_offset, self._end)
            if header.partition_leader_epoch > self.epoch_cache.latest_epoch:
                self.epoch_cache.assign(header.partition_leader_epoch, header.base_offset)
            self._store(position, header, batches)
        if durable:
            self.flush()
        return first

    def truncate_to(self, offset: int) -> bool:
        if offset >= self._end:
            self.epoch_cache.truncate_from_end(self._end)
            return False
        # A batch is kept only when every offset it holds is below ``offset``.
        keep = bisect.bisect_right([nxt for _, nxt, _, _ in self._batches], offset)
        del self._batches[keep:]
        del self._bases[keep:]
        self._end = self._batches[-1][1] if self._batches else 0
        self._flushed = min(self._flushed, self._end)
        self._hw = min(self._hw, self._end)
        self.epoch_cache.truncate_from_end(self._end)
        return True

    def read_bytes(self, offset: int, max_bytes: int) -> bytes:
        index = bisect.bisect_right(self._bases, offset) - 1
        if index < 0 or offset >= self._end:
            return b""
        out: list[bytes] = []
        size = 0
        for _, _, _, batch in self._batches[index:]:
            if out and size + len(batch) > max_bytes:
                break
            out.append(batch)
            size += len(batch)
        return b"".join(out)

    def flush(self) -> None:
        self._flushed = self._end
        self._hw_checkpoint = self._hw

    def sync(self) -> bool:
        synced = self._flushed < self._end
        self.flush()
        return synced

    def crash(self, *, lose_unflushed: bool = True) -> None:
        """Lose what was not fsynced (unless the OS survived: a process kill keeps the page
        cache); the high watermark is the last checkpointed one."""
        if lose_unflushed:
            self.truncate_to(self._flushed)
        self._hw = min(self._hw_checkpoint, self._end)


def as_replica_log(log: Log | SimReplicaLog) -> ReplicaLog:
    """Both the real partition log and the model are replica logs (mypy checks this line),
    so the differential test and the simulation drive the same protocol."""
    return log
