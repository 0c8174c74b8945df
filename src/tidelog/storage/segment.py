"""One segment of a partition log: a ``.log`` file of batches and its indexes.

Files of a segment share the 20-digit zero-padded base offset as their name::

    00000000000000001234.log        batches exactly as on the wire, back to back
    00000000000000001234.index      see :mod:`tidelog.storage.index`
    00000000000000001234.timeindex
    00000000000000001234.txnindex   aborted transactions, see :mod:`tidelog.storage.txn_index`
                                    (only once one was aborted in the segment)

A segment being built aside (by the cleaner) or being replaced carries an extra
suffix on every file: ``.cleaned`` while written, ``.swap`` once complete and about
to replace older segments, ``.deleted`` once removed from the log and about to be
unlinked.

Only the active (last) segment is written. ``size`` is the number of valid bytes:
recovery truncates the file to it, and every write goes at that position with
``pwrite`` so a failed, partial write is overwritten by the next one.

File handles are opened on demand through a :class:`HandleCache` so a log with
thousands of segments keeps only a few open: the cache closes the least recently
used idle segments beyond its cap. Everything that touches a segment's files runs
between :meth:`HandleCache.acquire` and :meth:`HandleCache.release` (``use``), so
a segment in use is never closed under its user. Reads hand out a
:class:`FileSlice` owning a duplicate of the file descriptor, so a slice stays
valid after the segment is closed, truncated away or deleted.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from tidelog.records.batch import (
    HEADER_SIZE,
    BatchHeader,
    iter_batches,
    parse_header,
    validate_batch,
)
from tidelog.records.errors import RecordsError, TruncatedBatchError
from tidelog.storage.errors import CorruptSegmentError, SegmentDeletedError
from tidelog.storage.index import INT32_MAX, OffsetIndex, TimeIndex
from tidelog.storage.txn_index import TxnIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"
SEGMENT_FILE_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)

# Header scans read the log in windows of this size (one pread per window).
_SCAN_WINDOW = 64 * 1024
# Recovery reads (and checks CRCs of) the log in windows of this size.
_RECOVERY_WINDOW = 1024 * 1024

_WINDOW_POSITION = re.compile(r" at position \d+")

_log = logging.getLogger(__name__)

FsyncFn = Callable[[int], None]


def segment_name(base_offset: int) -> str:
    """The 20-digit zero-padded file stem of the segment starting at ``base_offset``."""
    return f"{base_offset:020d}"


def parse_segment_name(stem: str) -> int | None:
    """Base offset from a file stem, or None when it is not 20 digits."""
    if len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)


def _pwrite_all(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        if written <= 0:
            raise OSError(f"pwrite wrote {written} bytes")
        position += written
        view = view[written:]


def pread_exactly(fd: int, length: int, position: int) -> bytes:
    """``length`` bytes at ``position``; fewer only when the file ends first."""
    data = os.pread(fd, length, position)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, position + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


class _Untrusted:
    """Marker: a scan started from an index hint that turned out wrong."""


_UNTRUSTED = _Untrusted()


class FileSlice:
    """``length`` bytes at ``position`` of a segment file, for ``os.sendfile``.

    Owns ``fd`` (a duplicate of the segment's descriptor): close it when done, or use
    the slice as a context manager. The bytes are those of the log when the read was
    made, unless a later truncation removed them.
    """

    __slots__ = ("fd", "first_offset", "length", "position")

    def __init__(self, fd: int, position: int, length: int, first_offset: int) -> None:
        self.fd = fd
        self.position = position
        self.length = length
        self.first_offset = first_offset

    def read(self) -> bytes:
        """The slice's bytes (a copy; the zero-copy path is ``os.sendfile``)."""
        if self.fd < 0:
            raise ValueError("slice is closed")
        return pread_exactly(self.fd, self.length, self.position)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> FileSlice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            self.close()

    def __repr__(self) -> str:
        return f"FileSlice(position={self.position}, length={self.length})"


class BatchPosition(NamedTuple):
    """A batch in a segment: its byte position and header."""

    position: int
    header: BatchHeader


class RecoveryProblem(NamedTuple):
    """What recovery dropped from one segment."""

    segment: int  # base offset
    position: int
    bytes_dropped: int
    reason: str


class Segment:
    """A ``.log`` file with its offset and time indexes; see the module docstring."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_bytes: int,
        created_ms: int,
        suffix: str = "",
        active: bool = False,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.suffix = suffix
        self.index_interval_bytes = index_interval_bytes
        self.created_ms = created_ms
        self.active = active
        stem = segment_name(base_offset)
        self.offset_index = OffsetIndex(
            directory / (stem + INDEX_SUFFIX + suffix), base_offset, max_index_bytes
        )
        self.time_index = TimeIndex(
            directory / (stem + TIME_INDEX_SUFFIX + suffix), base_offset, max_index_bytes
        )
        self.txn_index = TxnIndex(directory / (stem + TXN_INDEX_SUFFIX + suffix))
        self.log_path = directory / (stem + LOG_SUFFIX + suffix)
        try:
            self.size = self.log_path.stat().st_size
        except FileNotFoundError:
            self.size = 0
        self.pins = 0
        self.retired = False
        self._fd: int | None = None
        # Largest batch max timestamp and the last offset of the first batch holding it;
        # known for the active segment, read lazily from the time index otherwise.
        self._max_timestamp = -1
        self._offset_of_max_timestamp = -1
        self._timestamps_known = False
        self._last_time_entry = -(2**63)
        self._bytes_since_index_entry = 0
        self._rolling_timestamp: int | None = None
        # The offset after the last batch: tracked for the active segment.
        self.next_offset: int | None = None

    def __repr__(self) -> str:
        return f"Segment({self.base_offset}, size={self.size}, active={self.active})"

    # -- paths -----------------------------------------------------------------------

    @property
    def paths(self) -> tuple[Path, Path, Path, Path]:
        """The ``.log`` file first, then the indexes (in :data:`SEGMENT_FILE_SUFFIXES` order)."""
        return (self.log_path, self.offset_index.path, self.time_index.path, self.txn_index.path)

    def rename_suffix(self, suffix: str) -> None:
        """Rename every file of the segment to carry ``suffix`` (in place of the old one)."""
        stem = segment_name(self.base_offset)
        targets = [self.directory / (stem + kind + suffix) for kind in SEGMENT_FILE_SUFFIXES]
        # The ``.log`` file goes last: recovery reads a segment's state from its log file's
        # suffix, so its indexes (above all the txn index, which cannot be rebuilt from the
        # segment) must already carry that suffix when it does.
        for source, target in reversed(list(zip(self.paths, targets, strict=True))):
            with contextlib.suppress(FileNotFoundError):
                os.replace(source, target)
        self.suffix = suffix
        self.log_path = targets[0]
        self.offset_index.path = targets[1]
        self.time_index.path = targets[2]
        self.txn_index.path = targets[3]

    def delete_files(self) -> None:
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    # -- handles ---------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def open_files(self) -> None:
        """Open the ``.log`` file (which must exist); indexes load on first use."""
        if self._fd is None:
            self._fd = os.open(self.log_path, os.O_RDWR)

    def close_files(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.offset_index.close()
        self.time_index.close()

    @property
    def fd(self) -> int:
        if self._fd is None:
            raise RuntimeError(f"segment {self.base_offset} is not open")
        return self._fd

    def dup_fd(self) -> int:
        return os.dup(self.fd)

    # -- indexes ---------------------------------------------------------------------

    def ensure_indexes(self) -> None:
        """Load the indexes (read-only for a sealed segment), rebuilding them if unusable."""
        if (
            self.offset_index.loaded
            and self.time_index.loaded
            and self.offset_index.writable == self.active
        ):
            return
        if self.active:
            self.offset_index.load(writable=True)
            self.time_index.load(writable=True)
            return
        problem = self.index_problem(full=False)
        if problem is not None:
            _log.warning(
                "rebuilding indexes of segment %s in %s: %s",
                self.base_offset,
                self.directory,
                problem,
            )
            self.rebuild_indexes()
        self.offset_index.load(writable=False)
        self.time_index.load(writable=False)

    def index_problem(self, full: bool) -> str | None:
        """Why the index files cannot be trusted (absent, torn, out of range), or None."""
        for index in (self.offset_index, self.time_index):
            try:
                size = index.path.stat().st_size
            except FileNotFoundError:
                return f"{index.path.name} is missing"
            if size % index.entry.size:
                return f"{index.path.name} size {size} is not a multiple of {index.entry.size}"
        self.offset_index.load(writable=False)
        self.time_index.load(writable=False)
        try:
            problem = self.offset_index.check(self.size, full)
            if problem is None:
                problem = self.time_index.check(None, full)
            return problem
        finally:
            self.offset_index.close()
            self.time_index.close()

    def rebuild_indexes(self) -> None:
        """Rewrite both indexes from the ``.log`` file's batch headers."""
        self.offset_index.load(writable=True)
        self.time_index.load(writable=True)
        self._reset_tracking()
        self.offset_index.reset()
        self.time_index.reset()
        self._track(
            (pos, h.size, h.last_offset, h.max_timestamp)
            for pos, h in self.iter_headers(0, self.size)
        )
        if not self.active:
            self._append_final_time_entry()
            self.offset_index.close()
            self.time_index.close()

    def _reset_tracking(self) -> None:
        self._max_timestamp = -1
        self._offset_of_max_timestamp = -1
        self._timestamps_known = True
        self._last_time_entry = -(2**63)
        self._bytes_since_index_entry = 0
        self._rolling_timestamp = None

    def _track(self, batches: Iterable[tuple[int, int, int, int]]) -> None:
        """Index batches ``(position, size, last offset, max timestamp)`` just written.

        Kafka's rule: before a batch, if more than ``index.interval.bytes`` were written
        since the last entry, add an offset entry for this batch and a time entry when
        the maximum timestamp grew.
        """
        base = self.base_offset
        interval = self.index_interval_bytes
        offset_entries = bytearray()
        time_entries = bytearray()
        max_ts = self._max_timestamp
        offset_of_max = self._offset_of_max_timestamp
        since = self._bytes_since_index_entry
        last_time = self._last_time_entry
        for position, size, last_offset, batch_max_ts in batches:
            if batch_max_ts > max_ts:
                max_ts = batch_max_ts
                offset_of_max = last_offset
            if since > interval:
                offset_entries += OffsetIndex.pack(last_offset - base, position)
                if max_ts > last_time:
                    time_entries += TimeIndex.pack(max_ts, offset_of_max - base)
                    last_time = max_ts
                since = 0
            since += size
        self._max_timestamp = max_ts
        self._offset_of_max_timestamp = offset_of_max
        self._bytes_since_index_entry = since
        self._last_time_entry = last_time
        self.offset_index.append_raw(offset_entries)
        self.time_index.append_raw(time_entries)

    def _append_final_time_entry(self) -> None:
        if self._max_timestamp > self._last_time_entry and self._max_timestamp >= 0:
            self.time_index.append_raw(
                TimeIndex.pack(
                    self._max_timestamp, self._offset_of_max_timestamp - self.base_offset
                )
            )
            self._last_time_entry = self._max_timestamp

    @property
    def index_full(self) -> bool:
        return self.offset_index.is_full or self.time_index.is_full

    # -- active segment state ---------------------------------------------------------

    def activate(self) -> None:
        """Make this the writable segment: load indexes for writing and find its end.

        The end offset, maximum timestamp and bytes since the last index entry come from
        the last index entries plus a header scan of the batches after them.
        """
        self.active = False
        problem = None if self.size == 0 else self.index_problem(full=False)
        if problem is not None:
            _log.warning(
                "rebuilding indexes of segment %s in %s: %s",
                self.base_offset,
                self.directory,
                problem,
            )
            self.rebuild_indexes()
        self.active = True
        self.ensure_indexes()
        if self.size == 0:
            self.offset_index.reset()
            self.time_index.reset()
        last = self.offset_index.last_entry()
        start = 0 if last is None else last[1]
        last_time = self.time_index.last_entry()
        self._reset_tracking()
        if last_time is not None:
            self._max_timestamp, self._offset_of_max_timestamp = last_time
            self._last_time_entry = last_time[0]
        next_offset = self.base_offset
        for _, header in self.iter_headers(start, self.size):
            if header.max_timestamp > self._max_timestamp:
                self._max_timestamp = header.max_timestamp
                self._offset_of_max_timestamp = header.last_offset
            self._bytes_since_index_entry += header.size
            next_offset = header.next_offset
        self.next_offset = next_offset

    def seal(self) -> None:
        """Stop being the active segment: final time entry, indexes switch to read-only."""
        if not self.active:
            return
        self.ensure_indexes()
        self._append_final_time_entry()
        self.active = False
        self.offset_index.close()
        self.time_index.close()

    def fsync(self, fsync: FsyncFn, indexes: bool) -> None:
        fsync(self.fd)
        if indexes:
            self.txn_index.sync(fsync)
            for index in (self.offset_index, self.time_index):
                if index.writable:
                    index.fsync(fsync)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        fd = os.open(index.path, os.O_RDONLY)
                        try:
                            fsync(fd)
                        finally:
                            os.close(fd)

    # -- timestamps -------------------------------------------------------------------

    def _ensure_timestamps(self) -> None:
        if self._timestamps_known:
            return
        self.ensure_indexes()
        last = self.time_index.last_entry()
        if last is not None:
            self._max_timestamp, self._offset_of_max_timestamp = last
        else:
            self._max_timestamp, self._offset_of_max_timestamp = -1, -1
        self._timestamps_known = True

    def max_timestamp(self) -> tuple[int, int]:
        """(largest batch max timestamp, last offset of the first batch holding it)."""
        self._ensure_timestamps()
        return self._max_timestamp, self._offset_of_max_timestamp

    def largest_timestamp_for_retention(self) -> int:
        """Max timestamp, or the file's modification time when no batch carries one."""
        max_ts, _ = self.max_timestamp()
        if max_ts >= 0:
            return max_ts
        try:
            return int(self.log_path.stat().st_mtime * 1000)
        except FileNotFoundError:
            return -1

    def rolling_timestamp(self) -> int:
        """Max timestamp of the first batch (the time ``segment.ms`` counts from), or -1."""
        if self._rolling_timestamp is None:
            if self.size == 0:
                return -1
            header = self.header_at(0)
            self._rolling_timestamp = header.max_timestamp
        return self._rolling_timestamp

    # -- reading ---------------------------------------------------------------------

    def header_at(self, position: int) -> BatchHeader:
        data = pread_exactly(self.fd, HEADER_SIZE, position)
        try:
            return parse_header(data)
        except RecordsError as exc:
            raise CorruptSegmentError(
                f"segment {self.log_path}: bad batch at position {position}: {exc}"
            ) from exc

    def iter_headers(self, start: int, end: int) -> Iterator[tuple[int, BatchHeader]]:
        """``(position, header)`` of each batch in ``[start, end)``, one pread per window."""
        fd = self.fd
        window = b""
        window_start = start
        position = start
        while position < end:
            offset = position - window_start
            if len(window) - offset < HEADER_SIZE:
                window = pread_exactly(fd, min(_SCAN_WINDOW, end - position), position)
                window_start = position
                offset = 0
            try:
                header = parse_header(window, offset)
            except RecordsError as exc:
                raise CorruptSegmentError(
                    f"segment {self.log_path}: bad batch at position {position}: {exc}"
                ) from exc
            if position + header.size > end:
                raise CorruptSegmentError(
                    f"segment {self.log_path}: batch at position {position} of "
                    f"{header.size} bytes runs past the end ({end})"
                )
            yield position, header
            position += header.size

    def find_batch(self, offset: int, end: int | None = None) -> BatchPosition | None:
        """The first batch whose last offset is >= ``offset`` (None when none is)."""
        self.ensure_indexes()
        stop = self.size if end is None else end
        return self._first_batch(
            self.offset_index.lookup(offset),
            stop,
            offset,
            lambda header: header.last_offset >= offset,
        )

    def find_by_timestamp(self, timestamp: int, start_offset: int) -> BatchPosition | None:
        """The first batch with max timestamp >= ``timestamp`` and last offset >=
        ``start_offset``."""
        self.ensure_indexes()
        from_offset = max(self.time_index.lookup(timestamp), start_offset)
        return self._first_batch(
            self.offset_index.lookup(from_offset),
            self.size,
            from_offset,
            lambda header: header.max_timestamp >= timestamp and header.last_offset >= start_offset,
        )

    def _first_batch(
        self, hint: int, stop: int, target: int, matches: Callable[[BatchHeader], bool]
    ) -> BatchPosition | None:
        """The first batch from the index's ``hint`` on that ``matches``.

        An index is derived data and a clean shutdown skips checking more than its last
        entry, so its answer is a hint only: a position outside the segment, one that
        does not start a batch, or one past the batch holding ``target`` makes the scan
        start again from the beginning of the segment.
        """
        if 0 < hint < stop:
            try:
                found = self._scan(hint, stop, target, matches)
            except CorruptSegmentError:
                found = _UNTRUSTED
            if not isinstance(found, _Untrusted):
                return found
            _log.warning(
                "index of segment %s points at a bad position %s; scanning from 0",
                self.log_path,
                hint,
            )
        found = self._scan(0, stop, -1, matches)
        return None if isinstance(found, _Untrusted) else found

    def _scan(
        self, start: int, stop: int, target: int, matches: Callable[[BatchHeader], bool]
    ) -> BatchPosition | _Untrusted | None:
        first = True
        for position, header in self.iter_headers(start, stop):
            if first and header.base_offset > target >= 0:
                return _UNTRUSTED  # the index overshoots the batch holding the target
            first = False
            if matches(header):
                return BatchPosition(position, header)
        return None

    def whole_batches_end(self, start: int, end: int) -> int:
        """The end of the last batch that lies wholly in ``[start, end)`` (``start``, a
        batch position, when none does).

        Headers are scanned from the last offset index entry in ``[start, end]`` rather
        than from ``start``, so a long range costs a few header reads. The entry is a
        hint: it is used only when a batch starts there whose last offset is the one the
        entry records; otherwise the scan starts at ``start``.
        """
        scan_from = self._indexed_batch_at_or_below(end, start)
        complete = scan_from
        for position, header in self.iter_headers(scan_from, self.size):
            if position + header.size > end:
                break
            complete = position + header.size
        return complete

    def _indexed_batch_at_or_below(self, position: int, low: int) -> int:
        """Position of the last offset index entry in ``[low, position]`` whose batch
        checks out, else ``low``."""
        self.ensure_indexes()
        index = self.offset_index
        first, last, found = 0, index.entry_count - 1, -1
        while first <= last:
            middle = (first + last) // 2
            if index.entry_at(middle)[1] <= position:
                found, first = middle, middle + 1
            else:
                last = middle - 1
        if found < 0:
            return low
        relative, hint = index.entry_at(found)
        if hint <= low or hint + HEADER_SIZE > self.size:
            return low
        try:
            header = self.header_at(hint)
        except CorruptSegmentError:
            return low
        if header.last_offset != self.base_offset + relative or hint + header.size > self.size:
            return low
        return hint

    def read_batch(self, position: int, size: int) -> bytes:
        return pread_exactly(self.fd, size, position)

    # -- writing ---------------------------------------------------------------------

    def append(
        self,
        data: bytes | bytearray | memoryview,
        batches: list[tuple[int, int, int, int]],
        next_offset: int,
    ) -> None:
        """Write ``data`` at the end with one pwrite and index its batches.

        ``batches`` holds ``(position in data, size, last offset, max timestamp)``.
        """
        position = self.size
        if position + len(data) > INT32_MAX:
            raise OverflowError("segment position would overflow int32")
        _pwrite_all(self.fd, data, position)
        if position == 0 and batches:
            self._rolling_timestamp = batches[0][3]
        self.size = position + len(data)
        self._timestamps_known = True
        self._track((position + rel, size, last, ts) for rel, size, last, ts in batches)
        self.next_offset = next_offset

    def append_batches(self, data: bytes | bytearray | memoryview) -> None:
        """Append batches that already carry their offsets (building a cleaned segment).

        Raises :class:`~tidelog.records.errors.RecordsError` for bytes that are not
        whole batches and ``ValueError`` for offsets that do not increase.
        """
        expected = self.base_offset if self.next_offset is None else self.next_offset
        batches: list[tuple[int, int, int, int]] = []
        for position, header in iter_batches(data, verify_crc=False):
            if header.base_offset < expected:
                raise ValueError(f"batch base offset {header.base_offset} is below {expected}")
            if header.last_offset - self.base_offset > INT32_MAX:
                raise ValueError(f"offset {header.last_offset} overflows the segment")
            batches.append((position, header.size, header.last_offset, header.max_timestamp))
            expected = header.next_offset
        self.append(data, batches, expected)

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset``; returns bytes removed.

        The segment must be the active one. Indexes follow; the end offset becomes the
        next offset of the last batch kept (the base offset when none is kept).
        """
        found = self.find_batch(offset)
        if found is None:
            return 0
        return self.truncate_to_position(found.position)

    def truncate_to_position(self, position: int) -> int:
        removed = self.size - position
        if removed <= 0:
            return 0
        os.ftruncate(self.fd, position)
        self.size = position
        self.ensure_indexes()
        self.offset_index.truncate_to_position(position)
        # Time entries refer to last offsets of batches; a batch kept has a last offset
        # below the first removed batch's base, which the scan below finds.
        last_kept: BatchHeader | None = None
        last = self.offset_index.last_entry()
        start = 0 if last is None else last[1]
        for _, header in self.iter_headers(start, position):
            last_kept = header
        next_offset = self.base_offset if last_kept is None else last_kept.next_offset
        self.time_index.truncate_to_offset(next_offset)
        self.txn_index.truncate_to(next_offset)
        self._recompute_after_truncation(next_offset)
        return removed

    def _recompute_after_truncation(self, next_offset: int) -> None:
        self._reset_tracking()
        last_time = self.time_index.last_entry()
        start = 0
        if last_time is not None:
            self._max_timestamp, self._offset_of_max_timestamp = last_time
            self._last_time_entry = last_time[0]
            found = self.find_batch(last_time[1])
            start = 0 if found is None else found.position
        last = self.offset_index.last_entry()
        index_position = 0 if last is None else last[1]
        for _, header in self.iter_headers(start, self.size):
            if header.max_timestamp > self._max_timestamp:
                self._max_timestamp = header.max_timestamp
                self._offset_of_max_timestamp = header.last_offset
        self._bytes_since_index_entry = self.size - index_position
        self.next_offset = next_offset

    # -- recovery --------------------------------------------------------------------

    def recover(self, max_batch_bytes: int | None = None) -> RecoveryProblem | None:
        """Check every batch (CRC, offsets) and rebuild the indexes from them.

        Stops at the first bad batch and truncates the file there. Returns what was
        dropped, or None when the whole segment was valid. ``next_offset`` and the
        timestamps are exact afterwards.
        """
        self.offset_index.load(writable=True)
        self.time_index.load(writable=True)
        self.offset_index.reset()
        self.time_index.reset()
        self._reset_tracking()
        file_size = os.fstat(self.fd).st_size
        expected = self.base_offset
        position = 0
        problem: str | None = None
        window = b""
        window_start = 0
        batches: list[tuple[int, int, int, int]] = []
        while position < file_size:
            offset = position - window_start
            try:
                try:
                    header = validate_batch(window, offset, max_size=max_batch_bytes)
                except TruncatedBatchError:
                    remaining = file_size - position
                    want = min(max(_RECOVERY_WINDOW, self._declared_size(position)), remaining)
                    window = pread_exactly(self.fd, want, position)
                    window_start = position
                    offset = 0
                    header = validate_batch(window, 0, max_size=max_batch_bytes)
            except RecordsError as exc:
                # The records error names a position inside the read window; the problem
                # carries the position in the file instead.
                problem = _WINDOW_POSITION.sub("", str(exc))
                break
            if header.base_offset < expected:
                problem = f"batch base offset {header.base_offset} is below the expected {expected}"
                break
            if header.last_offset - self.base_offset > INT32_MAX:
                problem = f"batch last offset {header.last_offset} overflows the segment"
                break
            batches.append((position, header.size, header.last_offset, header.max_timestamp))
            if len(batches) >= 4096:
                self._track(batches)
                batches = []
            if position == 0:
                self._rolling_timestamp = header.max_timestamp
            expected = header.next_offset
            position += header.size
        self._track(batches)
        self.next_offset = expected
        # Entries of markers a crash lost go; the producer state's replay re-adds any
        # entry whose marker survived but whose write did not.
        self.txn_index.truncate_to(expected)
        result: RecoveryProblem | None = None
        if position < file_size:
            result = RecoveryProblem(
                self.base_offset,
                position,
                file_size - position,
                problem or "truncated batch at the end of the segment",
            )
            os.ftruncate(self.fd, position)
        self.size = position
        if not self.active:
            self._append_final_time_entry()
            self.offset_index.close()
            self.time_index.close()
        return result

    def _declared_size(self, position: int) -> int:
        """The size the batch at ``position`` declares, 0 when unreadable (never trusted
        beyond the file's end: callers cap it)."""
        data = pread_exactly(self.fd, 12, position)
        if len(data) < 12:
            return 0
        return int.from_bytes(data[8:12], "big", signed=True) + 12


class HandleCache:
    """Caps the number of idle open segments; the least recently used are closed.

    Segments in use (pinned) are never closed; a segment's pin count goes up in
    :meth:`acquire` and down in :meth:`release`. Thread-safe; shared by every log of
    a :class:`~tidelog.storage.manager.LogManager`.
    """

    def __init__(self, max_idle_open: int = 128) -> None:
        self.max_idle_open = max_idle_open
        self._lock = threading.Lock()
        self._idle: collections.OrderedDict[int, Segment] = collections.OrderedDict()

    def acquire(self, segment: Segment) -> Segment:
        """Pin ``segment`` open; raises :class:`SegmentDeletedError` once it is retired."""
        with self._lock:
            if segment.retired:
                raise SegmentDeletedError(
                    f"segment {segment.base_offset} of {segment.directory} was deleted"
                )
            self._idle.pop(id(segment), None)
            segment.open_files()
            segment.pins += 1
        return segment

    def release(self, segment: Segment) -> None:
        with self._lock:
            segment.pins -= 1
            if segment.pins == 0 and segment.retired:
                segment.close_files()
            elif segment.pins == 0 and segment.is_open:
                self._idle[id(segment)] = segment
                while len(self._idle) > self.max_idle_open:
                    _, victim = self._idle.popitem(last=False)
                    victim.close_files()

    @contextlib.contextmanager
    def use(self, segment: Segment) -> Iterator[Segment]:
        self.acquire(segment)
        try:
            yield segment
        finally:
            self.release(segment)

    def retire(self, segment: Segment) -> None:
        """Close the segment for good (deleted, replaced, or its log closed).

        A segment still pinned by another user is closed when that user releases it.
        """
        with self._lock:
            segment.retired = True
            self._idle.pop(id(segment), None)
            if segment.pins == 0:
                segment.close_files()

    @property
    def idle_open(self) -> int:
        with self._lock:
            return len(self._idle)
