"""The asyncio driver of the group coordinator: appends, timers, loading, request futures.

:class:`GroupDriver` owns the sans-io :class:`~tidelog.coordinator.GroupCoordinator` and is
the only code that calls it. Everything runs on the event loop thread, so the coordinator
needs no lock.

Requests. A handler calls :meth:`GroupDriver.respond` with the coordinator operation, a
fallback result and a function that builds the version's response. The driver gives the
operation a fresh token, dispatches the :class:`~tidelog.coordinator.Effects` it returns,
and answers at once when the token was completed right away, else with a
:class:`~tidelog.broker.reply.Deferred` that resolves when a later completion (the end of
a rebalance, the leader's SyncGroup, an append) names the token. Operations Kafka answers
directly (Heartbeat, OffsetFetch, ListGroups, DescribeGroups) call the coordinator through
:attr:`GroupDriver.coordinator` without a token.

Writes. Each :class:`~tidelog.coordinator.Write` becomes one batch appended to its
``__consumer_offsets`` partition at once, in the order the coordinator returned them
(appends are synchronous on the loop, so the order is the log's). ``acks=all`` semantics:
the write is reported with ``write_completed`` only once the log is fsynced past it. One
task per partition waits for durability and reports that partition's writes in append
order, sharing one fsync among every write queued meanwhile (the log's group commit);
reporting in order matters because a later commit of the same partition must never be
overwritten by an earlier one completing after it.

Timers. One task sleeps until :meth:`GroupCoordinator.next_deadline` and calls ``tick``;
any dispatch that brings the next deadline forward wakes it.

The offsets topic. ``__consumer_offsets`` is created through the controller on the first
FindCoordinator (``offsets.topic.num.partitions`` partitions, compacted); until its
partitions are created and loaded FindCoordinator answers COORDINATOR_NOT_AVAILABLE, and
group requests for a partition being loaded get COORDINATOR_LOAD_IN_PROGRESS from the
coordinator, as in Kafka. This node leads every partition, so the coordinator owns all of
them once loaded. The number of partitions is the topic's when it exists (Kafka's rule:
the config only sizes a topic yet to be created).

Loading. At start every existing ``__consumer_offsets`` partition is replayed in a
background task: its batches are read oldest first in a worker thread (control batches
skipped), reduced to the newest record per key (what compaction keeps, and all that replay
needs), records that cannot be decoded are dropped with a warning (bad bytes must not keep
a partition from loading), then :meth:`GroupCoordinator.load_partition` rebuilds its
groups on the loop.

Shutdown (:meth:`GroupDriver.stop`): every partition is unloaded, which answers every
waiting JoinGroup/SyncGroup with NOT_COORDINATOR; writes already appended are still made
durable and reported (their clients learn the outcome); the timer stops; anything still
waiting gets its fallback (COORDINATOR_NOT_AVAILABLE). The group state is in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, TypeVar, cast

from tidelog.broker.reply import Deferred
from tidelog.coordinator import (
    Effects,
    GroupConfig,
    GroupCoordinator,
    GroupRecordError,
    Response,
    Write,
)
from tidelog.coordinator.records import (
    GroupMetadataKey,
    OffsetCommitKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
)
from tidelog.metadata.controller import OFFSETS_TOPIC
from tidelog.protocol import ErrorCode
from tidelog.records import RecordsError, decode_records, iter_batches
from tidelog.storage import LogClosedError, RecordTooLargeError, StorageError

if TYPE_CHECKING:
    from tidelog.broker.broker import Broker
    from tidelog.broker.partitions import Partition

_log = logging.getLogger(__name__)

R = TypeVar("R", bound=Response)

#: Bytes read per call while loading a partition.
_LOAD_READ_BYTES = 4 * 1024 * 1024


class GroupRecordValue(NamedTuple):
    """A ``__consumer_offsets`` record as replay reads it."""

    key: bytes
    value: bytes | None


def _append_error_code(exc: Exception) -> ErrorCode:
    """The Kafka code of a failed append (the coordinator maps it for its clients)."""
    if isinstance(exc, RecordTooLargeError):
        return ErrorCode.MESSAGE_TOO_LARGE
    if isinstance(exc, LogClosedError):
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.KAFKA_STORAGE_ERROR


def _decodable(key: bytes, value: bytes | None) -> bool:
    """Whether replay can read this record (it raises on malformed ones)."""
    try:
        decoded = decode_key(key)
        if value is not None:
            if isinstance(decoded, OffsetCommitKey):
                decode_offset_commit_value(value)
            elif isinstance(decoded, GroupMetadataKey):
                decode_group_metadata_value(value)
    except GroupRecordError:
        return False
    return True


def read_group_records(partition: Partition) -> tuple[list[GroupRecordValue], int]:
    """The newest record per key of a ``__consumer_offsets`` partition, oldest key first,
    and the number of records dropped as unreadable. Blocking: run it in a worker thread.

    Keeping only the newest value per key gives replay the same result as the whole log:
    each key's outcome depends on its own records only.
    """
    log = partition.log
    latest: dict[bytes, bytes | None] = {}
    dropped = 0
    offset = log.log_start_offset
    end = log.log_end_offset
    while offset < end:
        data = log.read_bytes(offset, _LOAD_READ_BYTES)
        if not data:
            break
        next_offset = offset
        try:
            for position, header in iter_batches(data):
                next_offset = header.last_offset + 1
                if header.is_control:
                    continue
                try:
                    records = decode_records(data, position, header=header, verify_crc=False)
                except RecordsError as exc:
                    _log.warning(
                        "%s-%d: skipping an unreadable batch at offset %d: %s",
                        OFFSETS_TOPIC,
                        partition.index,
                        header.base_offset,
                        exc,
                    )
                    dropped += header.record_count
                    continue
                for record in records:
                    if record.key is None:
                        dropped += 1
                        continue
                    latest[bytes(record.key)] = (
                        None if record.value is None else bytes(record.value)
                    )
        except RecordsError:
            # A batch cut by the read size: read again from the first batch not seen.
            if next_offset == offset:
                _log.error(
                    "%s-%d: unreadable data at offset %d; loading what came before it",
                    OFFSETS_TOPIC,
                    partition.index,
                    offset,
                )
                break
        offset = next_offset
    kept: list[GroupRecordValue] = []
    for key, value in latest.items():
        if value is None:
            continue  # a tombstone removes the key; nothing older is left to remove
        if _decodable(key, value):
            kept.append(GroupRecordValue(key, value))
        else:
            dropped += 1
    return kept, dropped


class GroupDriver:
    """Runs the group coordinator of one broker (see the module docstring)."""

    def __init__(
        self,
        broker: Broker,
        config: GroupConfig | None = None,
        *,
        member_id_factory: Callable[[str], str] | None = None,
    ) -> None:
        self._broker = broker
        self._clock = broker.clock
        self._config = (
            config if config is not None else GroupConfig.from_broker_config(broker.config)
        )
        self._member_id_factory = member_id_factory
        self.coordinator = self._new_coordinator(self._config)
        #: partitions loaded (owned) or being loaded
        self._taken: set[int] = set()
        self._ready: set[int] = set()
        self._tokens = itertools.count(1)
        self._waiting: dict[object, tuple[asyncio.Future[Response], Response]] = {}
        self._queues: dict[int, deque[tuple[int, int, ErrorCode]]] = {}
        self._syncers: dict[int, asyncio.Task[None]] = {}
        self._loaders: set[asyncio.Task[None]] = set()
        self._timer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._sleeping_until: int | None = None
        self._creating: asyncio.Task[None] | None = None
        self._stopped = False

    def _new_coordinator(self, config: GroupConfig) -> GroupCoordinator:
        return GroupCoordinator(
            config,
            owned_partitions=(),
            topic_exists=self._topic_exists,
            member_id_factory=self._member_id_factory,
        )

    def _topic_exists(self, topic: str, partition: int) -> bool:
        found = self._broker.image.topic(topic)
        return found is not None and partition in found.partitions

    def now(self) -> int:
        return self._clock()

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def loading(self) -> list[int]:
        """The ``__consumer_offsets`` partitions taken but not loaded yet (or that failed to
        load): their groups get COORDINATOR_LOAD_IN_PROGRESS meanwhile."""
        return sorted(self._taken - self._ready)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start loading the existing ``__consumer_offsets`` partitions and the timer."""
        self._sync_with_metadata()
        # The first tick schedules the offset retention check.
        self._dispatch(self.coordinator.tick(self.now()))
        self._timer = asyncio.create_task(self._run_timer(), name="group coordinator timer")

    async def wait_loaded(self) -> None:
        """Return once every partition taken so far is loaded."""
        while self._loaders:
            await asyncio.gather(*list(self._loaders), return_exceptions=True)

    async def stop(self) -> None:
        """Answer everything waiting, report appended writes, stop the tasks."""
        if self._stopped:
            return
        self._stopped = True
        tasks = [*self._loaders, *([self._creating] if self._creating else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for p in sorted(self._taken):
            self._dispatch(self.coordinator.unload_partition(p))
        self._taken.clear()
        self._ready.clear()
        while self._syncers:
            await asyncio.gather(*list(self._syncers.values()), return_exceptions=True)
        if self._timer is not None:
            self._wake.set()
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None
        waiting, self._waiting = self._waiting, {}
        for future, fallback in waiting.values():
            if not future.done():
                future.set_result(fallback)

    # -- the offsets topic -------------------------------------------------------------

    def _sync_with_metadata(self) -> bool:
        """Take the ``__consumer_offsets`` partitions not taken yet; False: no such topic."""
        topic = self._broker.image.topic(OFFSETS_TOPIC)
        if topic is None:
            return False
        count = topic.num_partitions
        if not self._taken and count != self.coordinator.config.offsets_topic_num_partitions:
            # Nothing is owned yet, so the coordinator holds no state to lose.
            self._config = dataclasses.replace(self._config, offsets_topic_num_partitions=count)
            self.coordinator = self._new_coordinator(self._config)
        new = sorted(p for p in topic.partitions if p not in self._taken)
        if new:
            for p in new:
                self._taken.add(p)
                self.coordinator.begin_loading(p)
            task = asyncio.create_task(self._load(new), name="load __consumer_offsets")
            self._loaders.add(task)
            task.add_done_callback(self._loaders.discard)
        return True

    async def coordinator_error(self, group_id: str) -> ErrorCode:
        """FindCoordinator for a group: NONE when this broker serves it now, else
        COORDINATOR_NOT_AVAILABLE (the topic is being created or the partition loaded)."""
        if self._stopped:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not self._sync_with_metadata():
            await self._create_offsets_topic()
            self._sync_with_metadata()
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self.coordinator.partition_for(group_id) in self._ready:
            return ErrorCode.NONE
        return ErrorCode.COORDINATOR_NOT_AVAILABLE

    async def _create_offsets_topic(self) -> None:
        # One creation at a time; requests arriving meanwhile wait for it.
        if self._creating is None or self._creating.done():
            self._creating = asyncio.create_task(self._create(), name="create __consumer_offsets")
        with contextlib.suppress(Exception):
            await asyncio.shield(self._creating)

    async def _create(self) -> None:
        controller = self._broker.controller
        assert controller is not None, "broker built without a controller"
        result = await self._broker.run_blocking(controller.auto_create_topic, OFFSETS_TOPIC)
        if result.error.ok:
            _log.info("created %s", OFFSETS_TOPIC)
        elif result.error.code is not ErrorCode.TOPIC_ALREADY_EXISTS:
            _log.warning("could not create %s: %s", OFFSETS_TOPIC, result.error)

    async def _load(self, partitions: list[int]) -> None:
        for p in partitions:
            partition = self._broker.partitions.get(OFFSETS_TOPIC, p)
            if partition is None:
                # Not led here (a cluster); never the case on a single node.
                continue
            try:
                records, dropped = await asyncio.to_thread(read_group_records, partition)
            except (StorageError, OSError) as exc:
                _log.error("cannot load %s-%d: %s", OFFSETS_TOPIC, p, exc)
                continue
            if dropped:
                _log.warning(
                    "%s-%d: %d unreadable records left out of the load", OFFSETS_TOPIC, p, dropped
                )
            if self._stopped or p not in self._taken:
                return
            self._dispatch(self.coordinator.load_partition(p, records, self.now()))
            self._ready.add(p)
            _log.debug("loaded %s-%d (%d records)", OFFSETS_TOPIC, p, len(records))

    # -- requests --------------------------------------------------------------------------

    def respond(
        self,
        operation: Callable[[object, int], Effects],
        fallback: R,
        build: Callable[[R], object],
    ) -> object:
        """Run ``operation(token, now_ms)``; the response built from its result for the
        token, now or as a :class:`Deferred`. ``fallback`` answers a request still waiting
        when the driver stops."""
        if self._stopped:
            return build(fallback)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        token = next(self._tokens)
        self._waiting[token] = (cast("asyncio.Future[Response]", future), fallback)
        self._dispatch(operation(token, self.now()))
        if future.done():
            return build(future.result())

        async def later() -> object:
            return build(await future)

        return Deferred(later())

    def run_due_timers(self) -> None:
        """Fire the deadlines that are due now (the timer task does this by itself)."""
        self._dispatch(self.coordinator.tick(self.now()))

    def _dispatch(self, effects: Effects) -> None:
        for write in effects.writes:
            self._append(write)
        for completion in effects.completions:
            entry = self._waiting.pop(completion.token, None)
            if entry is not None and not entry[0].done():
                entry[0].set_result(completion.response)
        deadline = self.coordinator.next_deadline()
        if deadline is not None and (
            self._sleeping_until is None or deadline < self._sleeping_until
        ):
            self._wake.set()

    # -- writes ----------------------------------------------------------------------------

    def _append(self, write: Write) -> None:
        now = self.now()
        partition = self._broker.partitions.get(OFFSETS_TOPIC, write.partition)
        queue = self._queues.setdefault(write.partition, deque())
        if partition is None:
            queue.append((write.write_id, 0, ErrorCode.NOT_LEADER_OR_FOLLOWER))
        else:
            try:
                # The coordinator's own records always carry a key: no need to decode them
                # again for the compacted topic's key check.
                info = partition.append(
                    bytearray(write.to_batch(now)), now_ms=now, keys_checked=True
                )
            except (StorageError, OSError) as exc:
                code = _append_error_code(exc)
                _log.error("append to %s-%d failed: %s", OFFSETS_TOPIC, write.partition, exc)
                queue.append((write.write_id, 0, code))
            else:
                queue.append((write.write_id, info.last_offset + 1, ErrorCode.NONE))
        if write.partition not in self._syncers:
            self._syncers[write.partition] = asyncio.create_task(
                self._report_writes(write.partition), name=f"sync {OFFSETS_TOPIC}"
            )

    async def _report_writes(self, p: int) -> None:
        """Report partition ``p``'s writes in append order once each is durable."""
        queue = self._queues[p]
        try:
            while queue:
                pending = list(queue)
                queue.clear()
                end = max(end for _, end, _ in pending)
                sync_error = ErrorCode.NONE
                partition = self._broker.partitions.get(OFFSETS_TOPIC, p)
                if end > 0 and partition is not None:
                    try:
                        await partition.make_durable(end)
                    except (StorageError, OSError) as exc:
                        _log.error("fsync of %s-%d failed: %s", OFFSETS_TOPIC, p, exc)
                        sync_error = ErrorCode.KAFKA_STORAGE_ERROR
                now = self.now()
                for write_id, _, error in pending:
                    if error is ErrorCode.NONE:
                        error = sync_error
                    self._dispatch(self.coordinator.write_completed(write_id, now, error))
        finally:
            del self._syncers[p]

    # -- timers ----------------------------------------------------------------------------

    async def _run_timer(self) -> None:
        # The flag, not only the cancellation, ends the loop: on Python 3.11 a wait_for whose
        # inner wait completes as the task is cancelled swallows the cancellation.
        while not self._stopped:
            deadline = self.coordinator.next_deadline()
            self._sleeping_until = deadline
            self._wake.clear()
            now = self.now()
            if deadline is not None and deadline <= now:
                try:
                    self._dispatch(self.coordinator.tick(now))
                except Exception:
                    # A bug in one deadline must not stop every other one for good.
                    _log.exception("group coordinator tick failed")
                    await asyncio.sleep(1.0)
                continue
            timeout = None if deadline is None else (deadline - now) / 1000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
