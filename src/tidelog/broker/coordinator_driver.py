"""What the coordinators' drivers share: their topic, requests, timers, appends and loading.

Both coordinators (groups in ``__consumer_offsets``, transactions in ``__transaction_state``)
are sans-io state machines whose state is the records of a compacted internal topic.
:class:`CoordinatorDriver` is the asyncio side they share; everything runs on the event
loop thread, so a coordinator needs no lock.

Requests. A handler calls :meth:`CoordinatorDriver.respond` with the coordinator operation,
a fallback result and a function that builds the version's response. The driver gives the
operation a fresh token, dispatches the effects it returns, and answers at once when the
token was completed right away, else with a :class:`~tidelog.broker.reply.Deferred` that
resolves when a later completion names the token.

Timers. One task sleeps until the coordinator's ``next_deadline`` and calls ``tick``; any
dispatch that brings the next deadline forward wakes it.

The topic. It is created through the controller on the first FindCoordinator that needs it
(compacted, with its own settings); until its partitions are created and loaded
FindCoordinator answers COORDINATOR_NOT_AVAILABLE, and requests for a partition being
loaded get COORDINATOR_LOAD_IN_PROGRESS from the coordinator, as in Kafka. The coordinator
owns the partitions this node leads (on a single node, all of them) and gives up one whose
leadership moved to another node; FindCoordinator names the leader of a key's partition
(:meth:`CoordinatorDriver.leader_of`). The number of partitions
is the topic's when it exists (Kafka's rule: the config only sizes a topic yet to be
created).

Shutdown (:meth:`CoordinatorDriver.stop`): every partition is unloaded; writes already
appended are still made durable and reported; the timer stops; anything still waiting gets
its fallback (COORDINATOR_NOT_AVAILABLE).

:class:`DurableAppender` appends a coordinator's :class:`~tidelog.coordinator.Write` values
and reports each one once it is durable; :func:`read_latest_records` reads a partition back
for a load.

Appends. Each write becomes one batch appended at once, in the order the coordinator
returned them (appends are synchronous on the loop, so the order is the log's).
``acks=all`` semantics: a write is reported only once the log is fsynced past it. One task
per partition waits for durability and reports that partition's writes in append order,
sharing one fsync among every write queued meanwhile (the log's group commit); reporting in
order matters because a later write of the same key must never be overtaken by an earlier
one completing after it.

Loading. A partition's batches are read oldest first (in a worker thread) and reduced to
the newest record per key, which is what compaction keeps and all that a replay needs.
Transactions are honoured: records of a transactional batch count only once their
producer's COMMIT marker follows, are dropped at an ABORT marker, and are returned apart
(``open``) while no marker has come yet. Records that cannot be decoded are dropped with a
warning: bad bytes must not keep a partition from loading.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar

from tidelog.broker.reply import Deferred
from tidelog.coordinator import Write
from tidelog.protocol import ErrorCode
from tidelog.records import RecordsError, decode_records, iter_batches
from tidelog.storage import LogClosedError, RecordTooLargeError, StorageError

if TYPE_CHECKING:
    from tidelog.broker.broker import Broker
    from tidelog.broker.partitions import Partition

_log = logging.getLogger(__name__)

#: Bytes read per call while loading a partition.
_LOAD_READ_BYTES = 4 * 1024 * 1024

#: A control record's key: ``version: int16, type: int16`` (0 abort, 1 commit).
_CONTROL_KEY = struct.Struct(">hh")
_COMMIT = 1


class KeyValueRecord(NamedTuple):
    """A coordinator record as replay reads it."""

    key: bytes
    value: bytes | None


def append_error_code(exc: Exception) -> ErrorCode:
    """The Kafka code of a failed append (each coordinator maps it for its clients)."""
    if isinstance(exc, RecordTooLargeError):
        return ErrorCode.MESSAGE_TOO_LARGE
    if isinstance(exc, LogClosedError):
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.KAFKA_STORAGE_ERROR


@dataclass
class LoadedRecords:
    #: the newest committed record per key, oldest key first (tombstones left out)
    records: list[KeyValueRecord]
    #: records dropped as unreadable
    dropped: int = 0
    #: per producer id, the newest record per key of its transaction with no marker yet
    open: dict[int, list[KeyValueRecord]] = field(default_factory=dict)


def read_latest_records(
    partition: Partition, decodable: Callable[[bytes, bytes | None], bool]
) -> LoadedRecords:
    """The records of a coordinator partition as a load needs them (see the module
    docstring). ``decodable(key, value)`` says whether the coordinator can read a record.
    Blocking: run it in a worker thread."""
    log = partition.log
    name = f"{partition.topic}-{partition.index}"
    # key -> (offset, value): the offset decides between a regular record and a
    # transaction's record of the same key, as Kafka decides (the later one in the log wins)
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    pending: dict[int, dict[bytes, tuple[int, bytes | None]]] = {}
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
                try:
                    records = decode_records(data, position, header=header, verify_crc=False)
                except RecordsError as exc:
                    _log.warning(
                        "%s: skipping an unreadable batch at offset %d: %s",
                        name,
                        header.base_offset,
                        exc,
                    )
                    dropped += header.record_count
                    continue
                if header.is_control:
                    done = pending.pop(header.producer_id, None)
                    key = bytes(records[0].key or b"") if records else b""
                    if done and len(key) >= 4 and _CONTROL_KEY.unpack_from(key)[1] == _COMMIT:
                        for k, (at, v) in done.items():
                            if k not in latest or latest[k][0] < at:
                                latest[k] = (at, v)
                    continue
                target = (
                    pending.setdefault(header.producer_id, {})
                    if header.is_transactional
                    else latest
                )
                for record in records:
                    if record.key is None:
                        dropped += 1
                        continue
                    target[bytes(record.key)] = (
                        record.offset,
                        None if record.value is None else bytes(record.value),
                    )
        except RecordsError:
            # A batch cut by the read size: read again from the first batch not seen.
            if next_offset == offset:
                _log.error("%s: unreadable data at offset %d; loading what came before it",
                           name, offset)  # fmt: skip
                break
        offset = next_offset

    def kept(items: dict[bytes, bytes | None]) -> list[KeyValueRecord]:
        nonlocal dropped
        out = []
        for key, value in items.items():
            if decodable(key, value):
                out.append(KeyValueRecord(key, value))
            else:
                dropped += 1
        return out

    # A tombstone removes its key and nothing older is left to remove: leave it out.
    committed = kept({k: v for k, (_, v) in latest.items() if v is not None})
    # An open transaction's record that a later regular record of its key supersedes can
    # never win, whatever the marker says.
    still_open = {
        pid: kept({k: v for k, (at, v) in recs.items() if k not in latest or latest[k][0] < at})
        for pid, recs in pending.items()
    }
    return LoadedRecords(committed, dropped, {pid: r for pid, r in still_open.items() if r})


class DurableAppender:
    """Appends a coordinator's writes to ``topic`` and calls ``report(write_id, error)``
    once each is durable, in append order per partition (see the module docstring)."""

    def __init__(
        self, broker: Broker, topic: str, report: Callable[[int, ErrorCode], None]
    ) -> None:
        self._broker = broker
        self._topic = topic
        self._report = report
        self._queues: dict[int, deque[tuple[int, int, ErrorCode]]] = {}
        self._syncers: dict[int, asyncio.Task[None]] = {}

    def append(self, write: Write, now_ms: int) -> None:
        partition = self._broker.partitions.get(self._topic, write.partition)
        queue = self._queues.setdefault(write.partition, deque())
        if partition is None:
            queue.append((write.write_id, 0, ErrorCode.NOT_LEADER_OR_FOLLOWER))
        else:
            try:
                # The coordinator's own records always carry a key: no need to decode them
                # again for the compacted topic's key check.
                info = partition.append(
                    bytearray(write.to_batch(now_ms)), now_ms=now_ms, keys_checked=True
                )
            except (StorageError, OSError) as exc:
                code = append_error_code(exc)
                _log.error("append to %s-%d failed: %s", self._topic, write.partition, exc)
                queue.append((write.write_id, 0, code))
            else:
                queue.append((write.write_id, info.last_offset + 1, ErrorCode.NONE))
        if write.partition not in self._syncers:
            self._syncers[write.partition] = asyncio.create_task(
                self._report_writes(write.partition), name=f"sync {self._topic}"
            )

    async def drain(self) -> None:
        """Return once every write appended so far is reported."""
        while self._syncers:
            await asyncio.gather(*list(self._syncers.values()), return_exceptions=True)

    async def _report_writes(self, p: int) -> None:
        queue = self._queues[p]
        try:
            while queue:
                pending = list(queue)
                queue.clear()
                end = max(end for _, end, _ in pending)
                sync_error = ErrorCode.NONE
                partition = self._broker.partitions.get(self._topic, p)
                if end > 0 and partition is not None:
                    try:
                        await partition.make_durable(end)
                    except (StorageError, OSError) as exc:
                        _log.error("fsync of %s-%d failed: %s", self._topic, p, exc)
                        sync_error = ErrorCode.KAFKA_STORAGE_ERROR
                for write_id, _, error in pending:
                    self._report(write_id, sync_error if error is ErrorCode.NONE else error)
        finally:
            del self._syncers[p]


class CoordinatorMachine(Protocol):
    """What the driver calls on a coordinator (both coordinators have these)."""

    def partition_for(self, key: str, /) -> int: ...

    def begin_loading(self, partition: int, /) -> None: ...

    def unload_partition(self, partition: int, /) -> Any: ...

    def next_deadline(self) -> int | None: ...

    def tick(self, now_ms: int, /) -> Any: ...

    def write_completed(self, write_id: int, now_ms: int, error: ErrorCode = ..., /) -> Any: ...


C = TypeVar("C", bound=CoordinatorMachine)
R = TypeVar("R")


class CoordinatorDriver(Generic[C]):
    """Runs one coordinator of a broker (see the module docstring). Subclasses build the
    coordinator, load a partition's records into it and may handle more effects."""

    #: the internal topic
    topic: str

    def __init__(self, broker: Broker, coordinator: C) -> None:
        self._broker = broker
        self._clock = broker.clock
        self.coordinator = coordinator
        #: partitions loaded (owned) or being loaded
        self._taken: set[int] = set()
        self._ready: set[int] = set()
        self._tokens = itertools.count(1)
        self._waiting: dict[object, tuple[asyncio.Future[Any], Any]] = {}
        self._appender = DurableAppender(broker, self.topic, self._write_reported)
        self._loaders: set[asyncio.Task[None]] = set()
        self._timer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._sleeping_until: int | None = None
        self._creating: asyncio.Task[None] | None = None
        self._stopped = False

    # -- what a subclass provides

    def _configured_partitions(self) -> int:
        """The partition count the coordinator was built for."""
        raise NotImplementedError

    def _resize(self, count: int) -> None:
        """Rebuild the coordinator for a topic of ``count`` partitions (nothing is owned)."""
        raise NotImplementedError

    def _decodable(self, key: bytes, value: bytes | None) -> bool:
        """Whether the coordinator can read this record (replay raises on bad ones)."""
        raise NotImplementedError

    def _load_partition(self, p: int, loaded: LoadedRecords) -> None:
        """Hand partition ``p``'s records to the coordinator."""
        raise NotImplementedError

    # -- state

    def now(self) -> int:
        return self._clock()

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def loading(self) -> list[int]:
        """The partitions taken but not loaded yet (or that failed to load): their keys get
        COORDINATOR_LOAD_IN_PROGRESS meanwhile."""
        return sorted(self._taken - self._ready)

    def is_ready(self, key: str) -> bool:
        return self.coordinator.partition_for(key) in self._ready

    # -- lifecycle

    async def start(self) -> None:
        """Start loading the existing partitions of the topic, and the timer."""
        self._sync_with_metadata()
        # The first tick schedules the coordinator's periodic checks.
        self._dispatch(self.coordinator.tick(self.now()))
        self._timer = asyncio.create_task(self._run_timer(), name=f"{self.topic} timer")

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
        await self._appender.drain()
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

    # -- the topic

    def sync_with_metadata(self) -> bool:
        """Take the topic's partitions this node leads and does not own yet, and give up
        the ones another node leads now; False: no such topic."""
        return self._sync_with_metadata()

    def leader_of(self, key: str) -> int | None:
        """The broker leading the topic partition of ``key`` (None: no topic, or no
        leader)."""
        topic = self._broker.image.topic(self.topic)
        if topic is None:
            return None
        partition = topic.partitions.get(self.coordinator.partition_for(key))
        return partition.leader if partition is not None and partition.leader >= 0 else None

    def _sync_with_metadata(self) -> bool:
        """Take the topic's partitions not taken yet; False: no such topic."""
        topic = self._broker.image.topic(self.topic)
        if topic is None:
            return False
        count = topic.num_partitions
        if not self._taken and count != self._configured_partitions():
            # Nothing is owned yet, so the coordinator holds no state to lose.
            self._resize(count)
        node = self._broker.node_id
        # A partition without a leader (its broker fenced) stays where it is: nobody else
        # may serve its groups meanwhile.
        moved = sorted(
            p
            for p in self._taken
            if (part := topic.partitions.get(p)) is not None and part.leader not in (node, -1)
        )
        for p in moved:
            self._taken.discard(p)
            self._ready.discard(p)
            self._dispatch(self.coordinator.unload_partition(p))
        new = sorted(
            p
            for p, part in topic.partitions.items()
            if p not in self._taken and part.leader == node
        )
        if new:
            for p in new:
                self._taken.add(p)
                self.coordinator.begin_loading(p)
            task = asyncio.create_task(self._load(new), name=f"load {self.topic}")
            self._loaders.add(task)
            task.add_done_callback(self._loaders.discard)
        return True

    async def coordinator_error(self, key: str) -> ErrorCode:
        """FindCoordinator: NONE when this broker serves ``key`` now, else
        COORDINATOR_NOT_AVAILABLE (the topic is being created or the partition loaded)."""
        if self._stopped:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not self._sync_with_metadata():
            await self._create_topic()
            self._sync_with_metadata()
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self.is_ready(key):
            return ErrorCode.NONE
        return ErrorCode.COORDINATOR_NOT_AVAILABLE

    async def _create_topic(self) -> None:
        # One creation at a time; requests arriving meanwhile wait for it.
        if self._creating is None or self._creating.done():
            self._creating = asyncio.create_task(self._create(), name=f"create {self.topic}")
        with contextlib.suppress(Exception):
            await asyncio.shield(self._creating)

    async def _create(self) -> None:
        controller = self._broker.controller
        assert controller is not None, "broker built without a controller"
        result = await self._broker.run_blocking(controller.auto_create_topic, self.topic)
        if result.error.ok:
            _log.info("created %s", self.topic)
        elif result.error.code is not ErrorCode.TOPIC_ALREADY_EXISTS:
            _log.warning("could not create %s: %s", self.topic, result.error)

    async def _load(self, partitions: list[int]) -> None:
        for p in partitions:
            partition = self._broker.partitions.get(self.topic, p)
            if partition is None:
                # Not led here (a cluster); never the case on a single node.
                continue
            try:
                loaded = await asyncio.to_thread(read_latest_records, partition, self._decodable)
            except (StorageError, OSError) as exc:
                _log.error("cannot load %s-%d: %s", self.topic, p, exc)
                continue
            if loaded.dropped:
                _log.warning(
                    "%s-%d: %d unreadable records left out of the load",
                    self.topic,
                    p,
                    loaded.dropped,
                )
            if self._stopped or p not in self._taken:
                return
            self._load_partition(p, loaded)
            self._ready.add(p)
            _log.debug("loaded %s-%d (%d records)", self.topic, p, len(loaded.records))

    # -- requests

    def respond(
        self,
        operation: Callable[[object, int], Any],
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
        self._waiting[token] = (future, fallback)
        self._dispatch(operation(token, self.now()))
        if future.done():
            return build(future.result())

        async def later() -> object:
            return build(await future)

        return Deferred(later())

    def run_due_timers(self) -> None:
        """Fire the deadlines that are due now (the timer task does this by itself)."""
        self._dispatch(self.coordinator.tick(self.now()))

    def _dispatch(self, effects: Any) -> None:
        """Append the effects' writes, answer their completions, wake the timer if the
        next deadline came forward."""
        now = self.now()
        for write in effects.writes:
            self._appender.append(write, now)
        for completion in effects.completions:
            entry = self._waiting.pop(completion.token, None)
            if entry is not None and not entry[0].done():
                entry[0].set_result(completion.response)
        deadline = self.coordinator.next_deadline()
        if deadline is not None and (
            self._sleeping_until is None or deadline < self._sleeping_until
        ):
            self._wake.set()

    def _write_reported(self, write_id: int, error: ErrorCode) -> None:
        self._dispatch(self.coordinator.write_completed(write_id, self.now(), error))

    # -- timers

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
                    _log.exception("%s coordinator tick failed", self.topic)
                    await asyncio.sleep(1.0)
                continue
            timeout = None if deadline is None else (deadline - now) / 1000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
