"""The log of one partition: an ordered list of segments in ``<topic>-<partition>/``.

Offsets. The log holds offsets ``[log_start_offset, log_end_offset)``. The segments'
base offsets strictly increase; the last segment is the active one, the only one
written. ``log_end_offset`` (LEO) is the next offset to assign. ``recovery_point``
is the offset below which everything has been fsynced; ``high_watermark`` is the
replication-committed offset (it follows the LEO until replication sets it).

Append. :meth:`Log.append` (leader) writes the next offsets and the leader epoch into
each batch header in place (both outside the CRC, so nothing is decoded or
recomputed, compressed or not) and writes the whole buffer with one ``pwrite``;
:meth:`Log.append_as_follower` keeps the batches' own offsets and refuses offsets
that go backwards. Index entries are added per batch. A durable append returns only
after an fsync that started after its write; concurrent durable appends share fsyncs
(group commit, :meth:`Log._sync_to`: a leader gathers the callers on their way before
it picks its target). On compacted topics the leader path also decodes records, to
refuse keyless ones (:class:`~tidelog.storage.errors.InvalidRecordError`), unless the
caller did (``keys_checked``, the broker's produce validation).

Durability. Segment files (data and indexes) are synced with ``fdatasync`` (it
persists a changed size, so an append or truncation needs no more), directories and
checkpoints with ``fsync``. The active segment's indexes are synced only by
:meth:`Log.flush` and :meth:`Log.close` (and when the segment is sealed): recovery
rebuilds them, so they need not be as durable as the data.

Roll. Before an append, a new active segment starts (at the append's first offset)
when the active one is non-empty and the append would take it past
``segment.bytes``, when ``segment.ms`` has passed since its first batch's timestamp
(or since it was created, when that batch has none), when an index is full, or when
the append's offsets would not fit as int32 relative offsets.

Read. :meth:`Log.read` returns a :class:`~tidelog.storage.segment.FileSlice` of one
segment, starting at the batch that holds the requested offset (a whole batch, even
when the offset lies inside it), up to ``max_bytes`` (Kafka may cut the last batch
short there; ``whole_batches=True`` trims to whole batches), never past the batch
holding ``max_offset``, and with ``min_one_batch`` at least the first batch whole.

Retention and truncation. Segments wholly below the log start offset are deleted,
then (with ``cleanup.policy`` delete) the oldest segments whose largest timestamp is
older than ``retention.ms`` and those beyond ``retention.bytes``, never the active
segment and never above the high watermark. :meth:`Log.delete_records` moves the
log start offset. :meth:`Log.truncate_to` removes every batch with data at or above
an offset; :meth:`Log.truncate_fully_and_start_at` empties the log.

Aborted transactions. Each segment has a ``.txnindex``
(:mod:`~tidelog.storage.txn_index`) that the partition fills through
:meth:`Log.append_aborted_txn` when it appends an ABORT marker; :meth:`Log.aborted_transactions`
answers read_committed fetches from it. The log keeps it with its segment (truncation
drops entries of removed markers, deletion and retention remove the file, the cleaner
carries the entries into the cleaned segment) but never writes entries itself: only the
producer state knows where an aborted transaction started.

Crash safety. Segment files are only appended to (or truncated); files leave the
log by being renamed ``.deleted`` first; replaced segments come in as ``.swap``
files. Recovery (:meth:`Log.open` without a clean shutdown) re-checks every batch
from the segment holding the recovery point on, truncates at the first bad one and
drops every later segment, so the log is always a prefix of what was appended.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

from tidelog.records.batch import (
    BatchHeader,
    iter_batches,
    set_base_offset,
    set_max_timestamp_log_append_time,
    set_partition_leader_epoch,
)
from tidelog.records.errors import RecordsError
from tidelog.records.reader import iter_records
from tidelog.storage.checkpoint import FsyncFn, fsync_dir, write_durably
from tidelog.storage.config import LogConfig
from tidelog.storage.epoch import (
    LEADER_EPOCH_CHECKPOINT,
    UNDEFINED_EPOCH,
    LeaderEpochCache,
)
from tidelog.storage.errors import (
    InvalidAppendError,
    InvalidRecordError,
    LogClosedError,
    LogDirOfflineError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
    UnexpectedAppendOffsetError,
    is_disk_failure,
)
from tidelog.storage.index import INT32_MAX
from tidelog.storage.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    FileSlice,
    HandleCache,
    RecoveryProblem,
    Segment,
    parse_segment_name,
)
from tidelog.storage.txn_index import AbortedTxn, TxnIndex, decode_entries

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
PARTITION_METADATA = "partition.metadata"

_log = logging.getLogger(__name__)

Clock = Callable[[], int]

# The longest a group commit leader waits for durable appends still writing, and for
# callers it only expects (from the size of the last round), before it fsyncs.
_GATHER_WRITES_MAX_SECONDS = 0.002
_GATHER_MAX_SECONDS = 0.0005


class InvalidTimestampError(StorageError):
    """A ListOffsets target timestamp below -4 (no such special value)."""


@dataclass(frozen=True)
class AppendInfo:
    """What one append wrote."""

    first_offset: int
    last_offset: int
    #: Largest batch max timestamp of the append (-1 when no batch carries one).
    max_timestamp: int
    #: Last offset of the first batch holding ``max_timestamp`` (-1 when none).
    offset_of_max_timestamp: int
    #: The broker time written into the batches for LogAppendTime topics, else -1.
    log_append_time: int
    log_start_offset: int
    batch_count: int
    record_count: int
    #: Bytes written.
    size: int


class TimestampOffset(NamedTuple):
    """A ListOffsets answer: offset, the timestamp found there and its leader epoch."""

    offset: int
    timestamp: int
    leader_epoch: int


@dataclass
class RecoveryReport:
    """What opening the log found and did."""

    clean_shutdown: bool
    #: Data dropped: (segment base offset, position, bytes, reason).
    problems: list[RecoveryProblem] = field(default_factory=list)
    #: Segments whose indexes were rebuilt: (base offset, reason).
    rebuilt_indexes: list[tuple[int, str]] = field(default_factory=list)
    #: Leftover files removed (``.cleaned``, ``.deleted``, ``.tmp``, orphan indexes).
    removed_files: list[str] = field(default_factory=list)
    #: ``.swap`` segments put in place of the segments they replace.
    completed_swaps: list[int] = field(default_factory=list)
    #: Segments scanned batch by batch.
    recovered_segments: list[int] = field(default_factory=list)

    @property
    def bytes_dropped(self) -> int:
        return sum(problem.bytes_dropped for problem in self.problems)


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _reports_io_errors(method: _Method) -> _Method:
    """An ``OSError`` inside ``method`` (a write, fsync, roll, truncation, index or
    checkpoint write, or a read) is reported to the log's :attr:`Log.on_io_error` and
    raised as :class:`LogDirOfflineError`: after a failed write or fsync the page cache
    may already have dropped data, so nothing on that directory can be trusted. A log
    without ``on_io_error`` (no owner to take its directory offline), and an error that is
    not the disk's (:func:`~tidelog.storage.errors.is_disk_failure`), raise the
    ``OSError`` itself."""

    @functools.wraps(method)
    def guarded(self: Log, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except OSError as exc:
            if self.on_io_error is None or not is_disk_failure(exc):
                raise
            raise self.report_io_error(exc) from exc

    return cast(_Method, guarded)


class Log:
    """One partition's log. Thread-safe; see the module docstring for the rules.

    Create with :meth:`Log.open`. ``clock`` returns milliseconds and is the only source
    of time for the log's decisions (group commit also measures how long its fsyncs
    take, with ``time.perf_counter``, only to bound how long it gathers callers).
    ``fsync`` is called for every fsync of a directory or checkpoint, ``datasync`` for
    every sync of a segment's files (data and indexes), so tests can count or fail
    them. ``on_checkpoint`` is called (without
    the log's lock) after the log start offset or the recovery point moved in a way
    that must reach the directory checkpoints at once (DeleteRecords, truncation).
    """

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        *,
        topic: str,
        partition: int,
        clock: Clock,
        fsync: FsyncFn,
        datasync: FsyncFn,
        handle_cache: HandleCache,
        on_checkpoint: Callable[[], None] | None,
    ) -> None:
        self.directory = directory
        self.topic = topic
        self.partition = partition
        self._config = config
        self._clock = clock
        self._fsync = fsync
        self._datasync = datasync
        self._cache = handle_cache
        self.on_checkpoint = on_checkpoint
        #: Called (without the log's lock) with the new log end offset after a
        #: truncation, so the cleaner can lower its first dirty offset.
        self.on_truncate: Callable[[int], None] | None = None
        #: The partition's last stable offset, set by the partition that owns the log:
        #: retention never deletes, and the cleaner never cleans, at or above it (an open
        #: transaction's batches stay as they are). Without it the high watermark bounds
        #: both. Called possibly off the event loop, and under the log's lock.
        self.stable_offset: Callable[[], int] | None = None
        #: Called with the seconds each group-commit fsync round took (from whichever
        #: thread ran it), so the broker can export a flush-time histogram without the
        #: storage layer knowing about metrics.
        self.on_sync: Callable[[float], None] | None = None
        #: Called with the ``OSError`` of any I/O of the log (from whichever thread hit
        #: it), by the log manager, which takes the log's directory offline and then
        #: abandons the log (:meth:`abandon`).
        self.on_io_error: Callable[[OSError], object] | None = None
        #: The I/O error that took this log's directory offline (None while it is fine).
        self.offline_cause: OSError | None = None
        self._lock = threading.RLock()
        # Group commit state (see :meth:`sync`), guarded by ``_sync_mutex``: whether a
        # leader is syncing, the offsets each caller inside sync() waits for, durable
        # appends between their start and their sync() call, how many callers the last
        # round saw, and how long its fsyncs took.
        self._sync_mutex = threading.Lock()
        self._round_done = threading.Condition(self._sync_mutex)
        self._caller_arrived = threading.Condition(self._sync_mutex)
        self._sync_leader = False
        self._sync_needs: list[int] = []
        self._durable_writes = 0
        self._expected_callers = 1
        self._last_sync_seconds = 0.0
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._log_start_offset = 0
        self._log_end_offset = 0
        self._recovery_point = 0
        self._high_watermark: int | None = None
        self._dir_dirty = False
        self._last_flush_ms = clock()
        self._truncations = 0
        #: The largest ABORT marker offset indexed (None: not computed since open or a
        #: truncation). Too high is safe: it only bounds how far a lookup walks.
        self._last_abort_marker: int | None = None
        self._closed = False
        self.recovery_report = RecoveryReport(clean_shutdown=True)
        self.epoch_cache = LeaderEpochCache(directory / LEADER_EPOCH_CHECKPOINT, fsync)

    # -- opening -----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path | str,
        config: LogConfig | None = None,
        *,
        topic: str,
        partition: int,
        clock: Clock,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        clean_shutdown: bool = False,
        fsync: FsyncFn = os.fsync,
        datasync: FsyncFn | None = None,
        handle_cache: HandleCache | None = None,
        topic_id: str | None = None,
        on_checkpoint: Callable[[], None] | None = None,
    ) -> Log:
        """Open (creating when absent) the log in ``directory`` and recover it.

        Without ``clean_shutdown`` every batch from the segment holding
        ``recovery_point`` on is checked; see :attr:`recovery_report` for the outcome.

        ``datasync`` syncs segment files. By default it is ``os.fdatasync`` when
        ``fsync`` is ``os.fsync`` (Linux's fdatasync also persists a changed file size,
        all an append or a truncation needs; only timestamps are left out), and
        ``fsync`` itself otherwise, so an injected fsync sees every sync.
        """
        path = Path(directory)
        created = not path.exists()
        path.mkdir(parents=True, exist_ok=True)
        if created:
            fsync_dir(path.parent, fsync)
        log = cls(
            path,
            config or LogConfig(),
            topic=topic,
            partition=partition,
            clock=clock,
            fsync=fsync,
            datasync=datasync or (os.fdatasync if fsync is os.fsync else fsync),
            handle_cache=handle_cache or HandleCache(),
            on_checkpoint=on_checkpoint,
        )
        log._load(recovery_point, log_start_offset, clean_shutdown)
        if topic_id is not None:
            log._write_partition_metadata(topic_id)
        return log

    def _load(self, recovery_point: int, log_start_offset: int, clean: bool) -> None:
        report = RecoveryReport(clean_shutdown=clean)
        self.recovery_report = report
        self._remove_leftovers(report)
        self._complete_swaps(report)
        bases = sorted(self._segment_bases_on_disk(report))
        now = self._clock()
        for base in bases:
            self._add_segment(self._new_segment(base, now))
        if not self._segments:
            self._add_segment(self._create_segment(max(log_start_offset, 0)))
        if not clean:
            self._recover(recovery_point, report)
        active = self._segments[-1]
        self._cache.acquire(active)
        active.activate()
        self._log_end_offset = active.next_offset if active.next_offset is not None else 0
        start = max(log_start_offset, self._segments[0].base_offset)
        self._log_start_offset = min(start, self._log_end_offset)
        self._recovery_point = max(min(recovery_point, self._log_end_offset), 0)
        if clean:
            self._recovery_point = self._log_end_offset
        self.epoch_cache.truncate_from_end(self._log_end_offset)
        self.epoch_cache.truncate_from_start(self._log_start_offset)
        for problem in report.problems:
            _log.warning(
                "%s-%s: recovery dropped %d bytes of segment %d at position %d: %s",
                self.topic,
                self.partition,
                problem.bytes_dropped,
                problem.segment,
                problem.position,
                problem.reason,
            )

    def _remove_leftovers(self, report: RecoveryReport) -> None:
        for entry in sorted(os.listdir(self.directory)):
            if entry.endswith((DELETED_SUFFIX, CLEANED_SUFFIX, ".tmp")):
                (self.directory / entry).unlink(missing_ok=True)
                report.removed_files.append(entry)
                self._dir_dirty = True

    def _complete_swaps(self, report: RecoveryReport) -> None:
        """Finish a segment replacement that a crash interrupted.

        A ``.swap`` log file is complete (it was fsynced before being renamed to
        ``.swap``): the segments it replaces are those whose base offsets fall inside
        its offset range; they are removed and the swap takes the final name. Index
        files of a swap are dropped and rebuilt.
        """
        swaps: list[int] = []
        txn_swaps: list[str] = []
        for entry in sorted(os.listdir(self.directory)):
            if entry.endswith(SWAP_SUFFIX):
                stem_and_kind = entry[: -len(SWAP_SUFFIX)]
                if stem_and_kind.endswith(LOG_SUFFIX):
                    base = parse_segment_name(stem_and_kind[: -len(LOG_SUFFIX)])
                    if base is not None:
                        swaps.append(base)
                        continue
                if stem_and_kind.endswith(TXN_INDEX_SUFFIX):
                    # Kept until its swap is completed: it cannot be rebuilt.
                    txn_swaps.append(entry)
                    continue
                (self.directory / entry).unlink(missing_ok=True)
                report.removed_files.append(entry)
        now = self._clock()
        for base in swaps:
            swap = Segment(
                self.directory,
                base,
                index_interval_bytes=self._config.index_interval_bytes,
                max_index_bytes=self._config.segment_index_bytes,
                created_ms=now,
                suffix=SWAP_SUFFIX,
            )
            with self._cache.use(swap):
                next_offset = base
                try:
                    for _, header in swap.iter_headers(0, swap.size):
                        next_offset = header.next_offset
                except StorageError as exc:
                    _log.warning("swap segment %s has a bad batch: %s", swap.log_path, exc)
            self._cache.retire(swap)
            aborted = self._swap_txn_entries(base)
            for old_base in self._segment_bases_on_disk(report):
                if base <= old_base < max(next_offset, base + 1):
                    stem = f"{old_base:020d}"
                    for kind in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                        (self.directory / (stem + kind)).unlink(missing_ok=True)
            for kind in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                (self.directory / (f"{base:020d}" + kind + SWAP_SUFFIX)).unlink(missing_ok=True)
            if aborted:
                TxnIndex(self.directory / (f"{base:020d}" + TXN_INDEX_SUFFIX)).write_entries(
                    aborted
                )
            (self.directory / (f"{base:020d}" + TXN_INDEX_SUFFIX + SWAP_SUFFIX)).unlink(
                missing_ok=True
            )
            os.replace(swap.log_path, self.directory / (f"{base:020d}" + LOG_SUFFIX))
            report.completed_swaps.append(base)
            self._dir_dirty = True
        done = {f"{base:020d}{TXN_INDEX_SUFFIX}{SWAP_SUFFIX}" for base in swaps}
        for entry in txn_swaps:
            if entry not in done:
                # The crash came before its log file was complete: the old segments stay.
                (self.directory / entry).unlink(missing_ok=True)
                report.removed_files.append(entry)

    def _swap_txn_entries(self, base: int) -> list[AbortedTxn]:
        """The aborted transactions of the swap segment at ``base``: its ``.txnindex.swap``,
        or, once the swap's indexes already took their final names (the ``.log`` file is
        renamed last), the final ``.txnindex`` at ``base``, which is then the new one."""
        stem = f"{base:020d}{TXN_INDEX_SUFFIX}"
        for path in (self.directory / (stem + SWAP_SUFFIX), self.directory / stem):
            try:
                return decode_entries(path.read_bytes())
            except FileNotFoundError:
                continue
        return []

    def _segment_bases_on_disk(self, report: RecoveryReport) -> list[int]:
        bases: list[int] = []
        names = set(os.listdir(self.directory))
        for entry in names:
            if entry.endswith(LOG_SUFFIX):
                base = parse_segment_name(entry[: -len(LOG_SUFFIX)])
                if base is not None:
                    bases.append(base)
        for entry in names:
            for kind in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                if entry.endswith(kind):
                    stem = entry[: -len(kind)]
                    if parse_segment_name(stem) is not None and stem + LOG_SUFFIX not in names:
                        (self.directory / entry).unlink(missing_ok=True)
                        report.removed_files.append(entry)
        return bases

    def _recover(self, recovery_point: int, report: RecoveryReport) -> None:
        first = max(bisect.bisect_right(self._bases, recovery_point) - 1, 0)
        for segment in self._segments[:first]:
            with self._cache.use(segment):
                problem = segment.index_problem(full=True)
                if problem is not None:
                    report.rebuilt_indexes.append((segment.base_offset, problem))
                    _log.warning(
                        "%s-%s: rebuilding indexes of segment %d: %s",
                        self.topic,
                        self.partition,
                        segment.base_offset,
                        problem,
                    )
                    segment.rebuild_indexes()
        expected: int | None = None
        if first > 0:
            previous = self._segments[first - 1]
            found: BatchHeader | None = None
            with self._cache.use(previous):
                try:
                    previous.ensure_indexes()
                    last = previous.offset_index.last_entry()
                    for _, header in previous.iter_headers(
                        0 if last is None else last[1], previous.size
                    ):
                        found = header
                except StorageError:
                    found = None
            expected = previous.base_offset if found is None else found.next_offset
        index = first
        while index < len(self._segments):
            segment = self._segments[index]
            if expected is not None and segment.base_offset < expected:
                self._drop_segments_from(
                    index,
                    report,
                    f"segment base offset {segment.base_offset} is below the previous "
                    f"segment's end {expected}",
                )
                break
            report.recovered_segments.append(segment.base_offset)
            with self._cache.use(segment):
                dropped = segment.recover()
                if dropped is not None:
                    segment.fsync(self._datasync, indexes=False)
            expected = segment.next_offset
            index += 1
            if dropped is not None:
                report.problems.append(dropped)
                self._drop_segments_from(
                    index, report, f"follows a corrupt batch in segment {segment.base_offset}"
                )
                break
        if self._dir_dirty:
            fsync_dir(self.directory, self._fsync)
            self._dir_dirty = False

    def _drop_segments_from(self, index: int, report: RecoveryReport, reason: str) -> None:
        if index == 0:
            # Never leave a log without a segment: keep the first one, emptied.
            segment = self._segments[0]
            with self._cache.use(segment):
                dropped = segment.truncate_to_position(0)
            report.problems.append(RecoveryProblem(segment.base_offset, 0, dropped, reason))
            index = 1
        for segment in self._segments[index:]:
            report.problems.append(RecoveryProblem(segment.base_offset, 0, segment.size, reason))
            self._delete_segment_files(segment)
        del self._segments[index:]
        del self._bases[index:]

    def _write_partition_metadata(self, topic_id: str) -> None:
        path = self.directory / PARTITION_METADATA
        text = f"version: 0\ntopic_id: {topic_id}\n".encode()
        with contextlib.suppress(FileNotFoundError):
            if path.read_bytes() == text:
                return
        write_durably(path, text, self._fsync)

    @property
    def topic_id(self) -> str | None:
        """The topic id recorded in ``partition.metadata``, if any."""
        try:
            text = (self.directory / PARTITION_METADATA).read_text("utf-8", errors="replace")
        except FileNotFoundError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "topic_id":
                return value.strip() or None
        return None

    # -- segments ---------------------------------------------------------------------

    def _new_segment(self, base: int, created_ms: int, suffix: str = "") -> Segment:
        return Segment(
            self.directory,
            base,
            index_interval_bytes=self._config.index_interval_bytes,
            max_index_bytes=self._config.segment_index_bytes,
            created_ms=created_ms,
            suffix=suffix,
        )

    def _create_segment(self, base: int, suffix: str = "") -> Segment:
        """A new empty segment on disk (leftover files of that name are discarded)."""
        segment = self._new_segment(base, self._clock(), suffix)
        for path in segment.paths:
            path.unlink(missing_ok=True)
        segment.size = 0
        os.close(os.open(segment.log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        self._dir_dirty = True
        return segment

    def _add_segment(self, segment: Segment) -> None:
        index = bisect.bisect_left(self._bases, segment.base_offset)
        self._segments.insert(index, segment)
        self._bases.insert(index, segment.base_offset)

    def _delete_segment_files(self, segment: Segment) -> None:
        """Rename the files ``.deleted`` (the crash-safe step), then unlink them.

        Readers holding a :class:`FileSlice` keep their own descriptor, so the unlink
        does not need Kafka's ``file.delete.delay.ms`` wait.
        """
        self._cache.retire(segment)
        segment.rename_suffix(DELETED_SUFFIX)
        segment.delete_files()
        self._dir_dirty = True

    @property
    def segments(self) -> list[Segment]:
        """The segments, oldest first (a copy of the list; the last one is active)."""
        with self._lock:
            return list(self._segments)

    @property
    def active_segment(self) -> Segment:
        return self._segments[-1]

    @property
    def handle_cache(self) -> HandleCache:
        return self._cache

    @property
    def clock(self) -> Clock:
        """The time source the log was opened with (milliseconds), for callers that keep
        state beside the log and need the same time (the broker's producer state)."""
        return self._clock

    @property
    def config(self) -> LogConfig:
        return self._config

    def update_config(self, config: LogConfig) -> None:
        """New settings apply to new segments and to the next roll/retention decisions."""
        with self._lock:
            self._config = config

    # -- offsets -----------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log_end_offset

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def high_watermark(self) -> int:
        hw = self._high_watermark
        return self._log_end_offset if hw is None else hw

    def update_high_watermark(self, offset: int) -> int:
        """Set the high watermark (clamped to [log start, LEO]); it stops following LEO."""
        with self._lock:
            self._high_watermark = min(max(offset, self._log_start_offset), self._log_end_offset)
            return self._high_watermark

    @property
    def size_in_bytes(self) -> int:
        with self._lock:
            return sum(segment.size for segment in self._segments)

    @property
    def latest_epoch(self) -> int:
        return self.epoch_cache.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: ``(epoch, end offset)``; see :class:`LeaderEpochCache`."""
        with self._lock:
            return self.epoch_cache.end_offset_for(epoch, self._log_end_offset)

    def _check_open(self) -> None:
        if self.offline_cause is not None:
            raise LogDirOfflineError(self.directory.parent, self.offline_cause)
        if self._closed:
            raise LogClosedError(f"log {self.topic}-{self.partition} is closed")

    # -- append ------------------------------------------------------------------------

    @staticmethod
    def _writable_buffer(batches: bytes | bytearray | memoryview) -> bytearray | memoryview:
        if isinstance(batches, bytearray):
            return batches
        if isinstance(batches, memoryview) and not batches.readonly:
            return batches
        return bytearray(batches)

    def _parse(self, buf: bytes | bytearray | memoryview) -> list[tuple[int, BatchHeader]]:
        try:
            headers = list(iter_batches(buf, verify_crc=False))
        except RecordsError as exc:
            raise InvalidAppendError(f"append is not a sequence of whole batches: {exc}") from exc
        if not headers:
            raise InvalidAppendError("append holds no batch")
        limit = self._config.max_message_bytes
        for _, header in headers:
            if header.size > limit:
                raise RecordTooLargeError(
                    f"batch of {header.size} bytes exceeds max.message.bytes ({limit})"
                )
        if len(buf) > INT32_MAX:
            raise RecordTooLargeError(f"append of {len(buf)} bytes does not fit a segment")
        return headers

    @_reports_io_errors
    def append(
        self,
        batches: bytes | bytearray | memoryview,
        *,
        leader_epoch: int = UNDEFINED_EPOCH,
        durable: bool = False,
        keys_checked: bool = False,
    ) -> AppendInfo:
        """Append already validated batches as the leader, assigning offsets.

        Writes the base offset and ``leader_epoch`` into each batch header in place (in
        ``batches`` itself when it is a bytearray or writable memoryview), and for
        LogAppendTime topics the broker time as max timestamp. With ``durable`` it
        returns once the batches are fsynced (sharing the fsync with concurrent callers).

        On a compacted topic the records are decoded to refuse keyless ones, unless
        ``keys_checked`` says the caller did that already (the broker's produce
        validation does, reporting each keyless record), so no record is decoded twice.
        """
        if durable:
            self._start_durable_write()
        try:
            info = self._append_leader(batches, leader_epoch, keys_checked)
        except BaseException:
            if durable:
                self._abandon_durable_write()
            raise
        self._after_append(info, durable)
        return info

    def _append_leader(
        self, batches: bytes | bytearray | memoryview, leader_epoch: int, keys_checked: bool
    ) -> AppendInfo:
        buf = self._writable_buffer(batches)
        headers = self._parse(buf)
        if self._config.compact and not keys_checked:
            self._check_keys(buf, headers)
        with self._lock:
            self._check_open()
            append_time = self._clock() if self._config.log_append_time else -1
            first = self._log_end_offset
            next_offset = first
            entries: list[tuple[int, int, int, int]] = []
            records = 0
            for position, header in headers:
                set_base_offset(buf, position, next_offset)
                set_partition_leader_epoch(buf, position, leader_epoch)
                max_ts = header.max_timestamp
                if append_time >= 0:
                    set_max_timestamp_log_append_time(buf, position, header.size, append_time)
                    max_ts = append_time
                last = next_offset + header.last_offset_delta
                entries.append((position, header.size, last, max_ts))
                records += header.record_count
                next_offset = last + 1
            epochs = [(leader_epoch, first)] if leader_epoch >= 0 else []
            info = self._append_locked(buf, entries, first, next_offset, epochs, records)
            info = AppendInfo(
                info.first_offset,
                info.last_offset,
                info.max_timestamp,
                info.offset_of_max_timestamp,
                append_time,
                info.log_start_offset,
                info.batch_count,
                info.record_count,
                info.size,
            )
        return info

    @staticmethod
    def _check_keys(
        buf: bytes | bytearray | memoryview, headers: list[tuple[int, BatchHeader]]
    ) -> None:
        """Refuse records without a key (compacted topics only).

        The one place the produce path decodes records, as Kafka does: compaction keeps
        one record per key, so a keyless record could never be compacted.
        """
        for position, header in headers:
            if header.is_control:
                continue
            try:
                for record in iter_records(buf, position, header=header):
                    if record.key is None:
                        raise InvalidRecordError(
                            "compacted topic requires a key for every record (record at "
                            f"offset delta {record.offset - header.base_offset} has none)"
                        )
            except RecordsError as exc:
                raise InvalidRecordError(f"records of a batch cannot be decoded: {exc}") from exc

    @_reports_io_errors
    def append_as_follower(
        self, batches: bytes | bytearray | memoryview, *, durable: bool = False
    ) -> AppendInfo:
        """Append batches keeping their offsets and leader epochs (replication).

        The first batch must start at or after the log end offset and offsets must rise
        from batch to batch (gaps are allowed: compacted leaders have them).
        """
        if durable:
            self._start_durable_write()
        try:
            info = self._append_follower(batches)
        except BaseException:
            if durable:
                self._abandon_durable_write()
            raise
        self._after_append(info, durable)
        return info

    def _append_follower(self, batches: bytes | bytearray | memoryview) -> AppendInfo:
        buf = batches
        headers = self._parse(buf)
        with self._lock:
            self._check_open()
            expected = self._log_end_offset
            first = headers[0][1].base_offset
            entries: list[tuple[int, int, int, int]] = []
            epochs: list[tuple[int, int]] = []
            latest = self.epoch_cache.latest_epoch
            records = 0
            for position, header in headers:
                if header.base_offset < expected:
                    raise UnexpectedAppendOffsetError(
                        f"batch base offset {header.base_offset} is below the expected "
                        f"next offset {expected}"
                    )
                if header.partition_leader_epoch > latest:
                    epochs.append((header.partition_leader_epoch, header.base_offset))
                    latest = header.partition_leader_epoch
                entries.append((position, header.size, header.last_offset, header.max_timestamp))
                records += header.record_count
                expected = header.next_offset
            return self._append_locked(buf, entries, first, expected, epochs, records)

    def _append_locked(
        self,
        data: bytes | bytearray | memoryview,
        entries: list[tuple[int, int, int, int]],
        first_offset: int,
        next_offset: int,
        epochs: list[tuple[int, int]],
        records: int,
    ) -> AppendInfo:
        max_ts = -1
        offset_of_max = -1
        for _, _, last, ts in entries:
            if ts > max_ts:
                max_ts, offset_of_max = ts, last
        self._maybe_roll(len(data), max_ts, first_offset, next_offset - 1)
        segment = self._segments[-1]
        segment.append(data, entries, next_offset)
        for epoch, start in epochs:
            self.epoch_cache.assign(epoch, start)
        self._log_end_offset = next_offset
        return AppendInfo(
            first_offset,
            next_offset - 1,
            max_ts,
            offset_of_max,
            -1,
            self._log_start_offset,
            len(entries),
            records,
            len(data),
        )

    def _after_append(self, info: AppendInfo, durable: bool) -> None:
        if durable:
            self._sync_to(info.last_offset + 1, from_write=True)
        elif self._log_end_offset - self._recovery_point >= self._config.flush_messages:
            self.sync()

    # -- roll --------------------------------------------------------------------------

    def _maybe_roll(self, size: int, max_ts: int, first_offset: int, last_offset: int) -> None:
        segment = self._segments[-1]
        config = self._config
        reason: str | None = None
        if last_offset - segment.base_offset > INT32_MAX or first_offset < segment.base_offset:
            reason = "offsets overflow the segment"
        elif segment.size > 0:
            if segment.size > config.segment_bytes - size:
                reason = "segment.bytes"
            elif segment.index_full:
                reason = "index full"
            else:
                rolling = segment.rolling_timestamp()
                waited = (
                    max_ts - rolling
                    if rolling >= 0 and max_ts >= 0
                    else self._clock() - segment.created_ms
                )
                if waited > config.segment_ms - config.segment_jitter_ms:
                    reason = "segment.ms"
        if reason is not None:
            _log.debug(
                "%s-%s: rolling at %d (%s)", self.topic, self.partition, first_offset, reason
            )
            self._roll_locked(first_offset)

    @_reports_io_errors
    def roll(self) -> Segment:
        """Start a new active segment at the log end offset (no-op when the active one is
        empty); returns the active segment."""
        with self._lock:
            self._check_open()
            self._roll_locked(self._log_end_offset)
            return self._segments[-1]

    def _roll_locked(self, base: int) -> None:
        old = self._segments[-1]
        if old.size == 0:
            if old.base_offset == base:
                return
            # An empty active segment is replaced rather than left behind.
            self._cache.release(old)
            self._delete_segment_files(old)
            self._segments.pop()
            self._bases.pop()
        else:
            if old.next_offset is not None and base < old.next_offset:
                raise InvalidAppendError(f"cannot roll at {base}, below {old.next_offset}")
            old.seal()
            self._make_sealed_durable()
            self._cache.release(old)
        segment = self._create_segment(base)
        self._cache.acquire(segment)
        segment.activate()
        self._add_segment(segment)

    # -- durability --------------------------------------------------------------------

    def _make_sealed_durable(self) -> None:
        """fsync every unflushed segment (the last one just sealed) and the directory.

        Called on roll, before the next segment receives data: every sealed segment is
        then durable, so a crash can only damage the active segment and recovery always
        keeps a prefix of the log, even when the OS wrote later data before earlier data.
        """
        first = max(bisect.bisect_right(self._bases, self._recovery_point) - 1, 0)
        for segment in self._segments[first:]:
            with self._cache.use(segment):
                segment.fsync(self._datasync, indexes=True)
        if self._dir_dirty:
            fsync_dir(self.directory, self._fsync)
            self._dir_dirty = False
        end = self._segments[-1].next_offset
        if end is not None:
            self._recovery_point = max(self._recovery_point, end)

    @_reports_io_errors
    def sync(self, end_offset: int | None = None) -> bool:
        """Make everything below ``end_offset`` (default: the LEO) durable.

        Group commit: a caller whose offsets were covered by an fsync that started after
        its write returns without fsyncing. Returns True when this call fsynced.
        """
        needed = self._log_end_offset if end_offset is None else end_offset
        return self._sync_to(needed, from_write=False)

    def _sync_to(self, needed: int, from_write: bool) -> bool:
        """One caller of group commit; ``from_write`` when it ends a durable append.

        Callers wait (on ``_round_done``) while a leader syncs; one not covered by the
        round becomes the next leader. Before choosing its target (the LEO), a leader
        gathers callers: it waits while durable appends are still writing or fewer
        callers are waiting than the last round had (a closed loop of writers comes back
        as soon as its fsync returns), at most ``_GATHER_MAX_SECONDS`` and never longer
        than the last round's fsyncs took (another fsync would cost no more). Without
        the wait a leader takes the LEO right after the previous fsync, before the
        writers it released append again, and rounds alternate between halves.
        """
        if not from_write and self._recovery_point >= needed:
            return False
        with self._sync_mutex:
            if from_write:
                self._durable_writes -= 1
            if self._recovery_point >= needed:
                self._caller_arrived.notify()
                return False
            self._sync_needs.append(needed)
            self._caller_arrived.notify()
            try:
                while self._sync_leader and self._recovery_point < needed:
                    self._round_done.wait()
                if self._recovery_point >= needed:
                    self._sync_needs.remove(needed)
                    return False
                self._sync_leader = True
                self._gather_callers()
            except BaseException:
                self._sync_needs.remove(needed)
                raise
        try:
            return self._sync_locked(indexes_of_active=False)
        finally:
            with self._sync_mutex:
                self._expected_callers = len(self._sync_needs)
                self._sync_needs.remove(needed)
                self._sync_leader = False
                self._round_done.notify_all()

    def _gather_callers(self) -> None:
        """Wait (holding ``_sync_mutex``) for the callers of this round to arrive.

        A durable append already writing will call in within moments: it is waited for
        up to ``_GATHER_WRITES_MAX_SECONDS``. Callers only expected (the last round had
        more) are waited for up to ``_GATHER_MAX_SECONDS``. Neither wait outlasts the
        last round's fsyncs: past that, another fsync round costs less.
        """
        last = self._last_sync_seconds
        if last <= 0:
            return
        start = time.perf_counter()
        writes_deadline = start + min(_GATHER_WRITES_MAX_SECONDS, last)
        callers_deadline = start + min(_GATHER_MAX_SECONDS, last)
        while True:
            writing = self._durable_writes
            waiting = sum(1 for need in self._sync_needs if need > self._recovery_point)
            if writing > 0:
                deadline = writes_deadline
            elif waiting < self._expected_callers:
                deadline = callers_deadline
            else:
                return
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._caller_arrived.wait(remaining)

    def _start_durable_write(self) -> None:
        with self._sync_mutex:
            self._durable_writes += 1

    def _abandon_durable_write(self) -> None:
        with self._sync_mutex:
            self._durable_writes -= 1
            self._caller_arrived.notify()

    @contextlib.contextmanager
    def _sync_leadership(self) -> Iterator[None]:
        """Be the only one syncing (flush, close), without gathering callers."""
        with self._sync_mutex:
            while self._sync_leader:
                self._round_done.wait()
            self._sync_leader = True
        try:
            yield
        finally:
            with self._sync_mutex:
                self._sync_leader = False
                self._round_done.notify_all()

    def _sync_locked(self, indexes_of_active: bool, force: bool = False) -> bool:
        """fsync from the segment holding the recovery point to the LEO (the caller is the
        sync leader). Sealed segments below the recovery point are durable already (roll
        made them so) and are skipped; the active segment's indexes only with
        ``indexes_of_active`` (recovery rebuilds them, so data durability never waits
        for them)."""
        fds: list[int] = []
        index_paths: list[Path] = []
        with self._lock:
            if self.offline_cause is not None:
                # Not "nothing to sync": what the caller wrote may never reach the disk.
                raise LogDirOfflineError(self.directory.parent, self.offline_cause)
            if self._closed and not force:
                return False
            target = self._log_end_offset
            truncations = self._truncations
            first = max(bisect.bisect_right(self._bases, self._recovery_point) - 1, 0)
            for segment in self._segments[first:]:
                with self._cache.use(segment):
                    fds.append(segment.dup_fd())
                if not segment.active or indexes_of_active:
                    index_paths.extend(segment.paths[1:])
            dir_dirty = self._dir_dirty
            self._dir_dirty = False
        started = time.perf_counter()
        try:
            for fd in fds:
                self._datasync(fd)
            for path in index_paths:
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    continue
                try:
                    self._datasync(fd)
                finally:
                    os.close(fd)
            if dir_dirty:
                fsync_dir(self.directory, self._fsync)
        except BaseException:
            with self._lock:
                self._dir_dirty = self._dir_dirty or dir_dirty
            raise
        finally:
            for fd in fds:
                os.close(fd)
        self._last_sync_seconds = time.perf_counter() - started
        if self.on_sync is not None:
            self.on_sync(self._last_sync_seconds)
        with self._lock:
            if self._truncations == truncations:
                self._recovery_point = max(self._recovery_point, min(target, self._log_end_offset))
            self._last_flush_ms = self._clock()
        return True

    @_reports_io_errors
    def flush(self) -> None:
        """fsync every unflushed file, indexes of the active segment included."""
        with self._sync_leadership():
            self._sync_locked(indexes_of_active=True)

    @_reports_io_errors
    def maybe_flush(self, now_ms: int) -> bool:
        """Apply ``flush.messages`` / ``flush.ms``; the broker calls this on a schedule."""
        unflushed = self._log_end_offset - self._recovery_point
        if unflushed <= 0:
            return False
        if (
            unflushed >= self._config.flush_messages
            or now_ms - self._last_flush_ms >= self._config.flush_ms
        ):
            return self.sync()
        return False

    # -- read --------------------------------------------------------------------------

    @_reports_io_errors
    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
        whole_batches: bool = False,
    ) -> FileSlice | None:
        """Batches from the one holding ``offset``, as a slice of one segment file.

        None when there is nothing to return (``offset`` is the LEO, or at/after
        ``max_offset``). Raises :class:`OffsetOutOfRangeError` outside
        ``[log_start_offset, log_end_offset]``. The caller closes the slice.
        """
        with self._lock:
            self._check_open()
            if offset < self._log_start_offset or offset > self._log_end_offset:
                raise OffsetOutOfRangeError(offset, self._log_start_offset, self._log_end_offset)
            if offset == self._log_end_offset:
                return None
            if max_offset is not None and offset >= max_offset:
                return None
            index = max(bisect.bisect_right(self._bases, offset) - 1, 0)
            for segment in self._segments[index:]:
                with self._cache.use(segment):
                    found = segment.find_batch(offset)
                    if found is None:
                        continue
                    start = found.position
                    end = segment.size
                    if max_offset is not None:
                        if found.header.last_offset >= max_offset:
                            return None
                        limit = segment.find_batch(max_offset)
                        if limit is not None:
                            end = limit.position
                    available = end - start
                    length = min(available, max(max_bytes, 0))
                    if min_one_batch:
                        length = max(length, min(found.header.size, available))
                    if whole_batches and length < available:
                        length = segment.whole_batches_end(start, start + length) - start
                    if length <= 0:
                        return None
                    return FileSlice(segment.dup_fd(), start, length, found.header.base_offset)
            return None

    @_reports_io_errors
    def read_bytes(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
        whole_batches: bool = False,
    ) -> bytes:
        """Like :meth:`read`, as bytes (empty when there is nothing to return)."""
        piece = self.read(
            offset,
            max_bytes,
            max_offset=max_offset,
            min_one_batch=min_one_batch,
            whole_batches=whole_batches,
        )
        if piece is None:
            return b""
        with piece:
            return piece.read()

    # -- timestamps --------------------------------------------------------------------

    @_reports_io_errors
    def offset_for_timestamp(self, timestamp: int) -> TimestampOffset | None:
        """ListOffsets: -2 earliest, -1 latest, -3 max timestamp, else the first offset
        whose record timestamp is >= ``timestamp`` (None when there is none)."""
        with self._lock:
            self._check_open()
            if timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
                start = self._log_start_offset
                return TimestampOffset(start, -1, self.epoch_cache.epoch_for_offset(start))
            if timestamp == LATEST_TIMESTAMP:
                return TimestampOffset(self._log_end_offset, -1, self.epoch_cache.latest_epoch)
            if timestamp == MAX_TIMESTAMP:
                return self._max_timestamp_offset()
            if timestamp < 0:
                raise InvalidTimestampError(f"invalid ListOffsets timestamp {timestamp}")
            start = self._log_start_offset
            index = max(bisect.bisect_right(self._bases, start) - 1, 0)
            for segment in self._segments[index:]:
                with self._cache.use(segment):
                    if segment.max_timestamp()[0] < timestamp:
                        continue
                    found = segment.find_by_timestamp(timestamp, start)
                    if found is None:
                        continue
                    data = segment.read_batch(found.position, found.header.size)
                    for record in iter_records(data, 0, verify_crc=False):
                        if record.timestamp >= timestamp and record.offset >= start:
                            return TimestampOffset(
                                record.offset,
                                record.timestamp,
                                self.epoch_cache.epoch_for_offset(record.offset),
                            )
            return None

    def _max_timestamp_offset(self) -> TimestampOffset | None:
        best: Segment | None = None
        best_ts = -1
        for segment in self._segments:
            with self._cache.use(segment):
                ts, _ = segment.max_timestamp()
            if ts > best_ts:
                best, best_ts = segment, ts
        if best is None:
            return None
        with self._cache.use(best):
            _, offset_of_max = best.max_timestamp()
            found = best.find_batch(offset_of_max)
            if found is None:
                return None
            data = best.read_batch(found.position, found.header.size)
            for record in iter_records(data, 0, verify_crc=False):
                if record.timestamp == best_ts and record.offset >= self._log_start_offset:
                    return TimestampOffset(
                        record.offset,
                        record.timestamp,
                        self.epoch_cache.epoch_for_offset(record.offset),
                    )
        return None

    # -- retention ---------------------------------------------------------------------

    @_reports_io_errors
    def delete_old_segments(self, now_ms: int | None = None) -> int:
        """Apply the log start offset, ``retention.ms`` and ``retention.bytes``.

        Returns the number of segments deleted. Never deletes the active segment nor a
        segment holding offsets at or above the high watermark.
        """
        with self._lock:
            self._check_open()
            now = self._clock() if now_ms is None else now_ms
            deletable = self._deletable(lambda segment, upper: upper <= self._log_start_offset)
            config = self._config
            if config.delete and config.retention_ms >= 0:
                deadline = now - config.retention_ms

                def expired(segment: Segment, upper: int) -> bool:
                    with self._cache.use(segment):
                        return segment.largest_timestamp_for_retention() < deadline

                deletable = max(deletable, self._deletable(expired))
            if config.delete and config.retention_bytes >= 0:
                excess = sum(segment.size for segment in self._segments) - config.retention_bytes
                count = 0
                for segment in self._segments[:-1]:
                    upper = self._bases[count + 1]
                    if excess - segment.size < 0 or upper > self._retention_upper_bound():
                        break
                    excess -= segment.size
                    count += 1
                deletable = max(deletable, count)
            if deletable == 0:
                return 0
            self._delete_oldest(deletable)
        return deletable

    def _retention_upper_bound(self) -> int:
        return self.stable_upper_bound

    @property
    def stable_upper_bound(self) -> int:
        """The offset retention and cleaning stay below: the high watermark, or the last
        stable offset when the owner set :attr:`stable_offset`."""
        bound = self.high_watermark
        if self.stable_offset is not None:
            bound = min(bound, self.stable_offset())
        return bound

    def _deletable(self, predicate: Callable[[Segment, int], bool]) -> int:
        """How many segments from the oldest satisfy ``predicate(segment, next base)``."""
        count = 0
        high_watermark = self._retention_upper_bound()
        for index, segment in enumerate(self._segments[:-1]):
            upper = self._bases[index + 1]
            if upper > high_watermark or not predicate(segment, upper):
                break
            count += 1
        return count

    def _delete_oldest(self, count: int) -> None:
        doomed = self._segments[:count]
        new_start = self._bases[count]
        if new_start > self._log_start_offset:
            self._log_start_offset = new_start
            self.epoch_cache.truncate_from_start(new_start)
        del self._segments[:count]
        del self._bases[:count]
        for segment in doomed:
            self._delete_segment_files(segment)
        self._recovery_point = max(self._recovery_point, self._log_start_offset)
        _log.info(
            "%s-%s: deleted %d segment(s); log start offset now %d",
            self.topic,
            self.partition,
            count,
            self._log_start_offset,
        )

    @_reports_io_errors
    def delete_records(self, offset: int) -> int:
        """DeleteRecords: move the log start offset up to ``offset`` (<= high watermark),
        deleting segments wholly below it. Returns the new log start offset."""
        with self._lock:
            self._check_open()
            if offset < 0 or offset > self.high_watermark:
                raise OffsetOutOfRangeError(offset, self._log_start_offset, self.high_watermark)
            if offset <= self._log_start_offset:
                return self._log_start_offset
            self._log_start_offset = offset
            self.epoch_cache.truncate_from_start(offset)
            count = self._deletable(lambda segment, upper: upper <= offset)
            if count:
                self._delete_oldest(count)
            self._recovery_point = max(self._recovery_point, min(offset, self._log_end_offset))
            result = self._log_start_offset
        self._notify_checkpoint()
        return result

    def _notify_checkpoint(self) -> None:
        if self.on_checkpoint is not None:
            self.on_checkpoint()

    # -- truncation --------------------------------------------------------------------

    @_reports_io_errors
    def truncate_to(self, offset: int) -> bool:
        """Remove every batch holding an offset >= ``offset`` (whole batches: the LEO
        becomes the end of the last batch kept). False when ``offset`` >= LEO, when only
        epochs recorded at the log end without data are dropped."""
        if offset < 0:
            raise ValueError(f"cannot truncate to negative offset {offset}")
        with self._lock:
            self._check_open()
            if offset >= self._log_end_offset:
                # As Kafka does: a leader records its epoch at the log end when elected and
                # may lose leadership before appending. That entry holds nothing and must go,
                # or this replica, now a follower, keeps fetching with an epoch its leader
                # cannot place, and truncating never removes it.
                self.epoch_cache.truncate_from_end(self._log_end_offset)
                return False
            if self._bases[0] > offset:
                self._truncate_fully_locked(offset)
                self._log_start_offset = offset
            else:
                # Segments starting above the offset go; the last one kept is cut.
                keep = bisect.bisect_right(self._bases, offset)
                if keep < len(self._segments):
                    self._cache.release(self._segments[-1])
                    for segment in self._segments[keep:]:
                        self._delete_segment_files(segment)
                    del self._segments[keep:]
                    del self._bases[keep:]
                    new_active = self._segments[-1]
                    self._cache.acquire(new_active)
                    new_active.activate()
                segment = self._segments[-1]
                segment.truncate_to(offset)
                segment.fsync(self._datasync, indexes=False)
                end = segment.next_offset
                self._log_end_offset = segment.base_offset if end is None else end
            self._finish_truncation()
            leo = self._log_end_offset
        self._notify_truncation(leo)
        self._notify_checkpoint()
        return True

    def _notify_truncation(self, log_end_offset: int) -> None:
        if self.on_truncate is not None:
            self.on_truncate(log_end_offset)

    def _finish_truncation(self) -> None:
        leo = self._log_end_offset
        self._truncations += 1
        self._last_abort_marker = None
        self._recovery_point = min(self._recovery_point, leo)
        self._log_start_offset = min(self._log_start_offset, leo)
        if self._high_watermark is not None:
            self._high_watermark = min(self._high_watermark, leo)
        self.epoch_cache.truncate_from_end(leo)
        if self._dir_dirty:
            fsync_dir(self.directory, self._fsync)
            self._dir_dirty = False

    @_reports_io_errors
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and restart the log, empty, at ``offset``."""
        if offset < 0:
            raise ValueError(f"cannot start the log at negative offset {offset}")
        with self._lock:
            self._check_open()
            self._truncate_fully_locked(offset)
            self._log_start_offset = offset
            self._recovery_point = offset
            if self._high_watermark is not None:
                self._high_watermark = offset
            self._truncations += 1
            self._last_abort_marker = None
            self.epoch_cache.clear_and_flush()
            if self._dir_dirty:
                fsync_dir(self.directory, self._fsync)
                self._dir_dirty = False
        self._notify_truncation(offset)
        self._notify_checkpoint()

    def _truncate_fully_locked(self, offset: int) -> None:
        self._cache.release(self._segments[-1])
        for segment in self._segments:
            self._delete_segment_files(segment)
        self._segments.clear()
        self._bases.clear()
        segment = self._create_segment(offset)
        self._cache.acquire(segment)
        segment.activate()
        self._add_segment(segment)
        self._log_end_offset = offset

    # -- aborted transactions ----------------------------------------------------------

    @_reports_io_errors
    def append_aborted_txn(self, entry: AbortedTxn, *, if_absent: bool = False) -> bool:
        """Index an aborted transaction in the segment holding its ABORT marker
        (``entry.last_offset``); ``if_absent`` (replay) skips a marker already indexed.
        True when an entry was written."""
        with self._lock:
            self._check_open()
            if not self._log_start_offset <= entry.last_offset < self._log_end_offset:
                return False
            index = max(bisect.bisect_right(self._bases, entry.last_offset) - 1, 0)
            written = self._segments[index].txn_index.append(entry, if_absent=if_absent)
            if self._last_abort_marker is not None:
                self._last_abort_marker = max(self._last_abort_marker, entry.last_offset)
            return written

    @_reports_io_errors
    def aborted_transactions(self, first_offset: int, max_offset: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping a read that starts with the batch at
        ``first_offset`` and stops before ``max_offset`` (a read never leaves the segment
        it starts in, so the range ends with that segment). Entries from later segments
        count: a transaction started in this range may be aborted in a later segment."""
        with self._lock:
            self._check_open()
            index = max(bisect.bisect_right(self._bases, first_offset) - 1, 0)
            segment_end = (
                self._bases[index + 1] if index + 1 < len(self._bases) else self._log_end_offset
            )
            return self._collect_aborted(index, first_offset, min(max_offset, segment_end))

    @_reports_io_errors
    def collect_aborted_txns(self, start_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """Every indexed aborted transaction overlapping ``[start_offset, upper_bound)``
        (marker at or after ``start_offset``, first offset before ``upper_bound``)."""
        with self._lock:
            self._check_open()
            index = max(bisect.bisect_right(self._bases, start_offset) - 1, 0)
            return self._collect_aborted(index, start_offset, upper_bound)

    def _collect_aborted(self, index: int, first_offset: int, upper: int) -> list[AbortedTxn]:
        """Entries overlapping ``[first_offset, upper)`` from segment ``index`` on (the
        caller holds the lock)."""
        if self._last_abort_marker is None:
            self._last_abort_marker = max(
                (e.last_offset for s in self._segments for e in s.txn_index.entries),
                default=-1,
            )
        last_marker = self._last_abort_marker
        found: list[AbortedTxn] = []
        segments = self._segments
        for position in range(index, len(segments)):
            segment = segments[position]
            if segment.base_offset > last_marker:
                break  # no later segment indexes an abort (most logs have none)
            entries, complete = segment.txn_index.overlapping(first_offset, upper)
            found.extend(entries)
            if complete:
                break
        return found

    @_reports_io_errors
    def flush_txn_indexes(self) -> None:
        """fsync the transaction indexes written since their last sync (before a producer
        state snapshot: once the snapshot covers a marker, replay no longer re-adds its
        entry)."""
        with self._lock:
            self._check_open()
            for segment in self._segments:
                segment.txn_index.sync(self._datasync)

    # -- compaction support ------------------------------------------------------------

    @_reports_io_errors
    def new_cleaned_segment(self, base_offset: int) -> Segment:
        """An empty, writable segment with ``.cleaned`` files for the cleaner to fill with
        :meth:`Segment.append_batches`; hand it to :meth:`replace_segments` (or
        :meth:`discard_cleaned_segment`). It is pinned open until then."""
        with self._lock:
            self._check_open()
            segment = self._create_segment(base_offset, CLEANED_SUFFIX)
            self._cache.acquire(segment)
            segment.activate()
            return segment

    def discard_cleaned_segment(self, segment: Segment) -> None:
        self._cache.release(segment)
        self._cache.retire(segment)
        segment.delete_files()

    @_reports_io_errors
    def replace_segments(self, new: Segment, old: Sequence[Segment]) -> None:
        """Atomically put ``new`` (from :meth:`new_cleaned_segment`) in place of ``old``.

        ``old`` must be consecutive, non-active segments of this log with
        ``old[0].base_offset == new.base_offset``, and ``new``'s batches must lie in
        ``old``'s offset range, its last batch ending at or after the last old segment's
        base offset (so a crash mid-swap can tell which segments the swap replaces:
        those whose base offsets fall inside its range). Steps: fsync ``new``; rename
        its files ``.cleaned`` -> ``.swap``; rename the old files ``.deleted``; rename
        ``.swap`` -> final; unlink the ``.deleted`` files; fsync the directory between
        steps. A crash leaves either the old segments or the new one in the log.
        """
        with self._lock:
            self._check_open()
            if not old:
                raise ValueError("no segments to replace")
            first = self._segments.index(old[0])
            if self._segments[first : first + len(old)] != list(old):
                raise ValueError("segments to replace are not consecutive segments of the log")
            if first + len(old) >= len(self._segments):
                raise ValueError("the active segment cannot be replaced")
            if new.base_offset != old[0].base_offset:
                raise ValueError("the new segment must start at the first old segment's base")
            new.seal()
            new.fsync(self._datasync, indexes=True)
            new.rename_suffix(SWAP_SUFFIX)
            fsync_dir(self.directory, self._fsync)
            for segment in old:
                self._cache.retire(segment)
                segment.rename_suffix(DELETED_SUFFIX)
            new.rename_suffix("")
            fsync_dir(self.directory, self._fsync)
            for segment in old:
                segment.delete_files()
            self._cache.release(new)
            self._segments[first : first + len(old)] = [new]
            self._bases[first : first + len(old)] = [new.base_offset]

    # -- closing -----------------------------------------------------------------------

    @_reports_io_errors
    def close(self) -> None:
        """Flush everything (indexes included) and close every file."""
        with self._sync_leadership():
            with self._lock:
                if self._closed:
                    return
                # Refuse new work first; the flush below then sees a stable log.
                self._closed = True
                active = self._segments[-1]
                active.seal()
                active.active = True  # still the last segment; only its indexes closed
            self._sync_locked(indexes_of_active=True, force=True)
            with self._lock:
                self._cache.release(self._segments[-1])
                for segment in self._segments:
                    self._cache.retire(segment)

    def delete(self) -> None:
        """Close without flushing and remove every file of the log (not the directory)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._cache.release(self._segments[-1])
            for segment in self._segments:
                self._cache.retire(segment)
                segment.delete_files()

    def report_io_error(self, exc: OSError) -> LogDirOfflineError:
        """Report an I/O error on this log's files (its own, or the producer state's next
        to them) to :attr:`on_io_error`; the error to raise."""
        if self.on_io_error is not None:
            self.on_io_error(exc)
        return LogDirOfflineError(self.directory.parent, exc)

    def abandon(self, cause: OSError) -> None:
        """Close every file without writing anything (no flush, no index or checkpoint):
        the log's directory went offline after ``cause``. Every later call raises
        :class:`LogDirOfflineError`; what is on disk is left for the next start to
        recover."""
        with self._lock:
            if self.offline_cause is not None:
                return
            self.offline_cause = cause
            if not self._closed:
                self._closed = True
                self._cache.release(self._segments[-1])
            for segment in self._segments:
                self._cache.retire(segment)

    @property
    def closed(self) -> bool:
        return self._closed
