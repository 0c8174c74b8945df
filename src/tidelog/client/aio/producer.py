"""AIOProducer: per-partition accumulator, idempotent sequencing and one sender task.

Records
-------
``send()`` serializes a record, reserves its size in ``buffer.memory`` and appends it to the
open batch of its partition (``_Batch``: columns of values, keys, headers and futures, and
the timestamps as runs). The records are encoded as Kafka v2 records when the batch is
sealed for sending, all at once: per distinct value length, not per record, for the common
keyless, headerless records (:func:`_encode_records`); compression, CRC, header and request
building too happen once per batch. Records of a topic whose metadata is not known yet wait,
in order, in a per-topic list until it is. The memory a record reserved is given back when
its batch is acknowledged or failed; the synchronous facade blocks its caller up to
``max.block.ms`` while the buffer is full (:class:`BufferMemory`), then raises
:class:`BufferExhaustedError`.

The synchronous facade hands records over to the producer's loop through a queue, under the
buffer's lock (:meth:`AIOProducer.hand_over`). A *plain* record — only a topic, a ``bytes``
value and maybe an ``on_delivery`` callback — joins the current *run* of such records
(:class:`_Run`, :meth:`AIOProducer.plain_sender`): one list append. The loop moves a run
into batches by slices; each slice is a *part* of the run (:class:`_Part`), and the run's
:class:`_RunOutcomes` lists its parts. The future of a plain record is a
:class:`DeliveryFuture`, a ``concurrent.futures.Future`` that is only built when someone
needs more than its outcome; it refers to its run (by way of a :class:`_Chunk`) and its
place there, and the producer does not keep it: an acknowledged or failed batch settles
each of its parts once, and a future finds its outcome in its part when asked. So per
plain record the producer creates one object (the future) and does a few list appends,
whether or not the caller keeps the future. Other records' futures are settled one by one,
in one pass per batch.

Partitions
----------
An explicit partition wins; then ``partitioner.class`` (a callable ``(topic, key, value,
num_partitions) -> partition``) if given; then murmur2 of the key as Kafka's Java client
computes it; records without a key stick to one partition until a batch of it is full or
handed to the sender (KIP-480).

Sending
-------
A batch is full when its records' reserved sizes (each record counted with Kafka's upper
bound of 21 bytes of framing) would pass ``batch.size``: its bytes on the wire never do.

The sender task drains batches that are *ready*: full (``batch.size``), older than
``linger.ms``, due for a retry after ``retry.backoff.ms``, or wanted by ``flush()``/``close()``.
Each Produce request carries at most one batch per partition (Kafka refuses more) and at most
``max.request.size`` bytes; requests to a broker share one connection, which pipelines up to
``max.in.flight.requests.per.connection`` of them.

Idempotence (``enable.idempotence``, on by default as in Kafka's Java client)
----------------------------------------------------------------------------
The producer gets a producer id and epoch (InitProducerId) before its first batch. A batch
takes the partition's next sequence number when it is first sent and keeps it, and its bytes,
across retries; up to five batches per partition are in flight. Per partition (Kafka's
``TransactionManager`` rules):

* NONE and DUPLICATE_SEQUENCE_NUMBER acknowledge the batch (a broker answers a repeat of one
  of the last five batches with the original offsets);
* a retriable error, or OUT_OF_ORDER_SEQUENCE_NUMBER while an earlier batch of the partition
  is not acknowledged yet (it was lost or is being retried), puts the batch back in sequence
  order; while a partition has batches to re-send it sends one at a time, the lowest sequence
  first, and only when nothing else of it is in flight, so the broker sees them in order;
* OUT_OF_ORDER_SEQUENCE_NUMBER for the next expected sequence, UNKNOWN_PRODUCER_ID,
  INVALID_PRODUCER_EPOCH, or a sent batch that failed for good (its sequence is now a gap)
  ask for an epoch bump (KIP-360): once nothing is in flight the producer sends InitProducerId
  with its current id and epoch (a broker may also hand out a new id), every partition starts
  again at sequence 0, and the batches not acknowledged yet are re-stamped and re-sent in
  their original order.

Without idempotence a partition also pipelines up to ``max.in.flight.requests.per.connection``
batches, and a retry may then reorder records, as in Kafka.

Transactions (``transactional.id``)
-----------------------------------
:mod:`tidelog.client.aio.transactions` holds the state; the producer refuses records
outside a transaction, holds a partition's batches until AddPartitionsToTxn added it,
sets the transactional bit on every batch, names the id in Produce, and never bumps its
epoch itself: a sequence gap makes the transaction abort-only instead.

Failures
--------
A batch not acknowledged within ``delivery.timeout.ms`` of its creation fails with
REQUEST_TIMED_OUT once it is not in flight; ``retries`` bounds the re-sends; a request without
an answer in ``request.timeout.ms`` counts as a retriable failure (the connection is dropped,
as Kafka's clients do). Non-retriable broker errors fail the batch's futures with a
:class:`~tidelog.client.errors.ClientError` carrying the code. With ``acks=0`` no response is
awaited and offsets are reported as -1.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from itertools import accumulate
from typing import Any, Protocol, cast

from tidelog.client.aio.transactions import TransactionManager
from tidelog.client.cluster import STALE_METADATA_CODES, ClusterClient, TopicInfo
from tidelog.client.config import parse_config
from tidelog.client.connection import Connection
from tidelog.client.errors import (
    BrokerConnectionError,
    ClientClosedError,
    ClientError,
    ConfigError,
    broker_error,
)
from tidelog.client.groups import ConsumerGroupMetadata, OffsetAndMetadata
from tidelog.client.messages import epoch_millis
from tidelog.client.partitioner import StickyPartitioner, partition_for_key
from tidelog.client.types import RecordMetadata, TopicPartition
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.records import Compression, compress, seal_batch
from tidelog.records.batch import TRANSACTIONAL_MASK
from tidelog.records.varint import SMALL_VARINT_LIMIT, SMALL_VARINTS, varlong_bytes

log = logging.getLogger(__name__)

DeliveryCallback = Callable[[ClientError | None, RecordMetadata | None], None]
HeaderList = Iterable[tuple[str, bytes | bytearray | memoryview | str | None]]
Headers = tuple[tuple[str, bytes | None], ...]
PartitionerFn = Callable[[str, bytes | None, bytes | None, int], int]
Serializer = Callable[[Any], bytes | bytearray | memoryview | str | None]

# Bytes a record is charged beyond its key, value and headers (length, attributes, deltas,
# counts): what ``buffer.memory`` and the size checks count.
RECORD_OVERHEAD = 21
BATCH_HEADER_SIZE = 61
# General records taken from the synchronous facade's hand-over queue per turn of the event
# loop; also how far a run of plain records may get ahead of the loop before the sending thread
# yields the GIL (then every _YIELD_EVERY + 1 records).
_INBOX_SLICE = 2048
_YIELD_EVERY = 255
# Seconds between looks at the hand-over queue while records keep coming (at most linger.ms).
_INBOX_POLL = 0.001
# Kafka's limit of in-flight batches per partition for an idempotent producer.
MAX_IDEMPOTENT_IN_FLIGHT = 5
_INT32_MAX = 0x7FFFFFFF
_INT16_MAX = 0x7FFF

# Zigzag varints of small lengths and deltas come from the records package's table: a
# record is encoded with a few tuple lookups.
_ZZ = SMALL_VARINTS
_ZZ_LIMIT = SMALL_VARINT_LIMIT
# The header count (0) closing every record without headers.
_ZERO = b"\x00"


# What the synchronous facade does with a record that is not plain (positional arguments of
# send()).
GeneralSender = Callable[
    [str, Any, Any, HeaderList | None, int | None, int | None, DeliveryCallback | None],
    "DeliveryFuture",
]


class Sender(Protocol):
    """A synchronous ``send`` (see :meth:`AIOProducer.plain_sender`)."""

    def __call__(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: HeaderList | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> DeliveryFuture | None: ...


class BufferExhaustedError(ClientError):
    """``buffer.memory`` stayed full for ``max.block.ms``."""


class _Sink(Protocol):
    """What a record's outcome is delivered to: an asyncio or a concurrent future."""

    def done(self) -> bool: ...
    def set_result(self, result: RecordMetadata) -> None: ...
    def set_exception(self, exception: BaseException) -> None: ...


class _Failed:
    """A bare DeliveryFuture's outcome when the delivery failed."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class _Delivered:
    """A batch's acknowledgement: each record's RecordMetadata is made from it when asked
    (most never are), so an acknowledged record costs no object of its own."""

    __slots__ = ("append_time", "base_offset", "partition", "topic", "ts_starts", "ts_values")

    def __init__(self, batch: _Batch, base_offset: int, append_time: int) -> None:
        self.topic, self.partition = batch.tp
        self.base_offset = base_offset
        self.append_time = append_time
        # Only the timestamp runs: the futures may outlive the batch and its bytes.
        self.ts_starts = batch.ts_starts
        self.ts_values = batch.ts_values

    def metadata(self, index: int) -> RecordMetadata:
        offset = self.base_offset + index if self.base_offset >= 0 else -1
        if self.append_time >= 0:
            timestamp = self.append_time
        else:
            timestamp = self.ts_values[bisect.bisect_right(self.ts_starts, index) - 1]
        # tuple.__new__: the NamedTuple constructor is a Python function.
        return tuple.__new__(RecordMetadata, (self.topic, self.partition, offset, timestamp))


_PENDING: Any = object()  # the outcome of a bare DeliveryFuture not settled yet
# Guards the step from bare to standard Future against a settlement at the same moment.
# Re-entrant so that a base class touching its state while it is being built fails with an
# AttributeError rather than waiting for itself.
_BUILD_LOCK = threading.RLock()


class _Part:
    """Records ``start`` to ``end - 1`` of a run, placed in one batch from index ``base`` on;
    ``outcome`` is that batch's (_PENDING, _Delivered or _Failed) once it is settled.

    A part of one record is also the sink of a record of a run that took the general path:
    settled with its RecordMetadata (or error) like any future."""

    __slots__ = ("base", "end", "outcome", "owner", "start")

    def __init__(self, owner: _RunOutcomes, start: int, end: int, base: int) -> None:
        self.owner = owner
        self.start = start
        self.end = end
        self.base = base
        self.outcome: Any = _PENDING

    def done(self) -> bool:
        return self.outcome is not _PENDING

    def set_result(self, result: RecordMetadata) -> None:
        DeliveryFuture.settle_parts([self], result)

    def set_exception(self, exception: BaseException) -> None:
        DeliveryFuture.settle_parts([self], _Failed(exception))


class _RunOutcomes:
    """Where the futures of a run of plain records find their outcomes: the run's parts, by
    first index, in order. Settling a batch settles its parts, not each future: a future looks
    its outcome up when asked. ``waiting``: the futures of the run that became standard
    Futures while pending, settled one by one with their part (under ``_BUILD_LOCK``)."""

    __slots__ = ("parts", "starts", "waiting")

    def __init__(self) -> None:
        self.parts: list[_Part] = []
        self.starts: list[int] = []
        self.waiting: dict[int, DeliveryFuture] = {}  # by index in the run

    def add(self, start: int, end: int, base: int) -> _Part:
        part = _Part(self, start, end, base)
        # `parts` first: a reader on another thread finds a part for every start it sees.
        self.parts.append(part)
        self.starts.append(start)
        return part

    def lookup(self, index: int) -> tuple[Any, int]:
        """The outcome of record ``index`` of the run and its index in its batch."""
        k = bisect.bisect_right(self.starts, index) - 1
        if k < 0:
            return _PENDING, 0
        part = self.parts[k]
        if index >= part.end or part.outcome is _PENDING:
            return _PENDING, 0
        return part.outcome, part.base + index - part.start


class _Chunk:
    """What a future of a run refers to: its chunk of :data:`_CHUNK` records of the run, the
    future keeping only its place in the chunk. Python keeps the ints below 257 cached, so
    the future owns no object but itself (fewer allocations, and less for the garbage
    collector to visit while the futures live)."""

    __slots__ = ("base", "outcomes")

    def __init__(self, outcomes: _RunOutcomes, base: int) -> None:
        self.outcomes = outcomes
        self.base = base


# Records per _Chunk (a power of two, at most 256).
_CHUNK = 256
_CHUNK_MASK = _CHUNK - 1


class DeliveryFuture(concurrent.futures.Future[RecordMetadata]):
    """The ``concurrent.futures.Future`` the synchronous ``send`` returns, built on demand.

    A standard Future costs about 1.3 µs to create and 1 µs to settle, and it is a dozen
    objects (a condition, its lock and bound methods, a deque, two lists) that the garbage
    collector scans again and again while the futures live: with 100,000 records in flight
    that is several µs per record, more than the rest of the record's trip. Most delivery
    futures are looked at only after ``flush()``, if at all. So a DeliveryFuture starts
    *bare*: one object whose outcome is kept in attributes of its own (name-mangled, so they
    cannot meet the base class's). The standard Future is built — by its public constructor,
    with the outcome handed to its public ``set_result()`` / ``set_exception()`` — the first
    time something needs more than the outcome:

    * ``done()``, ``running()``, ``cancelled()``, ``cancel()`` and, once settled,
      ``result()`` and ``exception()`` answer from the outcome;
    * anything else (a ``result()`` that must wait, ``add_done_callback()``, ``repr()``,
      ``concurrent.futures.wait()`` and ``as_completed()``, which use the Future's own
      state) reaches an attribute the bare object does not have yet: ``__getattr__`` builds
      the Future then, and every later use is the standard one.

    The future of a plain record (see :meth:`AIOProducer.plain_sender`) is not even written
    to when its batch is settled, nor kept by the producer: its outcome is its run's
    :class:`_RunOutcomes` (by way of its :class:`_Chunk`) and its place in the run, looked up
    when asked; settling a batch costs the same for any number of such records.

    No private name of ``concurrent.futures`` is read or written here; what this relies on
    is that a Future's state is made by its ``__init__`` (so a bare object has none).

    A delivery is under way from the moment ``send`` returns: the future is *running* at
    once, so ``cancel()`` returns False, as for any running Future, and the record is
    delivered (or fails) regardless.
    """

    # The outcome: _PENDING, the result, a _Failed, the batch's _Delivered (with the record's
    # index in the batch) or a _Chunk of a run (with the record's index in the chunk).
    __outcome: Any = _PENDING
    __index = 0
    __built = False
    __building = False

    def __init__(self, outcome: Any = _PENDING, index: int = 0) -> None:
        """Bare: ``Future.__init__`` runs when the standard Future is needed (see above)."""
        # Both set here, in this order, so that every instance keeps the class's shared
        # attribute layout: set first elsewhere, they would give each object a dict.
        self.__outcome = outcome
        self.__index = index

    def __current(self) -> tuple[Any, int]:
        """The outcome as it stands (never a _Chunk) and the index that goes with it."""
        outcome = self.__outcome
        if type(outcome) is _Chunk:
            return outcome.outcomes.lookup(outcome.base + self.__index)
        return outcome, self.__index

    def __build(self) -> None:
        with _BUILD_LOCK:
            if self.__built or self.__building:
                return
            self.__building = True
            super().__init__()
            super().set_running_or_notify_cancel()
            outcome, index = self.__current()
            if type(outcome) is _Delivered:
                outcome = outcome.metadata(index)
            if type(outcome) is _Failed:
                super().set_exception(outcome.error)
            elif outcome is not _PENDING:
                super().set_result(outcome)
            elif type(self.__outcome) is _Chunk:
                # Settled with its part. (Its place is taken now: a result() on another
                # thread may replace the chunk by the RecordMetadata once it is settled.)
                chunk = self.__outcome
                chunk.outcomes.waiting[chunk.base + self.__index] = self
            self.__built = True

    def __getattr__(self, name: str) -> Any:
        # Reached only for attributes the object does not have: the standard Future's state
        # while it is bare.
        if self.__built or self.__building or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        self.__build()
        return object.__getattribute__(self, name)

    def done(self) -> bool:
        if not self.__built:
            return self.__current()[0] is not _PENDING
        return super().done()

    def running(self) -> bool:
        if not self.__built:
            return self.__current()[0] is _PENDING
        return super().running()

    def cancelled(self) -> bool:
        if not self.__built:
            return False
        return super().cancelled()

    def cancel(self) -> bool:
        if not self.__built:
            return False
        return super().cancel()

    def result(self, timeout: float | None = None) -> RecordMetadata:
        if not self.__built:
            outcome, index = self.__current()
            if type(outcome) is _Delivered:
                # Made once, and kept (a settled outcome never changes).
                outcome = self.__outcome = outcome.metadata(index)
            if type(outcome) is _Failed:
                if outcome.error is not None:
                    raise outcome.error
            elif outcome is not _PENDING:
                return outcome  # type: ignore[no-any-return]
            self.__build()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self.__built:
            outcome = self.__current()[0]
            if type(outcome) is _Failed:
                return outcome.error
            if outcome is not _PENDING:
                return None
            self.__build()
        return super().exception(timeout)

    def set_result(self, result: RecordMetadata) -> None:
        self.__settle(result)

    def set_exception(self, exception: BaseException | None) -> None:
        self.__settle(_Failed(exception))

    def __settle(self, outcome: Any) -> None:
        with _BUILD_LOCK:
            built = self.__built
            if not built and self.__current()[0] is _PENDING:
                self.__outcome = outcome
                return
        if not built:
            raise concurrent.futures.InvalidStateError("the delivery future is already settled")
        if type(outcome) is _Failed:
            super().set_exception(outcome.error)
        else:
            super().set_result(outcome)

    @staticmethod
    def settle_parts(parts: list[_Part], outcome: _Delivered | _Failed | RecordMetadata) -> None:
        """Settle the parts of runs a batch holds with the batch's ``outcome`` (or one
        record's part with its RecordMetadata); then the futures of theirs that were built
        meanwhile, one by one."""
        built: list[tuple[DeliveryFuture, int]] = []
        with _BUILD_LOCK:
            for part in parts:
                if part.outcome is not _PENDING:
                    continue
                part.outcome = outcome
                waiting = part.owner.waiting
                if waiting:
                    # Whichever is shorter: the waiting futures or the part's records.
                    start, end = part.start, part.end
                    if len(waiting) <= end - start:
                        mine = [(i, f) for i, f in waiting.items() if start <= i < end]
                        for i, _ in mine:
                            del waiting[i]
                    else:
                        pop = waiting.pop
                        mine = [
                            (i, f) for i in range(start, end) if (f := pop(i, None)) is not None
                        ]
                    built += [(f, part.base + i - start) for i, f in mine]
        for future, index in built:
            if future.done():  # settled by other means first
                continue
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                if isinstance(outcome, _Failed):
                    concurrent.futures.Future.set_exception(future, outcome.error)
                elif isinstance(outcome, _Delivered):
                    concurrent.futures.Future.set_result(future, outcome.metadata(index))
                else:
                    concurrent.futures.Future.set_result(future, outcome)

    @staticmethod
    def settle_batch(
        sinks: list[_Sink | None], delivered: _Delivered, parts: list[_Part] | None = None
    ) -> None:
        """Settle every sink of an acknowledged batch: its ``parts`` of runs once each; the
        bare DeliveryFutures outside them in one pass under one lock (two attribute writes
        each), the others (built ones, asyncio futures) one by one with their
        RecordMetadata."""
        if parts:
            DeliveryFuture.settle_parts(parts, delivered)
            indices: Iterable[int] = _outside(parts, len(sinks))
        else:
            indices = range(len(sinks))
        rest = []
        with _BUILD_LOCK:
            for index in indices:
                sink = sinks[index]
                if (
                    type(sink) is DeliveryFuture
                    and not sink.__built
                    and sink.__current()[0] is _PENDING
                ):
                    if type(sink.__outcome) is _Chunk:
                        # Pending without an index first: the run's index must not be
                        # read with the batch's (see __current()).
                        sink.__outcome = _PENDING
                    sink.__index = index  # before the outcome: see __current()
                    sink.__outcome = delivered
                else:
                    rest.append(index)
        for index in rest:
            sink = sinks[index]
            if sink is not None and not sink.done():
                with contextlib.suppress(Exception):  # an asyncio future its caller cancelled
                    sink.set_result(delivered.metadata(index))


def _outside(parts: list[_Part], count: int) -> list[int]:
    """The indices of a batch of ``count`` records that none of its ``parts`` holds."""
    indices: list[int] = []
    at = 0
    for part in sorted(parts, key=lambda p: p.base):
        indices += range(at, part.base)
        at = part.base + part.end - part.start
    indices += range(at, count)
    return indices


class BufferMemory:
    """``buffer.memory``: bytes reserved by records not yet acknowledged or failed.

    Thread-safe: the synchronous facade reserves from its caller's thread and blocks there;
    the producer's loop releases. An asyncio caller waits with :meth:`reserve_async`.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._async_waiters: list[asyncio.Future[None]] = []

    def try_reserve(self, size: int) -> bool:
        with self._lock:
            # A record larger than the whole buffer may still go alone (Kafka refuses it
            # earlier, by max.request.size); otherwise it could never be sent.
            if self.used + size <= self.total or self.used == 0:
                self.used += size
                return True
            return False

    def reserve(self, size: int, timeout: float) -> None:
        """Reserve ``size`` bytes, waiting at most ``timeout`` seconds for them."""
        with self._lock:
            used = self.used
            if used + size <= self.total or used == 0:
                self.used = used + size
                return
        deadline = time.monotonic() + timeout
        with self._cond:
            while not (self.used + size <= self.total or self.used == 0):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._exhausted(size, timeout)
                self._cond.wait(left)
            self.used += size

    async def reserve_async(self, size: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.try_reserve(size):
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._exhausted(size, timeout)
            waiter = asyncio.get_running_loop().create_future()
            self._async_waiters.append(waiter)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, left)

    def release(self, size: int) -> None:
        with self._cond:
            self.used -= size
            self._cond.notify_all()
        waiters, self._async_waiters = self._async_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _exhausted(self, size: int, timeout: float) -> BufferExhaustedError:
        return BufferExhaustedError(
            f"could not reserve {size} bytes of buffer.memory={self.total} within "
            f"max.block.ms={int(timeout * 1000)} ({self.used} bytes wait to be sent); "
            "the broker is slower than the producer or unreachable"
        )


def _as_bytes(name: str, value: Any) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(
        f"{name} must be bytes, str or None (or set {name}.serializer), got {type(value).__name__}"
    )


def _encode_headers(headers: Headers) -> bytes:
    parts = [varlong_bytes(len(headers))]
    for name, value in headers:
        encoded = name.encode("utf-8")
        parts.append(varlong_bytes(len(encoded)))
        parts.append(encoded)
        if value is None:
            parts.append(b"\x01")
        else:
            parts.append(varlong_bytes(len(value)))
            parts.append(value)
    return b"".join(parts)


class _Batch:
    """One RecordBatch being filled, then sent (and maybe re-sent) until it is settled.

    While open it keeps its records as columns (values, keys, encoded headers, futures) and
    its timestamps as runs (``ts_starts[i]`` is the first record with ``ts_values[i]``);
    adding a record is a few list appends. :meth:`seal` encodes them all at once and drops
    the columns the bytes replace.
    """

    __slots__ = (
        "attempts",
        "base_seq",
        "callbacks",
        "conn",
        "created",
        "data",
        "epoch",
        "headers",
        "keys",
        "not_before",
        "parts",
        "payload",
        "producer_id",
        "reserved",
        "settled",
        "sinks",
        "tp",
        "ts_starts",
        "ts_values",
        "values",
    )

    def __init__(self, tp: TopicPartition, now: float) -> None:
        self.tp = tp
        self.created = now
        self.values: list[bytes | None] = []
        # None while every record has no key / no header: the common case encodes faster.
        self.keys: list[bytes | None] | None = None
        self.headers: list[bytes] | None = None
        self.ts_starts: list[int] = []
        self.ts_values: list[int] = []
        # One per record; None for the records of parts of runs (settled per part).
        self.sinks: list[_Sink | None] = []
        self.callbacks: list[DeliveryCallback | None] | None = None
        # The parts of runs of plain records it holds: their futures are settled per part.
        self.parts: list[_Part] | None = None
        self.conn: Any = None  # the connection it was last sent on
        # The buffer.memory its records hold: also the upper bound of their encoded size.
        self.reserved = 0
        self.settled = False
        self.attempts = 0
        self.not_before = 0.0
        self.payload: bytes | None = None  # the (compressed) records, fixed once sent
        self.data: bytes | None = None  # header + payload as last sent
        self.base_seq = -1
        self.producer_id = -1
        self.epoch = -1

    @property
    def count(self) -> int:
        return len(self.sinks)

    @property
    def size(self) -> int:
        """Upper bound of the batch's size on the wire while it is open."""
        return BATCH_HEADER_SIZE + self.reserved

    def add(
        self,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        sink: _Sink,
        callback: DeliveryCallback | None,
        headers: bytes = b"\x00",
    ) -> None:
        """Add one record (``headers`` already encoded); the caller accounts ``reserved``."""
        count = len(self.sinks)
        if key is not None and self.keys is None:
            self.keys = [None] * count
        if self.keys is not None:
            self.keys.append(key)
        if headers != b"\x00" and self.headers is None:
            self.headers = [b"\x00"] * count
        if self.headers is not None:
            self.headers.append(headers)
        self.values.append(value)
        if not self.ts_values or self.ts_values[-1] != timestamp:
            self.ts_starts.append(count)
            self.ts_values.append(timestamp)
        self.sinks.append(sink)
        if callback is not None or self.callbacks is not None:
            if self.callbacks is None:
                self.callbacks = [None] * count
            self.callbacks.append(callback)

    def stamp_from_here(self, timestamp: int) -> None:
        """The records added from now on (until the next call) have ``timestamp``."""
        if not self.ts_values or self.ts_values[-1] != timestamp:
            self.ts_starts.append(len(self.sinks))
            self.ts_values.append(timestamp)

    def add_part(
        self,
        outcomes: _RunOutcomes,
        values: list[bytes],
        start: int,
        end: int,
        timestamp: int,
        callback: DeliveryCallback | None = None,
        callbacks: list[DeliveryCallback | None] | None = None,
    ) -> None:
        """Add records ``start`` to ``end - 1`` of a run (keyless, headerless, all with
        ``callback`` or else each with its own of ``callbacks``) as one part; the caller
        accounts ``reserved``."""
        count = len(self.sinks)
        n = end - start
        part = outcomes.add(start, end, count)
        if self.parts is None:
            self.parts = [part]
        else:
            self.parts.append(part)
        self.stamp_from_here(timestamp)
        if count == 0 and n == len(values):
            self.values = values  # type: ignore[assignment]
        else:
            self.values += values[start:end]
        self.sinks += [None] * n
        if self.keys is not None:
            self.keys += [None] * n
        if self.headers is not None:
            self.headers += [b"\x00"] * n
        mine = self.callbacks
        if mine is None and (callback is not None or callbacks is not None):
            mine = self.callbacks = [None] * count
        if mine is not None:
            mine += [callback] * n if callbacks is None else callbacks[start:end]

    def seal(self, compression: Compression, level: int | None) -> None:
        """Fix the records: encode (and compress) them once; the columns are not needed
        afterwards."""
        if self.payload is None:
            records = _encode_records(
                self.values, self.keys, self.headers, self.ts_starts, self.ts_values
            )
            if compression is Compression.NONE:
                self.payload = records
            else:
                self.payload = compress(compression, records, level)
            self.values = []
            self.keys = self.headers = None

    def frame(
        self,
        compression: Compression,
        producer_id: int,
        epoch: int,
        seq: int,
        attributes: int = 0,
    ) -> bytes:
        """The batch as sent: header for these producer fields + payload, CRC computed."""
        payload = self.payload
        assert payload is not None
        if self.data is not None and (producer_id, epoch, seq) == (
            self.producer_id,
            self.epoch,
            self.base_seq,
        ):
            return self.data
        data = seal_batch(
            payload,
            record_count=self.count,
            last_offset_delta=self.count - 1,
            base_timestamp=self.ts_values[0],
            max_timestamp=max(self.ts_values),
            compression=compression,
            attributes=attributes,
            precompressed=True,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=seq,
        )
        self.producer_id, self.epoch, self.base_seq = producer_id, epoch, seq
        self.data = data
        return data


def _encode_records(
    values: list[bytes | None],
    keys: list[bytes | None] | None,
    headers: list[bytes] | None,
    ts_starts: list[int],
    ts_values: list[int],
) -> bytes:
    """Kafka v2 records, offset deltas from 0, timestamp deltas from the first record's:
    length, attributes 0, timestamp delta, offset delta, key, value, headers.

    The work is split in *segments*: records with one timestamp (a batch is filled within a
    few milliseconds, so there are few) whose offset deltas have one varint size. A record
    of a segment of keyless, headerless records is ``head, offset delta, mid, value, 0``
    where head (length, attributes, timestamp delta) and mid (key -1, value length) depend
    only on the value's length: they are made once per distinct length, and the segment is
    laid out by C-level list operations (extended-slice assignments) and one final join."""
    parts: list[bytes] = []
    zz = _ZZ
    limit = _ZZ_LIMIT
    count = len(values)
    base = ts_values[0]
    plain = keys is None and headers is None
    ends = [*ts_starts[1:], count]
    for start, end, ts in zip(ts_starts, ends, ts_values, strict=True):
        d = ts - base
        attrs_ts = b"\x00" + (zz[d] if 0 <= d < limit else varlong_bytes(d))
        while start < end:
            # Offset deltas below 64 take one byte, below 8192 two, up to the table's end
            # three; beyond it each is encoded on its own.
            stop = min(end, 64 if start < 64 else 8192 if start < 8192 else limit)
            if not plain or start >= limit:
                stop = end
                parts += _encode_general(values, keys, headers, attrs_ts, start, end)
                start = stop
                continue
            chunk = values[start:stop]
            try:
                sizes = list(map(len, chunk))  # type: ignore[arg-type]
            except TypeError:  # a None value among them (a keyless tombstone): rare
                parts += _encode_general(values, None, None, attrs_ts, start, stop)
                start = stop
                continue
            fixed = len(attrs_ts) + len(zz[start]) + 2  # + key -1 and header count 0
            heads: dict[int, bytes] = {}
            mids: dict[int, bytes] = {}
            for n in set(sizes):
                vl = zz[n] if n < limit else varlong_bytes(n)
                length = fixed + len(vl) + n
                heads[n] = (zz[length] if length < limit else varlong_bytes(length)) + attrs_ts
                mids[n] = b"\x01" + vl
            span = stop - start
            pieces: list[bytes] = [_ZERO] * (5 * span)  # the header counts are in place
            if len(heads) == 1:
                pieces[0::5] = [heads[sizes[0]]] * span
                pieces[2::5] = [mids[sizes[0]]] * span
            else:
                pieces[0::5] = list(map(heads.__getitem__, sizes))
                pieces[2::5] = list(map(mids.__getitem__, sizes))
            pieces[1::5] = zz[start:stop]
            pieces[3::5] = cast(list[bytes], chunk)
            parts += pieces
            start = stop
    return b"".join(parts)


def _encode_general(
    values: list[bytes | None],
    keys: list[bytes | None] | None,
    headers: list[bytes] | None,
    attrs_ts: bytes,
    start: int,
    end: int,
) -> list[bytes]:
    """The pieces of records ``start`` to ``end`` (one timestamp), any key, value and
    headers."""
    zz = _ZZ
    limit = _ZZ_LIMIT
    parts: list[bytes] = []
    extend = parts.extend
    for delta in range(start, end):
        od = zz[delta] if delta < limit else varlong_bytes(delta)
        key = None if keys is None else keys[delta]
        value = values[delta]
        header = b"\x00" if headers is None else headers[delta]
        if key is None:
            key_part = b"\x01"
        else:
            n = len(key)
            key_part = (zz[n] if n < limit else varlong_bytes(n)) + key
        if value is None:
            value_part = b"\x01"
            value = b""
        else:
            n = len(value)
            value_part = zz[n] if n < limit else varlong_bytes(n)
        length = len(attrs_ts) + len(od) + len(key_part) + len(value_part) + len(value)
        length += len(header)
        extend(
            (
                zz[length] if length < limit else varlong_bytes(length),
                attrs_ts,
                od,
                key_part,
                value_part,
                value,
                header,
            )
        )
    return parts


class _Run:
    """Plain records of one topic handed over by the synchronous facade, in order: their
    values, their ``on_delivery`` callbacks, and where their futures find their outcomes.
    Filled under the buffer's lock until the loop takes it."""

    __slots__ = ("callback", "callbacks", "chunk", "outcomes", "topic", "values")

    def __init__(self, topic: str, callback: DeliveryCallback | None) -> None:
        self.topic = topic
        self.callback = callback  # every record's on_delivery, while they share one
        # One per record once they differ (a callback per record, as Kafka's perf tool and
        # many applications pass): a column, so that they do not cut the run into runs of
        # one record, each costing as much as a batch.
        self.callbacks: list[DeliveryCallback | None] | None = None
        self.values: list[bytes] = []
        # The futures are not kept: each knows its chunk and its place in it.
        self.outcomes = _RunOutcomes()
        self.chunk = _Chunk(self.outcomes, 0)

    def callback_of(self, index: int) -> DeliveryCallback | None:
        return self.callback if self.callbacks is None else self.callbacks[index]


class _PartitionState:
    """Accumulator and sequence bookkeeping of one partition."""

    __slots__ = (
        "in_flight",
        "last_acked_seq",
        "next_seq",
        "open",
        "queue",
        "tp",
        "window",
    )

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.open: _Batch | None = None  # still taking records
        self.queue: deque[_Batch] = deque()  # closed, waiting to be sent (retries first)
        self.in_flight: list[_Batch] = []  # sent, in sequence order
        # Idempotent: the batches numbered under the current producer id and epoch, in
        # sequence order, from the oldest not settled on. The broker recognizes a re-sent
        # batch only among the last five it appended, so no new batch is numbered while
        # five are here: answers that arrive out of order must not push an unanswered
        # batch out of that window.
        self.window: deque[_Batch] = deque()
        self.next_seq = 0
        self.last_acked_seq = -1

    def requeue(self, batch: _Batch) -> None:
        """Put a batch back, before every batch with a higher (or no) sequence."""
        index = 0
        for index, other in enumerate(self.queue):  # noqa: B007
            if other.payload is None or _seq_before(batch.base_seq, other.base_seq):
                break
        else:
            index = len(self.queue)
        self.queue.insert(index, batch)


def _wrap_seq(seq: int) -> int:
    return seq & _INT32_MAX


def _seq_before(a: int, b: int) -> bool:
    """Whether sequence ``a`` comes before ``b`` (sequences wrap at 2**31)."""
    return 0 < ((b - a) & _INT32_MAX) < (1 << 30)


class AIOProducer:
    """Produces records; ``config`` takes Kafka's producer property names.

    Use it from one event loop. ``send`` is a plain method that returns an asyncio future;
    ``send_and_wait`` awaits the acknowledgement; ``flush`` and ``close`` are coroutines.
    """

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.config = c = parse_config("producer", config, **kwargs)
        given = {**(config or {}), **{k.replace("_", "."): v for k, v in kwargs.items()}}
        self._idempotent = self._check_idempotence(c, "enable.idempotence" in given)
        self.cluster = ClusterClient(c)
        self._acks: int = c["acks"]
        self._linger = c["linger.ms"] / 1000
        self._batch_size: int = c["batch.size"]
        self._max_request: int = c["max.request.size"]
        self._retries: int = c["retries"]
        self._backoff = c["retry.backoff.ms"] / 1000
        self._delivery_timeout = c["delivery.timeout.ms"] / 1000
        self._request_timeout_ms: int = c["request.timeout.ms"]
        self._max_block: float = c["max.block.ms"] / 1000
        plain = not (c["key.serializer"] or c["value.serializer"] or c["partitioner.class"])
        self._plain_limit = self._max_request - BATCH_HEADER_SIZE if plain else 0
        self._compression = Compression[c["compression.type"].upper()]
        self._level: int | None = {
            Compression.GZIP: c["compression.gzip.level"],
            Compression.LZ4: c["compression.lz4.level"],
            Compression.ZSTD: c["compression.zstd.level"],
        }.get(self._compression)
        self._ignore_keys: bool = c["partitioner.ignore.keys"]
        self._partitioner: PartitionerFn | None = c["partitioner.class"]
        self._key_serializer: Serializer | None = c["key.serializer"]
        self._value_serializer: Serializer | None = c["value.serializer"]
        in_flight = c["max.in.flight.requests.per.connection"]
        self._max_in_flight = (
            min(in_flight, MAX_IDEMPOTENT_IN_FLIGHT) if self._idempotent else in_flight
        )
        self.buffer = BufferMemory(c["buffer.memory"])
        self._sticky = StickyPartitioner()
        self._sticky_now: dict[str, int] = {}
        self._states: dict[TopicPartition, _PartitionState] = {}
        self._topic_states: dict[str, tuple[TopicInfo, list[_PartitionState]]] = {}
        self._waiting: dict[str, list[tuple[Any, ...]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._progress: asyncio.Event | None = None
        self._sender: asyncio.Task[None] | None = None
        # Handed over by other threads (under the buffer's lock): general records' enqueue()
        # arguments and runs of plain records; `_run` is the run plain records still join.
        self._inbox: deque[tuple[Any, ...] | _Run] = deque()
        self._run: _Run | None = None
        self._inbox_scheduled = False
        self._refusing = False  # see refuse_sends()
        self._flushing = 0
        self._closing = False
        self._closed = False
        self._refreshing = False
        # Idempotence: the producer id and epoch, and whether sequences must be reset.
        self.producer_id = -1
        self.producer_epoch = -1
        self._need_bump = False
        self._initializing = False
        self._init_error: ClientError | None = None
        # Transactions (transactional.id): records are refused outside a transaction.
        self._txn: TransactionManager | None = None
        self.refusing_records = False
        transactional_id = c["transactional.id"]
        if transactional_id is not None:
            if not self._idempotent:
                raise ConfigError(
                    "transactional.id needs idempotence: enable.idempotence=true, acks=all, "
                    "retries > 0, max.in.flight.requests.per.connection <= 5"
                )
            self._txn = TransactionManager(self, transactional_id, c["transaction.timeout.ms"])
            self.refusing_records = True

    @staticmethod
    def _check_idempotence(c: Mapping[str, Any], explicit: bool) -> bool:
        """Kafka's rules: idempotence needs acks=all, retries > 0 and at most 5 requests in
        flight; set explicitly with other settings it is an error, as a default it is
        quietly turned off."""
        if not c["enable.idempotence"]:
            return False
        conflicts = []
        if c["acks"] != -1:
            conflicts.append("acks must be all")
        if c["retries"] == 0:
            conflicts.append("retries must be above 0")
        if c["max.in.flight.requests.per.connection"] > MAX_IDEMPOTENT_IN_FLIGHT:
            conflicts.append("max.in.flight.requests.per.connection must be at most 5")
        if not conflicts:
            return True
        if explicit:
            raise ConfigError("enable.idempotence=true: " + "; ".join(conflicts))
        return False

    @property
    def idempotent(self) -> bool:
        return self._idempotent

    @property
    def max_block(self) -> float:
        """``max.block.ms`` in seconds."""
        return self._max_block

    async def __aenter__(self) -> AIOProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- sending -----------------------------------------------------------------------------

    def prepare(
        self,
        topic: str,
        value: Any,
        key: Any,
        headers: HeaderList | None,
        partition: int | None,
    ) -> tuple[bytes | None, bytes | None, Headers, int]:
        """Check and serialize one record; returns key, value, headers and its size in
        ``buffer.memory`` (safe to call from any thread)."""
        if self._closing or self._closed:
            raise ClientClosedError("the producer is closed")
        if self.refusing_records and self._txn is not None:
            raise self._txn.refusal()
        if type(topic) is not str or not topic:
            raise TypeError("topic must be a non-empty str")
        if self._key_serializer is not None:
            key = self._key_serializer(key)
        if self._value_serializer is not None:
            value = self._value_serializer(value)
        if value is not None and type(value) is not bytes:
            value = _as_bytes("value", value)
        if key is not None and type(key) is not bytes:
            key = _as_bytes("key", key)
        size = RECORD_OVERHEAD
        if value is not None:
            size += len(value)
        if key is not None:
            size += len(key)
        record_headers: Headers = ()
        if headers:
            record_headers = tuple(
                (str(name), _as_bytes(f"header {name!r}", hvalue)) for name, hvalue in headers
            )
            size += sum(len(n) + len(v or b"") + 2 for n, v in record_headers)
        if partition is not None and (type(partition) is not int or partition < 0):
            raise ValueError(f"partition must be a non-negative int, got {partition!r}")
        return key, value, record_headers, size

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: HeaderList | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; the future resolves once the broker acknowledged it.

        ``timestamp`` is epoch milliseconds (default: now). ``on_delivery(error, metadata)``
        is called on the event loop when the record is acknowledged or has failed. When
        ``buffer.memory`` is full this raises :class:`BufferExhaustedError` at once; await
        :meth:`send_when_ready` to wait up to ``max.block.ms`` instead.
        """
        key, value, record_headers, size = self.prepare(topic, value, key, headers, partition)
        if not self.buffer.try_reserve(size):
            raise self.buffer._exhausted(size, 0)
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        self.enqueue(
            topic, key, value, record_headers, partition, timestamp, on_delivery, future, size
        )
        return future

    async def send_when_ready(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: HeaderList | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Like :meth:`send`, but waits up to ``max.block.ms`` for ``buffer.memory``."""
        key, value, record_headers, size = self.prepare(topic, value, key, headers, partition)
        await self.buffer.reserve_async(size, self._max_block)
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        try:
            self.enqueue(
                topic, key, value, record_headers, partition, timestamp, on_delivery, future, size
            )
        except BaseException:
            self.buffer.release(size)
            raise
        return future

    async def send_and_wait(self, topic: str, value: Any = None, **kwargs: Any) -> RecordMetadata:
        return await (await self.send_when_ready(topic, value, **kwargs))

    @property
    def plain_limit(self) -> int:
        """The largest ``size`` of a record that may be handed over *plain* (see
        :meth:`hand_over`); 0 when a serializer or ``partitioner.class`` must see
        every record."""
        return self._plain_limit

    def hand_over(self, loop: asyncio.AbstractEventLoop, item: tuple[Any, ...], size: int) -> None:
        """Hand a prepared record over from another thread: reserve its ``size`` bytes of
        ``buffer.memory``, waiting up to ``max.block.ms``, then queue ``item`` (the arguments
        of :meth:`enqueue`) for the loop. Records handed over from one thread (by this and by
        :meth:`plain_sender`'s function) are enqueued in order."""
        buffer = self.buffer
        lock = buffer._lock
        with lock:
            used = buffer.used
            reserved = used + size <= buffer.total or used == 0
            if reserved:
                buffer.used = used + size
        if not reserved:
            buffer.reserve(size, self._max_block)  # waits, or raises BufferExhaustedError
        with lock:
            self._run = None  # plain records sent after this one follow it
            self._inbox.append(item)
            schedule = not self._inbox_scheduled
            self._inbox_scheduled = True
        if schedule:
            loop.call_soon_threadsafe(self._take_inbox)

    def plain_sender(
        self, loop: asyncio.AbstractEventLoop, general: GeneralSender | None = None
    ) -> Sender:
        """The synchronous ``send`` (the arguments of :meth:`send`), for another thread than
        the loop's. A *plain* record — only a topic, a ``bytes`` value and maybe an
        ``on_delivery`` callback — is taken here; any other record (or a plain one when a
        serializer or ``partitioner.class`` is set, or its value is too large for one request)
        is passed on to ``general``, whose answer is returned (without one: None).

        A plain record is appended to the current *run* (:class:`_Run`) of its topic: the
        column the loop later moves into batches by slices. Per record that is one lock, one
        list append and no other object than the future (which the producer does not keep);
        a new run starts only when the loop took the previous one, a general record came
        between, or the topic changed (callbacks that differ from record to record go into
        the run's column of callbacks: one more append each). It blocks up to ``max.block.ms``
        while ``buffer.memory`` is full, then raises :class:`BufferExhaustedError`; after
        :meth:`refuse_sends` it raises ClientClosedError."""
        buffer = self.buffer
        lock = buffer._lock
        total = buffer.total
        limit = self._plain_limit
        inbox = self._inbox
        call_soon = loop.call_soon_threadsafe
        take = self._take_inbox
        sleep = time.sleep
        new_future = DeliveryFuture

        def send(
            topic: str,
            value: Any = None,
            key: Any = None,
            headers: HeaderList | None = None,
            partition: int | None = None,
            timestamp: int | None = None,
            on_delivery: DeliveryCallback | None = None,
        ) -> DeliveryFuture | None:
            if (
                type(value) is not bytes
                or key is not None
                or headers is not None
                or partition is not None
                or timestamp is not None
                or (size := len(value) + RECORD_OVERHEAD) > limit
                or type(topic) is not str
                or not topic
                or self._refusing
                or self.refusing_records
            ):
                if self._refusing:
                    raise ClientClosedError("the producer is closed")
                if general is None:
                    return None
                return general(topic, value, key, headers, partition, timestamp, on_delivery)
            lock.acquire()
            used = buffer.used
            if not (used + size <= total or used == 0):
                lock.release()
                buffer.reserve(size, self._max_block)  # waits, or raises BufferExhaustedError
                lock.acquire()
                used = buffer.used - size
            buffer.used = used + size
            run = self._run
            if run is None or run.topic != topic:
                run = self._run = _Run(topic, on_delivery)
                inbox.append(run)
            behind = len(run.values)
            if run.callbacks is not None:
                run.callbacks.append(on_delivery)
            elif run.callback is not on_delivery:
                run.callbacks = [run.callback] * behind
                run.callbacks.append(on_delivery)
            place = behind & _CHUNK_MASK
            if place:
                future = new_future(run.chunk, place)
            else:
                chunk = run.chunk = _Chunk(run.outcomes, behind)
                future = new_future(chunk, 0)
            run.values.append(value)
            if self._inbox_scheduled:
                lock.release()
                if behind >= _INBOX_SLICE and not behind & _YIELD_EVERY:
                    # The loop is behind: let it have the GIL now rather than at the end of
                    # the interpreter's switch interval, or its I/O (and every
                    # acknowledgement) stalls while this thread fills the buffer.
                    sleep(0)
            else:
                self._inbox_scheduled = True
                lock.release()
                call_soon(take)
            return future

        return send

    def refuse_sends(self) -> None:
        """From now on the functions :meth:`plain_sender` made raise ClientClosedError (called
        by the synchronous facade's ``close()``, from its caller's thread)."""
        self._refusing = True

    def _take_inbox(self) -> None:
        """Enqueue what was handed over so far, but no more than :data:`_INBOX_SLICE` general
        records: a thread that keeps sending must not keep the loop from sending what it has.
        Runs of plain records are taken whole (their cost is per batch)."""
        inbox = self._inbox
        with self.buffer._lock:
            self._run = None  # frozen from now on: new plain records start a new run
            count = len(inbox)
        took = count > 0
        if self._sender is None and not (self._closed or self._closing):
            self._start(asyncio.get_running_loop())
        now = int(time.time() * 1000)
        general = 0
        while count and general < _INBOX_SLICE:
            count -= 1
            item = inbox.popleft()
            if isinstance(item, _Run):
                self._place_run(item, now)
            else:
                general += 1
                self._enqueue_item(item)
        with self.buffer._lock:
            again = bool(inbox)
            # While records keep coming (and may linger anyway), look again in a moment
            # rather than have the sending thread wake the loop for each run: a wake-up is a
            # write to the loop's self-pipe and a switch of threads.
            poll = took and not again and self._linger > 0 and not self._closed
            self._inbox_scheduled = again or poll
        if self._loop is not None:
            if again:
                # The rest after the loop's other work (responses, the sender) had its turn.
                self._loop.call_soon(self._take_inbox)
            elif poll:
                self._loop.call_later(min(self._linger, _INBOX_POLL), self._take_inbox)

    def _place_run(self, run: _Run, now: int) -> None:
        """Move a run of plain records into the open batches of the topic's sticky partition,
        a slice per batch, each slice a part of the run (:class:`_Part`). They all get
        ``now``, the time of this turn, as their timestamp (the time the loop batches them,
        as for every record without one)."""
        topic, values, outcomes = run.topic, run.values, run.outcomes
        count = len(values)
        start = 0
        # Reserved sizes, cumulative from the run's start: computed only when the run does
        # not fit in one batch.
        ends: list[int] | None = None
        left = sum(map(len, values)) + RECORD_OVERHEAD * count
        room = self._batch_size - BATCH_HEADER_SIZE
        while start < count:
            first = len(values[start]) + RECORD_OVERHEAD
            try:
                batch = self._plain_batch(topic, first)
            except Exception as exc:  # a bug must not leave the records' futures hanging
                log.exception("cannot queue records of %r", topic)
                self.buffer.release(left)
                failure = ClientError(f"cannot queue the record: {exc!r}")
                DeliveryFuture.settle_parts([outcomes.add(start, count, 0)], _Failed(failure))
                for index in range(start, count):
                    self._callback(run.callback_of(index), failure, None)
                return
            if batch is None:  # closing, or no metadata yet: the general path, one by one
                for index in range(start, count):
                    value = values[index]
                    sink = outcomes.add(index, index + 1, 0)
                    item = (topic, None, value, (), None, now, run.callback_of(index), sink)
                    self._enqueue_item((*item, len(value) + RECORD_OVERHEAD))
                return
            space = room - batch.reserved
            if left <= space:
                end, taken = count, left
            else:
                if ends is None:
                    sizes = map(len, values)
                    ends = list(accumulate(map(RECORD_OVERHEAD.__add__, sizes)))
                base = ends[start - 1] if start else 0
                end = max(bisect.bisect_right(ends, base + space, start), start + 1)
                taken = ends[end - 1] - base
            batch.add_part(outcomes, values, start, end, now, run.callback, run.callbacks)
            batch.reserved += taken
            left -= taken
            start = end

    def _enqueue_item(self, item: tuple[Any, ...]) -> None:
        try:
            self.enqueue(*item)
        except BaseException as exc:  # keep going: one bad record fails alone
            self.buffer.release(item[8])
            self._resolve(item[7], item[6], ClientError(f"cannot queue the record: {exc!r}"))

    def _plain_batch(self, topic: str, size: int) -> _Batch | None:
        """The batch a plain record of ``topic`` goes into: the open batch of the sticky
        partition, with room for ``size`` bytes. None when the record must take the general
        path (the producer is closing, or the topic's metadata is not known yet)."""
        if self._closed or self._closing or size + BATCH_HEADER_SIZE > self._max_request:
            return None
        info = self.cluster.metadata.topics.get(topic)
        if info is None or topic in self._waiting or not info.partitions:
            return None
        count = len(info.partitions)
        while True:
            partition = self._sticky_now.get(topic)
            if partition is None or partition >= count:
                partition = self._sticky.partition(
                    topic, count, self.cluster.metadata.available_partitions(topic)
                )
                self._sticky_now[topic] = partition
            batch = self._batch_with_room(self._partition_state(topic, info, partition), size, True)
            if batch is not None:
                return batch

    def _batch_with_room(self, state: _PartitionState, size: int, sticky: bool) -> _Batch | None:
        """The open batch of ``state`` if it has room for ``size`` more bytes, or a new one.
        A full one is closed for the sender first; for a keyless record (``sticky``) the
        answer is then None: the sticky partition moved and the record follows it."""
        batch = state.open
        if batch is not None and batch.sinks and batch.size + size > self._batch_size:
            state.queue.append(batch)
            state.open = None
            self._wake()
            if sticky:
                self._switch_sticky(state.tp)
                return None
            batch = None
        if batch is None:
            batch = state.open = _Batch(state.tp, time.monotonic())
            if not state.queue:
                self._wake()
        return batch

    def _partition_state(self, topic: str, info: TopicInfo, partition: int) -> _PartitionState:
        cached = self._topic_states.get(topic)
        if cached is None or cached[0] is not info:
            cached = self._cache_topic(topic, info)
        return cached[1][partition]

    def enqueue(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        partition: int | None,
        timestamp: int | None,
        on_delivery: DeliveryCallback | None,
        sink: _Sink,
        size: int,
    ) -> None:
        """Append a prepared record whose ``size`` is already reserved (on the loop)."""
        if self._closed or self._closing:
            self.buffer.release(size)
            self._resolve(sink, on_delivery, ClientClosedError("the producer is closed"))
            return
        if self._sender is None:
            self._start(asyncio.get_running_loop())
        ts = int(time.time() * 1000) if timestamp is None else int(timestamp)
        if size + BATCH_HEADER_SIZE > self._max_request:
            self.buffer.release(size)
            self._resolve(
                sink,
                on_delivery,
                broker_error(
                    ErrorCode.MESSAGE_TOO_LARGE,
                    f"the record is {size} bytes, above max.request.size={self._max_request}",
                ),
            )
            return
        info = self.cluster.metadata.topics.get(topic)
        if info is None or topic in self._waiting:
            queued = self._waiting.setdefault(topic, [])
            queued.append((topic, key, value, headers, partition, ts, on_delivery, sink, size))
            if len(queued) == 1:
                self._spawn(self._fetch_topic(topic))
            return
        self._append(info, topic, key, value, headers, partition, ts, on_delivery, sink, size)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._sender is None:
            self._loop = loop
            self._wakeup = asyncio.Event()
            self._sender = loop.create_task(self._run_sender())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def _fetch_topic(self, topic: str) -> None:
        """Wait for ``topic``'s metadata, then append its queued records in order."""
        deadline = time.monotonic() + self._max_block
        error: ClientError | None = None
        info: TopicInfo | None = None
        while True:
            try:
                await self.cluster.refresh([topic], allow_auto_create=True)
                info = self.cluster.metadata.topics.get(topic)
                if info is not None and info.partitions:
                    break
                error = broker_error(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, context=f"topic {topic!r}"
                )
            except ClientError as exc:
                error = exc
                if not exc.retriable and not isinstance(exc, BrokerConnectionError):
                    break
            if self._closed or time.monotonic() >= deadline:
                break
            await asyncio.sleep(max(self._backoff, 0.05))
        queued = self._waiting.pop(topic, [])
        if info is None or not info.partitions:
            failure = ClientError(
                f"no metadata for topic {topic!r} within max.block.ms="
                f"{int(self._max_block * 1000)}: {error}",
                code=error.code if error is not None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            )
            for item in queued:
                self.buffer.release(item[8])
                self._resolve(item[7], item[6], failure)
            return
        for item in queued:
            self._append(info, *item)

    def _append(
        self,
        info: TopicInfo,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        partition: int | None,
        timestamp: int,
        on_delivery: DeliveryCallback | None,
        sink: _Sink,
        size: int,
    ) -> None:
        count = len(info.partitions)
        sticky = False
        if partition is None:
            if self._partitioner is not None:
                partition = self._custom_partition(topic, key, value, count)
            elif key is not None and not self._ignore_keys:
                partition = partition_for_key(key, count)
            else:
                sticky = True
                partition = self._sticky_now.get(topic)
                if partition is None or partition >= count:
                    partition = self._sticky.partition(
                        topic, count, self.cluster.metadata.available_partitions(topic)
                    )
                    self._sticky_now[topic] = partition
        if not 0 <= partition < count:
            self.buffer.release(size)
            self._resolve(
                sink,
                on_delivery,
                broker_error(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {topic!r} has {count} partitions, no partition {partition}",
                ),
            )
            return
        state = self._partition_state(topic, info, partition)
        batch = self._batch_with_room(state, size, sticky)
        if batch is None:  # full: the keyless record follows the sticky partition
            self._append(info, topic, key, value, headers, None, timestamp, on_delivery, sink, size)
            return
        batch.add(
            key,
            value,
            timestamp,
            sink,
            on_delivery,
            _encode_headers(headers) if headers else b"\x00",
        )
        batch.reserved += size

    def _cache_topic(self, topic: str, info: TopicInfo) -> tuple[TopicInfo, list[_PartitionState]]:
        """The states of every partition of ``topic``, by index, for this metadata."""
        states = []
        for partition in range(len(info.partitions)):
            tp = TopicPartition(topic, partition)
            state = self._states.get(tp)
            if state is None:
                state = self._states[tp] = _PartitionState(tp)
            states.append(state)
        cached = self._topic_states[topic] = (info, states)
        return cached

    def _custom_partition(
        self, topic: str, key: bytes | None, value: bytes | None, count: int
    ) -> int:
        assert self._partitioner is not None
        chosen = self._partitioner(topic, key, value, count)
        if type(chosen) is not int:
            raise TypeError(f"partitioner.class returned {chosen!r}, not a partition number")
        return chosen

    def _switch_sticky(self, tp: TopicPartition) -> None:
        if self._sticky_now.get(tp.topic) != tp.partition:
            return
        info = self.cluster.metadata.topics.get(tp.topic)
        if info is not None:
            self._sticky.batch_sealed(
                tp.topic,
                tp.partition,
                len(info.partitions),
                self.cluster.metadata.available_partitions(tp.topic),
            )
            self._sticky_now[tp.topic] = self._sticky.partition(tp.topic, len(info.partitions), ())

    # -- the sender --------------------------------------------------------------------------

    async def _run_sender(self) -> None:
        assert self._wakeup is not None
        while True:
            self._wakeup.clear()
            wait = self._drain(time.monotonic())
            if self._closing and not self._pending_work():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), wait)

    def _pending_work(self) -> bool:
        return bool(
            self._waiting
            or self._inbox
            or any(s.open or s.queue or s.in_flight for s in self._states.values())
        )

    def _any_in_flight(self) -> bool:
        return any(s.in_flight for s in self._states.values())

    def _expire(self, state: _PartitionState, now: float) -> None:
        """Fail batches (not in flight) older than ``delivery.timeout.ms``."""
        limit = self._delivery_timeout
        while state.queue and now - state.queue[0].created > limit:
            self._expire_batch(state, state.queue.popleft())
        if state.open is not None and not state.queue and now - state.open.created > limit:
            batch, state.open = state.open, None
            self._expire_batch(state, batch)

    def _expire_batch(self, state: _PartitionState, batch: _Batch) -> None:
        why = f"; last InitProducerId error: {self._init_error}" if self._init_error else ""
        self._settle_failed(
            batch,
            ClientError(
                f"{batch.tp}: {batch.count} record(s) not acknowledged within "
                f"delivery.timeout.ms={int(self._delivery_timeout * 1000)} "
                f"(sent {batch.attempts + (batch.payload is not None)} time(s)){why}",
                code=ErrorCode.REQUEST_TIMED_OUT,
            ),
        )

    def _drain(self, now: float) -> float | None:
        """Send every ready batch; return how long until the next one may be ready."""
        urgent = self._flushing > 0 or self._closing
        next_check: float | None = None
        missing_leader = False
        blocked = False
        txn = self._txn
        if txn is not None and self._need_bump:
            # Sequences of the transaction have a gap: only an abort (which then bumps the
            # epoch through the coordinator) can go on.
            txn.record_failed(
                ClientError("a batch's sequence was lost: the transaction must be aborted")
            )
        if self._idempotent and (self.producer_id < 0 or self._need_bump):
            # Nothing new goes out until there is a producer id (and, for a bump, until
            # every request in flight has been answered). A transactional producer's id
            # comes from init_transactions only.
            blocked = True
            if (
                txn is None
                and not self._initializing
                and not (self._need_bump and self._any_in_flight())
            ):
                self._initializing = True
                self._spawn(self._init_producer_id())
        by_leader: dict[int, list[list[_Batch]]] = {}
        for tp, state in list(self._states.items()):
            self._expire(state, now)
            if not (state.open or state.queue or state.in_flight):
                # An idle partition keeps its state: its sequence numbers must go on.
                continue
            if blocked:
                continue
            if txn is not None and not txn.may_send(tp):
                continue  # its partition is being added to the transaction
            rounds = 0
            while len(state.in_flight) < self._max_in_flight:
                batch = state.queue[0] if state.queue else state.open
                if batch is None:
                    break
                if batch.attempts:
                    # A retry: after its backoff, and (idempotent) only as the one batch of
                    # its partition in flight, so the broker sees sequences in order.
                    if self._idempotent and state.in_flight:
                        break
                    if now < batch.not_before:
                        next_check = _earliest(next_check, batch.not_before)
                        break
                elif batch is state.open:
                    ready_at = batch.created + self._linger
                    if not urgent and now < ready_at and batch.size < self._batch_size:
                        next_check = _earliest(next_check, ready_at)
                        break
                if (
                    self._idempotent
                    and len(state.window) >= MAX_IDEMPOTENT_IN_FLIGHT
                    and (
                        batch.payload is None
                        or batch.producer_id != self.producer_id
                        or batch.epoch != self.producer_epoch
                    )
                ):
                    break  # it would take a new sequence: see _PartitionState.window
                leader = self.cluster.metadata.leader(tp.topic, tp.partition)
                if leader is None:
                    missing_leader = True
                    break
                if batch is state.open:
                    state.open = None
                    self._switch_sticky(tp)
                else:
                    state.queue.popleft()
                self._stamp(state, batch)
                state.in_flight.append(batch)
                requests = by_leader.setdefault(leader, [])
                if len(requests) <= rounds:
                    requests.append([])
                requests[rounds].append(batch)
                rounds += 1
        if missing_leader or self.cluster.stale():
            self._refresh_soon()
            if next_check is None:
                next_check = now + max(self._backoff, 0.05)
        for leader, requests in by_leader.items():
            for batches in requests:
                self._send_request(leader, batches)
        return None if next_check is None else max(next_check - now, 0.0)

    def _stamp(self, state: _PartitionState, batch: _Batch) -> None:
        """Seal a batch and give it its producer fields (a sequence on first send)."""
        first = batch.payload is None
        batch.seal(self._compression, self._level)
        if not self._idempotent:
            batch.frame(self._compression, -1, -1, -1)
            return
        if first or batch.producer_id != self.producer_id or batch.epoch != self.producer_epoch:
            seq = state.next_seq
            state.next_seq = _wrap_seq(seq + batch.count)
            state.window.append(batch)
        else:
            seq = batch.base_seq
        attributes = TRANSACTIONAL_MASK if self._txn is not None else 0
        batch.frame(self._compression, self.producer_id, self.producer_epoch, seq, attributes)

    def _send_request(self, leader: int, batches: list[_Batch]) -> None:
        request: list[_Batch] = []
        request_size = 0
        for batch in batches:
            assert batch.data is not None
            size = len(batch.data)
            if request and request_size + size > self._max_request:
                self._spawn(self._produce(leader, request))
                request, request_size = [], 0
            request.append(batch)
            request_size += size
        self._spawn(self._produce(leader, request))

    def _refresh_soon(self) -> None:
        if self._refreshing or self._closed:
            return
        self._refreshing = True

        async def refresh() -> None:
            try:
                await self.cluster.refresh({tp.topic for tp in self._states} or None)
            except ClientError as exc:
                log.debug("metadata refresh failed: %s", exc)
                await asyncio.sleep(max(self._backoff, 0.05))
            finally:
                self._refreshing = False
                self._wake()

        self._spawn(refresh())

    async def _init_producer_id(self) -> None:
        """InitProducerId until it succeeds: first time, or to bump the epoch (KIP-360)."""
        try:
            while not self._closed:
                bump = self.producer_id >= 0 and self.producer_epoch < _INT16_MAX - 1
                try:
                    conn = await self._some_broker()
                    version = conn.version(ApiKey.INIT_PRODUCER_ID)
                    pid, epoch = (
                        (self.producer_id, self.producer_epoch)
                        if bump and version >= 3
                        else (-1, -1)
                    )
                    response = await conn.call(
                        ApiKey.INIT_PRODUCER_ID,
                        {
                            "transactional_id": None,
                            "transaction_timeout": 60_000,
                            "producer_id": pid,
                            "producer_epoch": epoch,
                        },
                    )
                    code = ErrorCode.from_wire(int(response.error_code))
                    if code is not ErrorCode.NONE:
                        raise broker_error(code, context="InitProducerId")
                except BrokerConnectionError as exc:
                    self._init_error = exc
                except ClientError as exc:
                    self._init_error = exc
                    log.warning("InitProducerId failed: %s", exc)
                else:
                    self._set_producer(int(response.producer_id), int(response.producer_epoch))
                    return
                await asyncio.sleep(max(self._backoff, 0.05))
        finally:
            self._initializing = False
            self._wake()

    async def _some_broker(self) -> Connection:
        """The connection to a known broker. (Metadata first, so that this never opens a
        second bootstrap connection next to a refresh's.)"""
        if not self.cluster.metadata.brokers:
            await self.cluster.refresh([])
        brokers = sorted(self.cluster.metadata.brokers)
        if not brokers:
            raise BrokerConnectionError("the cluster metadata lists no broker")
        return await self.cluster.connection(brokers[0])

    def _set_producer(self, producer_id: int, epoch: int) -> None:
        """A new producer id or epoch: every partition starts again at sequence 0; the
        batches not acknowledged get new sequences, in their order, when (re)sent."""
        log.debug(
            "producer id %d epoch %d (was %d/%d)",
            producer_id,
            epoch,
            self.producer_id,
            self.producer_epoch,
        )
        self.producer_id, self.producer_epoch = producer_id, epoch
        self._need_bump = False
        self._init_error = None
        for state in self._states.values():
            state.next_seq = 0
            state.last_acked_seq = -1
            state.window.clear()

    def _held_back(self, conn: Any, batches: list[_Batch]) -> list[_Batch]:
        """The batches that must not go out on ``conn`` now, because an earlier batch of their
        partition is waiting to be re-sent or in flight on a connection since lost: the broker
        would see them first (and it accepts any sequence from a producer it does not know
        yet). They are re-queued and follow the earlier ones."""
        held = []
        for batch in batches:
            state = self._states.get(batch.tp)
            if state is None:
                continue
            if any(
                b.payload is not None
                and b.epoch == batch.epoch
                and _seq_before(b.base_seq, batch.base_seq)
                for b in state.queue
            ):
                held.append(batch)
                continue
            for earlier in state.in_flight:
                if earlier is batch:
                    break
                if earlier.conn is not conn and earlier.conn is not None:
                    held.append(batch)
                    break
        return held

    async def _produce(self, leader: int, batches: list[_Batch]) -> None:
        topic_ids: dict[str, Any] = {}
        try:
            conn = await self.cluster.connection(leader)
            if self._idempotent:
                held = self._held_back(conn, batches)
                if held:
                    wait = ClientError(
                        "sent after the partition's earlier batches",
                        code=ErrorCode.NETWORK_EXCEPTION,
                    )
                    for b in held:
                        self._on_error(b, wait)
                    batches = [b for b in batches if b not in held]
                    if not batches:
                        self._wake()
                        return
            for b in batches:
                b.conn = conn
            version = conn.version(ApiKey.PRODUCE)
            topic_ids = {b.tp.topic: self.cluster.metadata.topic_id(b.tp.topic) for b in batches}
            if version >= 13 and None in topic_ids.values():
                version = 12
            by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for b in batches:
                by_topic[b.tp.topic].append({"index": b.tp.partition, "records": b.data})
            values = {
                "transactional_id": None if self._txn is None else self._txn.transactional_id,
                "acks": self._acks,
                "timeout": self._request_timeout_ms,
                "topic_data": [
                    {"name": t, "topic_id": topic_ids[t], "partition_data": parts}
                    for t, parts in by_topic.items()
                ],
            }
            try:
                response = await conn.call(
                    ApiKey.PRODUCE, values, version=version, expect_response=self._acks != 0
                )
            except BrokerConnectionError:
                await self.cluster.forget(conn)
                raise
        except ClientError as exc:
            for b in batches:
                self._on_error(b, exc)
            self._wake()
            return
        except Exception as exc:  # a bug must not leave futures hanging forever
            for b in batches:
                self._settle_failed(b, ClientError(f"producing failed: {exc!r}"))
            self._wake()
            raise
        if response is None:
            for b in batches:
                self._on_success(b, -1, -1)
            self._wake()
            return
        answered: dict[TopicPartition, Any] = {}
        for t in response.responses:
            name = getattr(t, "name", None)
            if name is None:
                tid = getattr(t, "topic_id", None)
                name = next((n for n, i in topic_ids.items() if i == tid), "")
            for p in t.partition_responses:
                answered[TopicPartition(name, int(p.index))] = p
        for b in batches:
            p = answered.get(b.tp)
            if p is None:
                self._on_error(
                    b, broker_error(ErrorCode.UNKNOWN_SERVER_ERROR, "no answer for the partition")
                )
                continue
            code = ErrorCode.from_wire(int(p.error_code))
            if code is ErrorCode.NONE or code is ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
                append_time = p.log_append_time
                self._on_success(
                    b,
                    int(p.base_offset),
                    -1 if append_time is None else epoch_millis(append_time),
                )
            else:
                self._on_error(
                    b, broker_error(code, getattr(p, "error_message", None), context=str(b.tp))
                )
        self._wake()

    # -- outcomes ----------------------------------------------------------------------------

    def _on_success(self, batch: _Batch, base_offset: int, append_time: int) -> None:
        state = self._states.get(batch.tp)
        if state is not None:
            with contextlib.suppress(ValueError):
                state.in_flight.remove(batch)
            if self._idempotent and batch.producer_id == self.producer_id:
                last = _wrap_seq(batch.base_seq + batch.count - 1)
                if batch.epoch == self.producer_epoch:
                    state.last_acked_seq = last
        self.buffer.release(batch.reserved)
        batch.reserved = 0
        delivered = _Delivered(batch, base_offset, append_time)
        DeliveryFuture.settle_batch(batch.sinks, delivered, batch.parts)
        self._settled(batch)
        if batch.callbacks is not None:
            _call_back_delivered(batch.callbacks, delivered)

    def _on_error(self, batch: _Batch, error: ClientError) -> None:
        """A sent batch was refused or got no answer: retry it, or fail it."""
        state = self._states.get(batch.tp)
        if state is None:  # the producer was closed meanwhile
            self._settle_failed(batch, error)
            return
        with contextlib.suppress(ValueError):
            state.in_flight.remove(batch)
        code = error.code
        now = time.monotonic()
        retry = error.retriable
        if self._idempotent:
            if code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER:
                # An earlier batch is unacknowledged (lost on the way or being retried): this
                # one is re-sent after it. If it *is* the next expected sequence the broker
                # lost our state: bump the epoch and re-send under it.
                expected = _wrap_seq(state.last_acked_seq + 1)
                retry = True
                if batch.base_seq == expected and batch.epoch == self.producer_epoch:
                    self._need_bump = True
            elif code in (ErrorCode.UNKNOWN_PRODUCER_ID, ErrorCode.INVALID_PRODUCER_EPOCH):
                retry = True
                if batch.epoch == self.producer_epoch:
                    self._need_bump = True
        if (
            retry
            and batch.attempts < self._retries
            and now - batch.created < self._delivery_timeout
            and not self._closed
        ):
            batch.attempts += 1
            batch.not_before = now + self._backoff
            state.requeue(batch)
            if code in STALE_METADATA_CODES or isinstance(error, BrokerConnectionError):
                self._refresh_soon()
            return
        self._settle_failed(batch, error)

    def _settle_failed(self, batch: _Batch, error: ClientError) -> None:
        state = self._states.get(batch.tp)
        if state is not None:
            with contextlib.suppress(ValueError):
                state.in_flight.remove(batch)
        if self._idempotent and batch.payload is not None and batch.epoch == self.producer_epoch:
            # Its sequence may or may not have been written: the next batches cannot follow
            # it safely, so the sequences start over under a new epoch.
            self._need_bump = True
        self._fail(batch, error)

    def _fail(self, batch: _Batch, error: ClientError) -> None:
        if self._txn is not None and not self._closed:
            self._txn.record_failed(error)
        self.buffer.release(batch.reserved)
        batch.reserved = 0
        if batch.parts:
            DeliveryFuture.settle_parts(batch.parts, _Failed(error))  # done() from now on
        for sink in batch.sinks:
            if sink is not None and not sink.done():
                with contextlib.suppress(Exception):  # a caller cancelled its future
                    sink.set_exception(error)
        self._settled(batch)
        if batch.callbacks is not None:
            for callback in batch.callbacks:
                self._callback(callback, error, None)

    def _settled(self, batch: _Batch) -> None:
        batch.settled = True
        state = self._states.get(batch.tp)
        if state is not None:
            window = state.window
            while window and window[0].settled:
                window.popleft()
        if self._progress is not None:
            self._progress.set()

    def _resolve(self, sink: _Sink, callback: DeliveryCallback | None, error: ClientError) -> None:
        if not sink.done():
            with contextlib.suppress(Exception):
                sink.set_exception(error)
        self._callback(callback, error, None)

    @staticmethod
    def _callback(
        callback: DeliveryCallback | None, error: ClientError | None, md: RecordMetadata | None
    ) -> None:
        if callback is None:
            return
        try:
            callback(error, md)
        except Exception:
            log.exception("on_delivery callback raised")

    # -- transactions (see tidelog.client.aio.transactions) ----------------------------------

    def _transactional(self) -> TransactionManager:
        if self._txn is None:
            raise ClientError("transactions need transactional.id")
        if self._closing or self._closed:
            raise ClientClosedError("the producer is closed")
        return self._txn

    async def init_transactions(self, timeout: float | None = None) -> None:
        """Get the transactional id's producer id and epoch from its coordinator, which
        fences every older producer of the id and ends its open transaction."""
        txn = self._transactional()
        if self._sender is None:
            self._start(asyncio.get_running_loop())
        await txn.init(self._max_block if timeout is None else timeout)

    def begin_transaction(self) -> None:
        self._transactional().begin()

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
        group: str | ConsumerGroupMetadata,
        timeout: float | None = None,
    ) -> None:
        """Commit ``offsets`` for ``group`` as part of the transaction: they count only if
        it commits. Given a consumer's ``group_metadata()`` the group's coordinator refuses
        them from a member that is no longer in the group's generation (KIP-447)."""
        txn = self._transactional()
        member = group if isinstance(group, ConsumerGroupMetadata) else ConsumerGroupMetadata(group)
        await txn.send_offsets(offsets, member, self._max_block if timeout is None else timeout)

    async def commit_transaction(self, timeout: float | None = None) -> None:
        """Send every record of the transaction, then commit it."""
        while self._inbox:
            self._take_inbox()
        txn = self._transactional()
        await txn.commit(self._max_block if timeout is None else timeout)

    async def abort_transaction(self, timeout: float | None = None) -> None:
        """Fail the records not sent yet and abort the transaction."""
        while self._inbox:
            self._take_inbox()
        txn = self._transactional()
        await txn.abort(self._max_block if timeout is None else timeout)

    @property
    def retry_backoff(self) -> float:
        return float(self._backoff)

    @property
    def delivery_timeout(self) -> float:
        return float(self._delivery_timeout)

    @property
    def needs_new_sequences(self) -> bool:
        return self._need_bump

    def wake(self) -> None:
        self._wake()

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` as one of the producer's tasks (cancelled by close)."""
        self._spawn(coro)

    def set_producer(self, producer_id: int, epoch: int) -> None:
        self._set_producer(producer_id, epoch)
        self._wake()

    def fail_unsent(self, error: ClientError) -> None:
        """Fail every record not in flight (a transaction that can only be aborted)."""
        while self._inbox:
            self._take_inbox()
        for state in self._states.values():
            unsent = [b for b in (state.open, *state.queue) if b is not None]
            state.open = None
            state.queue.clear()
            for batch in unsent:
                if batch.payload is not None and batch.epoch == self.producer_epoch:
                    self._need_bump = True  # its sequence was taken: a gap now
                self._fail(batch, error)
        for items in self._waiting.values():
            for item in items:
                self.buffer.release(item[8])
                self._resolve(item[7], item[6], error)
        self._waiting.clear()

    # -- flush and close ---------------------------------------------------------------------

    def _unsettled(self) -> tuple[list[_Batch], list[_Sink]]:
        batches = [
            batch
            for state in self._states.values()
            for batch in (state.open, *state.queue, *state.in_flight)
            if batch is not None
        ]
        sinks = [item[7] for items in self._waiting.values() for item in items]
        return batches, sinks

    async def flush(self, timeout: float | None = None) -> int:
        """Send everything queued now and wait for the answers; returns how many records are
        still outstanding (0 unless ``timeout`` seconds passed first)."""
        while self._inbox:
            self._take_inbox()
        unsettled, sinks = self._unsettled()
        if not unsettled and not sinks:
            return 0
        if self._progress is None:
            self._progress = asyncio.Event()
        self._flushing += 1
        self._wake()
        deadline = None if timeout is None else time.monotonic() + timeout
        # Waited for one at a time, the first first: each settled batch wakes this loop,
        # and looking through all of them at each wake-up would cost thousands of batches
        # squared when buffer.memory holds thousands.
        batches = deque(unsettled)
        try:
            while True:
                while batches and batches[0].settled:
                    batches.popleft()
                # Records still waiting for their topic's metadata: checked one by one (few).
                sinks = [s for s in sinks if not s.done()]
                left = None if deadline is None else deadline - time.monotonic()
                if not (batches or sinks) or (left is not None and left <= 0):
                    break
                self._progress.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._progress.wait(), min(left or 0.05, 0.05))
        finally:
            self._flushing -= 1
        return sum(b.count for b in batches if not b.settled) + len(sinks)

    async def close(self, timeout: float | None = None) -> None:
        """Flush (at most ``timeout`` seconds), then fail what is left and disconnect."""
        if self._closed:
            return
        while self._inbox:
            self._take_inbox()
        self._closing = True
        await self.flush(timeout)
        self._closed = True
        self._wake()
        leftover = ClientClosedError("the producer was closed before the record was sent")
        for state in self._states.values():
            for batch in (state.open, *state.queue, *state.in_flight):
                if batch is not None:
                    self._fail(batch, leftover)
        self._states.clear()
        self._topic_states.clear()
        for items in self._waiting.values():
            for item in items:
                self.buffer.release(item[8])
                self._resolve(item[7], item[6], leftover)
        self._waiting.clear()
        tasks = list(self._tasks)
        if self._sender is not None:
            tasks.append(self._sender)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.cluster.close()


def _call_back_delivered(callbacks: list[DeliveryCallback | None], delivered: _Delivered) -> None:
    """Call each record's ``on_delivery`` with its RecordMetadata, in batch order: a run of
    records with one timestamp at a time, the metadata made inline (this runs for every record
    of a batch that has callbacks)."""
    topic, partition = delivered.topic, delivered.partition
    base = delivered.base_offset
    new = tuple.__new__
    starts = delivered.ts_starts
    runs = zip(starts, [*starts[1:], len(callbacks)], delivered.ts_values, strict=True)
    for start, end, timestamp in runs:
        if delivered.append_time >= 0:
            timestamp = delivered.append_time
        for index in range(start, end):
            callback = callbacks[index]
            if callback is None:
                continue
            offset = base + index if base >= 0 else -1
            try:
                callback(None, new(RecordMetadata, (topic, partition, offset, timestamp)))
            except Exception:
                log.exception("on_delivery callback raised")


def _earliest(current: float | None, candidate: float) -> float:
    return candidate if current is None or candidate < current else current
