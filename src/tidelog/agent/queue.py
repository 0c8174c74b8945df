"""The disk queue of one topic-partition: append segments, group commit, a persisted cursor.

Directory ``<data.dir>/queues/<topic>-<partition>/``::

    <base position, 20 digits>-<first entry number, 20 digits>.q   segments, oldest first
    cursor                                                           the read side, two slots

Positions are global byte offsets in the queue (a segment's name gives the position of its
first byte), entry numbers count events from 0. Segment files are entries back to back
(big-endian)::

    length   uint32   size of the event body
    crc      uint32   CRC-32C of (length, number, body): a torn or damaged entry never passes
    number   uint64   entry number (consecutive across segments)
    body     length bytes, the record body of :mod:`tidelog.agent.event`

The active (newest) segment file runs ahead of its entries: it is extended with zeros
:data:`ZEROS_AHEAD` bytes at a time (never past ``queue.max.bytes``), so appends overwrite
blocks that exist and their ``fdatasync`` does not also commit a new file size. A zero header
fails its CRC, so readers and recovery stop at the end of the entries; the zeros are cut when
the segment rolls and when the queue closes.

Write side. :meth:`DiskQueue.append` encodes entries into a memory buffer under the queue's
lock, then waits until they are durable. There is no syncer thread: a caller that finds no
sync running becomes the one that runs it; it takes everything buffered, writes it with one
``pwrite`` per segment and calls ``fdatasync`` once (group commit: all events that arrived
while the previous sync ran share the next one). A lone caller thus writes and syncs its own
event on its own thread, with no hand-off to another thread and back. With the real
``fdatasync`` the usual sync (no segment roll in it) is a single ``pwritev`` with
``RWF_DSYNC``, durable when it returns like ``pwrite`` + ``fdatasync``, in one system call and
one release of the GIL (file systems without the flag get the two calls). A segment rolls at
``queue.segment.bytes``; a new segment file is created and the directory synced before the
first write to it.

Read side. The sender reads only synced entries (an entry that was sent before it was durable
could be lost by a crash and its number and sequence reused by another event).
``cursor`` holds two 64-byte slots written alternately (``pwrite`` + ``fdatasync``); loading
takes the valid slot with the higher generation, so a torn cursor write leaves the previous
one. Slot layout::

    magic "TLAC" | generation u64 | read_pos u64 | read_n u64 | skip_pos u64 | skip_n u64 |
    next_seq i32 | producer_id i64 | producer_epoch i16 | crc u32 | 2 bytes zero

``read_*`` is the first entry not yet acknowledged by the broker, ``next_seq`` the producer
sequence that entry gets, ``producer_*`` the idempotent producer of the queue. ``skip_*``
marks entries dropped by the drop-oldest policy: the sender continues at ``max(read, skip)``
once the batch it may have in flight at ``read`` is done.

``dropped`` lists the entry-number ranges skipped by drop-oldest, ``first u64 | end u64 |
crc u32`` per drop, synced before the cursor that skips them; at load, the file is cut at
the first record beyond the cursor's ``skip_n`` (a crash between the two leaves a record of a
drop that did not happen), so event queries answer ``dropped`` across restarts.

Offset index ``offsets`` (and ``offsets.old``): one record per batch the broker acknowledged,
``first u64 | count u32 | base_offset i64 | crc u32``, written (not synced) before the cursor
that makes the batch delivered; rotated at :data:`OFFSET_INDEX_RECORDS` records, so the last
65,536-131,072 batches keep their offsets across restarts (docs/agent.md).

A queue can be *sealed* (:meth:`DiskQueue.seal_if_moved`): a parked queue whose events have all
moved refuses new ones with :class:`QueueSealed`, checked under the same lock as the append.

Recovery (:meth:`DiskQueue.open`): segments wholly below the cursor are deleted; the newest
segment is scanned entry by entry. A bad entry with nothing valid after it is a torn tail
(only bytes whose append was never acknowledged; zeros after it were written ahead and are
not counted as torn) and is cut; one with valid entries (or a cursor position) after it is
damage, left for the reader to skip (:func:`find_next_entry`, :meth:`DiskQueue._corrupt`):
to the next valid entry, recorded as dropped and counted as ``corrupt``. The newest segment
is then fdatasync'ed: what a killed process wrote may still be only in the page cache, and
the parked-event moves build on what recovery found.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import errno
import logging
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from tidelog.agent.errors import (
    AgentClosedError,
    EventTooLargeError,
    QueueCorruptError,
    QueueFullError,
)

_log = logging.getLogger(__name__)

ENTRY = struct.Struct(">IIQ")
ENTRY_SIZE = ENTRY.size
_LEN = struct.Struct(">I")
_CURSOR = struct.Struct(">4sQQQQQiqhI2x")
_CURSOR_MAGIC = b"TLAC"
CURSOR_SLOT = 64
assert _CURSOR.size <= CURSOR_SLOT
SEGMENT_SUFFIX = ".q"
# The active segment file is extended with zeros this far ahead of its entries.
ZEROS_AHEAD = 1 << 20
_ZEROS = bytes(ZEROS_AHEAD)

# Entry-number ranges dropped by drop-oldest: ``first u64 | end u64 | crc u32`` per drop,
# appended and synced before the cursor that skips them; the newest DROPPED_RANGES_KEPT are
# kept (the file is rewritten with those when it holds twice as many).
_DROPPED = struct.Struct(">QQI")
DROPPED_RANGES = "dropped"
# Zeros set aside per queue, given up on a full disk to record a drop (which frees room).
RESERVE = "reserve"
RESERVE_BYTES = 16384
DISK_FULL_LOG_INTERVAL = 60.0
DROPPED_RANGES_KEPT = 10_000
_NONZERO = re.compile(rb"[^\x00]")

# The offset index: one record per acknowledged batch (see the module docstring).
_OFFSET = struct.Struct(">QIqI")
OFFSET_INDEX = "offsets"
OFFSET_INDEX_OLD = "offsets.old"
OFFSET_INDEX_RECORDS = 65_536

FsyncFn = Callable[[int], None]
# What one sync writes: the buffer's chunks (position of the first entry, its number, the
# encoded entries, whether they start a new segment), the end position and number after
# them, and the condition their callers wait on.
_Chunk = tuple[int, int, bytearray, bool]
# (chunks, end position, end number, their callers' condition, earliest since)
_SyncWork = tuple[list[_Chunk], int, int, threading.Condition, float | None]

POLICIES = ("block", "reject", "drop-oldest")


def segment_name(base: int, first_n: int) -> str:
    return f"{base:020d}-{first_n:020d}{SEGMENT_SUFFIX}"


_LEN_NUMBER = struct.Struct(">IQ")


def encode_entries(first: int, bodies: Sequence[bytes | memoryview]) -> bytes:
    """Entries numbered from ``first``, back to back (one pass for a whole call)."""
    pack_head = _LEN_NUMBER.pack
    pack_entry = ENTRY.pack
    parts: list[bytes | memoryview] = []
    append = parts.append
    number = first
    for body in bodies:
        length = len(body)
        append(pack_entry(length, crc32c(body, crc32c(pack_head(length, number))), number))
        append(body)
        number += 1
    return b"".join(parts)


def _entry_at(view: memoryview, off: int) -> tuple[int, int] | None:
    """(end offset, number) of the entry at ``off`` in ``view`` if it is whole and its CRC
    checks, else None."""
    if off < 0 or off + ENTRY_SIZE > len(view):
        return None
    length, crc, number = ENTRY.unpack_from(view, off)
    end = off + ENTRY_SIZE + length
    if end > len(view):
        return None
    check = crc32c(
        view[off + ENTRY_SIZE : end], crc32c(view[off + 8 : off + 16], crc32c(view[off : off + 4]))
    )
    return (end, number) if check == crc else None


def find_next_entry(
    view: memoryview, off: int, expected: int, known: Sequence[tuple[int, int]] = ()
) -> tuple[int, int] | None:
    """Where valid entries go on after damaged bytes at ``off`` (where entry ``expected``
    should start): the (offset, number) of the first later entry found, or None when none is
    (a torn tail). Candidates: the end the damaged entry's own length gives (the damage hit
    its body or CRC), ``known`` boundaries (the cursor's positions: ``(offset, number)``,
    accepted even where no entry follows, since entries before them were delivered), and
    the first later entry that checks (the damage hit a length, or a whole run of entries:
    a lost page), see :func:`_first_entry_after`. Only on damage."""
    found: list[tuple[int, int]] = []
    if off + ENTRY_SIZE <= len(view):
        (length,) = struct.unpack_from(">I", view, off)
        jump = off + ENTRY_SIZE + length
        entry = _entry_at(view, jump)
        if entry is not None and entry[1] == expected + 1:
            found.append((jump, expected + 1))
    for at, number in known:
        if off < at <= len(view) and number > expected:
            found.append((at, number))
    if not found:
        first = _first_entry_after(view, off, expected)
        if first is not None:
            found.append(first)
    # Plausible only if the entries skipped could fit in the bytes skipped.
    found = [(at, n) for at, n in found if (n - expected) * ENTRY_SIZE <= at - off]
    return min(found) if found else None


def _first_entry_after(view: memoryview, off: int, expected: int) -> tuple[int, int] | None:
    """The first entry after ``off`` whose CRC checks and whose number could follow
    ``expected`` there: in ``(expected, expected + bytes skipped / ENTRY_SIZE]``.

    Such a number's field starts with the five high bytes of a number of that range (one
    or two values, a few for a huge segment): they are found with ``bytes.find``, and runs
    of zeros (a lost page, zero-filled values) are jumped over with a regular expression, so
    that Python looks at few offsets (about one per entry when numbers are small and values
    hold zeros; a 16 MiB segment in well under a second)."""
    data = view.obj if isinstance(view.obj, bytes) else bytes(view)
    end = len(data.rstrip(b"\0"))
    top = expected + max(0, end - off) // ENTRY_SIZE
    prefixes = {
        struct.pack(">Q", min(top, expected + k * (1 << 24)))[:5]
        for k in range(((top - expected) >> 24) + 2)
    }
    number_at = struct.Struct(">Q").unpack_from
    best: tuple[int, int] | None = None
    for prefix in prefixes:
        at = data.find(prefix, off + 1 + 8)
        while at >= 0 and (best is None or at - 8 < best[0]):
            start = at - 8
            if start + ENTRY_SIZE > end:
                break
            (number,) = number_at(data, at)
            if expected < number <= expected + (start - off) // ENTRY_SIZE:
                entry = _entry_at(view, start)
                if entry is not None and entry[1] == number:
                    best = (start, number)
                    break
            if number == 0:
                # Inside zeros: go on where they end (a number field may start up to 7
                # bytes before the first byte that is not zero).
                nonzero = _NONZERO.search(data, at)
                if nonzero is None:
                    break
                at = data.find(prefix, max(at + 1, nonzero.start() - 7))
            else:
                at = data.find(prefix, at + 1)
    return best


def _read_records(
    path: Path, layout: struct.Struct
) -> tuple[list[tuple[tuple[int, ...], int]], int]:
    """The fixed-size records of ``path`` whose last field, a CRC-32C of the bytes before
    it, checks: (fields without the CRC, end offset) each; and the file's size (0 when there
    is no file). A damaged record is skipped, not the end of the file: the records after it
    are read (only bytes after the last good record are a torn tail, for the caller to cut)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    records: list[tuple[tuple[int, ...], int]] = []
    size = layout.size
    skipped = 0
    at = 0
    while at + size <= len(data):
        *fields, crc = layout.unpack_from(data, at)
        at += size
        if crc32c(data[at - size : at - 4]) != crc:
            skipped += 1
            continue
        records.append((tuple(fields), at))
    good_end = records[-1][1] if records else 0
    damaged = skipped - (len(data) - good_end) // size
    if damaged:
        _log.error("%s: skipping %d damaged record(s)", path, damaged)
    return records, len(data)


def _cut_after(path: Path, good: int, size: int) -> None:
    """Cut ``path`` (of ``size`` bytes) after its first ``good`` bytes, saying so."""
    if good < size:
        _log.warning("%s: cutting %d bytes after its last good record", path, size - good)
        os.truncate(path, good)


def _write_whole(fd: int, data: bytes, at: int) -> None:
    """``pwrite`` all of ``data`` at ``at``: a write cut short by a full disk returns a count,
    not an error; the next one raises it."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, at)
        view = view[written:]
        at += written


def append_whole(fd: int, record: bytes) -> None:
    """Append all of ``record`` to the ``O_APPEND`` file ``fd``, or none of it: on an error
    (a full disk), a part already written is cut off again, so that the file never holds a
    torn record that would end it at the next start."""
    view = memoryview(record)
    written = os.write(fd, view)
    if written == len(view):
        return
    size = os.fstat(fd).st_size - written
    try:
        view = view[written:]
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        os.ftruncate(fd, size)
        raise


def _dropped_record(first: int, end: int) -> bytes:
    raw = _DROPPED.pack(first, end, 0)[:-4]
    return raw + struct.pack(">I", crc32c(raw))


class QueueSealed(Exception):
    """The queue takes no more events (a parked queue whose events have all moved)."""


@dataclass(slots=True)
class Cursor:
    generation: int = 0
    read_pos: int = 0
    read_n: int = 0
    skip_pos: int = 0
    skip_n: int = 0
    next_seq: int = 0
    producer_id: int = -1
    producer_epoch: int = -1

    def pack(self) -> bytes:
        fields = (
            _CURSOR_MAGIC,
            self.generation,
            self.read_pos,
            self.read_n,
            self.skip_pos,
            self.skip_n,
            self.next_seq,
            self.producer_id,
            self.producer_epoch,
            0,
        )
        raw = _CURSOR.pack(*fields)
        crc = crc32c(raw[: _CURSOR.size - 6])
        raw = _CURSOR.pack(*fields[:-1], crc)
        return raw.ljust(CURSOR_SLOT, b"\0")

    @classmethod
    def unpack(cls, raw: bytes) -> Cursor | None:
        if len(raw) < _CURSOR.size:
            return None
        magic, gen, rp, rn, sp, sn, seq, pid, epoch, crc = _CURSOR.unpack_from(raw, 0)
        if magic != _CURSOR_MAGIC or crc32c(raw[: _CURSOR.size - 6]) != crc:
            return None
        return cls(gen, rp, rn, sp, sn, seq, pid, epoch)


def check_entry_sizes(bodies: Sequence[bytes | memoryview], max_entry_bytes: int) -> int:
    """The bytes ``bodies`` take as entries.

    :raises EventTooLargeError: a body is larger than ``max_entry_bytes``.
    """
    size = 0
    for body in bodies:
        if len(body) > max_entry_bytes:
            raise EventTooLargeError(
                f"event of {len(body)} bytes is larger than {max_entry_bytes} bytes "
                "(max.request.size)"
            )
        size += ENTRY_SIZE + len(body)
    return size


@dataclass(slots=True)
class Entry:
    number: int
    position: int  # of the entry header
    body: memoryview


@dataclass(slots=True)
class Segment:
    base: int
    first_n: int
    path: Path


class DiskQueue:
    """One topic-partition's queue (see the module docstring)."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int = 16 * 1024 * 1024,
        max_bytes: int = 1 << 40,
        policy: str = "block",
        max_entry_bytes: int = 1_048_576,
        fsync: FsyncFn = os.fdatasync,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"queue.full.policy: expected one of {', '.join(POLICIES)}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        # Drop-oldest frees whole segments: keep several of them within the budget.
        self.segment_bytes = max(4096, min(segment_bytes, max_bytes // 4))
        self.policy = policy
        self.max_entry_bytes = max_entry_bytes
        self._fsync = fsync
        # Entries are written with RWF_DSYNC (see _write_dsync) where the system has it, unless
        # a sync function of the caller's (tests that hold or fail syncs) must see every sync.
        self._dsync_writes = fsync is os.fdatasync and hasattr(os, "RWF_DSYNC")
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        # Notified after every sync, for close().
        self._durable = threading.Condition(self._lock)
        self._syncing = False
        # The callers whose entries are in ``_buffer`` wait on this one; a sync takes it with
        # the buffer and wakes just them when done (and one caller of the next buffer to
        # lead the next sync), not every waiter of the queue.
        self._batch = threading.Condition(self._lock)
        self.segments: list[Segment] = []
        self.cursor = Cursor()
        self.write_pos = 0
        self.write_n = 0
        self.durable_pos = 0
        self.durable_n = 0
        self._active_bytes = 0
        self._roll_next = False
        # Encoded entries not yet written: (position of the first, its number, bytes, whether
        # they start a new segment).
        self._buffer: list[_Chunk] = []
        # The earliest ``since`` of the buffered entries (see append).
        self._buffer_since: float | None = None
        # Bytes of the active segment file that exist (entries, then zeros written ahead).
        self._file_bytes = 0
        self._fd = -1
        self._fd_base = -1
        self._cursor_fd = -1
        # Cursor writes, in or out of the queue's lock (taken after it, never before it),
        # and the newest generation written.
        self._cursor_lock = threading.Lock()
        self._cursor_written = 0
        self._read_fds: dict[int, int] = {}
        self._failure: BaseException | None = None
        # The file system refused a write for want of space (ENOSPC, EDQUOT): the sync in
        # progress waits and tries again; new callers meet the queue's full policy.
        self.disk_full = False
        self.disk_full_waits = 0
        self._disk_full_why = ""
        # Under drop-oldest a full disk is a steady state (every write fills it again):
        # it is logged at most once a minute, and the reserve's absence once.
        self._disk_full_logged_at = -DISK_FULL_LOG_INTERVAL
        self._disk_full_logged = False
        self._reserve_missing = False
        # The cursor file could not take its two slots' blocks at creation (a full disk).
        self._cursor_unallocated = False
        self._closed = False
        self.in_flight_end: tuple[int, int] | None = None
        self.on_durable: Callable[[], None] | None = None
        # Called (under the queue's lock, on whichever thread drops) with each range of
        # entries recorded as dropped: they will never be delivered.
        self.on_dropped: Callable[[int, int], None] | None = None
        self.on_space: Callable[[], None] | None = None
        # Counters for the status report.
        self.appended = 0
        self.dropped = 0
        self.corrupt = 0
        self.fsyncs = 0
        self.truncated_bytes = 0
        # Entry-number ranges [from, to) dropped, for event queries (kept in ``dropped``).
        self.dropped_ranges: collections.deque[tuple[int, int]] = collections.deque(
            maxlen=DROPPED_RANGES_KEPT
        )
        self._dropped_records = 0
        self._oldest_time: collections.deque[tuple[int, float]] = collections.deque()
        # Entries below this number were there at start: their age comes from the entries.
        self._recovered_n = 0
        # Both cursor slots were damaged at start: delivery starts over at the oldest entry.
        self._cursor_reset = False
        self.sealed = False
        # Offset index of acknowledged batches: (first entry, count, base offset) sorted by
        # first entry; the records of ``offsets.old`` and ``offsets``.
        self._index_fd = -1
        self._index_records = 0
        self._index_failing = False
        self._delivered_first: list[int] = []
        self._delivered: list[tuple[int, int]] = []

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(cls, directory: Path, **kwargs: object) -> DiskQueue:
        queue = cls(directory, **kwargs)  # type: ignore[arg-type]
        try:
            queue._recover()
        except BaseException:
            queue._close_files()
            raise
        return queue

    def _recover(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.cursor = self._load_cursor()
        for path in sorted(self.directory.glob("*" + SEGMENT_SUFFIX)):
            stem = path.name[: -len(SEGMENT_SUFFIX)]
            base_text, _, first_text = stem.partition("-")
            if not (base_text.isdigit() and first_text.isdigit()):
                _log.warning("ignoring unexpected file %s", path)
                continue
            self.segments.append(Segment(int(base_text), int(first_text), path))
        self.segments.sort(key=lambda s: s.base)
        # Segments wholly before the read position were delivered before a crash.
        while len(self.segments) > 1 and self.segments[1].base <= self.cursor.read_pos:
            self.segments.pop(0).path.unlink()
        if not self.segments:
            seg = Segment(
                self.cursor.read_pos,
                self.cursor.read_n,
                self.directory / segment_name(self.cursor.read_pos, self.cursor.read_n),
            )
            fd = os.open(seg.path, os.O_CREAT | os.O_WRONLY, 0o644)
            os.close(fd)
            self._sync_dir()
            self.segments.append(seg)
        last = self.segments[-1]
        end, end_n = self._scan_tail(last)
        self.write_pos = self.durable_pos = end
        self.write_n = self.durable_n = end_n
        self._active_bytes = end - last.base
        oldest = self.segments[0]
        lost: tuple[int, int] | None = None
        if max(self.cursor.read_pos, self.cursor.skip_pos) < oldest.base and not self._cursor_reset:
            # The segment holding the next entry to deliver is gone (deleted by hand, or
            # lost by the file system): its entries are lost, which is said and counted.
            start_n = max(self.cursor.read_n, self.cursor.skip_n)
            if oldest.first_n > start_n:
                lost = (start_n, oldest.first_n)
            _log.error(
                "%s: the segment holding entry %d is missing; entries %d to %d are lost",
                self.directory,
                start_n,
                start_n,
                oldest.first_n - 1,
            )
            self.corrupt += 1
        if self.cursor.read_pos < oldest.base:
            # The cursor's segment is gone (skipped by drop-oldest, missing, or a reset
            # cursor): start at the oldest entry kept.
            self.cursor.read_pos = oldest.base
            self.cursor.read_n = oldest.first_n
        if self.cursor.read_pos > end:
            raise QueueCorruptError(
                f"{self.directory}: cursor position {self.cursor.read_pos} is past the end {end}"
            )
        self._fd = os.open(last.path, os.O_WRONLY)
        self._fd_base = last.base
        self._file_bytes = end - last.base
        # What the scan found may still be only in the page cache (a crash of the process,
        # not of the machine): make it durable before anything is built on it.
        os.fdatasync(self._fd)
        self._recovered_n = self.durable_n
        self._load_index()
        self._load_dropped()
        self._make_reserve()
        if lost is not None:
            self._record_dropped_locked(*lost)
            self.cursor.skip_pos, self.cursor.skip_n = oldest.base, oldest.first_n
            self._write_cursor_locked()

    def _scan_tail(self, seg: Segment) -> tuple[int, int]:
        """Check every entry of the newest segment; cut a torn tail. Returns (end, end_n).

        Bad bytes followed by valid entries (or by a cursor position) are damage, not a torn
        tail: they are left in place for the reader to skip (see :meth:`_corrupt`), and
        nothing acknowledged after them is cut. Only bad bytes with nothing valid after them
        can be a torn append, which was never acknowledged."""
        data = seg.path.read_bytes()
        view = memoryview(data)
        c = self.cursor
        known = [(at - seg.base, n) for at, n in ((c.read_pos, c.read_n), (c.skip_pos, c.skip_n))]
        pos = 0
        expected = seg.first_n
        while True:
            # Not max_entry_bytes: it may have been lowered since acknowledged entries were
            # written; the CRC tells a torn entry.
            entry = _entry_at(view, pos)
            if entry is not None and entry[1] == expected:
                pos = entry[0]
                expected += 1
                continue
            if not data[pos:].strip(b"\0"):
                break  # the end, or zeros written ahead
            resume = find_next_entry(view, pos, expected, known)
            if resume is None:
                break
            _log.error(
                "%s: damaged bytes at position %d (entry %d); entries go on at %d (entry %d)",
                seg.path,
                seg.base + pos,
                expected,
                seg.base + resume[0],
                resume[1],
            )
            pos, expected = resume
        if pos != len(data):
            # Zeros after the last entry were written ahead (a crash kept them); anything
            # else up to the last non-zero byte is a torn or damaged tail.
            torn = len(data[pos:].rstrip(b"\0"))
            if torn:
                self.truncated_bytes = torn
                _log.warning(
                    "%s: cutting %d bytes of torn tail at position %d",
                    seg.path,
                    torn,
                    seg.base + pos,
                )
            fd = os.open(seg.path, os.O_WRONLY)
            try:
                os.ftruncate(fd, pos)
                self._fsync(fd)
            finally:
                os.close(fd)
        return seg.base + pos, expected

    def _load_cursor(self) -> Cursor:
        path = self.directory / "cursor"
        self._cursor_fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        raw = os.pread(self._cursor_fd, 2 * CURSOR_SLOT, 0)
        slots = [Cursor.unpack(raw[i * CURSOR_SLOT : (i + 1) * CURSOR_SLOT]) for i in range(2)]
        valid = [c for c in slots if c is not None]
        if valid:
            return max(valid, key=lambda c: c.generation)
        if raw.strip(b"\0"):
            # Both slots damaged: resume at the oldest entry with a new producer id; events
            # in doubt may then be delivered twice, which the log says. (A cursor of zeros is
            # a queue that has delivered nothing yet, e.g. one made on a full disk.)
            _log.error(
                "%s: both cursor slots are damaged; resending from the oldest entry", self.directory
            )
            self._cursor_reset = True
            return Cursor(generation=1, read_pos=0, read_n=0)
        if len(raw) < 2 * CURSOR_SLOT:
            # A new queue: both slots take their blocks now, so that moving the read position
            # never needs new disk space (on a full disk it is what frees space). Best effort:
            # a queue made on a full disk takes them at its first delivery instead.
            try:
                _write_whole(self._cursor_fd, Cursor().pack() + bytes(CURSOR_SLOT), 0)
                self._fsync(self._cursor_fd)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                os.ftruncate(self._cursor_fd, 0)
                self._cursor_unallocated = True
                _log.warning("%s: cursor not preallocated yet: %s", self.directory, exc)
        return Cursor()

    def _take_room_held_back(self) -> None:
        """Once a write has succeeded, take what a queue opened on a full disk went without:
        the blocks of the cursor's slots (allocated without touching their bytes, so a
        valid slot stays) and the reserve. Best effort: tried again after the next sync."""
        if self._cursor_unallocated:
            with self._cursor_lock:
                try:
                    os.posix_fallocate(self._cursor_fd, 0, 2 * CURSOR_SLOT)
                    self._fsync(self._cursor_fd)
                except OSError:
                    pass
                else:
                    self._cursor_unallocated = False
        if self._reserve_missing:
            self._make_reserve()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._space.notify_all()
            # Entries buffered before the close are written by the callers waiting for them;
            # the files stay open until they are.
            while self._syncing or self._buffer:
                if self._failure is not None:
                    break
                if not self._syncing:
                    work = self._take_buffer_locked()
                    self._lock.release()
                    try:
                        self._write_and_sync(work)
                    finally:
                        self._lock.acquire()
                    continue
                self._durable.wait()
            if self._failure is None and self._fd >= 0:
                with contextlib.suppress(OSError):
                    self._cut_zeros(self.durable_pos - self._fd_base)
        self._close_files()

    def _close_files(self) -> None:
        for fd in (self._fd, self._cursor_fd, self._index_fd, *self._read_fds.values()):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._read_fds.clear()
        self._fd = self._cursor_fd = self._index_fd = -1

    def _sync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ write side

    @property
    def used_bytes(self) -> int:
        return self.write_pos - max(self.cursor.read_pos, self.cursor.skip_pos)

    def append(
        self,
        bodies: Sequence[bytes | memoryview],
        numbered: Callable[[int], None] | None = None,
        *,
        wait_for_space: bool = True,
        since: float | None = None,
    ) -> int:
        """Append ``bodies`` and return once they are durable; returns the first entry number.

        ``since`` (a ``time.time()``): when the entries became durable elsewhere (moved from
        a parked queue), so that their age counts from then, not from this append.

        ``numbered(first)`` runs under the queue's lock before the entries are buffered (so
        before they can become durable or be sent); if it raises, nothing is queued. When the
        budget is exhausted: policy ``block`` waits for space (or raises
        :class:`QueueFullError` when not ``wait_for_space``), ``reject`` raises it,
        ``drop-oldest`` drops the oldest undelivered segment(s).

        Group commit without a thread in between: a caller that finds no sync running takes
        everything buffered (its own entries and those of callers that arrived meanwhile),
        writes it and calls ``fdatasync`` itself; the others wait for that sync and the next
        caller with entries left over leads the next one.
        """
        first, batch = self._buffer_entries(bodies, numbered, wait_for_space, since)
        end = first + len(bodies)
        lock = self._lock
        while True:
            with lock:
                while self.durable_n < end:
                    if self._failure is not None:
                        raise AgentClosedError(
                            f"the queue could not write the event: {self._failure}"
                        )
                    if not self._syncing and self._buffer:
                        break
                    batch.wait()
                else:
                    return first
                work = self._take_buffer_locked()
            self._write_and_sync(work)

    def _buffer_entries(
        self,
        bodies: Sequence[bytes | memoryview],
        numbered: Callable[[int], None] | None,
        wait_for_space: bool,
        since: float | None = None,
    ) -> tuple[int, threading.Condition]:
        """Buffer the entries; returns the first number and the condition of their sync."""
        size = check_entry_sizes(bodies, self.max_entry_bytes)
        with self._lock:
            while True:
                if self._closed:
                    raise AgentClosedError("the queue is closed")
                if self._failure is not None:
                    raise AgentClosedError(f"the queue failed: {self._failure}")
                if self.sealed:
                    raise QueueSealed(self.directory.name)
                used = self.used_bytes
                if self.disk_full:
                    if self.policy == "block" and wait_for_space:
                        self._space.wait()
                        continue
                    if self.policy == "drop-oldest":
                        break  # buffered; the sync waiting for room drops what it must
                    raise QueueFullError(
                        f"queue {self.directory.name}: the disk is full ({self._disk_full_why}); "
                        f"{len(bodies)} event(s) not accepted"
                    )
                if used == 0 or used + size <= self.max_bytes:
                    break
                if self.policy == "drop-oldest":
                    if self._drop_oldest_locked():
                        continue
                    # Nothing droppable yet (all in the active segment, which rolls now):
                    # the budget is overshot by at most one segment.
                    break
                if self.policy == "block" and wait_for_space:
                    self._space.wait()
                    continue
                raise QueueFullError(
                    f"queue {self.directory.name} holds {used} of {self.max_bytes} bytes "
                    f"(queue.max.bytes); {len(bodies)} event(s) not accepted"
                )
            first = self.write_n
            if numbered is not None:
                # Before anything is buffered: if it raises, the queue is unchanged.
                numbered(first)
            number = first
            buffer = self._buffer
            if not self._roll_next and self._active_bytes + size <= self.segment_bytes:
                # The usual case: the whole call fits in the active segment.
                if not buffer:
                    buffer.append((self.write_pos, first, bytearray(), False))
                buffer[-1][2].extend(encode_entries(first, bodies))
                self._active_bytes += size
                self.write_pos += size
                number += len(bodies)
            else:
                for body in bodies:
                    entry = encode_entries(number, (body,))
                    if self._active_bytes and (
                        self._roll_next or self._active_bytes + len(entry) > self.segment_bytes
                    ):
                        buffer.append((self.write_pos, number, bytearray(), True))
                        self._active_bytes = 0
                        self._roll_next = False
                    elif not buffer:
                        buffer.append((self.write_pos, number, bytearray(), False))
                    buffer[-1][2].extend(entry)
                    self._active_bytes += len(entry)
                    self.write_pos += len(entry)
                    number += 1
            self.write_n = number
            self.appended += len(bodies)
            if since is not None:
                held = self._buffer_since
                self._buffer_since = since if held is None else min(held, since)
            return first, self._batch

    def _drop_oldest_locked(self) -> bool:
        """Skip the oldest undelivered segment; False when nothing can be dropped."""
        start = max(self.cursor.read_pos, self.cursor.skip_pos)
        if self.in_flight_end is not None:
            start = max(start, self.in_flight_end[0])
        index = self._segment_index(start)
        if index + 1 >= len(self.segments):
            # Everything is in the active segment: roll so that it can be dropped.
            self._roll_next = True
            return False
        nxt = self.segments[index + 1]
        start_n = max(self.cursor.read_n, self.cursor.skip_n)
        if self.in_flight_end is not None:
            start_n = max(start_n, self.in_flight_end[1])
        if nxt.first_n > start_n:
            try:
                self._record_dropped_locked(start_n, nxt.first_n)
            except OSError as exc:
                # Not recorded, so not dropped.
                _log.warning("%s: cannot record a drop: %s", self.directory, exc)
                return False
            self.dropped += nxt.first_n - start_n
        self.cursor.skip_pos, self.cursor.skip_n = nxt.base, nxt.first_n
        self._write_cursor_locked()
        self._delete_segments_locked()
        return True

    def claim(self, n: int, end_pos: int, end_n: int) -> bool:
        """Mark the entries ``[n, end_n)`` just read as in flight, so that drop-oldest
        leaves them alone; False (nothing marked) when a drop skipped past ``n`` since they
        were read: the reader must read again from the skip position."""
        with self._lock:
            if self.cursor.skip_n > n:
                return False
            self.in_flight_end = (end_pos, end_n)
            return True

    def _take_buffer_locked(self) -> _SyncWork:
        """Make the caller the one sync in progress, for everything buffered."""
        chunks, self._buffer = self._buffer, []
        batch, self._batch = self._batch, threading.Condition(self._lock)
        since, self._buffer_since = self._buffer_since, None
        self._syncing = True
        return chunks, self.write_pos, self.write_n, batch, since

    def _write_and_sync(self, work: _SyncWork) -> None:
        chunks, end_pos, end_n, batch, since = work
        error: Exception | None = None
        # [index of the first chunk not yet durable]: a retry after a full disk starts there.
        resume = [0]
        try:
            while True:
                try:
                    self._write_chunks(chunks, resume)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not self._wait_for_room(
                        chunks, resume[0], exc
                    ):
                        raise
        except Exception as exc:
            # Whatever stops the sync (the write, or making room: a drop's cursor write) must
            # reach the block below, or _syncing would stay set and every caller hang.
            error = exc
            _log.error(
                "%s: write failed, the queue stops accepting events: %s", self.directory, exc
            )
        with self._lock:
            self._syncing = False
            if self.disk_full and error is None:
                self.disk_full = False
                if self._disk_full_logged:
                    _log.warning("%s: there is room on the disk again", self.directory)
                self._make_reserve()
                self._space.notify_all()
            if error is None and (self._reserve_missing or self._cursor_unallocated):
                self._take_room_held_back()
            if error is None:
                self.fsyncs += 1
                self.durable_pos, self.durable_n = end_pos, end_n
                now = time.time()
                # One mark per 0.1 s: (end of the entries synced by then, time). Entries
                # moved from a parked queue carry the time they became durable there.
                stamp = now if since is None else min(now, since)
                ages = self._oldest_time
                if not ages or now - ages[-1][1] >= 0.1:
                    ages.append((end_n, stamp))
                else:
                    ages[-1] = (end_n, min(ages[-1][1], stamp))
            else:
                self._failure = error
                # The chunks before the last roll of this sync are durable (the roll synced
                # them): their callers are answered, and they are delivered.
                position, number = chunks[resume[0]][:2]
                if number > self.durable_n:
                    self.durable_pos, self.durable_n = position, number
            batch.notify_all()
            if error is not None:
                self._batch.notify_all()
                self._space.notify_all()  # callers waiting for room: the queue failed
            elif self._buffer:
                self._batch.notify()
            self._durable.notify_all()
        hook = self.on_durable
        if hook is not None:
            hook()

    def _write_chunks(self, chunks: list[_Chunk], resume: list[int]) -> None:
        """Write ``chunks[resume[0]:]`` and make everything durable.

        ``resume[0]`` moves to each chunk whose segment roll succeeds: the roll made every
        chunk before it durable (it syncs the old segment). A retry starts there and writes
        again whatever of the current segment a failed attempt may have written, or synced
        without effect: rewriting the same bytes at the same place is harmless, and a
        segment roll happens once.
        """
        # One chunk (no segment roll in it) and the real fdatasync: the write syncs itself.
        synced = self._dsync_writes and len(chunks) == 1
        for index in range(resume[0], len(chunks)):
            position, first_n, data, rolls = chunks[index]
            if rolls and self._fd_base != position:
                self._roll_file(position, first_n)
                resume[0] = index
            at = position - self._fd_base
            if at + len(data) > self._file_bytes:
                self._write_zeros_ahead(at + len(data))
            view = memoryview(data)
            if synced:
                synced = self._write_dsync(view, at)
                if synced:
                    continue
            while view:
                written = os.pwrite(self._fd, view, at)
                view = view[written:]
                at += written
        if not synced:
            self._fsync(self._fd)

    def _wait_for_room(self, chunks: list[_Chunk], done: int, exc: OSError) -> bool:
        """The disk is full: make room or wait for it; False when the queue closes.

        The chunks stay buffered in order and are written when there is room, so nothing
        acknowledged moves and nothing is numbered twice. Room comes from: the zeros written
        ahead of the active segment (a segment rolls here, cutting them, and the sender can
        delete the old segment once it is delivered); drop-oldest dropping a segment; the
        sender deleting delivered segments; anything else freeing space (tried again every
        second).
        """
        with self._lock:
            if not self.disk_full:
                self.disk_full = True
                self._disk_full_why = exc.strerror or str(exc)
                self.disk_full_waits += 1
                now = time.monotonic()
                self._disk_full_logged = now - self._disk_full_logged_at >= DISK_FULL_LOG_INTERVAL
                if self._disk_full_logged:
                    self._disk_full_logged_at = now
                    _log.error(
                        "%s: the disk is full (%s); waiting for room (queue.full.policy %s, "
                        "full %d time(s) so far)",
                        self.directory,
                        self._disk_full_why,
                        self.policy,
                        self.disk_full_waits,
                    )
            if self._closed:
                return False
            position, first_n, data, rolls = chunks[done]
            if (
                not rolls
                and position > self._fd_base
                and not any(c[3] for c in (*chunks[done + 1 :], *self._buffer))
            ):
                # Start a new segment here: the active one, cut at its last entry, frees its
                # zeros now and the whole file once delivered.
                chunks[done] = (position, first_n, data, True)
                self._active_bytes = self.write_pos - position
                return True
            if self.policy == "drop-oldest" and self._drop_oldest_locked():
                return True
            self._space.wait(1.0)
            return not self._closed

    def _write_dsync(self, view: memoryview, at: int) -> bool:
        """Write ``view`` at ``at`` with ``RWF_DSYNC``: durable when this returns, as after
        ``pwrite`` + ``fdatasync``, in one system call (and one release of the GIL) instead
        of two. False, with nothing written, where the file system does not take the flag;
        the queue then writes and fdatasyncs from now on."""
        try:
            while view:
                written = os.pwritev(self._fd, [view], at, os.RWF_DSYNC)
                view = view[written:]
                at += written
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP) or len(view) == 0:
                raise
            self._dsync_writes = False
            return False
        return True

    def _write_zeros_ahead(self, needed: int) -> None:
        try:
            self._extend_with_zeros(needed, ahead=True)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # Too little room for the zeros ahead: take just what the entries need.
            self._extend_with_zeros(needed, ahead=False)

    def _extend_with_zeros(self, needed: int, *, ahead: bool) -> None:
        """Extend the active segment file with zeros to cover ``needed`` bytes and more.

        Entries then overwrite blocks that exist, so their ``fdatasync`` flushes data only.
        An append that grows the file also commits the file system's journal (the new size),
        a second disk write that queues behind every other file's journal commit, the
        broker's on the same disk included. The zeros are made durable by the same
        ``fdatasync`` as the entries written with them, once per :data:`ZEROS_AHEAD` bytes.
        """
        # Never past the disk budget: what the zeros take counts as used disk space.
        room = needed + max(0, self.max_bytes - self.used_bytes)
        end = max(needed, min(self._file_bytes + ZEROS_AHEAD, self.segment_bytes, room))
        if not ahead:
            end = needed
        at = self._file_bytes
        try:
            while at < end:
                at += os.pwrite(self._fd, _ZEROS[: min(ZEROS_AHEAD, end - at)], at)
        finally:
            # Also after a full disk stopped it part-way: the zeros written exist, and a
            # roll or close must cut them.
            self._file_bytes = max(self._file_bytes, at)

    def _cut_zeros(self, data_end: int) -> None:
        """Drop the zeros written ahead of the active segment's last entry (not synced: a
        crash may leave them, and recovery finds the end of the entries either way)."""
        if self._file_bytes > data_end:
            os.ftruncate(self._fd, data_end)
            self._file_bytes = data_end

    def _roll_file(self, base: int, first_n: int) -> None:
        seg = Segment(base, first_n, self.directory / segment_name(base, first_n))
        # The new file, durable in its directory, before the queue switches to it: when a
        # step fails (a full disk), nothing has changed and a retry rolls again.
        fd = os.open(seg.path, os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            self._fsync(self._fd)
            self._cut_zeros(base - self._fd_base)
            self._sync_dir()
        except OSError:
            os.close(fd)
            raise
        os.close(self._fd)
        self._fd = fd
        self._fd_base = base
        self._file_bytes = 0
        with self._lock:
            self.segments.append(seg)

    # ------------------------------------------------------------------ read side

    def _segment_index(self, pos: int) -> int:
        segs = self.segments
        low, high = 0, len(segs) - 1
        while low < high:
            mid = (low + high + 1) // 2
            if segs[mid].base <= pos:
                low = mid
            else:
                high = mid - 1
        return low

    def start_of_next_read(self) -> tuple[int, int]:
        with self._lock:
            c = self.cursor
            return (c.read_pos, c.read_n) if c.read_pos >= c.skip_pos else (c.skip_pos, c.skip_n)

    def read(self, pos: int, n: int, max_bytes: int, *, skip_damage: bool = True) -> list[Entry]:
        """Durable entries from ``pos`` (entry ``n``), one segment at most, about ``max_bytes``.

        Always at least one entry when one is durable. Entries before damaged data are
        returned; damaged data read first makes the queue skip it, to the next valid entry
        or the end of the segment (counted in ``corrupt``, see :meth:`_corrupt`), and
        returns nothing: the reader reads again at :meth:`start_of_next_read`. Only a reader
        at the start of the undelivered entries may skip; one reading ahead of it passes
        ``skip_damage=False`` and gets nothing at damage (a skip from there would pass
        undelivered entries).
        """
        with self._lock:
            durable = self.durable_pos
            if pos >= durable:
                return []
            index = self._segment_index(pos)
            seg = self.segments[index]
            limit = self.segments[index + 1].base if index + 1 < len(self.segments) else durable
            limit = min(limit, durable)
        if pos >= limit:
            return []
        fd = self._read_fd(seg)
        want = min(limit - pos, max(max_bytes, ENTRY_SIZE + self.max_entry_bytes))
        data = os.pread(fd, want, pos - seg.base)
        view = memoryview(data)
        entries: list[Entry] = []
        off = 0
        expected = n
        total = 0
        while off + ENTRY_SIZE <= len(data):
            length, crc, number = ENTRY.unpack_from(data, off)
            end = off + ENTRY_SIZE + length
            if end > len(data):
                if pos + end > limit:
                    if not entries and skip_damage:
                        self._corrupt(pos + off, expected, seg, limit)
                elif off == 0 and len(data) == want:
                    # The first entry is larger than this read: one written before
                    # max_entry_bytes was lowered. Read it whole (it is within the segment).
                    want = end
                    data = os.pread(fd, want, pos - seg.base)
                    view = memoryview(data)
                    continue
                break
            check = crc32c(
                view[off + ENTRY_SIZE : end],
                crc32c(view[off + 8 : off + 16], crc32c(view[off : off + 4])),
            )
            if check != crc or number != expected:
                if not entries and skip_damage:
                    self._corrupt(pos + off, expected, seg, limit)
                # Else the entries before the damage go first: it is skipped once they are
                # delivered, so that a skip never passes undelivered entries (a crash before
                # their delivery would lose them).
                break
            entries.append(Entry(number, pos + off, view[off + ENTRY_SIZE : end]))
            off = end
            expected += 1
            total += ENTRY_SIZE + length
            if total >= max_bytes:
                break
        if not entries and len(data) < want and skip_damage:
            # The file ends before the next segment starts (a machine crash inside a roll
            # can leave that): what is missing is damaged, not coming.
            self._corrupt(pos, n, seg, limit)
        return entries

    def _corrupt(self, at: int, n: int, seg: Segment, limit: int) -> None:
        """Skip damaged data at ``at`` (where entry ``n`` should be): to the next valid entry
        of the segment if there is one, else to the end of the segment. The entries skipped
        are recorded as dropped (a query answers "dropped", not "delivered") before the
        cursor skips them, as drop-oldest does."""
        try:
            data = os.pread(self._read_fd(seg), limit - seg.base, 0)
        except OSError:
            data = b""
        resume = find_next_entry(memoryview(data), at - seg.base, n)
        with self._lock:
            if resume is not None:
                target = (seg.base + resume[0], resume[1])
            else:
                index = self._segment_index(at)
                if index + 1 < len(self.segments):
                    nxt = self.segments[index + 1]
                    target = (nxt.base, nxt.first_n)
                else:
                    target = (self.durable_pos, self.durable_n)
            if target[0] <= self.cursor.skip_pos:
                return  # skipped already
            self.corrupt += 1
            _log.error(
                "%s: damaged entry at position %d; skipping entries %d to %d, to position %d",
                seg.path,
                at,
                n,
                target[1] - 1,
                target[0],
            )
            if target[1] > n:
                try:
                    self._record_dropped_locked(n, target[1])
                except OSError as exc:
                    _log.warning("%s: cannot record the skipped entries: %s", self.directory, exc)
            self.cursor.skip_pos, self.cursor.skip_n = target
            self._write_cursor_locked()

    def after_damage(self, pos: int, n: int) -> tuple[int, int] | None:
        """Where entries go on after damaged data at ``pos`` (entry ``n``), if they do within
        its segment: (position, number)."""
        with self._lock:
            if pos >= self.durable_pos:
                return None
            index = self._segment_index(pos)
            seg = self.segments[index]
            limit = self.segments[index + 1].base if index + 1 < len(self.segments) else None
            limit = self.durable_pos if limit is None else min(limit, self.durable_pos)
        data = os.pread(self._read_fd(seg), limit - seg.base, 0)
        found = find_next_entry(memoryview(data), pos - seg.base, n)
        return None if found is None else (seg.base + found[0], found[1])

    def continue_after(self, pos: int, n: int) -> bool:
        """Number new entries from ``n``, at position ``pos``, when the queue ends before
        them: entries up to there were durable (a parked move's plan names them) and
        recovery cut the last of them as a torn tail (damaged data at the end of the queue).
        A new segment starts at ``(pos, n)``, so that no later entry takes their numbers or
        positions; what is missing reads as damage. Only before anything is appended; False
        when the queue reaches that far."""
        with self._lock:
            if n <= self.write_n:
                return False
            if self._buffer or self._syncing or self.write_n != self.durable_n:
                raise QueueCorruptError(f"{self.directory}: entries were appended since recovery")
        _log.error(
            "%s: entries %d to %d were cut as a torn tail although durable (damaged); new "
            "entries start at %d",
            self.directory,
            self.write_n,
            n - 1,
            n,
        )
        self._roll_file(pos, n)
        with self._lock:
            self.write_pos = self.durable_pos = pos
            self.write_n = self.durable_n = n
            self._active_bytes = 0
        return True

    def record_damage(self, first: int, end: int) -> None:
        """Entries ``[first, end)``, found damaged by a reader that does not move the cursor
        past them itself (a parked move finishing its plan): counted in ``corrupt`` and
        recorded as dropped, so that a query answers "dropped" for them. An error recording
        them is logged: they are lost either way."""
        with self._lock:
            self.corrupt += 1
            _log.error("%s: entries %d to %d are damaged; dropped", self.directory, first, end - 1)
            try:
                self._record_dropped_locked(first, end)
            except OSError as exc:
                _log.warning("%s: cannot record the damaged entries: %s", self.directory, exc)

    def _read_fd(self, seg: Segment) -> int:
        fd = self._read_fds.get(seg.base)
        if fd is None:
            fd = os.open(seg.path, os.O_RDONLY)
            self._read_fds[seg.base] = fd
        return fd

    def locate(self, pos: int, n: int, target_n: int) -> tuple[int, int]:
        """The position of entry ``target_n`` (at most the durable end), reading from ``pos``
        ahead of the delivered entries: over damage, without skipping it. When damaged data
        covers ``target_n``, the first valid entry after it (a number past ``target_n``)."""
        while n < target_n:
            entries = self.read(pos, n, 1 << 20, skip_damage=False)
            if not entries:
                beyond = self.after_damage(pos, n)
                if beyond is None:
                    break
                pos, n = beyond
                continue
            for entry in entries:
                if entry.number == target_n:
                    return entry.position, entry.number
            last = entries[-1]
            pos, n = last.position + ENTRY_SIZE + len(last.body), last.number + 1
        return pos, n

    def commit(
        self,
        pos: int,
        n: int,
        next_seq: int,
        producer_id: int,
        producer_epoch: int,
        *,
        delivered: tuple[int, int, int] | None = None,
        refused: tuple[int, int] | None = None,
    ) -> None:
        """Persist the read side: entries before ``pos`` are delivered (blocking, fsyncs).

        ``delivered`` is (first entry, count, base offset or -1) of the batch the broker
        acknowledged, recorded in the offset index first. ``refused`` is the range of entries
        [first, end) the broker refused, recorded (and synced) with the drops first: they
        answer "dropped" from then on.
        """
        with self._lock:
            if delivered is not None:
                self._record_delivery(*delivered)
            if refused is not None:
                self._record_dropped_locked(*refused)
            c = self.cursor
            c.read_pos, c.read_n = pos, n
            if c.skip_pos <= pos:
                c.skip_pos, c.skip_n = pos, n
            c.next_seq = next_seq
            c.producer_id, c.producer_epoch = producer_id, producer_epoch
            generation, raw = self._pack_cursor_locked()
        # Written and synced outside the queue's lock: appends (and the acknowledgements of
        # their callers) do not wait behind this fsync.
        self._write_cursor(generation, raw)
        with self._lock:
            # Only now that the cursor is durable: no segment it still points into is gone.
            self._delete_segments_locked()
            while self._oldest_time and self._oldest_time[0][0] <= n:
                self._oldest_time.popleft()
            self._space.notify_all()
        hook = self.on_space
        if hook is not None:
            hook()

    def _pack_cursor_locked(self) -> tuple[int, bytes]:
        c = self.cursor
        c.generation += 1
        return c.generation, c.pack()

    def _write_cursor(self, generation: int, raw: bytes) -> None:
        """Write and sync a packed cursor into its slot, unless a later generation was
        written meanwhile: every packed cursor holds all changes before it, so the later one
        stands for this one too (and must not be overwritten by it in their shared slot)."""
        with self._cursor_lock:
            if generation <= self._cursor_written:
                return
            try:
                os.pwrite(self._cursor_fd, raw, (generation % 2) * CURSOR_SLOT)
            except OSError as exc:
                # A slot without its blocks (a queue opened on a full disk), or a file
                # system that allocates on overwrite: the reserve gives up its room.
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not self._release_reserve():
                    raise
                os.pwrite(self._cursor_fd, raw, (generation % 2) * CURSOR_SLOT)
            self._fsync(self._cursor_fd)
            self._cursor_written = generation

    def _write_cursor_locked(self) -> None:
        self._write_cursor(*self._pack_cursor_locked())

    def _delete_segments_locked(self) -> None:
        c = self.cursor
        keep: list[Segment] = []
        read_index = self._segment_index(c.read_pos)
        for i, seg in enumerate(self.segments):
            nxt = self.segments[i + 1].base if i + 1 < len(self.segments) else None
            delivered = nxt is not None and nxt <= c.read_pos
            skipped = i > read_index and nxt is not None and nxt <= c.skip_pos
            if delivered or skipped:
                fd = self._read_fds.pop(seg.base, None)
                if fd is not None:
                    os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    seg.path.unlink()
            else:
                keep.append(seg)
        self.segments = keep

    def seal_if_moved(self, n: int) -> bool:
        """Seal the queue if every entry ever submitted is before entry ``n``."""
        with self._lock:
            if self.write_n <= n:
                self.sealed = True
            return self.sealed

    def unseal(self) -> None:
        with self._lock:
            self.sealed = False

    # ------------------------------------------------------------------ offset index

    def _load_index(self) -> None:
        old = self.directory / OFFSET_INDEX_OLD
        current = self.directory / OFFSET_INDEX
        records: list[tuple[int, int, int]] = []
        for path in (old, current):
            found, size = _read_records(path, _OFFSET)
            records.extend((first, count, base) for (first, count, base), _ in found)
            if path is current:
                good_end = found[-1][1] if found else 0
                self._index_records = good_end // _OFFSET.size
                # A record torn by a crash: only offsets, the cursor says what was delivered.
                _cut_after(path, good_end, size)
        records.sort()
        self._delivered_first = [r[0] for r in records]
        self._delivered = [(r[1], r[2]) for r in records]
        self._index_fd = os.open(current, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)

    def _load_dropped(self) -> None:
        """The dropped ranges whose skip is durable. The file is cut at a torn record and at
        a record of a drop the cursor never skipped (a crash between the two): that drop
        did not happen, and a later one must not make the record count."""
        path = self.directory / DROPPED_RANGES
        found, size = _read_records(path, _DROPPED)
        good_end = 0
        for (first, end), record_end in found:
            # (With a reset cursor, skip_n says nothing: every record is kept.)
            if first >= end or (end > self.cursor.skip_n and not self._cursor_reset):
                break
            self.dropped_ranges.append((first, end))
            good_end = record_end
        self._dropped_records = good_end // _DROPPED.size
        _cut_after(path, good_end, size)

    def _record_dropped_locked(self, first: int, end: int) -> None:
        """Make the drop of entries [first, end) durable before the cursor skips them, and
        known to queries. On a full disk the reserve file gives up its room for it."""
        try:
            self._write_dropped_locked(first, end)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not self._release_reserve():
                raise
            self._write_dropped_locked(first, end)
        self.dropped_ranges.append((first, end))
        if self.on_dropped is not None:
            self.on_dropped(first, end)

    def _write_dropped_locked(self, first: int, end: int) -> None:
        path = self.directory / DROPPED_RANGES
        if self._dropped_records >= 2 * DROPPED_RANGES_KEPT:
            # Rewrite with the newest ranges (this one included), then replace atomically.
            kept = [*list(self.dropped_ranges)[1 - DROPPED_RANGES_KEPT :], (first, end)]
            fresh = self.directory / (DROPPED_RANGES + ".new")
            data = b"".join(_dropped_record(f, e) for f, e in kept)
            try:
                fd = os.open(fresh, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
                try:
                    _write_whole(fd, data, 0)
                    self._fsync(fd)
                finally:
                    os.close(fd)
                os.replace(fresh, path)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    fresh.unlink()
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                # No room for the rewrite (a full disk, where drops happen): append this
                # record instead, and rewrite at a later drop.
            else:
                self._sync_dir()
                self._dropped_records = len(kept)
                return
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
        try:
            size = os.fstat(fd).st_size
            append_whole(fd, _dropped_record(first, end))
            try:
                self._fsync(fd)
            except OSError:
                # Not durable, so not recorded: a record left behind would name a drop
                # that never happened (its events delivered would answer "dropped").
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)
        if self._dropped_records == 0:
            self._sync_dir()  # the file is new
        self._dropped_records += 1

    def _make_reserve(self) -> None:
        """Set :data:`RESERVE_BYTES` of disk aside (best effort), for what must be written to
        free room on a full disk: the record of a drop."""
        path = self.directory / RESERVE
        with contextlib.suppress(OSError):
            # Not synced: a machine crash may leave it short, and then it is made again.
            if path.stat().st_size == RESERVE_BYTES:
                return
        try:
            fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
            try:
                _write_whole(fd, bytes(RESERVE_BYTES), 0)
            finally:
                os.close(fd)
        except OSError as exc:
            if not self._reserve_missing:
                _log.warning("%s: no disk reserve: %s", self.directory, exc)
            self._reserve_missing = True
            with contextlib.suppress(OSError):
                path.unlink()
            return
        self._reserve_missing = False

    def _release_reserve(self) -> bool:
        try:
            (self.directory / RESERVE).unlink()
        except FileNotFoundError:
            return False
        _log.warning("%s: the disk is full; giving up the reserve", self.directory)
        return True

    def _record_delivery(self, first: int, count: int, base: int) -> None:
        raw = _OFFSET.pack(first, count, base, 0)
        raw = raw[:-4] + struct.pack(">I", crc32c(raw[:-4]))
        # Not synced per batch: the cursor written next is what makes the delivery count;
        # after a crash of the machine the newest records may be missing (offset unknown).
        try:
            if self._index_fd < 0:  # a rotation failed: open the index again
                self._index_fd = os.open(
                    self.directory / OFFSET_INDEX, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644
                )
            append_whole(self._index_fd, raw)
        except OSError as exc:
            # Only offsets for queries are lost (they answer -1); the read position must
            # still move, or a full disk would never get the room delivery frees.
            if not self._index_failing:
                _log.warning("%s: offsets not recorded: %s", self.directory, exc)
            self._index_failing = True
            return
        self._index_failing = False
        self._index_records += 1
        if self._delivered_first and first < self._delivered_first[-1]:
            index = bisect.bisect_right(self._delivered_first, first)
            self._delivered_first.insert(index, first)
            self._delivered.insert(index, (count, base))
        else:
            self._delivered_first.append(first)
            self._delivered.append((count, base))
        if self._index_records >= OFFSET_INDEX_RECORDS:
            try:
                self._fsync(self._index_fd)
                fd, self._index_fd = self._index_fd, -1
                os.close(fd)
                os.replace(self.directory / OFFSET_INDEX, self.directory / OFFSET_INDEX_OLD)
            except OSError as exc:
                # Tried again at the next record; the offsets already recorded stay.
                _log.warning("%s: offset index not rotated: %s", self.directory, exc)
                return
            # Rotated: from here a failure must not rotate again (that would replace the
            # full offsets.old); a missing fd is opened again at the next record.
            keep = len(self._delivered) - self._index_records
            del self._delivered_first[:keep], self._delivered[:keep]
            self._index_records = 0
            try:
                self._index_fd = os.open(
                    self.directory / OFFSET_INDEX, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644
                )
                self._sync_dir()
            except OSError as exc:
                _log.warning("%s: offset index not reopened: %s", self.directory, exc)

    def was_dropped(self, number: int) -> bool:
        """Whether entry ``number`` is in a dropped range kept (drop-oldest, damage skipped,
        a refusal). Safe from any thread: the ranges grow under the lock while sending
        threads drop, so they are copied under it."""
        with self._lock:
            ranges = tuple(self.dropped_ranges)
        return any(first <= number < end for first, end in ranges)

    def delivered_offset(self, number: int) -> int | None:
        """The offset of delivered entry ``number`` from the index (-1: delivered, offset
        unknown, e.g. found already there after a crash); None when not in the index."""
        with self._lock:
            index = bisect.bisect_right(self._delivered_first, number) - 1
            if index < 0:
                return None
            first = self._delivered_first[index]
            count, base = self._delivered[index]
        if number >= first + count:
            return None
        return base + number - first if base >= 0 else -1

    # ------------------------------------------------------------------ status

    def depth(self) -> int:
        with self._lock:
            c = self.cursor
            return self.durable_n - max(c.read_n, c.skip_n)

    def oldest_age(self) -> float:
        """Seconds since the oldest undelivered event became durable (0 when none).

        Events stored in this run are timed when their group commit completes; for events
        found at start the time comes from the entry itself: its timestamp, capped by the
        modification time of its segment (a timestamp in the future, or set by the caller).
        """
        with self._lock:
            c = self.cursor
            start_pos, start_n = (
                (c.read_pos, c.read_n) if c.read_pos >= c.skip_pos else (c.skip_pos, c.skip_n)
            )
            if self.durable_n <= start_n:
                return 0.0
            now = time.time()
            if start_n >= self._recovered_n:
                # Marks of entries no longer undelivered: delivered ones are removed at each
                # commit, skipped ones (drop-oldest, damage) here.
                ages = self._oldest_time
                while ages and ages[0][0] <= start_n:
                    ages.popleft()
                if not ages:
                    return 0.0
                return max(0.0, now - min(t for _, t in ages))
            seg = self.segments[self._segment_index(start_pos)]
        try:
            fd = os.open(seg.path, os.O_RDONLY)
            try:
                raw = os.pread(fd, ENTRY_SIZE + 8, start_pos - seg.base)
                mtime = os.fstat(fd).st_mtime
            finally:
                os.close(fd)
        except OSError:
            return 0.0  # the segment was delivered and deleted meanwhile
        if len(raw) < ENTRY_SIZE + 8:
            return 0.0
        length, _, number = ENTRY.unpack_from(raw, 0)
        if number != start_n or length < 8:
            return 0.0
        stamp_ms: int = struct.unpack_from(">q", raw, ENTRY_SIZE)[0]
        if stamp_ms < 0:  # not a record body (a parked event pinned to a partition)
            return max(0.0, now - mtime)
        return max(0.0, now - min(stamp_ms / 1000, float(mtime)))
