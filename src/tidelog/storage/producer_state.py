"""Idempotent-producer state of one partition, and its snapshot files.

For every producer id that wrote to the partition the state keeps its epoch and the
metadata of its last :data:`BATCHES_TO_RETAIN` batches (first/last sequence, first/last
offset, max timestamp). The broker checks each incoming client batch against it before
the append (:meth:`ProducerStateManager.check`) and records the batch after the append
(:meth:`ProducerStateManager.record`). Nothing here decodes records: every input is a
batch header.

Rules (Kafka's ``ProducerAppendInfo`` / ``ProducerStateEntry``):

* a batch whose epoch and exact sequence range equal one of the producer's retained
  batches is a duplicate: the caller answers with that batch's offsets, appends nothing;
* an epoch below the producer's current epoch: :class:`InvalidProducerEpochError`;
* a newer epoch must start at sequence 0 (:class:`OutOfOrderSequenceError` otherwise);
* the same epoch must continue at last sequence + 1, where ``Int32.MAX`` wraps to 0;
* a producer without state (new, or expired, or removed by retention) is accepted at any
  sequence (KIP-360: the broker no longer answers UNKNOWN_PRODUCER_ID).

Snapshot file ``<offset, 20 digits>.snapshot`` in the partition directory holds the state
of every batch below ``offset``. Layout (big-endian)::

    magic     4  b"TLPS"
    version   2  int16 = 1
    crc       4  uint32 CRC-32C of every byte after this field
    offset    8  int64 the log end offset the state covers
    count     4  int32 number of producers
    count times:
        producer_id       8 int64
        epoch             2 int16
        coordinator_epoch 4 int32 (-1 until transactions exist)
        txn_first_offset  8 int64 (-1 until transactions exist)
        last_timestamp    8 int64 max timestamp of the last batch
        last_update_ms    8 int64 broker time of the last append (-1 when unknown)
        batch_count       1 int8  0..5
        batch_count times:
            first_seq     4 int32
            last_seq      4 int32
            first_offset  8 int64
            last_offset   8 int64
            timestamp     8 int64

Snapshots are written to ``<name>.tmp``, fsynced, renamed, and the directory fsynced; log
recovery removes a ``.tmp`` left by a crash and leaves ``*.snapshot`` alone. They are
taken on a clean close and when a segment rolls (at the new segment's base offset); the
newest :data:`SNAPSHOTS_TO_KEEP` are kept. Loading takes the newest snapshot that parses
and lies at or below the log end offset (others above it are deleted: they describe data
a crash or a truncation removed), drops producers whose last batch is below the log start
offset, and rebuilds the rest by scanning batch headers from the snapshot offset to the
log end offset.

Expiry: a producer is removed when ``now - max(last_timestamp, last_update_ms) >=
producer.id.expiration.ms`` (Kafka uses the batch timestamp alone; the broker's own append
time is added so that producers sending old CreateTime timestamps do not expire at once).

A restart must not make a producer expire sooner than it would have without the restart.
The log does not record when the broker appended a batch, so a producer whose batches are
re-read from the log at load (the part after the snapshot, or the whole log when there is
none, as after a crash) counts as updated at the time of the load: the caller passes that
time (``now_ms`` of :meth:`ProducerStateManager.load`, :meth:`~ProducerStateManager.reload`,
:meth:`~ProducerStateManager.catch_up`, :meth:`~ProducerStateManager.truncate`; this module
reads no clock). A snapshot entry whose ``last_update_ms`` is unknown (-1) is treated the
same way. Replaying never moves ``last_update_ms`` back (a snapshot may hold a later time
than the load's). Since the log keeps no append times, the time given at a load is only
kept by a snapshot: the broker writes one after a load that replayed batches
(:attr:`ProducerStateManager.replayed`), or each crash would date the same batches again
and a broker crashing more often than ``producer.id.expiration.ms`` would keep an idle
producer forever.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from tidelog.records.batch import BatchHeader
from tidelog.storage.checkpoint import FsyncFn, write_durably
from tidelog.storage.errors import StorageError
from tidelog.storage.log import Log

_log = logging.getLogger(__name__)

BATCHES_TO_RETAIN = 5
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOTS_TO_KEEP = 2
#: Kafka's default ``producer.id.expiration.ms`` (one day).
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000
INT32_MAX = 2**31 - 1
NO_EPOCH = -1
NO_SEQUENCE = -1

_MAGIC = b"TLPS"
_VERSION = 1
_PREFIX = struct.Struct(">4shI")  # magic, version, crc
_BODY_HEAD = struct.Struct(">qi")  # offset, count
_PRODUCER = struct.Struct(">qhiqqqb")
_BATCH = struct.Struct(">iiqqq")


class ProducerStateError(StorageError):
    """A client batch that the producer state refuses."""


class InvalidProducerEpochError(ProducerStateError):
    """The batch's producer epoch is older than the producer's current epoch."""


class OutOfOrderSequenceError(ProducerStateError):
    """The batch's first sequence does not continue the producer's sequence."""


class CorruptSnapshotError(StorageError):
    """A snapshot file that does not follow the snapshot format."""


class BatchMetadata(NamedTuple):
    """One retained batch of a producer."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


class ProducerEntry:
    """What the partition knows about one producer id."""

    __slots__ = (
        "batches",
        "coordinator_epoch",
        "epoch",
        "last_timestamp",
        "last_update_ms",
        "producer_id",
        "txn_first_offset",
    )

    def __init__(self, producer_id: int, epoch: int) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.batches: deque[BatchMetadata] = deque(maxlen=BATCHES_TO_RETAIN)
        self.last_timestamp = -1
        self.last_update_ms = -1
        self.coordinator_epoch = -1
        self.txn_first_offset = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    def add(self, epoch: int, batch: BatchMetadata, now_ms: int) -> None:
        if epoch != self.epoch:
            # A new epoch starts a new sequence space: older batches can no longer match.
            self.epoch = epoch
            self.batches.clear()
        self.batches.append(batch)
        self.last_timestamp = batch.timestamp
        self.last_update_ms = now_ms


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """``next_seq`` directly follows ``last_seq`` (sequences wrap from Int32.MAX to 0)."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def list_snapshots(directory: Path) -> list[tuple[int, Path]]:
    """``(offset, path)`` of every snapshot file in ``directory``, oldest first."""
    found: list[tuple[int, Path]] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return found
    for name in names:
        if not name.endswith(SNAPSHOT_SUFFIX):
            continue
        stem = name[: -len(SNAPSHOT_SUFFIX)]
        if len(stem) == 20 and stem.isdigit():
            found.append((int(stem), directory / name))
    found.sort()
    return found


def encode_snapshot(offset: int, producers: Iterable[ProducerEntry]) -> bytes:
    entries = list(producers)
    body = bytearray(_BODY_HEAD.pack(offset, len(entries)))
    for entry in entries:
        body += _PRODUCER.pack(
            entry.producer_id,
            entry.epoch,
            entry.coordinator_epoch,
            entry.txn_first_offset,
            entry.last_timestamp,
            entry.last_update_ms,
            len(entry.batches),
        )
        for batch in entry.batches:
            body += _BATCH.pack(*batch)
    return _PREFIX.pack(_MAGIC, _VERSION, crc32c(body)) + bytes(body)


def decode_snapshot(data: bytes, source: str = "snapshot") -> tuple[int, list[ProducerEntry]]:
    """The offset and producers of a snapshot; :class:`CorruptSnapshotError` when bad."""
    if len(data) < _PREFIX.size + _BODY_HEAD.size:
        raise CorruptSnapshotError(f"{source}: {len(data)} bytes is too short")
    magic, version, crc = _PREFIX.unpack_from(data, 0)
    if magic != _MAGIC:
        raise CorruptSnapshotError(f"{source}: bad magic {magic!r}")
    if version != _VERSION:
        raise CorruptSnapshotError(f"{source}: unknown version {version}")
    body = memoryview(data)[_PREFIX.size :]
    if crc32c(body) != crc:
        raise CorruptSnapshotError(f"{source}: CRC mismatch")
    offset, count = _BODY_HEAD.unpack_from(body, 0)
    if offset < 0 or count < 0 or count * _PRODUCER.size > len(body):
        raise CorruptSnapshotError(f"{source}: bad offset {offset} or producer count {count}")
    pos = _BODY_HEAD.size
    entries: list[ProducerEntry] = []
    for _ in range(count):
        if len(body) - pos < _PRODUCER.size:
            raise CorruptSnapshotError(f"{source}: truncated producer entry at {pos}")
        pid, epoch, coordinator_epoch, txn_first, last_ts, last_update, n = _PRODUCER.unpack_from(
            body, pos
        )
        pos += _PRODUCER.size
        if not 0 <= n <= BATCHES_TO_RETAIN or len(body) - pos < n * _BATCH.size:
            raise CorruptSnapshotError(f"{source}: bad batch count {n} for producer {pid}")
        entry = ProducerEntry(pid, epoch)
        for _ in range(n):
            entry.batches.append(BatchMetadata._make(_BATCH.unpack_from(body, pos)))
            pos += _BATCH.size
        entry.coordinator_epoch = coordinator_epoch
        entry.txn_first_offset = txn_first
        entry.last_timestamp = last_ts
        entry.last_update_ms = last_update
        entries.append(entry)
    if pos != len(body):
        raise CorruptSnapshotError(f"{source}: {len(body) - pos} trailing bytes")
    return offset, entries


def scan_headers(log: Log, start_offset: int) -> Iterator[BatchHeader]:
    """Headers of the log's batches holding offsets >= ``start_offset``, oldest first.

    Reads batch headers only (64 KiB windows), never records.
    """
    cache = log.handle_cache
    for segment in log.segments:
        if segment.next_offset is not None and segment.next_offset <= start_offset:
            continue
        with cache.use(segment):
            found = segment.find_batch(start_offset)
            if found is None:
                continue
            for _, header in segment.iter_headers(found.position, segment.size):
                yield header


class ProducerStateManager:
    """The producer state of one partition (see the module docstring)."""

    def __init__(
        self,
        directory: Path,
        *,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        fsync: FsyncFn = os.fsync,
    ) -> None:
        self.directory = directory
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._fsync = fsync
        self.producers: dict[int, ProducerEntry] = {}
        #: Every batch below this offset has been applied.
        self.end_offset = 0
        #: Log start offset the state was last trimmed to.
        self.start_offset = 0
        #: Batches the last catch-up read back from the log (dated at its ``now_ms``).
        self.replayed = 0

    # -- loading -----------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        log: Log,
        *,
        now_ms: int,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        fsync: FsyncFn = os.fsync,
    ) -> ProducerStateManager:
        """The state of ``log``, loaded at broker time ``now_ms`` (see :meth:`reload`)."""
        state = cls(log.directory, producer_id_expiration_ms=producer_id_expiration_ms, fsync=fsync)
        state.reload(log, now_ms)
        return state

    def reload(self, log: Log, now_ms: int) -> None:
        """Rebuild from the newest usable snapshot plus a header scan up to the LEO.

        ``now_ms`` is the broker time of the load: producers of the scanned batches, and
        snapshot entries without a known update time, count as updated then (a restart
        must not make a producer expire sooner than it would have without it).
        """
        end = log.log_end_offset
        start = log.log_start_offset
        self.producers = {}
        self.end_offset = 0
        for offset, path in reversed(list_snapshots(self.directory)):
            if offset > end:
                # State of data the log no longer holds (truncation, or a crash that lost it).
                path.unlink(missing_ok=True)
                continue
            try:
                loaded_offset, entries = decode_snapshot(path.read_bytes(), str(path))
                if loaded_offset != offset:
                    raise CorruptSnapshotError(f"{path}: holds offset {loaded_offset}")
            except (OSError, CorruptSnapshotError) as exc:
                _log.warning("ignoring producer state snapshot %s: %s", path, exc)
                path.unlink(missing_ok=True)
                continue
            for entry in entries:
                if entry.last_update_ms < 0:
                    entry.last_update_ms = now_ms
            self.producers = {entry.producer_id: entry for entry in entries}
            self.end_offset = offset
            break
        self.start_offset = start
        self._evict_below(start)
        self.end_offset = max(self.end_offset, start)
        self.catch_up(log, now_ms)

    def catch_up(self, log: Log, now_ms: int) -> int:
        """Apply the batches between :attr:`end_offset` and the LEO; the number applied.

        The log does not keep append times: the producers of these batches count as
        updated at ``now_ms``, the broker time of the call.
        """
        end = log.log_end_offset
        self.replayed = 0
        if self.end_offset >= end:
            return 0
        applied = 0
        for header in scan_headers(log, self.end_offset):
            if header.last_offset < self.end_offset:
                continue
            self.apply_header(header, now_ms)
            applied += 1
        self.end_offset = max(self.end_offset, end)
        self.replayed = applied
        return applied

    def apply_header(self, header: BatchHeader, now_ms: int, timestamp: int | None = None) -> None:
        """Record a batch already in the log (its header carries its real offsets), read
        back at broker time ``now_ms``: the producer's update time never moves back (a
        snapshot may hold a later one than the time of the load)."""
        if header.producer_id >= 0 and not header.is_control:
            known = self.producers.get(header.producer_id)
            before = -1 if known is None else known.last_update_ms
            self.record(
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.last_sequence,
                header.base_offset,
                header.last_offset,
                header.max_timestamp if timestamp is None else timestamp,
                max(before, now_ms),
            )
        self.end_offset = max(self.end_offset, header.next_offset)

    # -- produce path ------------------------------------------------------------------

    def check(
        self, producer_id: int, epoch: int, first_seq: int, last_seq: int
    ) -> BatchMetadata | None:
        """Check a client batch before its append.

        Returns the retained batch it duplicates (append nothing, answer with its offsets)
        or None (append it); raises :class:`ProducerStateError` when it must be refused.
        """
        entry = self.producers.get(producer_id)
        if entry is None:
            return None
        duplicate = entry.find_duplicate(epoch, first_seq, last_seq)
        if duplicate is not None:
            return duplicate
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"epoch {epoch} of producer {producer_id} is older than its current epoch "
                f"{entry.epoch}"
            )
        if epoch != entry.epoch:
            if first_seq != 0 and entry.epoch != NO_EPOCH:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id} starts epoch {epoch} at sequence {first_seq}; "
                    "a new epoch must start at 0"
                )
        elif not in_sequence(entry.last_seq, first_seq):
            raise OutOfOrderSequenceError(
                f"out of order sequence {first_seq} for producer {producer_id} epoch {epoch}: "
                f"the last sequence written is {entry.last_seq}"
            )
        return None

    def record(
        self,
        producer_id: int,
        epoch: int,
        first_seq: int,
        last_seq: int,
        first_offset: int,
        last_offset: int,
        timestamp: int,
        now_ms: int,
    ) -> None:
        """Record an appended batch of ``producer_id``."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id, epoch)
        entry.add(
            epoch, BatchMetadata(first_seq, last_seq, first_offset, last_offset, timestamp), now_ms
        )
        if last_offset + 1 > self.end_offset:
            self.end_offset = last_offset + 1

    # -- expiry ------------------------------------------------------------------------

    def _evict_below(self, log_start_offset: int) -> int:
        gone = [
            pid
            for pid, entry in self.producers.items()
            if entry.last_offset < log_start_offset and entry.txn_first_offset < 0
        ]
        for pid in gone:
            del self.producers[pid]
        return len(gone)

    def on_log_start_offset(self, log_start_offset: int) -> int:
        """Forget producers whose last batch fell below the log start offset (retention,
        DeleteRecords); the number removed."""
        if log_start_offset <= self.start_offset:
            return 0
        self.start_offset = log_start_offset
        return self._evict_below(log_start_offset)

    def expire(self, now_ms: int) -> int:
        """Remove producers idle for ``producer.id.expiration.ms``; the number removed."""
        limit = self.producer_id_expiration_ms
        gone = [
            pid
            for pid, entry in self.producers.items()
            if entry.txn_first_offset < 0
            and now_ms - max(entry.last_timestamp, entry.last_update_ms) >= limit
        ]
        for pid in gone:
            del self.producers[pid]
        return len(gone)

    # -- snapshots ---------------------------------------------------------------------

    def take_snapshot(self, offset: int | None = None) -> Path:
        """Write the state as the snapshot at ``offset`` (default :attr:`end_offset`).

        ``offset`` may only differ from :attr:`end_offset` when the state describes exactly
        the batches below it. Older snapshots beyond :data:`SNAPSHOTS_TO_KEEP` are deleted.
        """
        at = self.end_offset if offset is None else offset
        path = snapshot_path(self.directory, at)
        write_durably(path, encode_snapshot(at, self.producers.values()), self._fsync)
        existing = list_snapshots(self.directory)
        for _, old in existing[:-SNAPSHOTS_TO_KEEP]:
            old.unlink(missing_ok=True)
        return path

    def truncate(self, log: Log, now_ms: int) -> None:
        """The log was truncated (or restarted) below :attr:`end_offset`: rebuild at broker
        time ``now_ms`` (see :meth:`reload`)."""
        self.reload(log, now_ms)
