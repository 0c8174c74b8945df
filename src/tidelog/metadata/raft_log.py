"""The Raft log of a controller on disk: ``<metadata.log.dir>/__cluster_metadata-0/``.

:class:`FileRaftLog` is the production :class:`~tidelog.metadata.raft.store.RaftLog`. It
lives here, beside the quorum, because the quorum (``tidelog.metadata.raft``) is sans-io and
may not touch files: this module is where its log meets the disk.

Files, as Kafka's KRaft writes them:

- the partition log itself, through :class:`~tidelog.metadata.log.MetadataLog` (the one
  wrapper over the storage :class:`~tidelog.storage.log.Log`): one record batch per entry
  (:func:`~tidelog.metadata.raft.batches.encode_entries`), baseOffset the entry's offset,
  partitionLeaderEpoch its Raft epoch. An append is not durable until :meth:`flush`
  (fsync); a truncation is durable when it returns. The storage log's
  ``leader-epoch-checkpoint`` is the epoch cache.
- snapshots (KIP-630): ``<20-digit end offset>-<10-digit epoch>.checkpoint``, record
  batches (:func:`~tidelog.metadata.raft.batches.encode_snapshot`), written to a temporary
  file, fsynced, renamed and the directory fsynced. Writing one deletes the log segments
  wholly below it and moves the log start to its end offset; older snapshots are deleted.

After writing a snapshot, the batch holding the offset just below it is kept (it may sit in
a segment that is otherwise below the snapshot): on open, it shows whether the log still
continues the snapshot (same epoch, ending exactly there). If it does not (a crash while a
snapshot fetched from the leader was replacing the whole log), or the log does not reach the
snapshot, the log is emptied and starts at the snapshot's end, as the install would have
left it.

Open: storage recovery truncates a torn tail; snapshot files are read newest first and
every batch is checked, a torn or corrupt one is deleted (with a warning) and the next
older one tried; the leader-epoch cache is checked against the batches (and rebuilt if a
damaged checkpoint lost it); what recovery kept is fsynced, so that everything the log then
holds is durable (a process killed before its fsync leaves written data in the page cache
only).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from tidelog.metadata.log import MetadataLog
from tidelog.metadata.raft.batches import decode_entries, decode_snapshot, encode_entries
from tidelog.metadata.raft.messages import Entry, OffsetAndEpoch
from tidelog.records.errors import RecordsError
from tidelog.runtime.system import Fsync
from tidelog.storage.checkpoint import write_durably

__all__ = ["SNAPSHOT_SUFFIX", "FileRaftLog", "snapshot_file_name"]

SNAPSHOT_SUFFIX = ".checkpoint"
_SNAPSHOT_NAME = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")

_log = logging.getLogger(__name__)


def snapshot_file_name(snapshot_id: OffsetAndEpoch) -> str:
    """Kafka's name for a snapshot file: end offset and epoch, zero-padded."""
    return f"{snapshot_id.offset:020d}-{snapshot_id.epoch:010d}{SNAPSHOT_SUFFIX}"


class FileRaftLog:
    """A :class:`~tidelog.metadata.raft.store.RaftLog` over the metadata partition log and
    snapshot files. Not thread-safe: one Raft driver owns it."""

    def __init__(self, log: MetadataLog, clock: Callable[[], int], fsync: Fsync) -> None:
        self._log = log
        self._clock = clock
        self._fsync = fsync
        self._snapshot: tuple[OffsetAndEpoch, bytes] | None = None

    @classmethod
    def open(
        cls,
        metadata_log_dir: str | Path,
        *,
        clock: Callable[[], int],
        fsync: Fsync = os.fsync,
        segment_bytes: int | None = None,
    ) -> FileRaftLog:
        """Open (creating when absent) ``<metadata_log_dir>/__cluster_metadata-0``;
        ``segment_bytes`` is ``metadata.log.segment.bytes``."""
        log = MetadataLog.open(
            metadata_log_dir, clock=clock, fsync=fsync, segment_bytes=segment_bytes
        )
        raft_log = cls(log, clock, fsync)
        raft_log._recover()
        return raft_log

    @property
    def directory(self) -> Path:
        return self._log.directory

    @property
    def metadata_log(self) -> MetadataLog:
        return self._log

    def close(self) -> None:
        self._log.close()

    # -- opening -------------------------------------------------------------------------

    def _snapshot_files(self) -> list[tuple[OffsetAndEpoch, Path]]:
        """Snapshot files, newest first."""
        found = []
        for path in self.directory.iterdir():
            match = _SNAPSHOT_NAME.match(path.name)
            if match:
                found.append((OffsetAndEpoch(int(match[1]), int(match[2])), path))
        found.sort(key=lambda item: (item[0].offset, item[0].epoch), reverse=True)
        return found

    def _recover(self) -> None:
        for snapshot_id, path in self._snapshot_files():
            if self._snapshot is not None:
                path.unlink()
                continue
            data = path.read_bytes()
            try:
                decode_snapshot(data)
            except RecordsError as exc:
                _log.warning("deleting snapshot %s, which does not decode: %s", path, exc)
                path.unlink()
                continue
            self._snapshot = (snapshot_id, data)
        if self._snapshot is not None:
            snapshot_id = self._snapshot[0]
            if self._continues(snapshot_id):
                if self._log.start_offset < snapshot_id.offset:
                    self._log.delete_before(snapshot_id.offset - 1)
            else:
                self._log.truncate_fully_and_start_at(snapshot_id.offset)
        if self._log.repair_epoch_cache():
            _log.warning("%s: rebuilt the leader-epoch cache from the batches", self.directory)
        self._log.sync()

    def _continues(self, snapshot_id: OffsetAndEpoch) -> bool:
        """Whether the log on disk carries on from the snapshot: it starts exactly at its end
        (an installed snapshot), or holds the entry ending there, of its epoch."""
        log = self._log
        offset = snapshot_id.offset
        if log.start_offset == offset:
            return True
        if not log.start_offset < offset <= log.end_offset:
            return False
        # A read of at most 0 bytes gives exactly the batch holding the offset.
        (before,) = decode_entries(log.read_bytes(log.batch_base_offset(offset - 1), 0))
        return before.end_offset == offset and before.epoch == snapshot_id.epoch

    # -- RaftLog ---------------------------------------------------------------------------

    def _snapshot_epoch(self) -> int:
        return self._snapshot[0].epoch if self._snapshot is not None else 0

    def start_offset(self) -> int:
        if self._snapshot is not None:
            return max(self._snapshot[0].offset, self._log.start_offset)
        return self._log.start_offset

    def end_offset(self) -> int:
        return self._log.end_offset

    def flushed_end_offset(self) -> int:
        return max(self._log.durable_end_offset, self.start_offset())

    def last_epoch(self) -> int:
        if self.end_offset() > self.start_offset():
            return self._log.latest_epoch
        return self._snapshot_epoch()

    def _check_held(self, offset: int) -> None:
        if not self.start_offset() <= offset < self.end_offset():
            raise ValueError(
                f"offset {offset} is outside the log [{self.start_offset()}, {self.end_offset()})"
            )

    def entry_epoch(self, offset: int) -> int:
        self._check_held(offset)
        return self._log.epoch_of(offset)

    def entry_start(self, offset: int) -> int:
        self._check_held(offset)
        return self._log.batch_base_offset(offset)

    def _check_boundary(self, offset: int) -> None:
        if self.start_offset() < offset < self.end_offset() and self.entry_start(offset) != offset:
            raise ValueError(f"offset {offset} is inside the entry from {self.entry_start(offset)}")

    def read(self, start: int, max_bytes: int) -> Sequence[Entry]:
        if start < self.start_offset():
            raise ValueError(f"read from {start}, below the log start {self.start_offset()}")
        self._check_boundary(start)
        if start >= self.end_offset():
            return []
        return decode_entries(self._log.read_bytes(start, max_bytes))

    def append(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        expected, epoch = self.end_offset(), self.last_epoch()
        for entry in entries:
            if entry.offset != expected or entry.epoch < epoch:
                raise ValueError(
                    f"entry at offset {entry.offset} of epoch {entry.epoch} does not continue "
                    f"the log (end {expected}, epoch {epoch})"
                )
            expected, epoch = entry.end_offset, entry.epoch
        self._log.append_batches_as_follower(
            encode_entries(entries, timestamp=self._clock()), durable=False
        )

    def truncate_to(self, end_offset: int) -> None:
        if end_offset < self.start_offset():
            raise ValueError(f"truncation to {end_offset}, below the log start")
        self._check_boundary(end_offset)
        self._log.truncate_to(end_offset)

    def flush(self) -> None:
        self._log.sync()

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        start = self.start_offset()
        starts = self._log.epoch_starts()
        for i in range(len(starts) - 1, -1, -1):
            found = starts[i][0]
            if found <= epoch:
                end = starts[i + 1][1] if i + 1 < len(starts) else self.end_offset()
                if end > start:
                    return OffsetAndEpoch(end, found)
                break
        return OffsetAndEpoch(start, self._snapshot_epoch())

    def latest_snapshot_id(self) -> OffsetAndEpoch | None:
        return self._snapshot[0] if self._snapshot is not None else None

    def read_snapshot(self) -> tuple[OffsetAndEpoch, bytes] | None:
        return self._snapshot

    def _store_snapshot(self, snapshot_id: OffsetAndEpoch, payload: bytes) -> None:
        """Write the snapshot file durably; then the older ones go."""
        if snapshot_id.offset < 0 or snapshot_id.epoch < 0:
            raise ValueError(f"bad snapshot id {snapshot_id}")
        write_durably(self.directory / snapshot_file_name(snapshot_id), payload, self._fsync)
        self._snapshot = (snapshot_id, payload)
        for older, path in self._snapshot_files():
            if older != snapshot_id:
                path.unlink()

    def write_snapshot(self, snapshot_id: OffsetAndEpoch, payload: bytes) -> None:
        offset = snapshot_id.offset
        if not self.start_offset() < offset <= self.flushed_end_offset():
            raise ValueError(
                f"snapshot {snapshot_id} does not end within the flushed log "
                f"({self.start_offset()}, {self.flushed_end_offset()}]"
            )
        self._check_boundary(offset)
        if self.entry_epoch(offset - 1) != snapshot_id.epoch:
            raise ValueError(
                f"snapshot {snapshot_id}: the entry before it is of epoch "
                f"{self.entry_epoch(offset - 1)}"
            )
        self._store_snapshot(snapshot_id, payload)
        # The batch just below the snapshot stays: see the module docstring.
        self._log.delete_before(offset - 1)

    def install_snapshot(self, snapshot_id: OffsetAndEpoch, payload: bytes) -> None:
        self._store_snapshot(snapshot_id, payload)
        self._log.truncate_fully_and_start_at(snapshot_id.offset)
