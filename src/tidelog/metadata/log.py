"""The metadata log: metadata records in a storage :class:`~tidelog.storage.Log`.

Layout: ``<metadata.log.dir>/__cluster_metadata-0/`` (the metadata log dir defaults to
the first log dir), an ordinary partition log of record batches. Each batch holds the
records of one controller operation (value: :func:`~tidelog.metadata.records.encode_record`,
key null, uncompressed), so an operation is applied whole or not at all: a batch torn by
a crash fails its CRC and storage recovery truncates it when the log is opened.

Durability: :meth:`MetadataLog.append` returns only after the batch is fsynced, before
the caller applies it to the image, so nothing the controller acknowledged is lost and
nothing lost was acknowledged.

This module knows nothing of the controller: a Raft quorum replicates the same log
(:class:`~tidelog.metadata.raft_log.FileRaftLog` appends batches that keep their offsets,
the leader epoch of each batch is its Raft epoch, and flushes, truncates and trims it
through the methods below) and brokers can replay it the same way.

Retention: nothing deletes metadata batches by age or size; the log before a Raft snapshot
is deleted when the snapshot is written (:meth:`MetadataLog.delete_before`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.metadata.errors import MetadataRecordError
from tidelog.metadata.image import MetadataDelta, MetadataImage
from tidelog.metadata.records import MetadataRecord, decode_record, encode_record
from tidelog.records.batch import iter_batches
from tidelog.records.builder import BatchBuilder
from tidelog.records.errors import RecordsError
from tidelog.records.reader import iter_records
from tidelog.storage.checkpoint import FsyncFn
from tidelog.storage.config import LONG_MAX, LogConfig
from tidelog.storage.log import Log, RecoveryReport

__all__ = ["METADATA_PARTITION", "METADATA_TOPIC", "MetadataBatch", "MetadataLog"]

METADATA_TOPIC = "__cluster_metadata"
METADATA_PARTITION = 0
# Reads during replay go in pieces of this size (a larger batch is read whole).
_READ_BYTES = 1 << 20

# Never deleted by retention; batches are as large as an operation needs (a topic with
# many partitions), bounded by the controller's per-operation limit.
METADATA_LOG_CONFIG = LogConfig(
    segment_bytes=64 * 1024 * 1024,
    segment_ms=LONG_MAX,
    retention_ms=-1,
    retention_bytes=-1,
    max_message_bytes=2**31 - 1,
)


@dataclass(frozen=True)
class MetadataBatch:
    """One batch of the metadata log, as the loader consumes it.

    A control batch (Raft's leader-change and snapshot markers, written by the quorum,
    not the controller) has no metadata records: ``records`` is empty and ``is_control``
    set, and it only moves the log position on.
    """

    base_offset: int
    last_offset: int
    #: The leader epoch the batch was written in (the Raft epoch).
    epoch: int
    records: tuple[tuple[int, MetadataRecord], ...]
    is_control: bool = False

    def apply_to(self, image: MetadataImage) -> tuple[MetadataImage, MetadataDelta | None]:
        """``image`` after this batch, and the delta (None for a control batch, which
        changes nothing but the image's offset and epoch)."""
        if self.is_control or not self.records:
            return image.advanced_to(self.last_offset, self.epoch), None
        return image.apply(self.records, epoch=self.epoch)


class MetadataLog:
    """Appends metadata record batches durably and reads them back in order."""

    def __init__(self, log: Log, clock: Callable[[], int]) -> None:
        self._log = log
        self._clock = clock

    @classmethod
    def open(
        cls,
        metadata_log_dir: str | Path,
        *,
        clock: Callable[[], int],
        fsync: FsyncFn = os.fsync,
        segment_bytes: int | None = None,
    ) -> MetadataLog:
        """Open (creating when absent) ``<metadata_log_dir>/__cluster_metadata-0``.

        Every batch is re-checked on open (the log is small and must be exact): a torn or
        corrupt tail is truncated by storage recovery (see :attr:`recovery_report`).
        ``segment_bytes`` (Kafka's ``metadata.log.segment.bytes``) overrides the segment
        size, so that snapshots can delete whole segments of a small log.
        """
        directory = Path(metadata_log_dir) / f"{METADATA_TOPIC}-{METADATA_PARTITION}"
        config = METADATA_LOG_CONFIG
        if segment_bytes is not None:
            config = dataclasses.replace(config, segment_bytes=segment_bytes)
        log = Log.open(
            directory,
            config,
            topic=METADATA_TOPIC,
            partition=METADATA_PARTITION,
            clock=clock,
            clean_shutdown=False,
            fsync=fsync,
        )
        return cls(log, clock)

    @property
    def directory(self) -> Path:
        return self._log.directory

    @property
    def recovery_report(self) -> RecoveryReport:
        return self._log.recovery_report

    @property
    def end_offset(self) -> int:
        """The offset the next record gets."""
        return self._log.log_end_offset

    # -- writing -----------------------------------------------------------------------

    @staticmethod
    def build_batch(records: Sequence[MetadataRecord], timestamp: int) -> bytes:
        """One record batch holding ``records`` (base offset 0; the log assigns offsets)."""
        if not records:
            raise ValueError("a metadata batch holds at least one record")
        builder = BatchBuilder()
        for record in records:
            builder.append(None, encode_record(record), timestamp=timestamp)
        return builder.close()

    def append(self, records: Sequence[MetadataRecord], *, leader_epoch: int = 0) -> int:
        """Append ``records`` as one batch, fsync it, and return its first offset."""
        batch = self.build_batch(records, self._clock())
        info = self._log.append(batch, leader_epoch=leader_epoch, durable=True)
        return info.first_offset

    def append_batches_as_follower(
        self, batches: bytes | bytearray | memoryview, *, durable: bool = True
    ) -> int:
        """Append batches that keep their offsets (replication); returns the new end.

        Durable on return unless ``durable`` is false (Raft appends, then calls
        :meth:`sync` once for everything appended since)."""
        self._log.append_as_follower(batches, durable=durable)
        return self._log.log_end_offset

    # -- what Raft needs of the partition log -------------------------------------------

    @property
    def start_offset(self) -> int:
        """The first offset the log holds (it moves with :meth:`delete_before`)."""
        return self._log.log_start_offset

    @property
    def durable_end_offset(self) -> int:
        """Everything below this offset is fsynced (the storage log's recovery point)."""
        return min(self._log.recovery_point, self._log.log_end_offset)

    def sync(self) -> None:
        """fsync everything appended (concurrent callers share the fsync)."""
        self._log.sync()

    def read_bytes(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding ``offset``: at least one, then while within
        ``max_bytes``; empty at the log end."""
        return self._log.read_bytes(offset, max_bytes, whole_batches=True)

    def batch_base_offset(self, offset: int) -> int:
        """The base offset of the batch holding ``offset`` (start <= offset < end)."""
        piece = self._log.read(offset, 0)
        if piece is None:
            raise ValueError(f"no batch holds offset {offset} (log end {self.end_offset})")
        with piece:
            return piece.first_offset

    def epoch_starts(self) -> list[tuple[int, int]]:
        """The leader-epoch cache (``leader-epoch-checkpoint``): (epoch, first offset) for
        each epoch the log holds, oldest first."""
        return [(entry.epoch, entry.start_offset) for entry in self._log.epoch_cache.entries]

    def repair_epoch_cache(self) -> bool:
        """Check the leader-epoch cache against the batches' partitionLeaderEpoch and rebuild
        it when they disagree (a lost or damaged ``leader-epoch-checkpoint``: the storage
        log treats it as derived data, Raft relies on it). True when it was rebuilt."""
        start, end = self._log.log_start_offset, self._log.log_end_offset
        starts: list[tuple[int, int]] = []
        offset = start
        while offset < end:
            data = self._log.read_bytes(offset, _READ_BYTES, whole_batches=True)
            if not data:
                break
            for _, header in iter_batches(data, verify_crc=False):
                epoch = header.partition_leader_epoch
                if epoch >= 0 and (not starts or epoch > starts[-1][0]):
                    starts.append((epoch, max(header.base_offset, start)))
                offset = header.next_offset
        if starts == self.epoch_starts():
            return False
        cache = self._log.epoch_cache
        cache.clear_and_flush()
        for epoch, first in starts:
            cache.assign(epoch, first)
        return True

    def epoch_of(self, offset: int) -> int:
        """The leader epoch of the batch holding ``offset`` (-1 when none is known)."""
        return self._log.epoch_cache.epoch_for_offset(offset)

    @property
    def latest_epoch(self) -> int:
        return self._log.latest_epoch

    def truncate_to(self, offset: int) -> None:
        """Remove every batch holding an offset at or after ``offset``; durable on return."""
        self._log.truncate_to(offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every batch; the log starts again, empty, at ``offset``."""
        self._log.truncate_fully_and_start_at(offset)

    def delete_before(self, offset: int) -> None:
        """Move the log start up to ``offset`` and delete the segments wholly below it."""
        self._log.delete_records(offset)

    # -- reading -----------------------------------------------------------------------

    def batches(self, start: int = 0) -> Iterator[MetadataBatch]:
        """Every batch from offset ``start`` on, control batches included, in log order.

        Raises MetadataRecordError for a batch or record that does not decode (storage
        recovery has already dropped torn tails, so this means damage inside the log).
        """
        offset = max(start, self._log.log_start_offset)
        end = self._log.log_end_offset
        while offset < end:
            data = self._log.read_bytes(offset, _READ_BYTES, whole_batches=True)
            if not data:
                break
            try:
                for position, header in iter_batches(data):
                    if header.next_offset <= offset:
                        continue
                    entries: list[tuple[int, MetadataRecord]] = []
                    if not header.is_control:
                        for record in iter_records(data, position, header=header):
                            if record.offset >= offset:
                                entries.append((record.offset, decode_record(record.value)))
                    offset = header.next_offset
                    yield MetadataBatch(
                        header.base_offset,
                        header.last_offset,
                        header.partition_leader_epoch,
                        tuple(entries),
                        header.is_control,
                    )
            except RecordsError as exc:
                raise MetadataRecordError(
                    f"metadata log batch near offset {offset} does not decode: {exc}"
                ) from exc

    def read_batches(self, start: int = 0) -> Iterator[list[tuple[int, MetadataRecord]]]:
        """The metadata records from offset ``start`` on, batch by batch, as (offset,
        record); control batches are skipped. See :meth:`batches`."""
        for batch in self.batches(start):
            if batch.records:
                yield list(batch.records)

    def replay(self, image: MetadataImage) -> MetadataImage:
        """``image`` with every batch after ``image.offset`` applied (see
        :class:`~tidelog.metadata.loader.MetadataLoader`, which also tells publishers)."""
        for batch in self.batches(image.offset + 1):
            image, _ = batch.apply_to(image)
        return image

    def close(self) -> None:
        self._log.close()
