"""WriteTxnMarkers (v1-v2): the transaction coordinator ends a transaction on partitions.

A marker names a producer (id, epoch), the coordinator epoch and the outcome (COMMIT or
ABORT), and the partitions of this broker that the transaction wrote to. Per partition
(:meth:`~tidelog.broker.partitions.Partition.append_txn_marker`): a control batch is
appended, the producer's ongoing transaction ends there, an aborted one is indexed, and
the last stable offset moves. Errors are per partition, with Kafka's codes: a partition
this broker does not have -> UNKNOWN_TOPIC_OR_PARTITION; an epoch older than the
producer's -> INVALID_PRODUCER_EPOCH; a coordinator epoch older than the last one seen for
the producer -> TRANSACTION_COORDINATOR_FENCED; storage failures as for Produce.

:func:`apply_txn_markers` is the in-process entry point (the coordinator on this broker
calls it directly); it appends and returns at once, like an append to the page cache.
:func:`apply_txn_markers_durably` and the API handler also wait until every partition
written is fsynced, as Kafka writes markers with ``acks=all``: the coordinator must not
record the transaction complete before its markers are as durable as acknowledged data.
The API handler (a coordinator on another broker) also settles the transactional offsets
of a ``__consumer_offsets`` partition it wrote a marker to, as Kafka's handler does; the
in-process coordinator does that itself after :func:`apply_txn_markers_durably`.

Version 0 left Kafka in 4.0 and kio has no schema for it; brokers send v1 (and v2, which
adds the transaction version, from Kafka 4.1). Markers are checked with the transaction
versions 0/1 epoch rule (the marker's epoch may equal the producer's), which a
transactions v2 marker (a bumped epoch) also passes.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tidelog.broker.authorization import access
from tidelog.broker.broker import Broker
from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.produce import storage_error_code
from tidelog.broker.handlers.registry import handles
from tidelog.broker.partitions import Partition, PartitionError
from tidelog.metadata.acls import AclOperation
from tidelog.metadata.controller import OFFSETS_TOPIC
from tidelog.protocol import SUPPORTED_VERSIONS, ApiKey, ErrorCode
from tidelog.storage import StorageError

_log = logging.getLogger(__name__)

_RANGE = SUPPORTED_VERSIONS[ApiKey.WRITE_TXN_MARKERS]
_RESPONSES = {
    v: importlib.import_module(f"kio.schema.write_txn_markers.v{v}.response")
    for v in range(_RANGE.min_accepted, _RANGE.max_version + 1)
}


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """End the transaction of ``producer_id`` on ``partitions`` (topic, index)."""

    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool
    partitions: Sequence[tuple[str, int]]


def _write(
    broker: Broker, markers: Sequence[TxnMarker], now_ms: int
) -> tuple[list[dict[tuple[str, int], ErrorCode]], dict[Partition, int]]:
    results: list[dict[tuple[str, int], ErrorCode]] = []
    written: dict[Partition, int] = {}
    for marker in markers:
        outcome: dict[tuple[str, int], ErrorCode] = {}
        for topic, index in marker.partitions:
            partition = broker.partitions.get(topic, index)
            if partition is None:
                outcome[(topic, index)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            try:
                offset = partition.append_txn_marker(
                    marker.producer_id,
                    marker.producer_epoch,
                    marker.coordinator_epoch,
                    marker.commit,
                    now_ms,
                )
            except PartitionError as exc:
                _log.info("%s-%d: marker refused: %s", topic, index, exc)
                outcome[(topic, index)] = exc.code
                continue
            except (StorageError, OSError) as exc:
                code = storage_error_code(exc)
                _log.error("%s-%d: could not append a transaction marker: %s", topic, index, exc)
                outcome[(topic, index)] = code
                continue
            written[partition] = max(written.get(partition, 0), offset + 1)
            outcome[(topic, index)] = ErrorCode.NONE
        results.append(outcome)
    return results, written


def apply_txn_markers(
    broker: Broker, markers: Sequence[TxnMarker]
) -> list[dict[tuple[str, int], ErrorCode]]:
    """Write each marker to its partitions; one ``{(topic, partition): code}`` per marker,
    in order. Returns once appended (not yet fsynced: see the module docstring)."""
    results, _ = _write(broker, markers, broker.clock())
    return results


async def apply_txn_markers_durably(
    broker: Broker, markers: Sequence[TxnMarker]
) -> list[dict[tuple[str, int], ErrorCode]]:
    """:func:`apply_txn_markers`, returning once every marker written is fsynced; a failed
    fsync turns that partition's answer into KAFKA_STORAGE_ERROR."""
    results, written = _write(broker, markers, broker.clock())
    await _make_durable(results, written)
    return results


async def _make_durable(
    results: list[dict[tuple[str, int], ErrorCode]], written: dict[Partition, int]
) -> None:
    items = list(written.items())
    outcomes = await asyncio.gather(
        *(partition.make_durable(end) for partition, end in items), return_exceptions=True
    )
    for (partition, _), outcome in zip(items, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
            _log.error("fsync of %s-%d failed: %s", partition.topic, partition.index, outcome)
            key = (partition.topic, partition.index)
            for outcome_of_marker in results:
                if outcome_of_marker.get(key) is ErrorCode.NONE:
                    outcome_of_marker[key] = ErrorCode.KAFKA_STORAGE_ERROR


@handles(ApiKey.WRITE_TXN_MARKERS)
async def handle_write_txn_markers(ctx: RequestContext, request: Any) -> object:
    module = _RESPONSES[ctx.api_version]
    markers = [
        TxnMarker(
            producer_id=int(marker.producer_id),
            producer_epoch=int(marker.producer_epoch),
            coordinator_epoch=int(marker.coordinator_epoch),
            commit=bool(marker.transaction_result),
            partitions=[
                (topic.name, int(index))
                for topic in marker.topics
                for index in topic.partition_indexes
            ],
        )
        for marker in request.markers
    ]
    broker = ctx.broker
    denied = access(ctx).cluster_error(AclOperation.CLUSTER_ACTION)
    if denied is not None:
        # Only brokers write markers; Kafka fails every partition of the request.
        results = [dict.fromkeys(marker.partitions, denied) for marker in markers]
    else:
        results = await apply_txn_markers_durably(broker, markers)
    groups = broker.groups
    if groups is not None:
        for marker, outcome in zip(markers, results, strict=True):
            for (topic, index), code in outcome.items():
                if topic == OFFSETS_TOPIC and code is ErrorCode.NONE:
                    groups.transaction_completed(index, marker.producer_id, marker.commit)
    answers = []
    for marker, outcome in zip(request.markers, results, strict=True):
        topics = []
        for topic in marker.topics:
            partitions = tuple(
                module.WritableTxnMarkerPartitionResult(
                    partition_index=index, error_code=outcome[(topic.name, int(index))].to_kio()
                )
                for index in topic.partition_indexes
            )
            topics.append(
                module.WritableTxnMarkerTopicResult(name=topic.name, partitions=partitions)
            )
        answers.append(
            module.WritableTxnMarkerResult(producer_id=marker.producer_id, topics=tuple(topics))
        )
    return module.WriteTxnMarkersResponse(markers=tuple(answers))
