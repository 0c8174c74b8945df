"""The aborted-transaction index of one segment (Kafka's ``.txnindex``).

One entry per aborted transaction whose ABORT marker lies in the segment, in marker
order, 34 bytes each, big-endian::

    version             int16  0
    producer_id         int64
    first_offset        int64  the transaction's first offset in this partition
    last_offset         int64  the offset of its ABORT marker
    last_stable_offset  int64  the partition's last stable offset once it was aborted

A ``read_committed`` Fetch answers with the aborted transactions overlapping the data it
returns (producer id, first offset); consumers drop those producers' records from the
first offset until the marker. ``last_stable_offset`` bounds the search: once an entry's
LSO is at or above the end of the fetched range, every transaction that started inside
it has ended, so later segments cannot hold one that overlaps.

Unlike the offset and time indexes, this one cannot be rebuilt from its own segment (a
transaction's first offset may lie in an earlier segment); it is derived from the
producer state, which replays markers after its snapshot and re-adds an entry a crash
lost (:meth:`TxnIndex.append` with ``if_absent``). Entries are written when the marker
is appended, dropped when truncation removes their marker, and the file goes with its
segment. A size that is not a multiple of 34 (a torn write) keeps the whole entries.

The entries are few (one per aborted transaction): the index is read into memory on
first use and the file is opened only to append, truncate or sync.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

TXN_INDEX_VERSION = 0
_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size

FsyncFn = Callable[[int], None]


class AbortedTxn(NamedTuple):
    """One aborted transaction of a partition."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def encode_entry(entry: AbortedTxn) -> bytes:
    return _ENTRY.pack(TXN_INDEX_VERSION, *entry)


def decode_entries(data: bytes) -> list[AbortedTxn]:
    """The whole entries of ``data`` (a torn tail is ignored)."""
    usable = len(data) - len(data) % ENTRY_SIZE
    return [AbortedTxn(*_ENTRY.unpack_from(data, pos)[1:]) for pos in range(0, usable, ENTRY_SIZE)]


class TxnIndex:
    """The ``.txnindex`` file of one segment (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: list[AbortedTxn] | None = None
        self._last_offsets: list[int] = []
        self.dirty = False

    @property
    def entries(self) -> list[AbortedTxn]:
        """Every entry, in marker order (read from the file on first use)."""
        if self._entries is None:
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                data = b""
            self._entries = decode_entries(data)
            self._last_offsets = [entry.last_offset for entry in self._entries]
            if len(data) % ENTRY_SIZE:
                self._rewrite()
        return self._entries

    def append(self, entry: AbortedTxn, *, if_absent: bool = False) -> bool:
        """Add ``entry`` (its marker follows every entry's); with ``if_absent`` nothing is
        written when an entry for the same marker exists. True when written."""
        entries = self.entries
        if if_absent:
            at = bisect.bisect_left(self._last_offsets, entry.last_offset)
            if at < len(entries) and entries[at].last_offset == entry.last_offset:
                return False
            if at < len(entries):
                # Replay re-adds an entry lost in a crash below later ones: keep the order.
                entries.insert(at, entry)
                self._last_offsets.insert(at, entry.last_offset)
                self._rewrite()
                return True
        elif self._last_offsets and entry.last_offset <= self._last_offsets[-1]:
            raise ValueError(
                f"aborted transaction marker {entry.last_offset} is not after "
                f"{self._last_offsets[-1]} in {self.path}"
            )
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            _write_all(fd, encode_entry(entry))
        finally:
            os.close(fd)
        entries.append(entry)
        self._last_offsets.append(entry.last_offset)
        self.dirty = True
        return True

    def truncate_to(self, offset: int) -> int:
        """Drop the entries whose marker is at or above ``offset``; the number dropped."""
        entries = self.entries
        keep = bisect.bisect_left(self._last_offsets, offset)
        dropped = len(entries) - keep
        if dropped:
            del entries[keep:]
            del self._last_offsets[keep:]
            self._rewrite()
        return dropped

    def overlapping(self, start_offset: int, upper_bound: int) -> tuple[list[AbortedTxn], bool]:
        """Entries of transactions overlapping ``[start_offset, upper_bound)``, and whether
        the search is complete (an entry's LSO reached ``upper_bound``: no later segment
        can hold an overlapping transaction)."""
        found: list[AbortedTxn] = []
        entries = self.entries
        for entry in entries[bisect.bisect_left(self._last_offsets, start_offset) :]:
            if entry.first_offset < upper_bound:
                found.append(entry)
            if entry.last_stable_offset >= upper_bound:
                return found, True
        return found, False

    def sync(self, datasync: FsyncFn) -> None:
        """Make the file durable when entries were written since the last sync."""
        if not self.dirty:
            return
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(self.path, os.O_RDONLY)
            try:
                datasync(fd)
            finally:
                os.close(fd)
        self.dirty = False

    def rename(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.path, path)
        self.path = path

    def write_entries(self, entries: list[AbortedTxn]) -> None:
        """Make the index hold exactly ``entries`` (in marker order): the cleaner's
        replacement segment and a completed swap keep the entries of the segments they
        replace."""
        self._entries = list(entries)
        self._last_offsets = [entry.last_offset for entry in self._entries]
        self._rewrite()

    def _rewrite(self) -> None:
        assert self._entries is not None
        data = b"".join(encode_entry(entry) for entry in self._entries)
        if not data:
            self.path.unlink(missing_ok=True)
            self.dirty = False
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        self.dirty = True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
