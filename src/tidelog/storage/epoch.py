"""The leader epoch cache: for each leader epoch, the first offset written in it.

Persisted in the partition's ``leader-epoch-checkpoint`` in the checkpoint text
format (version ``0``, count, then ``epoch start_offset`` lines), replaced
atomically on every change. Changes are rare (one per leader election), so each
one is written durably at once.

Invariants: epochs strictly increase and start offsets strictly increase along
the list. The cache is truncated with the log (entries starting at or after the
new end go) and trimmed at its start when the log start offset moves (the last
epoch starting at or below the new log start is kept, moved up to it).
"""

from __future__ import annotations

import bisect
import logging
import os
from pathlib import Path
from typing import NamedTuple

from tidelog.storage.checkpoint import FsyncFn, parse_int_field, read_checkpoint, write_checkpoint
from tidelog.storage.errors import CorruptCheckpointError

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"

_log = logging.getLogger(__name__)


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """Epoch -> start offset, kept in memory and mirrored to a checkpoint file."""

    def __init__(self, path: Path, fsync: FsyncFn = os.fsync) -> None:
        self._path = path
        self._fsync = fsync
        self._entries: list[EpochEntry] = []
        try:
            rows = read_checkpoint(path, 2)
            entries = [
                EpochEntry(
                    parse_int_field(epoch, str(path), 0, 2**31 - 1),
                    parse_int_field(offset, str(path), 0),
                )
                for epoch, offset in rows
            ]
        except CorruptCheckpointError as exc:
            # Derived data: a bad cache only costs followers a longer truncation walk.
            _log.warning("ignoring corrupt leader epoch checkpoint: %s", exc)
            entries = []
        for entry in entries:
            if self._entries and (
                entry.epoch <= self._entries[-1].epoch
                or entry.start_offset < self._entries[-1].start_offset
            ):
                _log.warning("ignoring out of order leader epoch entry %s in %s", entry, path)
                continue
            self._entries.append(entry)

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch in which ``offset`` was written, or ``UNDEFINED_EPOCH``."""
        starts = [entry.start_offset for entry in self._entries]
        index = bisect.bisect_right(starts, offset) - 1
        return self._entries[index].epoch if index >= 0 else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; False when nothing changed."""
        if epoch < 0:
            return False
        if self._entries and epoch <= self._entries[-1].epoch:
            return False
        # A new epoch cannot start before data of an older one that is still kept.
        while self._entries and self._entries[-1].start_offset >= start_offset:
            self._entries.pop()
        self._entries.append(EpochEntry(epoch, start_offset))
        self._persist()
        return True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: ``(epoch, end offset)`` for ``requested_epoch``.

        The end offset is the start offset of the first epoch above the requested one
        (the log end offset for the latest epoch). The returned epoch is the largest
        known epoch not above the requested one; when the requested epoch is below every
        known epoch, it is returned as is with the first epoch's start offset; when it
        is above every known epoch (or the cache is empty, or it is undefined) the answer
        is ``(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)``.
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch == self._entries[-1].epoch:
            return requested_epoch, log_end_offset
        epochs = [entry.epoch for entry in self._entries]
        higher = bisect.bisect_right(epochs, requested_epoch)
        if higher == len(epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        floor = higher - 1
        if floor < 0:
            return requested_epoch, self._entries[higher].start_offset
        return self._entries[floor].epoch, self._entries[higher].start_offset

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop epochs that start at or after ``end_offset`` (the log was truncated)."""
        keep = len(self._entries)
        while keep and self._entries[keep - 1].start_offset >= end_offset:
            keep -= 1
        if keep != len(self._entries):
            del self._entries[keep:]
            self._persist()

    def truncate_from_start(self, start_offset: int) -> None:
        """Trim to a new log start offset: earlier epochs go, the one covering it moves up."""
        starts = [entry.start_offset for entry in self._entries]
        index = bisect.bisect_right(starts, start_offset) - 1
        if index < 0:
            return
        covering = self._entries[index]
        if index == 0 and covering.start_offset == start_offset:
            return
        self._entries = [EpochEntry(covering.epoch, start_offset), *self._entries[index + 1 :]]
        self._persist()

    def clear_and_flush(self) -> None:
        self._entries = []
        self._persist()

    def _persist(self) -> None:
        write_checkpoint(
            self._path, [(e.epoch, e.start_offset) for e in self._entries], self._fsync
        )
