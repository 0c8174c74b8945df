"""ListOffsets, OffsetForLeaderEpoch and DeleteRecords: where a partition's offsets are.

Shared rules (Kafka's):

* ``current_leader_epoch`` -1 means "not checked"; one below the partition's leader epoch
  is FENCED_LEADER_EPOCH (the client's metadata is old), one above is
  UNKNOWN_LEADER_EPOCH (ours is);
* this broker leads every partition it hosts, so "the leader" is always here.

The leader epoch cache of a log only learns an epoch when data is appended in it. Kafka
records a new leader's epoch at its log end offset when leadership changes; here that
entry is implied: when the partition's leader epoch is above the cache's latest, the
epoch is treated as starting at the log end offset (:func:`epoch_end_offset`).
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from typing import Any

from tidelog.broker.authorization import access
from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE, make
from tidelog.broker.partitions import Partition
from tidelog.metadata.acls import AclOperation
from tidelog.protocol import ApiKey, ErrorCode, response_class
from tidelog.storage import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    OffsetOutOfRangeError,
    StorageError,
)

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1

#: ListOffsets special timestamps beyond earliest/latest/max (Kafka's values).
EARLIEST_LOCAL_TIMESTAMP = -4  # v8+: the first offset on local disk = earliest here
_READ_COMMITTED = 1
LATEST_TIERED_TIMESTAMP = -5  # v9+: the last offset in tiered storage; none here
EARLIEST_PENDING_UPLOAD_TIMESTAMP = -6  # v11+: the first offset not yet tiered; none here

_CONSUMER_REPLICA_ID = -1
_DEBUG_REPLICA_ID = -2
_DELETE_TO_HIGH_WATERMARK = -1


def check_leader_epoch(partition: Partition, current_leader_epoch: int) -> ErrorCode:
    """Kafka's fencing of a request's ``current_leader_epoch`` against the partition's."""
    if current_leader_epoch < 0 or current_leader_epoch == partition.leader_epoch:
        return ErrorCode.NONE
    if current_leader_epoch < partition.leader_epoch:
        return ErrorCode.FENCED_LEADER_EPOCH
    return ErrorCode.UNKNOWN_LEADER_EPOCH


def epoch_end_offset(partition: Partition, requested_epoch: int) -> tuple[int, int]:
    """OffsetForLeaderEpoch: (largest epoch <= requested, end offset of that epoch).

    The end offset is where the next higher epoch starts (the log end offset for the
    latest epoch); an epoch above every known one, or -1, gives (-1, -1). An epoch below
    every known one is returned as is with the first epoch's start offset.
    """
    log = partition.log
    latest = log.latest_epoch
    leader_epoch = partition.leader_epoch
    if requested_epoch < 0 or leader_epoch <= latest:
        return log.end_offset_for_epoch(requested_epoch)
    # The leader epoch starts at the log end offset, after every epoch in the cache.
    if requested_epoch == leader_epoch:
        return leader_epoch, log.log_end_offset
    if requested_epoch > leader_epoch:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    epoch, end = log.end_offset_for_epoch(requested_epoch)
    if epoch == UNDEFINED_EPOCH:
        # Above every cached epoch (or no cache at all) but below the leader's: it ends
        # where the leader epoch starts.
        return (latest if latest >= 0 else requested_epoch), log.log_end_offset
    return epoch, end


def _schema(api_key: ApiKey, version: int) -> tuple[type, Any]:
    cls = response_class(api_key, version)
    assert cls is not None, f"{api_key.name} v{version} has no response schema"
    return cls, sys.modules[cls.__module__]


# -- ListOffsets -------------------------------------------------------------------------


def _list_offset(
    partition: Partition,
    timestamp: int,
    *,
    replica_id: int,
    isolation_level: int,
) -> tuple[ErrorCode, int, int, int]:
    """(error, offset, timestamp, leader epoch) for one ListOffsets partition."""
    log = partition.log
    # Consumers see up to the high watermark, or with read committed up to the last stable
    # offset; debugging tools (replica id -2) see up to the log end offset.
    if replica_id != _CONSUMER_REPLICA_ID:
        fetchable = log.log_end_offset
    elif isolation_level == _READ_COMMITTED:
        fetchable = partition.last_stable_offset
    else:
        fetchable = partition.high_watermark
    if timestamp == LATEST_TIMESTAMP:
        return ErrorCode.NONE, fetchable, -1, partition.leader_epoch
    if timestamp in (LATEST_TIERED_TIMESTAMP, EARLIEST_PENDING_UPLOAD_TIMESTAMP):
        # Nothing is ever tiered here (Kafka answers the same without remote storage).
        return ErrorCode.NONE, UNDEFINED_OFFSET, -1, UNDEFINED_EPOCH
    if timestamp == EARLIEST_LOCAL_TIMESTAMP:
        timestamp = EARLIEST_TIMESTAMP
    if timestamp < 0 and timestamp not in (EARLIEST_TIMESTAMP, MAX_TIMESTAMP):
        return ErrorCode.INVALID_REQUEST, UNDEFINED_OFFSET, -1, UNDEFINED_EPOCH
    found = log.offset_for_timestamp(timestamp)
    if found is None:
        return ErrorCode.NONE, UNDEFINED_OFFSET, -1, UNDEFINED_EPOCH
    if timestamp != EARLIEST_TIMESTAMP and found.offset >= fetchable:
        # A record the fetcher may not read yet is not an answer (Kafka's rule).
        return ErrorCode.NONE, UNDEFINED_OFFSET, -1, UNDEFINED_EPOCH
    return ErrorCode.NONE, found.offset, found.timestamp, found.leader_epoch


@handles(ApiKey.LIST_OFFSETS)
async def handle_list_offsets(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    cls, schema = _schema(ApiKey.LIST_OFFSETS, version)
    replica_id = int(request.replica_id)
    isolation_level = int(getattr(request, "isolation_level", 0))
    partitions = ctx.broker.partitions
    checks = access(ctx)
    topics = []
    for topic in request.topics:
        counts = Counter(int(item.partition_index) for item in topic.partitions)
        duplicated = {index for index, count in counts.items() if count > 1}
        denied = checks.topic_error(AclOperation.DESCRIBE, topic.name)
        results = []
        for item in topic.partitions:
            index = int(item.partition_index)
            error, offset, ts, epoch = ErrorCode.NONE, UNDEFINED_OFFSET, -1, UNDEFINED_EPOCH
            partition = partitions.get(topic.name, index)
            if denied is not None:
                error = denied
            elif index in duplicated:
                # Kafka allows one timestamp per partition from v1 on, and refuses every
                # entry of a partition listed twice.
                error = ErrorCode.INVALID_REQUEST
            elif partition is None:
                error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif replica_id >= 0:
                # Only followers send a replica id, and a single node has none.
                error = ErrorCode.NOT_LEADER_OR_FOLLOWER
            else:
                error = check_leader_epoch(
                    partition, int(getattr(item, "current_leader_epoch", -1))
                )
                if error is ErrorCode.NONE:
                    try:
                        error, offset, ts, epoch = _list_offset(
                            partition,
                            int(item.timestamp),
                            replica_id=replica_id,
                            isolation_level=isolation_level,
                        )
                    except StorageError:
                        error = ErrorCode.KAFKA_STORAGE_ERROR
            results.append(
                make(
                    schema.ListOffsetsPartitionResponse,
                    partition_index=item.partition_index,
                    error_code=error.to_kio(),
                    timestamp=ts,
                    offset=offset,
                    leader_epoch=epoch,
                )
            )
        topics.append(
            make(schema.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(results))
        )
    return make(cls, throttle_time=ZERO_THROTTLE, topics=tuple(topics))


# -- OffsetForLeaderEpoch ----------------------------------------------------------------


@handles(ApiKey.OFFSET_FOR_LEADER_EPOCH)
async def handle_offset_for_leader_epoch(ctx: RequestContext, request: Any) -> object:
    cls, schema = _schema(ApiKey.OFFSET_FOR_LEADER_EPOCH, ctx.api_version)
    # Followers and consumers (replica id -2 from v3 on) get the same answer, as in Kafka.
    partitions = ctx.broker.partitions
    topic_error = access(ctx).offset_for_leader_epoch_errors()
    topics = []
    for topic in request.topics:
        denied = topic_error(topic.topic)
        results = []
        for item in topic.partitions:
            error = ErrorCode.NONE
            epoch, end = UNDEFINED_EPOCH, UNDEFINED_OFFSET
            partition = partitions.get(topic.topic, int(item.partition))
            if denied is not None:
                error = denied
            elif partition is None:
                error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                error = check_leader_epoch(partition, int(item.current_leader_epoch))
                if error is ErrorCode.NONE:
                    try:
                        epoch, end = epoch_end_offset(partition, int(item.leader_epoch))
                    except StorageError:
                        error = ErrorCode.KAFKA_STORAGE_ERROR
            results.append(
                make(
                    schema.EpochEndOffset,
                    error_code=error.to_kio(),
                    partition=item.partition,
                    leader_epoch=epoch,
                    end_offset=end,
                )
            )
        topics.append(
            make(schema.OffsetForLeaderTopicResult, topic=topic.topic, partitions=tuple(results))
        )
    return make(cls, throttle_time=ZERO_THROTTLE, topics=tuple(topics))


# -- DeleteRecords -----------------------------------------------------------------------


async def _delete_records(partition: Partition, offset: int) -> tuple[ErrorCode, int]:
    """(error, low watermark) after moving the log start offset of ``partition``."""
    log = partition.log
    if not log.config.delete:
        # Kafka refuses DeleteRecords on compacted-only topics.
        return ErrorCode.POLICY_VIOLATION, UNDEFINED_OFFSET
    target = partition.high_watermark if offset == _DELETE_TO_HIGH_WATERMARK else offset
    if target < 0 or target > partition.high_watermark:
        return ErrorCode.OFFSET_OUT_OF_RANGE, UNDEFINED_OFFSET
    try:
        if target > log.log_start_offset:
            # Deleting segment files can take a while on a busy disk: off the loop.
            await asyncio.to_thread(log.delete_records, target)
            # Long polls waiting below the new start must learn it now.
            partition.wake_waiters()
    except OffsetOutOfRangeError:
        return ErrorCode.OFFSET_OUT_OF_RANGE, UNDEFINED_OFFSET
    except StorageError:
        return ErrorCode.KAFKA_STORAGE_ERROR, UNDEFINED_OFFSET
    return ErrorCode.NONE, log.log_start_offset


@handles(ApiKey.DELETE_RECORDS)
async def handle_delete_records(ctx: RequestContext, request: Any) -> object:
    cls, schema = _schema(ApiKey.DELETE_RECORDS, ctx.api_version)
    partitions = ctx.broker.partitions
    checks = access(ctx)
    topics = []
    for topic in request.topics:
        denied = checks.topic_error(AclOperation.DELETE, topic.name)
        results = []
        for item in topic.partitions:
            partition = partitions.get(topic.name, int(item.partition_index))
            if denied is not None:
                error, low = denied, UNDEFINED_OFFSET
            elif partition is None:
                error, low = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UNDEFINED_OFFSET
            else:
                error, low = await _delete_records(partition, int(item.offset))
            results.append(
                make(
                    schema.DeleteRecordsPartitionResult,
                    partition_index=item.partition_index,
                    low_watermark=low,
                    error_code=error.to_kio(),
                )
            )
        topics.append(
            make(schema.DeleteRecordsTopicResult, name=topic.name, partitions=tuple(results))
        )
    return make(cls, throttle_time=ZERO_THROTTLE, topics=tuple(topics))
