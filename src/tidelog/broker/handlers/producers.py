"""InitProducerId and DescribeProducers.

InitProducerId (Kafka's ``KafkaApis.handleInitProducerIdRequest`` and the transaction
coordinator's rules):

* ``producer_id`` and ``producer_epoch`` (v3+, KIP-360) must both be -1 or both be set:
  INVALID_REQUEST otherwise;
* without a transactional id the producer gets a new producer id with epoch 0, whatever
  id and epoch it sent: Kafka allocates a fresh id for every idempotent (non-transactional)
  producer, which bumps its epoch on its own when it needs to (KIP-360);
* an empty transactional id: INVALID_REQUEST (Kafka's rule);
* any other transactional id goes to the transaction coordinator
  (:mod:`tidelog.coordinator.transactions`): the id's producer id with a bumped epoch,
  which fences its older producers; a first use gets a new producer id (from the
  controller's producer id blocks) with epoch 0; an open transaction of the id is aborted
  first and the request answered CONCURRENT_TRANSACTIONS meanwhile; a
  ``transaction_timeout`` above ``transaction.max.timeout.ms``:
  INVALID_TRANSACTION_TIMEOUT. PRODUCER_FENCED is INVALID_PRODUCER_EPOCH before v4
  (KIP-588). v6's two-phase commit (``enable_2pc``, ``keep_prepared_txn``; KIP-939) is
  not served: TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
* an id that cannot be allocated (the controller is unavailable):
  COORDINATOR_NOT_AVAILABLE, retriable.

DescribeProducers (KIP-664): per requested partition, every producer the partition keeps
state for; a partition this broker does not host: UNKNOWN_TOPIC_OR_PARTITION.
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

from tidelog.broker.authorization import access
from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.groups import ms
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE
from tidelog.broker.handlers.transactions import fenced_code, txn_driver_of
from tidelog.coordinator.transactions import InitProducerIdRequest, InitProducerIdResult
from tidelog.metadata.acls import AclOperation
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
    if transactional_id == "":
        return _init_response(version, ErrorCode.INVALID_REQUEST)
    if getattr(request, "enable2_pc", False) or getattr(request, "keep_prepared_txn", False):
        # Two-phase commit (KIP-939) is not served; Kafka refuses it the same way when
        # transaction.two.phase.commit.enable is off.
        return _init_response(version, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    checks = access(ctx)
    if transactional_id is not None:
        denied = checks.transactional_id_error(AclOperation.WRITE, transactional_id)
        if denied is not None:
            return _init_response(version, denied)
        return await _init_transactional(
            ctx, transactional_id, ms(request.transaction_timeout), producer_id, producer_epoch
        )
    if not checks.may_write_idempotently():
        return _init_response(version, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    new_id = await _allocate(ctx)
    if new_id is None:
        return _init_response(version, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    return _init_response(version, ErrorCode.NONE, new_id, 0)


async def _allocate(ctx: RequestContext) -> int | None:
    """A fresh producer id from the controller's blocks; None when none can be had."""
    try:
        return int(await ctx.broker.allocate_producer_id())
    except Exception:
        _log.exception("could not allocate a producer id")
        return None


async def _init_transactional(
    ctx: RequestContext,
    transactional_id: str,
    timeout_ms: int,
    producer_id: int,
    producer_epoch: int,
) -> object:
    version = ctx.api_version

    def build(result: InitProducerIdResult) -> object:
        error = fenced_code(result.error, fenced_from=4, version=version)
        return _init_response(version, error, result.producer_id, result.producer_epoch)

    driver = txn_driver_of(ctx)
    if driver is None:
        return build(InitProducerIdResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
    new_id = None
    if driver.coordinator.needs_producer_id(transactional_id):
        new_id = await _allocate(ctx)
        if new_id is None:
            return build(InitProducerIdResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
    req = InitProducerIdRequest(transactional_id, timeout_ms, producer_id, producer_epoch, new_id)
    coordinator = driver.coordinator
    return driver.respond(
        lambda token, now: coordinator.init_producer_id(token, now, req),
        InitProducerIdResult(ErrorCode.COORDINATOR_NOT_AVAILABLE),
        build,
    )


@handles(ApiKey.DESCRIBE_PRODUCERS)
async def handle_describe_producers(ctx: RequestContext, request: Any) -> object:
    broker = ctx.broker
    now_ms = broker.clock()
    checks = access(ctx)
    topics = []
    for topic in request.topics:
        denied = checks.topic_error(AclOperation.READ, topic.name)
        partitions = []
        for index in topic.partition_indexes:
            partition = broker.partitions.get(topic.name, index)
            if partition is None or denied is not None:
                partitions.append(
                    PartitionResponse(
                        partition_index=index,
                        error_code=(denied or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION).to_kio(),
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
