"""The partitions this broker leads, each a storage log plus its leader state.

On a single node every partition's replica set is this broker, the ISR is this broker,
and the high watermark is the log end offset: a record is committed once it is in the
log (Kafka's rule with an ISR of one). ``acks=all`` additionally waits for the fsync,
which is this broker's replacement for replication (ARCHITECTURE.md §3).

Appends run on the event loop thread, synchronously, in request order: a write into the
page cache is short, and doing it inline keeps the order of pipelined produce requests.
Only the fsync of a durable append is handed to a worker thread, where concurrent
callers share one fsync through the log's group commit.

Fetch long polls wait on :meth:`Partition.wait_for_data`, which every append wakes.

Each partition also owns its idempotent-producer state
(:class:`~tidelog.storage.producer_state.ProducerStateManager`), loaded when the partition
is opened. :meth:`Partition.check_producer` runs before a client append and
:meth:`Partition.append` records the appended batches in it. A snapshot of it is written
when a segment rolls (at the new segment's base offset, before the batches that rolled it
are recorded) and by :meth:`Partition.close` on a clean shutdown. The state follows the
log: when the log end offset moved without this class (truncation, replication), the
next call catches up or rebuilds from the snapshots.

Transactions. The producer state tracks each producer's ongoing transaction;
:meth:`Partition.append_txn_marker` (WriteTxnMarkers, the transaction coordinator) appends a
COMMIT or ABORT control batch that ends it, and indexes an aborted one in the segment's
``.txnindex``. :attr:`Partition.last_stable_offset` (LSO) is the smallest first offset of
an ongoing transaction, capped by the high watermark; a transaction whose marker is not
yet below the high watermark still holds it back (Kafka's rule, for replication: until
then a read_committed consumer could not tell whether to drop it). Retention never deletes,
and the cleaner never cleans, at or above the LSO, so an open transaction's batches stay.

A failing disk. When the log manager takes a log dir offline after an I/O error
(:mod:`tidelog.storage.manager`), the partitions on it stay here, :attr:`Partition.offline`:
requests for them get KAFKA_STORAGE_ERROR (:meth:`Partition.storage_error`), their long
polls are woken (:meth:`Partitions.wake_offline`), and :meth:`Partitions.ensure` keeps
returning the offline partition rather than creating an empty log for it elsewhere. A
producer-state snapshot that fails takes the dir offline too, and fails the append that
rolled (Kafka writes it as part of the roll).

Loading, catching up and rebuilding happen at a broker time: the caller's ``now_ms`` when
it has one, else the log's clock (the broker's clock, injected into the log manager).
Producers re-read from the log count as updated then, so a restart (or a rebuild) never
makes a producer expire sooner than it would have without it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from tidelog.metadata.errors import ApiError
from tidelog.protocol import ErrorCode
from tidelog.records import BatchHeader, iter_batches
from tidelog.records.control import build_end_txn_marker_batch
from tidelog.storage import AppendInfo, Log, LogConfig, LogDirOfflineError, LogManager
from tidelog.storage.errors import is_disk_failure
from tidelog.storage.producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    BatchMetadata,
    InvalidProducerEpochError,
    ProducerEntry,
    ProducerStateManager,
    TransactionCoordinatorFencedError,
)

_log = logging.getLogger(__name__)

#: Kafka's ``producer.id.expiration.check.interval.ms``.
PRODUCER_EXPIRATION_CHECK_INTERVAL_MS = 600_000


def kafka_uuid_string(value: uuid.UUID) -> str:
    """A UUID as Kafka prints topic ids (URL-safe base64, no padding), e.g. in
    ``partition.metadata``."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode("ascii")


class PartitionError(Exception):
    """A partition operation refused with a Kafka error code (``code``)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def api_error(self) -> ApiError:
        return ApiError(self.code, str(self))


@dataclass(frozen=True, slots=True)
class TopicPartition:
    topic: str
    partition: int


class Partition:
    """One partition led by this broker."""

    def __init__(
        self,
        log: Log,
        *,
        topic_id: uuid.UUID | None,
        leader_epoch: int,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ) -> None:
        self.log = log
        self.topic = log.topic
        self.index = log.partition
        self.topic_id = topic_id
        self.leader_epoch = leader_epoch
        self._data_arrived: asyncio.Event | None = None
        self.producers = ProducerStateManager.load(
            log, now_ms=log.clock(), producer_id_expiration_ms=producer_id_expiration_ms
        )
        if self.producers.replayed:
            # Producers read back from the log (after a crash) are dated at this load; a
            # snapshot keeps that date, else every crash would date them again and a broker
            # crashing often would never let an idle producer expire.
            self._snapshot(None)
        self._active_base = log.active_segment.base_offset
        self._next_expiry_check_ms = -1
        #: (first offset, marker offset) of transactions completed with a marker not yet
        #: below the high watermark, oldest first: they still hold the LSO back.
        self._unreplicated: deque[tuple[int, int]] = deque()
        log.stable_offset = self._stable_offset

    @property
    def high_watermark(self) -> int:
        return self.log.log_end_offset

    @property
    def offline(self) -> bool:
        """Whether the partition's log dir went offline after an I/O error."""
        return self.log.offline_cause is not None

    def storage_error(self) -> PartitionError:
        """KAFKA_STORAGE_ERROR naming the offline dir and the error that took it offline."""
        cause = self.log.offline_cause
        return PartitionError(
            ErrorCode.KAFKA_STORAGE_ERROR,
            f"{self.topic}-{self.index} is on log dir {self.log.directory.parent}, offline "
            f"after an I/O error: {cause}",
        )

    @property
    def last_stable_offset(self) -> int:
        """The offset below which every transaction has ended (and its marker is below the
        high watermark): read_committed consumers read up to here."""
        producers = self.producers
        if producers.end_offset != self.log.log_end_offset:
            self._follow_log(self.log.clock())
        high_watermark = self.high_watermark
        lso = high_watermark
        first = producers.first_unstable_offset
        if first is not None and first < lso:
            lso = first
        pending = self._unreplicated
        while pending and pending[0][1] < high_watermark:
            pending.popleft()
        for first_offset, _ in pending:
            lso = min(lso, first_offset)
        # DeleteRecords may move the log start past an open transaction's first offset:
        # the LSO never points below the log (Kafka's rule).
        return max(lso, self.log.log_start_offset)

    def _stable_offset(self) -> int:
        # The LSO for retention and the cleaner, possibly off the event loop: reads
        # attributes only (last_stable_offset may rebuild the producer state).
        first = self.producers.first_unstable_offset
        pending = self._unreplicated
        limits = [self.log.high_watermark]
        if first is not None:
            limits.append(first)
        with contextlib.suppress(IndexError):  # emptied by the event loop meanwhile
            limits.append(pending[0][0])
        return min(limits)

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    def append(
        self,
        batches: bytearray | memoryview,
        *,
        headers: list[BatchHeader] | None = None,
        now_ms: int = -1,
        keys_checked: bool = False,
    ) -> AppendInfo:
        """Append validated batches as leader (offsets assigned in place); wakes fetchers.

        ``headers`` are the headers of ``batches`` when the caller already parsed them.
        Batches with a producer id are recorded in the producer state; ``now_ms`` is the
        broker time of the append (for producer expiry). ``keys_checked``: the caller
        already refused keyless records (compacted topics), so the log does not decode
        the records again (see :meth:`Log.append`). Without ``now_ms`` the log's clock
        gives the time.
        """
        if now_ms < 0:
            now_ms = self.log.clock()
        self._follow_log(now_ms)
        if headers is None:
            headers = [header for _, header in iter_batches(batches, verify_crc=False)]
        info = self.log.append(batches, leader_epoch=self.leader_epoch, keys_checked=keys_checked)
        self._snapshot_if_rolled(info)
        producers = self.producers
        offset = info.first_offset
        append_time = info.log_append_time
        for header in headers:
            last = offset + header.last_offset_delta
            if header.producer_id >= 0 and not header.is_control:
                producers.record(
                    header.producer_id,
                    header.producer_epoch,
                    header.base_sequence,
                    header.last_sequence,
                    offset,
                    last,
                    append_time if append_time >= 0 else header.max_timestamp,
                    now_ms,
                    transactional=header.is_transactional,
                )
            offset = last + 1
        producers.end_offset = max(producers.end_offset, info.last_offset + 1)
        self._wake()
        return info

    def _snapshot_if_rolled(self, info: AppendInfo) -> None:
        active_base = self.log.active_segment.base_offset
        if active_base != self._active_base:
            self._active_base = active_base
            if active_base == info.first_offset and self.producers.end_offset == active_base:
                # The append rolled: snapshot the state of everything below the new segment.
                failure = self._snapshot(active_base)
                if failure is not None:
                    raise failure

    # -- transactions ------------------------------------------------------------------

    def append_txn_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        now_ms: int,
    ) -> int:
        """Append a COMMIT (``commit``) or ABORT marker for ``producer_id`` and end its
        ongoing transaction here; returns the marker's offset.

        Raises :class:`PartitionError` with INVALID_PRODUCER_EPOCH for an epoch older than
        the producer's, TRANSACTION_COORDINATOR_FENCED for a coordinator epoch older than
        the last one seen for it. A producer without an ongoing transaction here still
        gets its marker (Kafka writes it; it then ends nothing and indexes nothing).
        Storage errors propagate (:class:`~tidelog.storage.StorageError`, ``OSError``).
        """
        self._follow_log(now_ms)
        producers = self.producers
        try:
            producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
        except InvalidProducerEpochError as exc:
            raise PartitionError(ErrorCode.INVALID_PRODUCER_EPOCH, str(exc)) from exc
        except TransactionCoordinatorFencedError as exc:
            raise PartitionError(ErrorCode.TRANSACTION_COORDINATOR_FENCED, str(exc)) from exc
        batch = build_end_txn_marker_batch(
            commit=commit,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            coordinator_epoch=coordinator_epoch,
            timestamp=now_ms,
        )
        info = self.log.append(bytearray(batch), leader_epoch=self.leader_epoch)
        self._snapshot_if_rolled(info)
        offset = info.first_offset
        completed = producers.complete_txn(
            producer_id,
            producer_epoch,
            coordinator_epoch,
            offset,
            commit=commit,
            timestamp=info.log_append_time if info.log_append_time >= 0 else now_ms,
            now_ms=now_ms,
        )
        if completed is not None:
            if completed.aborted:
                self.log.append_aborted_txn(producers.aborted_entry(completed))
            if offset >= self.high_watermark:
                self._unreplicated.append((completed.first_offset, offset))
        self._wake()
        return offset

    def has_ongoing_txn(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether the producer, at this epoch, has a transaction ongoing here (a produce
        that continues it needs no verification with the coordinator)."""
        self._follow_log(self.log.clock())
        return self.producers.has_ongoing_txn(producer_id, producer_epoch)

    def aborted_transactions(self, first_offset: int, max_offset: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions a read_committed fetch
        returning the batches from ``first_offset`` up to ``max_offset`` must report."""
        return [
            (entry.producer_id, entry.first_offset)
            for entry in self.log.aborted_transactions(first_offset, max_offset)
        ]

    # -- idempotent producers ----------------------------------------------------------

    def check_producer(self, header: BatchHeader, now_ms: int) -> BatchMetadata | None:
        """Check a client batch against the producer state (before :meth:`append`).

        Returns the retained batch it duplicates, or None; raises
        :class:`~tidelog.storage.producer_state.ProducerStateError` to refuse it.
        """
        self._follow_log(now_ms)
        self.maybe_expire_producers(now_ms)
        return self.producers.check(
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            header.last_sequence,
            transactional=header.is_transactional,
        )

    def set_producer_id_expiration_ms(self, expiration_ms: int) -> None:
        """Apply a new ``producer.id.expiration.ms`` (a dynamic broker config) from the
        next expiry check on."""
        self.producers.producer_id_expiration_ms = expiration_ms

    def active_producers(self, now_ms: int) -> list[ProducerEntry]:
        """The producers the partition holds state for (DescribeProducers), by id."""
        self._follow_log(now_ms)
        self.maybe_expire_producers(now_ms)
        return sorted(self.producers.producers.values(), key=lambda e: e.producer_id)

    def maybe_expire_producers(self, now_ms: int) -> None:
        """Apply retention and ``producer.id.expiration.ms`` to the producer state, at most
        once per check interval."""
        producers = self.producers
        producers.on_log_start_offset(self.log.log_start_offset)
        if now_ms >= self._next_expiry_check_ms:
            self._next_expiry_check_ms = now_ms + PRODUCER_EXPIRATION_CHECK_INTERVAL_MS
            producers.expire(now_ms)

    def _follow_log(self, now_ms: int) -> None:
        """Bring the producer state to the log end offset; batches it reads from the log
        count as appended at ``now_ms``."""
        producers = self.producers
        leo = self.log.log_end_offset
        if leo == producers.end_offset:
            return
        if leo > producers.end_offset:
            producers.catch_up(self.log, now_ms)
        else:
            producers.truncate(self.log, now_ms)
        self._active_base = self.log.active_segment.base_offset

    def truncate_to(self, offset: int) -> bool:
        """Truncate the log (see :meth:`Log.truncate_to`) and rebuild the producer state."""
        truncated = self.log.truncate_to(offset)
        if truncated:
            # Markers above the offset are gone: their transactions are open again.
            self._unreplicated.clear()
            self.producers.truncate(self.log, self.log.clock())
            self._active_base = self.log.active_segment.base_offset
            self._wake()
        return truncated

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.log.truncate_fully_and_start_at(offset)
        self._unreplicated.clear()
        self.producers.truncate(self.log, self.log.clock())
        self._active_base = self.log.active_segment.base_offset
        self._wake()

    def close(self) -> None:
        """Snapshot the producer state (clean shutdown); call before closing the log."""
        if self.log.closed:
            return
        self._follow_log(self.log.clock())
        self._snapshot(None)

    def _snapshot(self, offset: int | None) -> LogDirOfflineError | None:
        # A snapshot only shortens the next load (the state is rebuilt from the log), but
        # a failed write means the disk cannot be trusted: the log dir goes offline, and
        # the error is returned for the caller to fail what it was doing.
        # The txn indexes go first: replay after the snapshot no longer re-adds their entries.
        try:
            self.log.flush_txn_indexes()
            self.producers.take_snapshot(offset)
        except LogDirOfflineError as exc:
            return exc
        except OSError as exc:
            _log.error(
                "%s-%d: could not write a producer state snapshot: %s", self.topic, self.index, exc
            )
            if is_disk_failure(exc):
                return self.log.report_io_error(exc)
        return None

    async def make_durable(self, end_offset: int) -> None:
        """Return once everything below ``end_offset`` is fsynced (group commit)."""
        if self.log.recovery_point >= end_offset:
            return
        await asyncio.to_thread(self.log.sync, end_offset)

    def _wake(self) -> None:
        event = self._data_arrived
        if event is not None:
            self._data_arrived = None
            event.set()

    def data_arrived(self) -> asyncio.Event:
        """An event set by the next append (one shared event per wait round)."""
        if self._data_arrived is None:
            self._data_arrived = asyncio.Event()
        return self._data_arrived

    def wake_waiters(self) -> None:
        """Wake long polls without an append (truncation, deletion, shutdown)."""
        self._wake()


class Partitions:
    """Every partition this broker leads, backed by one :class:`LogManager`."""

    def __init__(self, logs: LogManager) -> None:
        self.logs = logs
        self._partitions: dict[TopicPartition, Partition] = {}

    def __len__(self) -> int:
        return len(self._partitions)

    def __iter__(self) -> Iterator[Partition]:
        return iter(list(self._partitions.values()))

    def get(self, topic: str, partition: int) -> Partition | None:
        return self._partitions.get(TopicPartition(topic, partition))

    def of_topic(self, topic: str) -> list[Partition]:
        return sorted(
            (p for tp, p in self._partitions.items() if tp.topic == topic),
            key=lambda p: p.index,
        )

    def ensure(
        self,
        topic: str,
        partition: int,
        *,
        config: LogConfig,
        topic_id: uuid.UUID | None,
        leader_epoch: int,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ) -> Partition:
        """The partition, its log opened or created on first use.

        ``producer_id_expiration_ms`` (the broker's ``producer.id.expiration.ms``) applies
        to a partition created by this call; an existing one keeps its producer state.
        """
        key = TopicPartition(topic, partition)
        existing = self._partitions.get(key)
        if existing is not None:
            existing.leader_epoch = leader_epoch
            return existing
        log = self.logs.get_or_create_log(
            topic, partition, config, topic_id=kafka_uuid_string(topic_id) if topic_id else None
        )
        # A log opened before this call (found on disk at start) takes the topic's settings.
        log.update_config(config)
        created = Partition(
            log,
            topic_id=topic_id,
            leader_epoch=leader_epoch,
            producer_id_expiration_ms=producer_id_expiration_ms,
        )
        self._partitions[key] = created
        return created

    def close(self) -> None:
        """Snapshot every partition's producer state; call before ``LogManager.close()``."""
        for partition in self._partitions.values():
            partition.close()

    def offline(self) -> list[Partition]:
        """The partitions whose log dir went offline."""
        return [p for p in self._partitions.values() if p.offline]

    def wake_offline(self) -> None:
        """Wake the long polls of offline partitions (call on the event loop once a dir
        went offline): they answer KAFKA_STORAGE_ERROR at once."""
        for partition in self.offline():
            partition.wake_waiters()

    def remove_topic(self, topic: str) -> int:
        """Delete every partition of ``topic`` and its files; the number removed."""
        removed = 0
        for key in [k for k in self._partitions if k.topic == topic]:
            partition = self._partitions.pop(key)
            partition.wake_waiters()
            self.logs.delete_log(key.topic, key.partition)
            removed += 1
        return removed
