"""Log compaction (``cleanup.policy=compact``): keep the newest record of every key.

One pass over a log (:meth:`Cleaner.clean_log`):

1. Ranges. The *first dirty offset* ``D`` comes from ``cleaner-offset-checkpoint`` in the
   log dir (Kafka's checkpoint format, ``topic partition offset``), clamped to
   ``[log start, LEO]``. The *first uncleanable offset* ``E`` is the base offset of the
   first segment that may not be cleaned: the active segment, a segment reaching above
   the high watermark, or one whose largest timestamp is within ``min.compaction.lag.ms``
   of ``now``. Everything below ``D`` is *clean* (deduplicated by earlier passes), ``[D,
   E)`` is *dirty*. The dirty ratio is dirty bytes / (clean + dirty bytes), counted in
   whole segments; a pass runs when it is above ``min.cleanable.dirty.ratio``, when the
   oldest dirty segment is older than ``max.compaction.lag.ms``, when a tombstone's delete
   horizon written by this cleaner has passed, or when forced.
2. Offset map. The records of ``[D, E)`` are decoded batch by batch into a map ``key ->
   latest offset`` (keys compared as bytes; values never held). The map has a byte budget
   (``log.cleaner.dedupe.buffer.size``); when full, it stops at a batch boundary ``M``
   and this pass treats every offset at or above ``M`` as untouchable. The new first
   dirty offset is ``M`` (``E`` when everything fit).
3. Rewrite. Every segment below ``M`` (from the first one) is rewritten, consecutive
   segments grouped into one while their sizes fit ``segment.bytes``, their index files
   ``segment.index.bytes`` and their offsets an int32 relative offset. A record is kept
   when its offset is at or above ``M``, or it has a key, no newer offset for that key is
   in the map, and it is not an expired tombstone. Batches whose records are all kept
   are copied byte for byte; the others are re-encoded with the kept records' original
   offsets, timestamps, keys, values and headers, and the batch's base offset, last
   offset delta, producer id / epoch / base sequence, leader epoch, attributes and
   codec. A batch left with no record is dropped, unless it is the last batch of its
   producer id in the log (its sequence numbers carry producer state, as in Kafka) or
   the last batch of the group (the swap needs it, see ``docs/storage.md`` §13): those
   stay as a bare header.
4. Swap. Each group's cleaned segment replaces it through
   :meth:`~tidelog.storage.log.Log.replace_segments` (``.cleaned`` -> ``.swap`` -> final,
   with fsyncs; recovery finishes or discards an interrupted swap). A single-segment
   group in which nothing changed is not swapped. The checkpoint moves to ``M`` last, so
   a crash before it only makes the next pass redo work.

Tombstones (KIP-534). A tombstone (null value) that is the newest of its key is kept by
the first pass that sees it, and its batch is re-encoded with the delete-horizon
attribute bit and ``base_timestamp = now + delete.retention.ms``. A later pass drops it
once ``now >= horizon``. Consumers thus have ``delete.retention.ms`` after the segment
holding a tombstone was cleaned to read it.

Transactions. Nothing at or above the partition's last stable offset is cleaned
(:attr:`~tidelog.storage.log.Log.stable_upper_bound`: an open transaction's data, and a
transaction whose marker is not yet below the high watermark, stay as written). Batches of
aborted transactions (a transactional batch of producer P inside an aborted transaction of
P that the ``.txnindex`` files list) are removed as Kafka removes them, records and all,
except that the last data batch of a producer stays as a bare header (its sequence numbers,
as for other batches). A COMMIT or ABORT marker whose transaction has no batch left goes
as Kafka's does: the first pass that finds it so writes a delete horizon (``now +
delete.retention.ms``) into it, a pass after the horizon removes it, and its ``.txnindex``
entry with it. Kept whole, never compacted: other control batches, markers of
transactions with batches left, and committed transactional batches, whose records
neither enter the offset map nor are dropped (the cleaner never drops a record it cannot
prove superseded; Kafka deduplicates them). The other ``.txnindex`` entries of replaced
segments are copied into the cleaned one, so read_committed consumers skip whatever
aborted data a pass has not removed yet. Keyless records, which only a
follower or a policy change can bring into a compacted log, are dropped, as Kafka does.

Time is ``now_ms`` only; the cleaner runs no thread. Memory: the offset map (budgeted),
one I/O window and one output buffer of ``io_buffer_size``, one decoded batch.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.records.batch import BatchHeader, peek_batch_size, validate_batch
from tidelog.records.builder import BatchBuilder, build_empty_batch
from tidelog.records.control import parse_end_txn_marker
from tidelog.records.errors import RecordsError, TruncatedBatchError
from tidelog.records.reader import iter_records
from tidelog.storage.checkpoint import (
    FsyncFn,
    parse_int_field,
    read_checkpoint,
    write_checkpoint,
)
from tidelog.storage.config import LONG_MAX
from tidelog.storage.errors import (
    CorruptCheckpointError,
    CorruptSegmentError,
    SegmentDeletedError,
    StorageError,
)
from tidelog.storage.index import INT32_MAX
from tidelog.storage.log import Log
from tidelog.storage.segment import Segment, pread_exactly
from tidelog.storage.txn_index import AbortedTxn

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
#: Kafka's ``log.cleaner.dedupe.buffer.size`` default.
DEFAULT_DEDUPE_BUFFER_SIZE = 128 * 1024 * 1024
#: Kafka's ``log.cleaner.io.buffer.size`` is 512 KiB per read and write buffer.
DEFAULT_IO_BUFFER_SIZE = 1024 * 1024
# What one map entry costs besides its key bytes: a dict slot, the bytes object's header
# and an int. An estimate that errs high, so the budget is not exceeded.
_MAP_ENTRY_OVERHEAD = 112

_log = logging.getLogger(__name__)


class OffsetMap:
    """``key -> latest offset`` over the dirty range, with a byte budget.

    Keys are held as ``bytes`` (exact comparison; no hash collisions to fear), values
    never. :attr:`full` says the budget is used up.
    """

    __slots__ = ("_map", "bytes_used", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self._map: dict[bytes, int] = {}
        self.max_bytes = max_bytes
        self.bytes_used = 0

    def put(self, key: bytes, offset: int) -> None:
        if key not in self._map:
            self.bytes_used += len(key) + _MAP_ENTRY_OVERHEAD
        self._map[key] = offset

    def get(self, key: bytes) -> int:
        """The latest offset of ``key``, -1 when the dirty range does not hold it."""
        return self._map.get(key, -1)

    @property
    def full(self) -> bool:
        return self.bytes_used >= self.max_bytes

    def __len__(self) -> int:
        return len(self._map)


@dataclass(frozen=True)
class CleanableRange:
    """Where a log stands for the cleaner (see the module docstring, step 1)."""

    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    dirty_bytes: int

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


@dataclass(frozen=True)
class CleanResult:
    """What one :meth:`Cleaner.clean_log` call did."""

    topic: str
    partition: int
    #: True when segments were rewritten (a pass ran to its end).
    cleaned: bool
    #: Why nothing was cleaned, or "cleaned".
    reason: str
    first_dirty_offset: int
    #: The new first dirty offset (the end of the offset map).
    end_offset: int
    dirty_ratio: float = 0.0
    segments_before: int = 0
    segments_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    records_before: int = 0
    records_after: int = 0
    keys_mapped: int = 0
    #: The earliest delete horizon of a tombstone kept by this pass (None when none).
    next_delete_horizon: int | None = None

    @property
    def records_removed(self) -> int:
        return self.records_before - self.records_after

    @property
    def bytes_removed(self) -> int:
        return self.bytes_before - self.bytes_after


@dataclass
class _Stats:
    bytes_before: int = 0
    bytes_after: int = 0
    records_before: int = 0
    records_after: int = 0
    segments_before: int = 0
    segments_after: int = 0
    next_horizon: int | None = None

    def horizon(self, value: int) -> None:
        if self.next_horizon is None or value < self.next_horizon:
            self.next_horizon = value


class Cleaner:
    """Compacts logs on request; the broker decides when (no thread inside).

    ``dedupe_buffer_size`` bounds the offset map; ``io_buffer_size`` the read window and
    the output buffer. Attach every log (:meth:`attach`) so that truncations lower its
    first dirty offset. Calls on one log must not overlap; different logs may be cleaned
    from different threads.
    """

    def __init__(
        self,
        *,
        dedupe_buffer_size: int = DEFAULT_DEDUPE_BUFFER_SIZE,
        io_buffer_size: int = DEFAULT_IO_BUFFER_SIZE,
        fsync: FsyncFn = os.fsync,
    ) -> None:
        if dedupe_buffer_size <= 0 or io_buffer_size <= 0:
            raise ValueError("cleaner buffer sizes must be positive")
        self.dedupe_buffer_size = dedupe_buffer_size
        self.io_buffer_size = io_buffer_size
        self._fsync = fsync
        self._checkpoint_lock = threading.Lock()
        # Earliest pending tombstone delete horizon per log directory (memory only: after
        # a restart the ratio or max.compaction.lag.ms triggers the next pass).
        self._horizons: dict[Path, int] = {}

    # -- checkpoint --------------------------------------------------------------------

    @staticmethod
    def _checkpoint_path(log: Log) -> Path:
        return log.directory.parent / CLEANER_OFFSET_CHECKPOINT

    def _read(self, path: Path) -> dict[tuple[str, int], int]:
        try:
            rows = read_checkpoint(path, 3)
            return {
                (topic, parse_int_field(part, str(path), 0, 2**31 - 1)): parse_int_field(
                    offset, str(path), 0
                )
                for topic, part, offset in rows
            }
        except CorruptCheckpointError as exc:
            # Offset 0 (everything dirty) is always safe, only slower.
            _log.warning("ignoring corrupt cleaner checkpoint: %s", exc)
            return {}

    def _update(self, log: Log, offset: int | None, *, lower_only: bool = False) -> None:
        path = self._checkpoint_path(log)
        key = (log.topic, log.partition)
        with self._checkpoint_lock:
            entries = self._read(path)
            old = entries.get(key)
            if offset is None:
                if old is None:
                    return
                del entries[key]
            else:
                if lower_only and (old is None or old <= offset):
                    return
                if old == offset:
                    return
                entries[key] = offset
            # Entries of partitions no longer in this dir are dropped on the way.
            rows = [
                (topic, partition, value)
                for (topic, partition), value in sorted(entries.items())
                if (topic, partition) == key or (path.parent / f"{topic}-{partition}").is_dir()
            ]
            write_checkpoint(path, rows, self._fsync)

    def checkpointed_offset(self, log: Log) -> int | None:
        """The first dirty offset recorded for ``log`` (None when there is none)."""
        with self._checkpoint_lock:
            return self._read(self._checkpoint_path(log)).get((log.topic, log.partition))

    def attach(self, log: Log) -> None:
        """Lower the log's checkpoint on truncation; clamp it to the LEO now (a crash
        between a truncation and its checkpoint update left it too high)."""
        log.on_truncate = lambda end: self.truncate_checkpoint(log, end)
        self.truncate_checkpoint(log, log.log_end_offset)

    def truncate_checkpoint(self, log: Log, offset: int) -> None:
        """The log was truncated to ``offset``: data from there on is new, so dirty."""
        self._update(log, offset, lower_only=True)

    def forget(self, log: Log) -> None:
        """Remove the log's checkpoint entry (the log is being deleted)."""
        self._horizons.pop(log.directory, None)
        self._update(log, None)

    # -- ranges ------------------------------------------------------------------------

    def cleanable_range(self, log: Log, now_ms: int) -> CleanableRange:
        """First dirty and first uncleanable offsets and the byte counts of the ratio."""
        segments = log.segments
        start = log.log_start_offset
        high_watermark = log.stable_upper_bound
        lag = log.config.min_compaction_lag_ms
        uncleanable = segments[-1].base_offset
        for index, segment in enumerate(segments[:-1]):
            upper = segments[index + 1].base_offset
            if upper > high_watermark:
                uncleanable = segment.base_offset
                break
            if lag > 0:
                with log.handle_cache.use(segment):
                    largest = segment.largest_timestamp_for_retention()
                if largest > now_ms - lag:
                    uncleanable = segment.base_offset
                    break
        checkpoint = self.checkpointed_offset(log)
        dirty = start if checkpoint is None else checkpoint
        if dirty < start or dirty > log.log_end_offset:
            dirty = start
        dirty = min(dirty, max(uncleanable, start))
        clean_bytes = 0
        dirty_bytes = 0
        for index, segment in enumerate(segments[:-1]):
            upper = segments[index + 1].base_offset
            if upper <= start or segment.base_offset >= uncleanable:
                continue
            if upper <= dirty:
                clean_bytes += segment.size
            else:
                dirty_bytes += segment.size
        return CleanableRange(dirty, uncleanable, clean_bytes, dirty_bytes)

    def needs_cleaning(self, log: Log, now_ms: int) -> tuple[bool, CleanableRange]:
        """Whether a pass is due (ratio, max compaction lag, an expired horizon)."""
        ranges = self.cleanable_range(log, now_ms)
        config = log.config
        if not config.compact:
            return False, ranges
        horizon = self._horizons.get(log.directory)
        if horizon is not None and horizon <= now_ms:
            return True, ranges
        if ranges.dirty_bytes == 0:
            return False, ranges
        if ranges.dirty_ratio > config.min_cleanable_dirty_ratio:
            return True, ranges
        if config.max_compaction_lag_ms < LONG_MAX:
            first = self._first_dirty_timestamp(log, ranges)
            if first >= 0 and first < now_ms - config.max_compaction_lag_ms:
                return True, ranges
        return False, ranges

    @staticmethod
    def _first_dirty_timestamp(log: Log, ranges: CleanableRange) -> int:
        for segment in log.segments[:-1]:
            if segment.base_offset >= ranges.first_uncleanable_offset:
                break
            with log.handle_cache.use(segment):
                found = segment.find_batch(ranges.first_dirty_offset)
            if found is not None:
                return found.header.max_timestamp
        return -1

    # -- one pass ----------------------------------------------------------------------

    def clean_log(self, log: Log, now_ms: int, *, force: bool = False) -> CleanResult:
        """Compact ``log`` if a pass is due (always with ``force``); see the module doc.

        Raises :class:`~tidelog.storage.errors.StorageError` when a sealed segment holds
        a batch that does not decode (nothing is swapped then).
        """
        due, ranges = self.needs_cleaning(log, now_ms)
        dirty = ranges.first_dirty_offset
        if not log.config.compact:
            return self._nothing(log, ranges, "cleanup.policy does not include compact")
        if not due and not force:
            return self._nothing(log, ranges, "dirty ratio below min.cleanable.dirty.ratio")
        end = ranges.first_uncleanable_offset
        if end <= log.segments[0].base_offset:
            return self._nothing(log, ranges, "no cleanable segment")
        offset_map = OffsetMap(self.dedupe_buffer_size)
        stats = _Stats()
        try:
            map_end = self._build_offset_map(log, offset_map, dirty, end)
            finished = self._rewrite(log, offset_map, map_end, now_ms, stats)
        except SegmentDeletedError:
            finished = False
        except RecordsError as exc:
            raise CorruptSegmentError(f"{log.topic}-{log.partition}: {exc}") from exc
        if not finished:
            return self._nothing(log, ranges, "the log changed while it was cleaned")
        self._update(log, map_end)
        if stats.next_horizon is None:
            self._horizons.pop(log.directory, None)
        else:
            self._horizons[log.directory] = stats.next_horizon
        result = CleanResult(
            log.topic,
            log.partition,
            True,
            "cleaned",
            dirty,
            map_end,
            ranges.dirty_ratio,
            stats.segments_before,
            stats.segments_after,
            stats.bytes_before,
            stats.bytes_after,
            stats.records_before,
            stats.records_after,
            len(offset_map),
            stats.next_horizon,
        )
        _log.info(
            "%s-%s: cleaned offsets below %d: %d -> %d bytes, %d records removed",
            log.topic,
            log.partition,
            map_end,
            result.bytes_before,
            result.bytes_after,
            result.records_removed,
        )
        return result

    @staticmethod
    def _nothing(log: Log, ranges: CleanableRange, reason: str) -> CleanResult:
        return CleanResult(
            log.topic,
            log.partition,
            False,
            reason,
            ranges.first_dirty_offset,
            ranges.first_dirty_offset,
            ranges.dirty_ratio,
        )

    def _build_offset_map(self, log: Log, offset_map: OffsetMap, dirty: int, end: int) -> int:
        """Fill the map from ``[dirty, end)``; returns where it stopped (a batch boundary)."""
        for segment in log.segments:
            if segment.base_offset >= end:
                break
            with log.handle_cache.use(segment):
                size = segment.size
                found = segment.find_batch(dirty) if segment.base_offset <= dirty else None
                if segment.base_offset <= dirty and found is None:
                    continue
                start = 0 if found is None else found.position
                for data, position, header, _ in self._batches(segment, start, size):
                    if header.next_offset <= dirty:
                        continue
                    if header.base_offset >= end:
                        return end
                    if offset_map.full and len(offset_map) > 0:
                        return header.base_offset
                    if header.is_control or header.is_transactional:
                        continue
                    put = offset_map.put
                    for record in iter_records(data, position, header=header):
                        if record.key is not None and record.offset >= dirty:
                            put(record.key, record.offset)
        return end

    def _batches(
        self, segment: Segment, start: int, end: int
    ) -> Iterator[tuple[bytes, int, BatchHeader, int]]:
        """``(window, position in window, header, position in file)`` of each batch of
        ``[start, end)``, CRC checked, read in ``io_buffer_size`` windows (a larger batch
        is read whole)."""
        position = start
        window_size = self.io_buffer_size
        while position < end:
            data = pread_exactly(segment.fd, min(window_size, end - position), position)
            offset = 0
            while offset < len(data):
                try:
                    header = validate_batch(data, offset)
                except TruncatedBatchError:
                    if offset > 0:
                        break
                    declared = peek_batch_size(data) if len(data) >= 12 else 0
                    if declared <= len(data) or position + declared > end:
                        raise CorruptSegmentError(
                            f"segment {segment.log_path}: truncated batch at {position}"
                        ) from None
                    data = pread_exactly(segment.fd, declared, position)
                    continue
                except RecordsError as exc:
                    raise CorruptSegmentError(
                        f"segment {segment.log_path}: bad batch at {position + offset}: {exc}"
                    ) from exc
                yield data, offset, header, position + offset
                offset += header.size
            if offset == 0:
                raise CorruptSegmentError(f"segment {segment.log_path}: no batch at {position}")
            position += offset

    # -- rewriting ---------------------------------------------------------------------

    def _producer_last_batches(self, log: Log) -> dict[int, int]:
        """Last offset of the last data batch of every producer id in the log."""
        last: dict[int, int] = {}
        for segment in log.segments:
            # The active segment may be truncated under the scan; what was read still
            # counts (a missed later batch only keeps an earlier one, never drops one).
            with contextlib.suppress(StorageError), log.handle_cache.use(segment):
                for _, header in segment.iter_headers(0, segment.size):
                    if header.producer_id >= 0 and not header.is_control:
                        last[header.producer_id] = header.last_offset
        return last

    def _groups(self, log: Log, segments: Sequence[Segment], next_base: int) -> list[list[Segment]]:
        """``segments`` (consecutive; ``next_base`` is the base of the one after them)
        cut into runs that fit in one cleaned segment."""
        config = log.config
        groups: list[list[Segment]] = []
        bases = [segment.base_offset for segment in segments] + [next_base]
        index = 0
        while index < len(segments):
            group = [segments[index]]
            size = segments[index].size
            index_bytes = _index_bytes(segments[index])
            index += 1
            while index < len(segments):
                candidate = segments[index]
                candidate_index = _index_bytes(candidate)
                last_offset = bases[index + 1] - 1
                if (
                    size + candidate.size > config.segment_bytes
                    or index_bytes + candidate_index > config.segment_index_bytes
                    or last_offset - group[0].base_offset > INT32_MAX
                ):
                    break
                group.append(candidate)
                size += candidate.size
                index_bytes += candidate_index
                index += 1
            groups.append(group)
        return groups

    def _rewrite(
        self, log: Log, offset_map: OffsetMap, map_end: int, now_ms: int, stats: _Stats
    ) -> bool:
        everything = log.segments
        count = sum(1 for segment in everything[:-1] if segment.base_offset < map_end)
        if count == 0:
            return True
        segments = everything[:count]
        producers = self._producer_last_batches(log)
        txns = TxnCleaning(log.collect_aborted_txns(segments[0].base_offset, map_end))
        for group in self._groups(log, segments, everything[count].base_offset):
            if sum(segment.size for segment in group) == 0:
                continue
            if not self._clean_group(
                log, group, offset_map, map_end, now_ms, producers, txns, stats
            ):
                return False
        return True

    def _clean_group(
        self,
        log: Log,
        group: list[Segment],
        offset_map: OffsetMap,
        map_end: int,
        now_ms: int,
        producers: dict[int, int],
        txns: TxnCleaning,
        stats: _Stats,
    ) -> bool:
        horizon_ms = now_ms + log.config.delete_retention_ms
        cleaned = log.new_cleaned_segment(group[0].base_offset)
        out = bytearray()
        changed = len(group) > 1
        group_stats = _Stats()
        try:
            for number, segment in enumerate(group):
                last_segment = number == len(group) - 1
                with log.handle_cache.use(segment):
                    size = segment.size
                    group_stats.bytes_before += size
                    for data, position, header, at in self._batches(segment, 0, size):
                        group_stats.records_before += header.record_count
                        last_of_group = last_segment and at + header.size == size
                        kept, count = self._retain(
                            data,
                            position,
                            header,
                            offset_map,
                            map_end,
                            now_ms,
                            horizon_ms,
                            producers,
                            txns,
                            last_of_group,
                            group_stats,
                        )
                        if kept is None:
                            changed = True
                            continue
                        if kept is not data:
                            changed = True
                            out += kept
                        else:
                            out += memoryview(data)[position : position + header.size]
                        group_stats.records_after += count
                        if len(out) >= self.io_buffer_size:
                            cleaned.append_batches(out)
                            out = bytearray()
            if out:
                cleaned.append_batches(out)
            if not changed:
                log.discard_cleaned_segment(cleaned)
                stats.bytes_before += group_stats.bytes_before
                stats.bytes_after += group_stats.bytes_before
                stats.records_before += group_stats.records_before
                stats.records_after += group_stats.records_after
                stats.segments_before += 1
                stats.segments_after += 1
                if group_stats.next_horizon is not None:
                    stats.horizon(group_stats.next_horizon)
                return True
            # An aborted transaction stays indexed as long as its marker is in the log.
            cleaned.txn_index.write_entries(
                [
                    entry
                    for segment in group
                    for entry in segment.txn_index.entries
                    if entry.last_offset not in txns.dropped_markers
                ]
            )
            log.replace_segments(cleaned, group)
        except (CorruptSegmentError, RecordsError):
            with contextlib.suppress(OSError, StorageError):
                log.discard_cleaned_segment(cleaned)
            raise
        except (ValueError, StorageError) as exc:
            # The log moved under the pass (retention, truncation, a deleted segment).
            with contextlib.suppress(OSError, StorageError):
                log.discard_cleaned_segment(cleaned)
            _log.info("%s-%s: cleaning abandoned: %s", log.topic, log.partition, exc)
            return False
        except BaseException:
            with contextlib.suppress(OSError, StorageError):
                log.discard_cleaned_segment(cleaned)
            raise
        stats.bytes_before += group_stats.bytes_before
        stats.bytes_after += cleaned.size
        stats.records_before += group_stats.records_before
        stats.records_after += group_stats.records_after
        stats.segments_before += len(group)
        stats.segments_after += 1
        if group_stats.next_horizon is not None:
            stats.horizon(group_stats.next_horizon)
        return True

    def _retain(
        self,
        data: bytes,
        position: int,
        header: BatchHeader,
        offset_map: OffsetMap,
        map_end: int,
        now_ms: int,
        horizon_ms: int,
        producers: dict[int, int],
        txns: TxnCleaning,
        last_of_group: bool,
        stats: _Stats,
    ) -> tuple[bytes | None, int]:
        """What to write for one batch: ``data`` itself (copy unchanged), new bytes, or
        None (drop); and how many records that holds."""
        if header.base_offset >= map_end:
            return data, header.record_count
        if header.is_control:
            return self._retain_marker(
                data, position, header, txns, now_ms, horizon_ms, last_of_group, stats
            )
        pid = header.producer_id
        if header.is_transactional and not txns.aborted(pid, header.base_offset):
            txns.retained.add(pid)
            return data, header.record_count
        needed_empty = last_of_group or producers.get(pid) == header.last_offset
        if header.is_transactional:
            # Aborted: no record of it may ever be read (only its sequence numbers count).
            if not needed_empty:
                return None, 0
            txns.retained.add(pid)  # its marker must stay to end it on replay
            return (self._empty(header) if header.record_count else data), 0
        if header.record_count == 0:
            # Left empty by an earlier pass: it goes once nothing needs it any more.
            return (data if needed_empty else None), 0
        had_horizon = header.has_delete_horizon
        expired = had_horizon and now_ms >= header.base_timestamp
        kept = []
        needs_horizon = False
        total = 0
        get = offset_map.get
        for record in iter_records(data, position, header=header):
            total += 1
            key = record.key
            if key is None or get(key) > record.offset:
                continue
            if record.value is None:
                if expired:
                    continue
                needs_horizon = True
            kept.append(record)
        if needs_horizon:
            batch_horizon = header.base_timestamp if had_horizon else horizon_ms
            stats.horizon(batch_horizon)
        if len(kept) == total and (not needs_horizon or had_horizon):
            return data, total
        if not kept:
            return (self._empty(header) if needed_empty else None), 0
        builder = BatchBuilder(
            compression=header.compression,
            base_offset=header.base_offset,
            partition_leader_epoch=header.partition_leader_epoch,
            producer_id=header.producer_id,
            producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
            log_append_time=header.max_timestamp if header.is_log_append_time else None,
            last_offset_delta=header.last_offset_delta,
            delete_horizon_ms=(
                (header.base_timestamp if had_horizon else horizon_ms) if needs_horizon else None
            ),
        )
        base = header.base_offset
        for record in kept:
            builder.append(
                record.key,
                record.value,
                record.headers,
                timestamp=record.timestamp,
                offset_delta=record.offset - base,
            )
        return builder.close(), len(kept)

    @staticmethod
    def _retain_marker(
        data: bytes,
        position: int,
        header: BatchHeader,
        txns: TxnCleaning,
        now_ms: int,
        horizon_ms: int,
        last_of_group: bool,
        stats: _Stats,
    ) -> tuple[bytes | None, int]:
        """A control batch: a transaction marker whose transaction has no batch left in
        the log goes once ``delete.retention.ms`` passed (Kafka's rule: the first pass that
        finds it so writes a delete horizon into it, a pass after the horizon drops it);
        every other control batch stays."""
        records = list(iter_records(data, position, header=header))
        try:
            marker = parse_end_txn_marker(records[0].key, records[0].value) if records else None
        except RecordsError:
            marker = None  # leader change and KRaft control records are not ours to drop
        pid = header.producer_id
        if marker is None or pid in txns.retained:
            txns.retained.discard(pid)
            return data, header.record_count
        if header.has_delete_horizon:
            if now_ms >= header.base_timestamp and not last_of_group:
                txns.dropped_markers.add(header.base_offset)
                return None, 0
            stats.horizon(header.base_timestamp)
            return data, header.record_count
        stats.horizon(horizon_ms)
        builder = BatchBuilder(
            base_offset=header.base_offset,
            partition_leader_epoch=header.partition_leader_epoch,
            producer_id=pid,
            producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
            transactional=True,
            control=True,
            log_append_time=header.max_timestamp if header.is_log_append_time else None,
            last_offset_delta=header.last_offset_delta,
            delete_horizon_ms=horizon_ms,
        )
        for record in records:
            builder.append(
                record.key,
                record.value,
                record.headers,
                timestamp=record.timestamp,
                offset_delta=record.offset - header.base_offset,
            )
        return builder.close(), len(records)

    @staticmethod
    def _empty(header: BatchHeader) -> bytes:
        """The batch as a bare header with no record (producer fields kept)."""
        return build_empty_batch(
            base_offset=header.base_offset,
            last_offset_delta=header.last_offset_delta,
            timestamp=header.max_timestamp,
            partition_leader_epoch=header.partition_leader_epoch,
            producer_id=header.producer_id,
            producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
            attributes=header.attributes,
        )


class TxnCleaning:
    """What one pass knows about transactions, batch by batch in offset order.

    The aborted transactions of the log as offset ranges per producer: a transactional
    batch of producer P at offset o is aborted when an aborted transaction of P started at
    or before o and its ABORT marker came after o (a producer has one transaction open at
    a time, so that transaction is the batch's). ``retained``: producers whose current
    transaction still has a batch in the cleaned log (its marker must stay). ``dropped_
    markers``: offsets of the markers this pass removed (their index entries go too: a
    consumer told of an aborted transaction drops its producer's batches until the
    marker)."""

    def __init__(self, entries: Iterable[AbortedTxn]) -> None:
        self.retained: set[int] = set()
        self.dropped_markers: set[int] = set()
        ranges: dict[int, list[tuple[int, int]]] = {}
        for entry in entries:
            ranges.setdefault(entry.producer_id, []).append((entry.first_offset, entry.last_offset))
        self._firsts = {pid: [first for first, _ in sorted(r)] for pid, r in ranges.items()}
        self._lasts = {pid: [last for _, last in sorted(r)] for pid, r in ranges.items()}

    def aborted(self, producer_id: int, offset: int) -> bool:
        firsts = self._firsts.get(producer_id)
        if firsts is None:
            return False
        at = bisect.bisect_right(firsts, offset) - 1
        return at >= 0 and offset < self._lasts[producer_id][at]


def _index_bytes(segment: Segment) -> int:
    total = 0
    for path in (segment.offset_index.path, segment.time_index.path):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total
