"""Fetch (v4-v18): records for consumers, with long poll, byte limits and fetch sessions.

A request is handled in three steps, all on the event loop thread:

1. **Context.** Session id and epoch select one of Kafka's fetch contexts
   (:mod:`tidelog.broker.fetch_sessions`): *sessionless* (epoch -1; any session named is
   closed), *full* (epoch 0: a new session is created when the response is built),
   *incremental* (the session's partitions, updated by the request), or a session error
   (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR)
   answered at once with no partitions. Session changes happen here, in request order.

2. **Read.** Partitions are read in order with a shared budget of ``max_bytes``; each
   partition reads at most ``min(partition_max_bytes, budget left)``. Until some partition
   returned records, the first batch is returned whole even above both limits (KIP-74),
   so a consumer always progresses. Reads stop at whole batches (:data:`WHOLE_BATCHES`):
   Kafka may end a partition with a truncated batch, which clients drop and fetch again;
   whole batches never send those wasted bytes. Per partition, in Kafka's order:
   topic (UNKNOWN_TOPIC_ID / INCONSISTENT_TOPIC_ID for ids, UNKNOWN_TOPIC_OR_PARTITION),
   replica id (followers are refused, see below), ``current_leader_epoch``
   (FENCED_LEADER_EPOCH when older than ours, UNKNOWN_LEADER_EPOCH when newer),
   ``last_fetched_epoch`` (v12+: a diverging epoch is answered with the epoch and its end
   offset and no records), then the read (OFFSET_OUT_OF_RANGE outside
   [log start, log end]). Reads never go past the high watermark, and with read_committed
   never past the last stable offset (LSO), which every response carries. A read_committed
   read also gets the aborted transactions overlapping its batches, from the segments'
   transaction indexes, so the consumer drops their records (read_uncommitted gets null,
   as from Kafka). Records are never decoded for this: the LSO is a batch boundary and the
   index is read per segment. Errors carry -1 for the offsets, as Kafka's do.

3. **Answer or wait.** The response is sent at once when ``max_wait_ms`` <= 0, there is no
   partition, ``min_bytes`` are available, or any partition has an error or a diverging
   epoch. Otherwise the handler returns a :class:`~tidelog.broker.reply.Deferred` (the
   connection goes on with later requests) that waits for the
   :meth:`~tidelog.broker.partitions.Partition.data_arrived` event of any partition, reads
   again, and answers when enough bytes are there, an error appeared, or ``max_wait_ms``
   (measured with the broker clock from the request's arrival) ran out.

Responses are encoded by :mod:`tidelog.broker.fetch_response` with each partition's
records as a file region for ``sendfile``. Incremental responses carry only partitions
with records, a changed high watermark or log start offset, an error or a diverging epoch.

Follower fetches (replica id >= 0) get NOT_LEADER_OR_FOLLOWER for every partition, which
is Kafka's answer to a replica outside a partition's replica set: on a single node every
replica set is this broker alone. With v16+, leadership errors also carry the current
leader (this broker) and its endpoint (KIP-951).
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidelog.broker.authorization import access, no_topic_error
from tidelog.broker.broker import Broker
from tidelog.broker.connection import RequestContext
from tidelog.broker.fetch_response import (
    NodeEndpoint,
    PartitionResult,
    TopicResult,
    encode_fetch_response,
)
from tidelog.broker.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    CachedPartition,
    FetchSession,
    PartitionKey,
    next_epoch,
    sessions_of,
)
from tidelog.broker.handlers.offsets import check_leader_epoch, epoch_end_offset
from tidelog.broker.handlers.registry import handles
from tidelog.broker.partitions import Partition
from tidelog.broker.quotas import CONSUMER_BYTE_RATE, ClientQuotaManager
from tidelog.broker.reply import Deferred, EncodedResponse
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.storage import OffsetOutOfRangeError, StorageError

_log = logging.getLogger(__name__)

_SESSIONLESS = 0
_FULL = 1
_INCREMENTAL = 2

_READ_COMMITTED = 1
_NO_ABORTED: tuple[tuple[int, int], ...] = ()

#: End each partition's records at a batch boundary. Kafka cuts at the byte limit and lets
#: clients drop the torn last batch; whole batches never send those bytes, but finding the
#: boundary scans the batch headers of the region (about 2.5 ms for 1 MiB of 1 KiB batches,
#: nothing measurable for 100 KiB batches) until storage can start that scan from its
#: offset index.
WHOLE_BATCHES = True


@dataclass(slots=True)
class _Fetch:
    """One Fetch request after its context was decided."""

    version: int
    replica_id: int
    isolation_level: int
    max_bytes: int
    min_bytes: int
    max_wait_ms: int
    deadline_ms: int
    kind: int
    items: list[tuple[PartitionKey, CachedPartition]]
    #: the listener the request came in on: the leader's address is given for that one
    listener: str
    session: FetchSession | None = None
    #: the authorization error of a topic (None: it may be read)
    topic_error: Callable[[str], ErrorCode | None] = no_topic_error
    #: records the bytes returned against the client's quota; the throttle time in ms
    record_bytes: Callable[[int], int] = lambda returned_bytes: 0


_Read = tuple[PartitionKey, CachedPartition, PartitionResult]


def _ms(value: datetime.timedelta) -> int:
    """kio reads int32 millisecond fields as timedeltas."""
    return round(value.total_seconds() * 1000)


def _replica_id(request: Any, version: int) -> int:
    if version >= 15:
        return int(request.replica_state.replica_id)
    return int(request.replica_id)


def _requested(request: Any, version: int) -> OrderedDict[PartitionKey, CachedPartition]:
    """The request's partitions by key; a partition listed twice keeps its first place."""
    uses_ids = version >= 13
    out: OrderedDict[PartitionKey, CachedPartition] = OrderedDict()
    for topic in request.topics:
        topic_id: uuid.UUID | None = topic.topic_id if uses_ids else None
        name: str | None = None if uses_ids else topic.topic
        key_topic = topic_id if uses_ids else name
        for p in topic.partitions:
            index = int(p.partition)
            out[(key_topic, index)] = CachedPartition(
                topic=name,
                topic_id=topic_id,
                partition=index,
                fetch_offset=int(p.fetch_offset),
                max_bytes=int(p.partition_max_bytes),
                current_leader_epoch=int(getattr(p, "current_leader_epoch", -1)),
                last_fetched_epoch=int(getattr(p, "last_fetched_epoch", -1)),
            )
    return out


def _forgotten(request: Any, version: int) -> list[PartitionKey]:
    uses_ids = version >= 13
    return [
        (topic.topic_id if uses_ids else topic.topic, int(index))
        for topic in getattr(request, "forgotten_topics_data", ())
        for index in topic.partitions
    ]


class _Resolver:
    """Topic ids to names and partitions, asked once per topic per read round."""

    __slots__ = ("_broker", "_names")

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._names: dict[uuid.UUID, str | None] = {}

    def partition(self, item: CachedPartition) -> tuple[Partition | None, ErrorCode]:
        if item.topic_id is None and item.topic is None:
            return None, ErrorCode.UNKNOWN_TOPIC_ID  # the zero topic id
        if item.topic_id is not None:
            if item.topic_id in self._names:
                name = self._names[item.topic_id]
            else:
                name = self._names[item.topic_id] = self._broker.topic_name_of(item.topic_id)
            if name is None:
                return None, ErrorCode.UNKNOWN_TOPIC_ID
            item.topic = name
        assert item.topic is not None
        partition = self._broker.partitions.get(item.topic, item.partition)
        if partition is None:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if partition.offline:
            # Its log dir failed: nothing on it is served again until a restart.
            return None, ErrorCode.KAFKA_STORAGE_ERROR
        if (
            item.topic_id is not None
            and partition.topic_id is not None
            and partition.topic_id != item.topic_id
        ):
            return None, ErrorCode.INCONSISTENT_TOPIC_ID
        return partition, ErrorCode.NONE


def _read_one(
    fetch: _Fetch,
    node_id: int,
    resolver: _Resolver,
    item: CachedPartition,
    budget: int,
    min_one_batch: bool,
) -> PartitionResult:
    result = PartitionResult(item.partition)
    partition, error = resolver.partition(item)
    # Authorization first, as in Kafka: a denied topic does not say whether it exists.
    denied = fetch.topic_error(item.topic) if item.topic is not None else None
    if denied is not None:
        result.error_code = denied
        return result
    if partition is None:
        result.error_code = error
        return result
    if fetch.replica_id >= 0:
        error = ErrorCode.NOT_LEADER_OR_FOLLOWER
    else:
        error = check_leader_epoch(partition, item.current_leader_epoch)
    if error is not ErrorCode.NONE:
        result.error_code = error
        if fetch.version >= 16:
            result.current_leader = (node_id, partition.leader_epoch)
        return result
    log = partition.log
    high_watermark = partition.high_watermark
    last_stable_offset = partition.last_stable_offset
    read_committed = fetch.isolation_level == _READ_COMMITTED
    if fetch.version >= 12 and item.last_fetched_epoch >= 0:
        epoch, end = epoch_end_offset(partition, item.last_fetched_epoch)
        if epoch < item.last_fetched_epoch or end < item.fetch_offset:
            result.high_watermark = high_watermark
            result.last_stable_offset = last_stable_offset
            result.log_start_offset = partition.log_start_offset
            result.diverging_epoch = (epoch, end)
            return result
    limit = last_stable_offset if read_committed else high_watermark
    try:
        piece = log.read(
            item.fetch_offset,
            min(item.max_bytes, budget),
            max_offset=limit if limit < log.log_end_offset else None,
            min_one_batch=min_one_batch,
            whole_batches=WHOLE_BATCHES,
        )
    except OffsetOutOfRangeError:
        result.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
        return result
    except StorageError:
        _log.exception("fetch from %s-%d failed", item.topic, item.partition)
        result.error_code = ErrorCode.KAFKA_STORAGE_ERROR
        return result
    result.high_watermark = high_watermark
    result.last_stable_offset = last_stable_offset
    result.log_start_offset = partition.log_start_offset
    if read_committed:
        result.aborted_transactions = (
            partition.aborted_transactions(piece.first_offset, limit)
            if piece is not None
            else _NO_ABORTED
        )
    result.records = piece
    return result


def _read_all(fetch: _Fetch, broker: Broker) -> list[_Read]:
    """Every partition of ``fetch``, in order, under the response byte budget (KIP-74)."""
    resolver = _Resolver(broker)
    budget = max(fetch.max_bytes, 0)
    min_one_batch = True
    reads: list[_Read] = []
    for key, item in fetch.items:
        result = _read_one(fetch, broker.node_id, resolver, item, budget, min_one_batch)
        size = result.records_size
        if size:
            min_one_batch = False
            budget = max(budget - size, 0)
        reads.append((key, item, result))
    return reads


def _close(reads: list[_Read]) -> None:
    for _, _, result in reads:
        if result.records is not None:
            result.records.close()


def _satisfied(fetch: _Fetch, reads: list[_Read]) -> bool:
    total = 0
    for _, _, result in reads:
        if result.error_code or result.diverging_epoch is not None:
            return True
        total += result.records_size
    return total >= fetch.min_bytes


def _respond(fetch: _Fetch, broker: Broker, reads: list[_Read]) -> EncodedResponse:
    """The response for ``reads``; creates or updates the session as the context says."""
    session_id = INVALID_SESSION_ID
    chosen = reads
    if fetch.kind == _FULL:
        cached: OrderedDict[PartitionKey, CachedPartition] = OrderedDict()
        for key, item, result in reads:
            item.high_watermark = result.high_watermark
            item.log_start_offset = result.log_start_offset
            cached[key] = item
        created = sessions_of(broker).create(
            cached, uses_topic_ids=fetch.version >= 13, now_ms=broker.clock()
        )
        if created is not None:
            session_id = created.id
    elif fetch.kind == _INCREMENTAL:
        session = fetch.session
        assert session is not None
        session_id = session.id
        chosen = []
        for key, item, result in reads:
            if item.must_respond(
                records_size=result.records_size,
                high_watermark=result.high_watermark,
                log_start_offset=result.log_start_offset,
                error_code=result.error_code,
                diverging=result.diverging_epoch is not None,
            ):
                chosen.append((key, item, result))
                # Fairness: partitions just answered go to the back of the line.
                if session.partitions.get(key) is item:
                    session.partitions.move_to_end(key)
            elif result.records is not None:
                result.records.close()
    topics: list[TopicResult] = []
    current: TopicResult | None = None
    current_key: object = object()
    leader_errors = False
    metrics = broker.metrics
    returned_bytes = 0
    for key, item, result in chosen:
        if key[0] != current_key or current is None:
            current_key = key[0]
            current = TopicResult(item.topic or "", item.topic_id)
            topics.append(current)
        current.partitions.append(result)
        leader_errors = leader_errors or result.current_leader is not None
        if result.records is not None:
            returned_bytes += result.records.length
            if metrics is not None and item.topic is not None:
                metrics.fetched(item.topic, result.records.length)
    endpoints = (
        [NodeEndpoint(broker.node_id, *broker.endpoint(fetch.listener))]
        if leader_errors and fetch.version >= 16
        else []
    )
    return encode_fetch_response(
        fetch.version,
        topics,
        session_id=session_id,
        node_endpoints=endpoints,
        throttle_time_ms=fetch.record_bytes(returned_bytes) if returned_bytes else 0,
    )


async def _long_poll(fetch: _Fetch, broker: Broker) -> EncodedResponse:
    """Wait for data in any partition of ``fetch`` until it is satisfied or times out.

    The coroutine starts only when the connection gets to this response, possibly after
    appends that the handler's own read did not see. So every round first subscribes to
    the partitions' next append and only then reads: both run on the event loop thread,
    so no append can slip between them unseen.
    """
    while True:
        events = _subscribe(fetch, broker)
        reads = _read_all(fetch, broker)
        remaining = fetch.deadline_ms - broker.clock()
        if remaining <= 0 or broker.stopping or _satisfied(fetch, reads):
            return _respond(fetch, broker, reads)
        _close(reads)
        if not await _wait_for_any(events, remaining):
            return _respond(fetch, broker, _read_all(fetch, broker))


def _subscribe(fetch: _Fetch, broker: Broker) -> list[asyncio.Event]:
    """The events set by the next append to each partition of ``fetch``."""
    resolver = _Resolver(broker)
    events: dict[int, asyncio.Event] = {}
    for _, item in fetch.items:
        partition, _ = resolver.partition(item)
        if partition is not None:
            event = partition.data_arrived()
            events[id(event)] = event
    return list(events.values())


async def _wait_for_any(events: list[asyncio.Event], remaining_ms: int) -> bool:
    """True when one of ``events`` was set within ``remaining_ms``."""
    if not events:
        await asyncio.sleep(remaining_ms / 1000)
        return False
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        done, _ = await asyncio.wait(
            waiters, timeout=remaining_ms / 1000, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for waiter in waiters:
            waiter.cancel()
    return bool(done)


def _session_error(version: int, error: ErrorCode) -> EncodedResponse:
    return encode_fetch_response(version, [], error_code=error, session_id=INVALID_SESSION_ID)


def _record_fetched(ctx: RequestContext, quotas: ClientQuotaManager, returned_bytes: int) -> int:
    """Record the bytes returned against the client's ``consumer_byte_rate`` and mute the
    connection for the throttle time (the response goes at once all the same: KIP-219)."""
    throttle_ms = quotas.record(
        CONSUMER_BYTE_RATE, ctx.principal.name, ctx.client_id, returned_bytes
    )
    ctx.throttle(throttle_ms)
    return throttle_ms


@handles(ApiKey.FETCH)
async def handle_fetch(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    broker = ctx.broker
    now = broker.clock()
    uses_ids = version >= 13
    requested = _requested(request, version)
    session_id = int(getattr(request, "session_id", INVALID_SESSION_ID))
    epoch = int(getattr(request, "session_epoch", FINAL_EPOCH))
    sessions = sessions_of(broker)
    session: FetchSession | None = None
    if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
        if session_id != INVALID_SESSION_ID:
            # A full fetch closes the session it names (and epoch 0 starts a new one).
            sessions.remove(session_id)
        kind = _FULL if epoch == INITIAL_EPOCH else _SESSIONLESS
        items = list(requested.items())
    else:
        session = sessions.get(session_id)
        if session is None:
            return _session_error(version, ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != epoch:
            return _session_error(version, ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        if session.uses_topic_ids != uses_ids:
            return _session_error(version, ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR)
        session.update(requested, _forgotten(request, version))
        if not session.partitions:
            sessions.remove(session.id)
            session = None
            kind = _SESSIONLESS
            items = list(requested.items())
        else:
            sessions.touch(session, now)
            session.epoch = next_epoch(epoch)
            kind = _INCREMENTAL
            items = list(session.partitions.items())
    max_wait_ms = _ms(request.max_wait)
    fetch = _Fetch(
        version=version,
        replica_id=_replica_id(request, version),
        isolation_level=int(request.isolation_level),
        max_bytes=int(request.max_bytes),
        min_bytes=int(request.min_bytes),
        max_wait_ms=max_wait_ms,
        deadline_ms=now + max_wait_ms,
        kind=kind,
        items=items,
        listener=ctx.listener,
        session=session,
    )
    fetch.topic_error = access(ctx).fetch_topic_errors(fetch.replica_id)
    if broker.quotas is not None and fetch.replica_id < 0:
        fetch.record_bytes = functools.partial(_record_fetched, ctx, broker.quotas)
    if fetch.replica_id >= 0:
        _log.debug(
            "refusing a follower fetch from replica %d (%s): no partition here has followers",
            fetch.replica_id,
            ctx.peer,
        )
    reads = _read_all(fetch, broker)
    if max_wait_ms <= 0 or not items or _satisfied(fetch, reads):
        return _respond(fetch, broker, reads)
    _close(reads)
    return Deferred(_long_poll(fetch, broker))
