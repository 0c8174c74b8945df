"""InitProducerId and DescribeProducers.

InitProducerId (Kafka's ``KafkaApis.handleInitProducerIdRequest`` and the transaction
coordinator's rules):

* ``producer_id`` and ``producer_epoch`` (v3+, KIP-360) must both be -1 or both be set:
  INVALID_REQUEST otherwise;
* without a transactional id the producer gets a new producer id with epoch 0, whatever
  id and epoch it sent: Kafka allocates a fresh id for every idempotent (non-transactional)
  producer, which bumps its epoch on its own when it needs to (KIP-360);
* an empty transactional id: INVALID_REQUEST (Kafka's rule);
* any other transactional id: TRANSACTIONAL_ID_AUTHORIZATION_FAILED until the transaction
  coordinator exists. It is fatal for the client, which then fails at once with a clear
  message instead of retrying a coordinator that will never answer;
* an id that cannot be allocated (the controller is unavailable):
  COORDINATOR_NOT_AVAILABLE, retriable.

DescribeProducers (KIP-664): per requested partition, every producer the partition keeps
state for (``coordinator_epoch`` and ``current_txn_start_offset`` -1 until transactions
exist); a partition this broker does not host: UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from kio.schema.describe_producers.v0.response import (
    DescribeProducersResponse,
    PartitionResponse,
    ProducerState,
    TopicResponse,
)
from kio.schema.types import ProducerId
from kio.static.primitive import i32, i64

from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE
from tidelog.protocol import SUPPORTED_VERSIONS, ApiKey, ErrorCode

_log = logging.getLogger(__name__)

_INIT_RANGE = SUPPORTED_VERSIONS[ApiKey.INIT_PRODUCER_ID]
_INIT_RESPONSES = {
    v: importlib.import_module(f"kio.schema.init_producer_id.v{v}.response").InitProducerIdResponse
    for v in range(_INIT_RANGE.min_accepted, _INIT_RANGE.max_version + 1)
}


def _init_response(version: int, error: ErrorCode, producer_id: int = -1, epoch: int = -1) -> Any:
    return _INIT_RESPONSES[version](
        throttle_time=ZERO_THROTTLE,
        error_code=error.to_kio(),
        producer_id=producer_id,
        producer_epoch=epoch,
    )


@handles(ApiKey.INIT_PRODUCER_ID)
async def handle_init_producer_id(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    producer_id = getattr(request, "producer_id", -1)
    producer_epoch = getattr(request, "producer_epoch", -1)
    if (producer_id == -1) != (producer_epoch == -1):
        return _init_response(version, ErrorCode.INVALID_REQUEST)
    transactional_id = request.transactional_id
    if transactional_id is not None:
        if transactional_id == "":
            return _init_response(version, ErrorCode.INVALID_REQUEST)
        return _init_response(version, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    # Broker.allocate_producer_id comes with the metadata layer (through the controller).
    broker: Any = ctx.broker
    try:
        new_id = await broker.allocate_producer_id()
    except Exception:
        _log.exception("could not allocate a producer id")
        return _init_response(version, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    return _init_response(version, ErrorCode.NONE, int(new_id), 0)


@handles(ApiKey.DESCRIBE_PRODUCERS)
async def handle_describe_producers(ctx: RequestContext, request: Any) -> object:
    broker = ctx.broker
    now_ms = broker.clock()
    topics = []
    for topic in request.topics:
        partitions = []
        for index in topic.partition_indexes:
            partition = broker.partitions.get(topic.name, index)
            if partition is None:
                partitions.append(
                    PartitionResponse(
                        partition_index=index,
                        error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.to_kio(),
                        active_producers=(),
                    )
                )
                continue
            producers = tuple(
                ProducerState(
                    producer_id=ProducerId(entry.producer_id),
                    producer_epoch=i32(entry.epoch),
                    last_sequence=i32(entry.last_seq),
                    last_timestamp=i64(entry.last_timestamp),
                    coordinator_epoch=i32(entry.coordinator_epoch),
                    current_txn_start_offset=i64(entry.txn_first_offset),
                )
                for entry in partition.active_producers(now_ms)
            )
            partitions.append(
                PartitionResponse(
                    partition_index=index,
                    error_code=ErrorCode.NONE.to_kio(),
                    active_producers=producers,
                )
            )
        topics.append(TopicResponse(name=topic.name, partitions=tuple(partitions)))
    return DescribeProducersResponse(throttle_time=ZERO_THROTTLE, topics=tuple(topics))
