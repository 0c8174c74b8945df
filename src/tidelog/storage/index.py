"""The sparse offset index and the time index of one segment.

Both are flat files of fixed-size big-endian entries, named after the segment::

    <base>.index      entry = relative_offset:int32  position:int32         (8 bytes)
    <base>.timeindex  entry = timestamp:int64       relative_offset:int32   (12 bytes)

``relative_offset`` is an offset minus the segment's base offset. An offset index
entry ``(r, p)`` says: the batch that starts at byte ``p`` of the ``.log`` file has
last offset ``base + r``. One entry is written per ``index.interval.bytes`` of log
(never per record); the first batch of a segment (position 0) has none. A time index
entry ``(t, r)`` says: ``t`` is the largest timestamp of every batch up to and
including the one whose last offset is ``base + r``; entries are written only when
that maximum grows, at the same points as offset index entries, plus one when the
segment stops being the active one (so its last entry is the segment's maximum).

Invariants: both fields of the offset index strictly increase; timestamps and offsets
of the time index strictly increase; every position lies inside the ``.log`` file.
Files are not preallocated: their size is always a whole number of entries, so a
torn tail (a size that is not a multiple of the entry size) means a crash and the
index is rebuilt. Indexes are derived data: a missing or failed index is rebuilt
from the ``.log`` file, and a shorter index (entries lost in a crash) is still
correct, only sparser.

Memory stays bounded: while a segment is active its index is mirrored in a
``bytearray`` (at most ``segment.index.bytes``, since a full index rolls the
segment); a sealed segment's index is memory-mapped read-only while the segment is
open and unmapped when the segment's handles are closed. Lookups binary-search the
buffer, never a Python list of entries.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from pathlib import Path

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
INT32_MAX = 2**31 - 1


class _IndexFile:
    """Fixed-size entries in a file: a writable mirror or a read-only map."""

    entry: struct.Struct = _OFFSET_ENTRY

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(max_index_bytes // self.entry.size, 0)
        self._fd: int | None = None
        self._mirror: bytearray | None = None
        self._map: mmap.mmap | None = None
        self._loaded = False
        self._count = 0

    # -- state -----------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._loaded

    @property
    def writable(self) -> bool:
        return self._fd is not None

    def load(self, writable: bool) -> None:
        """Open the file (creating an empty one when writable and absent)."""
        self.close()
        if writable:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                usable = size - size % self.entry.size
                if usable != size:
                    os.ftruncate(fd, usable)
                self._mirror = bytearray(os.pread(fd, usable, 0)) if usable else bytearray()
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            self._count = len(self._mirror) // self.entry.size
        else:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                usable = size - size % self.entry.size
                if usable:
                    self._map = mmap.mmap(fd, usable, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
            self._count = usable // self.entry.size
        self._loaded = True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._map is not None:
            self._map.close()
            self._map = None
        self._mirror = None
        self._loaded = False
        self._count = 0

    def fsync(self, fsync: Callable[[int], None]) -> None:
        if self._fd is not None:
            fsync(self._fd)

    @property
    def _buf(self) -> bytearray | mmap.mmap | bytes:
        if self._mirror is not None:
            return self._mirror
        if self._map is not None:
            return self._map
        return b""

    # -- reading ---------------------------------------------------------------------

    @property
    def entry_count(self) -> int:
        return self._count

    @property
    def size_in_bytes(self) -> int:
        return self._count * self.entry.size

    @property
    def is_full(self) -> bool:
        return self._count >= self.max_entries

    def entry_at(self, index: int) -> tuple[int, int]:
        first, second = self.entry.unpack_from(self._buf, index * self.entry.size)
        return int(first), int(second)

    def _floor(self, key: int, field: int) -> int:
        """Index of the last entry whose ``field`` is <= ``key``; -1 when none."""
        buf = self._buf
        size = self.entry.size
        unpack = self.entry.unpack_from
        low, high = 0, self._count - 1
        found = -1
        while low <= high:
            mid = (low + high) // 2
            if unpack(buf, mid * size)[field] <= key:
                found = mid
                low = mid + 1
            else:
                high = mid - 1
        return found

    # -- writing ---------------------------------------------------------------------

    def append_raw(self, entries: bytes | bytearray) -> None:
        """Append already packed entries with one write."""
        if not entries:
            return
        assert self._fd is not None and self._mirror is not None, "index is not writable"
        position = len(self._mirror)
        view = memoryview(entries)
        while view:
            written = os.pwrite(self._fd, view, position)
            position += written
            view = view[written:]
        self._mirror += entries
        self._count = len(self._mirror) // self.entry.size

    def truncate_entries(self, count: int) -> None:
        """Keep the first ``count`` entries."""
        assert self._fd is not None and self._mirror is not None, "index is not writable"
        if count >= self._count:
            return
        os.ftruncate(self._fd, count * self.entry.size)
        del self._mirror[count * self.entry.size :]
        self._count = count

    def reset(self) -> None:
        self.truncate_entries(0)


class OffsetIndex(_IndexFile):
    """``.index``: (relative last offset of a batch, position of that batch)."""

    entry = _OFFSET_ENTRY

    @staticmethod
    def pack(relative_offset: int, position: int) -> bytes:
        return _OFFSET_ENTRY.pack(relative_offset, position)

    def lookup(self, offset: int) -> int:
        """Position from which to scan for ``offset``: the last entry at or below it."""
        found = self._floor(offset - self.base_offset, 0)
        return 0 if found < 0 else self.entry_at(found)[1]

    def last_entry(self) -> tuple[int, int] | None:
        """(absolute offset, position) of the last entry."""
        if not self._count:
            return None
        relative, position = self.entry_at(self._count - 1)
        return self.base_offset + relative, position

    def truncate_to_position(self, position: int) -> None:
        """Drop entries that point at or beyond ``position``."""
        self.truncate_entries(self._floor_position(position - 1) + 1)

    def _floor_position(self, position: int) -> int:
        return self._floor(position, 1)

    def check(self, log_size: int, full: bool) -> str | None:
        """Why this index cannot be trusted, or None. ``full`` checks every entry."""
        if not self._count:
            return None
        last_relative, last_position = self.entry_at(self._count - 1)
        if last_relative < 0 or last_position < 0 or last_position >= max(log_size, 1):
            return f"last entry ({last_relative}, {last_position}) lies outside the segment"
        if full:
            previous = (-1, -1)
            for entry in self.entry.iter_unpack(self._buf[: self.size_in_bytes]):
                if entry[0] <= previous[0] or entry[1] <= previous[1]:
                    return f"entry {entry} does not increase after {previous}"
                previous = entry
        return None


class TimeIndex(_IndexFile):
    """``.timeindex``: (max timestamp so far, relative last offset of its batch)."""

    entry = _TIME_ENTRY

    @staticmethod
    def pack(timestamp: int, relative_offset: int) -> bytes:
        return _TIME_ENTRY.pack(timestamp, relative_offset)

    def lookup(self, timestamp: int) -> int:
        """Offset from which to scan for ``timestamp``: the last entry at or below it."""
        found = self._floor(timestamp, 0)
        return self.base_offset if found < 0 else self.base_offset + self.entry_at(found)[1]

    def last_entry(self) -> tuple[int, int] | None:
        """(timestamp, absolute offset) of the last entry."""
        if not self._count:
            return None
        timestamp, relative = self.entry_at(self._count - 1)
        return timestamp, self.base_offset + relative

    def truncate_to_offset(self, offset: int) -> None:
        """Drop entries whose offset is at or beyond ``offset``."""
        self.truncate_entries(self._floor(offset - 1 - self.base_offset, 1) + 1)

    def check(self, max_relative_offset: int | None, full: bool) -> str | None:
        if not self._count:
            return None
        _, last_relative = self.entry_at(self._count - 1)
        if last_relative < 0 or (
            max_relative_offset is not None and last_relative > max_relative_offset
        ):
            return f"last entry offset {last_relative} lies outside the segment"
        if full:
            previous = (-(2**63), -1)
            for entry in self.entry.iter_unpack(self._buf[: self.size_in_bytes]):
                if entry[0] <= previous[0] or entry[1] < previous[1]:
                    return f"entry {entry} does not increase after {previous}"
                previous = entry
        return None
