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
  sequence (KIP-360: the broker no longer answers UNKNOWN_PRODUCER_ID), except for a
  transactional batch, which must then start at sequence 0 (KIP-890's check, which Kafka
  applies to transactions v2 producers: a late batch of an earlier transaction, whose
  producer state is gone, cannot start a new transaction here).

Transactions. A producer's first transactional batch after a marker (or ever) starts a
transaction on the partition: ``txn_first_offset`` holds its offset until a COMMIT or
ABORT marker (:meth:`ProducerStateManager.complete_txn`) ends it. While one is ongoing a
non-transactional batch from that producer is refused (:class:`InvalidTxnStateError`).
A marker is checked first (:meth:`ProducerStateManager.check_marker`, Kafka's rules for
transactions v0/v1): an epoch below the producer's is :class:`InvalidProducerEpochError`,
a coordinator epoch below the last one seen for the producer is
:class:`TransactionCoordinatorFencedError`. A marker is written even when the producer
has no ongoing transaction here (an abort of a transaction that wrote nothing to this
partition); it then completes nothing and indexes nothing, as in Kafka. The smallest
first offset of the ongoing transactions is :attr:`ProducerStateManager.first_unstable_offset`,
from which the partition derives its last stable offset. Producers with an ongoing
transaction never expire and are never dropped by retention. Snapshots keep
``txn_first_offset`` and the coordinator epoch; replaying the log after a snapshot
re-reads each marker's record (one small control record, the only records this module
ever reads) and re-adds the aborted-transaction index entry a crash may have lost.

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
        coordinator_epoch 4 int32 of the producer's last marker (-1: none seen)
        txn_first_offset  8 int64 first offset of its ongoing transaction (-1: none)
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
from tidelog.records.control import EndTransactionMarker, parse_end_txn_marker
from tidelog.records.errors import RecordsError
from tidelog.records.reader import iter_records
from tidelog.storage.checkpoint import FsyncFn, write_durably
from tidelog.storage.errors import StorageError
from tidelog.storage.log import Log
from tidelog.storage.txn_index import AbortedTxn

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


class InvalidTxnStateError(ProducerStateError):
    """A non-transactional batch from a producer with an ongoing transaction."""


class TransactionCoordinatorFencedError(ProducerStateError):
    """A marker whose coordinator epoch is older than the last one seen for its producer."""


class CompletedTxn(NamedTuple):
    """A transaction a marker ended on this partition."""

    producer_id: int
    first_offset: int
    #: The marker's offset.
    last_offset: int
    aborted: bool


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


def scan_headers(
    log: Log, start_offset: int
) -> Iterator[tuple[BatchHeader, EndTransactionMarker | None]]:
    """Headers of the log's batches holding offsets >= ``start_offset``, oldest first,
    each with its transaction marker when it is a COMMIT/ABORT control batch.

    Reads batch headers (64 KiB windows), and the one record of each transaction marker.
    """
    cache = log.handle_cache
    for segment in log.segments:
        if segment.next_offset is not None and segment.next_offset <= start_offset:
            continue
        with cache.use(segment):
            found = segment.find_batch(start_offset)
            if found is None:
                continue
            for position, header in segment.iter_headers(found.position, segment.size):
                marker = None
                if header.is_control and header.is_transactional:
                    marker = _read_marker(segment.read_batch(position, header.size), header)
                yield header, marker


def _read_marker(data: bytes, header: BatchHeader) -> EndTransactionMarker | None:
    """The marker of a control batch; None when it holds none (a cleaned, empty one) or
    is not a transaction marker."""
    try:
        for record in iter_records(data, 0, header=header, verify_crc=False):
            return parse_end_txn_marker(record.key, record.value)
    except RecordsError as exc:
        _log.warning("control batch at offset %d is not a marker: %s", header.base_offset, exc)
    return None


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
        #: producer id -> first offset of its ongoing transaction.
        self.ongoing: dict[int, int] = {}
        #: The smallest first offset of an ongoing transaction (None when there is none).
        #: A plain attribute, so a thread reading it (retention) never walks a changing dict.
        self.first_unstable_offset: int | None = None
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
        self.ongoing = {}
        self.first_unstable_offset = None
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
            self.ongoing = {
                entry.producer_id: entry.txn_first_offset
                for entry in entries
                if entry.txn_first_offset >= 0
            }
            self._ongoing_changed()
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
        for header, marker in scan_headers(log, self.end_offset):
            if header.last_offset < self.end_offset:
                continue
            completed = self.apply_header(header, now_ms, marker=marker)
            if completed is not None and completed.aborted:
                # A crash may have lost the entry written with the marker.
                log.append_aborted_txn(self.aborted_entry(completed), if_absent=True)
            applied += 1
        self.end_offset = max(self.end_offset, end)
        self.replayed = applied
        return applied

    def apply_header(
        self,
        header: BatchHeader,
        now_ms: int,
        timestamp: int | None = None,
        marker: EndTransactionMarker | None = None,
    ) -> CompletedTxn | None:
        """Record a batch already in the log (its header carries its real offsets), read
        back at broker time ``now_ms``: the producer's update time never moves back (a
        snapshot may hold a later one than the time of the load). ``marker`` is the
        transaction marker a control batch holds; the transaction it completes is
        returned. Nothing is checked: the log holds what was accepted."""
        completed = None
        if header.producer_id >= 0:
            known = self.producers.get(header.producer_id)
            before = -1 if known is None else known.last_update_ms
            if not header.is_control:
                self.record(
                    header.producer_id,
                    header.producer_epoch,
                    header.base_sequence,
                    header.last_sequence,
                    header.base_offset,
                    header.last_offset,
                    header.max_timestamp if timestamp is None else timestamp,
                    max(before, now_ms),
                    transactional=header.is_transactional,
                )
            elif marker is not None:
                completed = self.complete_txn(
                    header.producer_id,
                    header.producer_epoch,
                    marker.coordinator_epoch,
                    header.base_offset,
                    commit=marker.commit,
                    timestamp=header.max_timestamp if timestamp is None else timestamp,
                    now_ms=max(before, now_ms),
                )
        self.end_offset = max(self.end_offset, header.next_offset)
        return completed

    # -- produce path ------------------------------------------------------------------

    def check(
        self,
        producer_id: int,
        epoch: int,
        first_seq: int,
        last_seq: int,
        *,
        transactional: bool = False,
    ) -> BatchMetadata | None:
        """Check a client batch before its append.

        Returns the retained batch it duplicates (append nothing, answer with its offsets)
        or None (append it); raises :class:`ProducerStateError` when it must be refused.
        """
        entry = self.producers.get(producer_id)
        if entry is None:
            if transactional and first_seq != 0:
                raise OutOfOrderSequenceError(
                    f"transactional producer {producer_id} has no state on this partition and "
                    f"starts at sequence {first_seq}; expected 0"
                )
            return None
        duplicate = entry.find_duplicate(epoch, first_seq, last_seq)
        if duplicate is not None:
            return duplicate
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"epoch {epoch} of producer {producer_id} is older than its current epoch "
                f"{entry.epoch}"
            )
        if entry.txn_first_offset >= 0 and not transactional:
            raise InvalidTxnStateError(
                f"non-transactional batch from producer {producer_id}, whose transaction "
                f"started at offset {entry.txn_first_offset} is ongoing"
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
        *,
        transactional: bool = False,
    ) -> None:
        """Record an appended batch of ``producer_id``; a transactional one starts the
        producer's transaction when none is ongoing."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id, epoch)
        entry.add(
            epoch, BatchMetadata(first_seq, last_seq, first_offset, last_offset, timestamp), now_ms
        )
        if transactional and entry.txn_first_offset < 0:
            entry.txn_first_offset = first_offset
            self.ongoing[producer_id] = first_offset
            self._ongoing_changed()
        if last_offset + 1 > self.end_offset:
            self.end_offset = last_offset + 1

    # -- transactions ------------------------------------------------------------------

    def has_ongoing_txn(self, producer_id: int, epoch: int) -> bool:
        """Whether ``producer_id`` has a transaction ongoing here, at ``epoch``."""
        entry = self.producers.get(producer_id)
        return entry is not None and entry.txn_first_offset >= 0 and entry.epoch == epoch

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> None:
        """Check a COMMIT/ABORT marker before its append (Kafka's rules for transaction
        versions 0 and 1); raises :class:`ProducerStateError` to refuse it."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"marker epoch {epoch} of producer {producer_id} is older than its current "
                f"epoch {entry.epoch}"
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"marker coordinator epoch {coordinator_epoch} for producer {producer_id} is "
                f"older than the last one seen, {entry.coordinator_epoch}"
            )

    def complete_txn(
        self,
        producer_id: int,
        epoch: int,
        coordinator_epoch: int,
        marker_offset: int,
        *,
        commit: bool,
        timestamp: int,
        now_ms: int,
    ) -> CompletedTxn | None:
        """Record the marker at ``marker_offset``; the transaction it ends, if one was
        ongoing here."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id, epoch)
        if epoch != entry.epoch:
            entry.epoch = epoch
            entry.batches.clear()
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp = timestamp
        entry.last_update_ms = max(entry.last_update_ms, now_ms)
        completed = None
        if entry.txn_first_offset >= 0:
            completed = CompletedTxn(producer_id, entry.txn_first_offset, marker_offset, not commit)
            entry.txn_first_offset = -1
            del self.ongoing[producer_id]
            self._ongoing_changed()
        if marker_offset + 1 > self.end_offset:
            self.end_offset = marker_offset + 1
        return completed

    def aborted_entry(self, completed: CompletedTxn) -> AbortedTxn:
        """The transaction index entry of an aborted transaction just completed: its LSO is
        the first offset of the transactions still ongoing, or the offset after the
        marker."""
        lso = self.first_unstable_offset
        return AbortedTxn(
            completed.producer_id,
            completed.first_offset,
            completed.last_offset,
            completed.last_offset + 1 if lso is None else lso,
        )

    def _ongoing_changed(self) -> None:
        self.first_unstable_offset = min(self.ongoing.values()) if self.ongoing else None

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
