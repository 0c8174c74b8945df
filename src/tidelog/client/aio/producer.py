"""AIOProducer: an accumulator of per-partition batches and one sender task.

``send()`` is a plain method (call it on the producer's event loop) that encodes the record
into the open batch of its partition at once and returns a future of
:class:`~tidelog.client.types.RecordMetadata`. Records of a topic whose metadata is not known
yet wait, in order, in a per-topic queue until it is.

The sender task drains batches that are *ready*: full (``batch.size``), older than
``linger.ms``, retried after ``retry.backoff.ms``, or wanted by ``flush()``/``close()``. Ready
batches are grouped by partition leader into one Produce request per broker (at most
``max.request.size`` bytes). A partition has at most one batch in flight, so retries never
reorder records within a partition (the Java client needs idempotence for that guarantee with
more than one in flight; this producer has no idempotence yet and ``enable.idempotence`` must
stay false). A batch is closed (compressed, CRC computed) once, when it is first sent; a retry
resends the same bytes.

A retriable error (including a lost connection) requeues the batch at the head of its
partition, up to ``retries`` times and within ``delivery.timeout.ms`` of the first record; the
errors that mean the leader moved refresh metadata first. Everything else fails the batch's
futures with a :class:`~tidelog.client.errors.ClientError` carrying the broker's error code.
With ``acks=0`` no response is awaited and offsets are reported as -1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tidelog.client.cluster import STALE_METADATA_CODES, ClusterClient, TopicInfo
from tidelog.client.config import parse_config
from tidelog.client.errors import (
    BrokerConnectionError,
    ClientClosedError,
    ClientError,
    ConfigError,
    broker_error,
)
from tidelog.client.messages import epoch_millis
from tidelog.client.partitioner import StickyPartitioner, partition_for_key
from tidelog.client.types import RecordMetadata, TopicPartition
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.records import BatchBuilder, Compression

log = logging.getLogger(__name__)

DeliveryCallback = Callable[[ClientError | None, RecordMetadata | None], None]
HeaderList = Iterable[tuple[str, bytes | bytearray | memoryview | str | None]]

# Bytes a record adds beyond its key, value and headers (length, attributes, deltas, counts).
_RECORD_OVERHEAD = 21
_BATCH_OVERHEAD = 61


class _Batch:
    __slots__ = (
        "attempts",
        "builder",
        "created",
        "data",
        "deliveries",
        "not_before",
        "tp",
    )

    def __init__(self, tp: TopicPartition, builder: BatchBuilder, now: float) -> None:
        self.tp = tp
        self.builder = builder
        self.created = now
        self.deliveries: list[
            tuple[asyncio.Future[RecordMetadata], int, DeliveryCallback | None]
        ] = []
        self.data: bytes | None = None
        self.attempts = 0
        self.not_before = 0.0

    def seal(self) -> bytes:
        if self.data is None:
            self.data = self.builder.close()
        return self.data


def _as_bytes(name: str, value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"{name} must be bytes, str or None, got {type(value).__name__}")


class AIOProducer:
    """Produces records; ``config`` takes Kafka's producer property names."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.config = parse_config("producer", config, **kwargs)
        if self.config["enable.idempotence"]:
            raise ConfigError(
                "enable.idempotence=true is not supported yet; leave it false (the default)"
            )
        self.cluster = ClusterClient(self.config)
        c = self.config
        self._acks: int = c["acks"]
        self._linger = c["linger.ms"] / 1000
        self._batch_size: int = c["batch.size"]
        self._max_request: int = c["max.request.size"]
        self._retries: int = c["retries"]
        self._backoff = c["retry.backoff.ms"] / 1000
        self._delivery_timeout = c["delivery.timeout.ms"] / 1000
        self._request_timeout_ms: int = c["request.timeout.ms"]
        self._compression = Compression[c["compression.type"].upper()]
        self._level: int | None = {
            Compression.GZIP: c["compression.gzip.level"],
            Compression.LZ4: c["compression.lz4.level"],
            Compression.ZSTD: c["compression.zstd.level"],
        }.get(self._compression)
        self._ignore_keys: bool = c["partitioner.ignore.keys"]
        self._sticky = StickyPartitioner()
        self._batches: dict[TopicPartition, deque[_Batch]] = defaultdict(deque)
        self._in_flight: dict[TopicPartition, _Batch] = {}
        self._waiting: dict[str, list[tuple[Any, ...]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wakeup: asyncio.Event | None = None
        self._sender: asyncio.Task[None] | None = None
        self._flushing = 0
        self._closing = False
        self._closed = False
        self._refreshing = False

    async def __aenter__(self) -> AIOProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- sending -----------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        headers: HeaderList | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; the future resolves once the broker acknowledged it.

        ``timestamp`` is epoch milliseconds (default: now). ``on_delivery(error, metadata)``
        is called on the event loop when the record is acknowledged or has failed.
        """
        if self._closing or self._closed:
            raise ClientClosedError("the producer is closed")
        if not isinstance(topic, str) or not topic:
            raise TypeError("topic must be a non-empty str")
        record_key = _as_bytes("key", key)
        record_value = _as_bytes("value", value)
        record_headers = tuple(
            (str(name), _as_bytes(f"header {name!r}", hvalue)) for name, hvalue in headers or ()
        )
        if partition is not None and (isinstance(partition, bool) or partition < 0):
            raise ValueError(f"partition must be a non-negative int, got {partition!r}")
        ts = int(time.time() * 1000) if timestamp is None else int(timestamp)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[RecordMetadata] = loop.create_future()
        self._start(loop)
        size = (
            _RECORD_OVERHEAD
            + len(record_key or b"")
            + len(record_value or b"")
            + sum(len(n) + len(v or b"") + 2 for n, v in record_headers)
        )
        if size + _BATCH_OVERHEAD > self._max_request:
            self._resolve(
                future,
                on_delivery,
                broker_error(
                    ErrorCode.MESSAGE_TOO_LARGE,
                    f"the record is {size} bytes, above max.request.size={self._max_request}",
                ),
            )
            return future
        item = (
            topic,
            record_key,
            record_value,
            record_headers,
            partition,
            ts,
            size,
            future,
            on_delivery,
        )
        info = self.cluster.metadata.topics.get(topic)
        if info is None or topic in self._waiting:
            self._waiting.setdefault(topic, []).append(item)
            if len(self._waiting[topic]) == 1:
                self._spawn(self._fetch_topic(topic))
        else:
            self._append(info, *item)
        return future

    async def send_and_wait(
        self, topic: str, value: bytes | str | None = None, **kwargs: Any
    ) -> RecordMetadata:
        return await self.send(topic, value, **kwargs)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._sender is None:
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
        deadline = time.monotonic() + self._delivery_timeout
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
            failure = error or broker_error(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, context=topic)
            for item in queued:
                self._resolve(item[7], item[8], failure)
            return
        for item in queued:
            self._append(info, *item)

    def _append(
        self,
        info: TopicInfo,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: tuple[tuple[str, bytes | None], ...],
        partition: int | None,
        timestamp: int,
        size: int,
        future: asyncio.Future[RecordMetadata],
        on_delivery: DeliveryCallback | None,
    ) -> None:
        count = len(info.partitions)
        if partition is not None:
            if partition >= count:
                self._resolve(
                    future,
                    on_delivery,
                    broker_error(
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        f"topic {topic!r} has {count} partitions, no partition {partition}",
                    ),
                )
                return
        elif key is not None and not self._ignore_keys:
            partition = partition_for_key(key, count)
        else:
            partition = self._sticky.partition(
                topic, count, self.cluster.metadata.available_partitions(topic)
            )
        tp = TopicPartition(topic, partition)
        queue = self._batches[tp]
        batch = queue[-1] if queue else None
        if batch is not None and (
            batch.data is not None or batch.builder.uncompressed_size + size > self._batch_size
        ):
            self._sealed_for_sticky(tp)
            batch = None
        if batch is None:
            builder = BatchBuilder(compression=self._compression, compression_level=self._level)
            batch = _Batch(tp, builder, time.monotonic())
            queue.append(batch)
            if len(queue) == 1:
                self._wake()
        batch.builder.append(key, value, headers, timestamp=timestamp)
        batch.deliveries.append((future, timestamp, on_delivery))
        if batch.builder.uncompressed_size >= self._batch_size:
            self._wake()

    def _sealed_for_sticky(self, tp: TopicPartition) -> None:
        info = self.cluster.metadata.topics.get(tp.topic)
        if info is not None:
            self._sticky.batch_sealed(
                tp.topic,
                tp.partition,
                len(info.partitions),
                self.cluster.metadata.available_partitions(tp.topic),
            )

    # -- the sender --------------------------------------------------------------------------

    async def _run_sender(self) -> None:
        assert self._wakeup is not None
        while True:
            self._wakeup.clear()
            now = time.monotonic()
            wait = self._drain(now)
            if self._closing and not self._pending_work():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), wait)

    def _pending_work(self) -> bool:
        return bool(self._in_flight or self._waiting or any(self._batches.values()))

    def _drain(self, now: float) -> float | None:
        """Send every ready batch; return how long until the next one may be ready."""
        urgent = self._flushing > 0 or self._closing
        by_leader: dict[int, list[_Batch]] = defaultdict(list)
        next_check: float | None = None
        missing_leader = False
        for tp, queue in list(self._batches.items()):
            if not queue:
                del self._batches[tp]
                continue
            if tp in self._in_flight:
                continue
            batch = queue[0]
            if now - batch.created > self._delivery_timeout:
                queue.popleft()
                self._fail(
                    batch,
                    ClientError(
                        f"{tp}: {len(batch.deliveries)} record(s) expired after "
                        f"delivery.timeout.ms={int(self._delivery_timeout * 1000)}",
                        code=ErrorCode.REQUEST_TIMED_OUT,
                    ),
                )
                continue
            ready_at = batch.not_before if batch.attempts else batch.created + self._linger
            full = len(queue) > 1 or batch.builder.uncompressed_size >= self._batch_size
            if not (urgent or full) and now < ready_at:
                next_check = ready_at if next_check is None else min(next_check, ready_at)
                continue
            if batch.attempts and now < batch.not_before:
                next_check = (
                    batch.not_before if next_check is None else min(next_check, batch.not_before)
                )
                continue
            leader = self.cluster.metadata.leader(tp.topic, tp.partition)
            if leader is None:
                missing_leader = True
                continue
            queue.popleft()
            if batch.data is None and not queue:
                self._sealed_for_sticky(tp)
            batch.seal()
            self._in_flight[tp] = batch
            by_leader[leader].append(batch)
        if missing_leader or self.cluster.stale():
            self._refresh_soon()
            next_check = now + max(self._backoff, 0.05) if next_check is None else next_check
        for leader, batches in by_leader.items():
            request: list[_Batch] = []
            request_size = 0
            for batch in batches:
                size = len(batch.seal())
                if request and request_size + size > self._max_request:
                    self._spawn(self._produce(leader, request))
                    request, request_size = [], 0
                request.append(batch)
                request_size += size
            self._spawn(self._produce(leader, request))
        return None if next_check is None else max(next_check - now, 0.0)

    def _refresh_soon(self) -> None:
        if self._refreshing or self._closed:
            return
        self._refreshing = True

        async def refresh() -> None:
            try:
                topics = {tp.topic for tp in self._batches} | {tp.topic for tp in self._in_flight}
                await self.cluster.refresh(topics or None)
            except ClientError as exc:
                log.debug("metadata refresh failed: %s", exc)
                await asyncio.sleep(max(self._backoff, 0.05))
            finally:
                self._refreshing = False
                self._wake()

        self._spawn(refresh())

    async def _produce(self, leader: int, batches: list[_Batch]) -> None:
        try:
            conn = await self.cluster.connection(leader)
            version = conn.version(ApiKey.PRODUCE)
            topic_ids = {b.tp.topic: self.cluster.metadata.topic_id(b.tp.topic) for b in batches}
            if version >= 13 and None in topic_ids.values():
                version = 12
            by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for b in batches:
                by_topic[b.tp.topic].append({"index": b.tp.partition, "records": b.data})
            values = {
                "transactional_id": None,
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
                self._retry_or_fail(b, exc)
            self._wake()
            return
        except Exception as exc:  # a bug must not leave futures hanging forever
            for b in batches:
                self._fail(b, ClientError(f"producing failed: {exc!r}"))
            raise
        if response is None:
            for b in batches:
                self._complete(b, -1, -1)
            self._wake()
            return
        answered: dict[TopicPartition, Any] = {}
        for t in response.responses:
            name = getattr(t, "name", None)
            if name is None:
                name = next(
                    (n for n, tid in topic_ids.items() if tid == getattr(t, "topic_id", None)), ""
                )
            for p in t.partition_responses:
                answered[TopicPartition(name, int(p.index))] = p
        for b in batches:
            p = answered.get(b.tp)
            if p is None:
                self._retry_or_fail(
                    b, broker_error(ErrorCode.UNKNOWN_SERVER_ERROR, "no answer for the partition")
                )
                continue
            code = ErrorCode.from_wire(int(p.error_code))
            if code is ErrorCode.NONE:
                append_time = p.log_append_time
                self._complete(
                    b,
                    int(p.base_offset),
                    -1 if append_time is None else epoch_millis(append_time),
                )
            else:
                self._retry_or_fail(
                    b, broker_error(code, getattr(p, "error_message", None), context=str(b.tp))
                )
        self._wake()

    def _retry_or_fail(self, batch: _Batch, error: ClientError) -> None:
        self._in_flight.pop(batch.tp, None)
        now = time.monotonic()
        if (
            error.retriable
            and batch.attempts < self._retries
            and now - batch.created < self._delivery_timeout
            and not self._closed
        ):
            batch.attempts += 1
            batch.not_before = now + self._backoff
            self._batches[batch.tp].appendleft(batch)
            if error.code in STALE_METADATA_CODES or isinstance(error, BrokerConnectionError):
                self._refresh_soon()
            return
        self._fail(batch, error)

    def _complete(self, batch: _Batch, base_offset: int, append_time: int) -> None:
        self._in_flight.pop(batch.tp, None)
        topic, partition = batch.tp
        for i, (future, ts, callback) in enumerate(batch.deliveries):
            md = RecordMetadata(
                topic,
                partition,
                base_offset + i if base_offset >= 0 else -1,
                append_time if append_time >= 0 else ts,
            )
            if not future.done():
                future.set_result(md)
            self._callback(callback, None, md)

    def _fail(self, batch: _Batch, error: ClientError) -> None:
        self._in_flight.pop(batch.tp, None)
        for future, _, callback in batch.deliveries:
            self._resolve(future, callback, error)

    def _resolve(
        self,
        future: asyncio.Future[RecordMetadata],
        callback: DeliveryCallback | None,
        error: ClientError,
    ) -> None:
        if not future.done():
            future.set_exception(error)
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

    # -- flush and close ---------------------------------------------------------------------

    def _outstanding(self) -> list[asyncio.Future[RecordMetadata]]:
        futures = [f for q in self._batches.values() for b in q for f, _, _ in b.deliveries]
        futures += [f for b in self._in_flight.values() for f, _, _ in b.deliveries]
        futures += [item[7] for items in self._waiting.values() for item in items]
        return [f for f in futures if not f.done()]

    async def flush(self, timeout: float | None = None) -> int:
        """Send everything queued now and wait for the answers; returns how many are still
        outstanding (0 unless ``timeout`` seconds passed first)."""
        pending = self._outstanding()
        if not pending:
            return 0
        self._flushing += 1
        self._wake()
        try:
            _, not_done = await asyncio.wait(pending, timeout=timeout)
        finally:
            self._flushing -= 1
        return len(not_done)

    async def close(self, timeout: float | None = None) -> None:
        """Flush (at most ``timeout`` seconds), then fail what is left and disconnect."""
        if self._closed:
            return
        self._closing = True
        await self.flush(timeout)
        self._closed = True
        self._wake()
        leftover = ClientClosedError("the producer was closed before the record was sent")
        for queue in self._batches.values():
            for batch in queue:
                self._fail(batch, leftover)
        self._batches.clear()
        for batch in list(self._in_flight.values()):
            self._fail(batch, leftover)
        for items in self._waiting.values():
            for item in items:
                self._resolve(item[7], item[8], leftover)
        self._waiting.clear()
        tasks = list(self._tasks)
        if self._sender is not None:
            tasks.append(self._sender)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.cluster.close()
