"""Produce (v3 and up): validate, check idempotence, append, answer per ``acks``.

Per partition, synchronously and in request order:

1. resolve the partition (by name, or by topic id from v13): unknown topic ->
   UNKNOWN_TOPIC_OR_PARTITION (v13: UNKNOWN_TOPIC_ID for an unknown id); Kafka does not
   create topics on produce;
2. validate the records (:mod:`tidelog.broker.produce_validation`);
3. with invalid ``acks`` nothing is written: INVALID_REQUIRED_ACKS;
   a transactional batch that would start a transaction on the partition must be
   verified by the broker's ``transaction_verifier`` (KIP-890; INVALID_TXN_STATE when the
   partition is not in the producer's ongoing transaction), see
   :mod:`tidelog.broker.produce_validation`;
4. idempotent batches (producer id >= 0) are checked against the partition's producer
   state: a repeat of one of the producer's last five batches is answered with that batch's
   offsets and not written again; an old epoch -> INVALID_PRODUCER_EPOCH (Kafka >= 2.7 on
   the produce path, every version); a sequence gap, or a new epoch not starting at 0 ->
   OUT_OF_ORDER_SEQUENCE_NUMBER; a non-transactional batch from a producer with an ongoing
   transaction -> INVALID_TXN_STATE. Neither DUPLICATE_SEQUENCE_NUMBER nor UNKNOWN_PRODUCER_ID
   is returned: current Kafka answers duplicates with their offsets and accepts any
   sequence from a producer it has no state for (KIP-360);
5. append; storage errors map to Kafka codes (:func:`storage_error_code`). A partition
   whose log dir went offline after an I/O error (this request's or an earlier one's)
   answers KAFKA_STORAGE_ERROR and is never written or acknowledged again.

A failed partition never affects the others. Then, by ``acks``:

* ``0``: no response (:data:`NO_RESPONSE`); when any partition failed the connection is
  closed (:class:`CloseConnection`) so the client notices, as Kafka does;
* ``1``: the response, built at once;
* ``-1``: a :class:`Deferred` that resolves once every written partition (duplicates
  included) is fsynced up to its last offset, the partitions syncing concurrently with group
  commit. A failed fsync turns that partition's answer into KAFKA_STORAGE_ERROR.

``log_append_time`` is the broker time for LogAppendTime topics and -1 otherwise (Kafka
echoes the original batch's max timestamp for a duplicate even on CreateTime topics;
Tidelog answers -1 there).
"""

from __future__ import annotations

import asyncio
import datetime
import importlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from kio.static.primitive import i32Timedelta

from tidelog.broker.authorization import access
from tidelog.broker.connection import CloseConnection, RequestContext
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE
from tidelog.broker.metrics import BrokerMetrics
from tidelog.broker.partitions import Partition
from tidelog.broker.produce_validation import (
    Refusal,
    TransactionVerifier,
    validate_partition_records,
)
from tidelog.broker.quotas import PRODUCER_BYTE_RATE
from tidelog.broker.reply import NO_RESPONSE, Deferred
from tidelog.metadata.acls import AclOperation
from tidelog.protocol import SUPPORTED_VERSIONS, ApiKey, ErrorCode
from tidelog.storage import (
    CorruptSegmentError,
    InvalidAppendError,
    LogClosedError,
    LogDirOfflineError,
    RecordTooLargeError,
    SegmentDeletedError,
    StorageError,
)
from tidelog.storage.producer_state import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
)

_log = logging.getLogger(__name__)

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_KIO_CODES = {code: code.to_kio() for code in ErrorCode}
_NONE = ErrorCode.NONE
_VALID_ACKS = frozenset((-1, 0, 1))


@dataclass(frozen=True, slots=True)
class _Shape:
    """The response classes of one Produce version and which fields they have."""

    response: Any
    topic: Any
    partition: Any
    record_error: Any
    by_topic_id: bool
    log_start_offset: bool
    record_errors: bool


def _shape(version: int) -> _Shape:
    module = importlib.import_module(f"kio.schema.produce.v{version}.response")
    partition_cls = module.PartitionProduceResponse
    names = {f.name for f in fields(partition_cls)}
    topic_names = {f.name for f in fields(module.TopicProduceResponse)}
    return _Shape(
        response=module.ProduceResponse,
        topic=module.TopicProduceResponse,
        partition=partition_cls,
        record_error=getattr(module, "BatchIndexAndErrorMessage", None),
        by_topic_id="topic_id" in topic_names,
        log_start_offset="log_start_offset" in names,
        record_errors="record_errors" in names,
    )


_RANGE = SUPPORTED_VERSIONS[ApiKey.PRODUCE]
_SHAPES = {v: _shape(v) for v in range(_RANGE.min_accepted, _RANGE.max_version + 1)}


class _Result:
    """One partition's outcome, turned into the version's response class at the end."""

    __slots__ = (
        "base_offset",
        "error",
        "index",
        "log_append_time",
        "log_start_offset",
        "message",
        "record_errors",
    )

    def __init__(
        self,
        index: int,
        error: ErrorCode = _NONE,
        base_offset: int = -1,
        log_append_time: int = -1,
        log_start_offset: int = -1,
        message: str | None = None,
        record_errors: Sequence[tuple[int, str | None]] = (),
    ) -> None:
        self.index = index
        self.error = error
        self.base_offset = base_offset
        self.log_append_time = log_append_time
        self.log_start_offset = log_start_offset
        self.message = message
        self.record_errors = record_errors

    def fail(self, error: ErrorCode, message: str | None = None) -> None:
        self.error = error
        self.base_offset = -1
        self.log_append_time = -1
        self.log_start_offset = -1
        self.message = message


def storage_error_code(exc: Exception) -> ErrorCode:
    """The Kafka code for an exception of the append (most specific type first)."""
    if isinstance(exc, RecordTooLargeError):
        return ErrorCode.MESSAGE_TOO_LARGE
    if isinstance(exc, InvalidAppendError):
        return ErrorCode.INVALID_RECORD
    if isinstance(exc, LogDirOfflineError):
        return ErrorCode.KAFKA_STORAGE_ERROR
    if isinstance(exc, LogClosedError):
        # The partition is going away (deleted, or the broker is stopping): retriable.
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    if isinstance(exc, CorruptSegmentError | SegmentDeletedError | OSError):
        return ErrorCode.KAFKA_STORAGE_ERROR
    return ErrorCode.UNKNOWN_SERVER_ERROR


def _produce_partition(
    partition: Partition,
    result: _Result,
    records: bytes | None,
    version: int,
    now_ms: int,
    acks_valid: bool,
    metrics: BrokerMetrics | None,
    verifier: TransactionVerifier,
    transactional_id: str | None,
) -> int:
    """Validate and append one partition's records, filling ``result``; returns the offset
    that must be durable before an acks=all answer (0 when nothing is to wait for)."""
    if partition.offline:
        offline = partition.storage_error()
        result.fail(offline.code, str(offline))
        return 0
    log = partition.log
    config = log.config
    checked = validate_partition_records(
        records,
        api_version=version,
        config=config,
        now_ms=now_ms,
        topic_partition=f"{partition.topic}-{partition.index}",
    )
    if isinstance(checked, Refusal):
        result.fail(checked.error, checked.message)
        result.record_errors = checked.record_errors
        return 0
    if not acks_valid:
        result.fail(ErrorCode.INVALID_REQUIRED_ACKS)
        return 0
    header = checked
    if header.is_transactional and not partition.has_ongoing_txn(
        header.producer_id, header.producer_epoch
    ):
        code = verifier.verify(
            transactional_id,
            header.producer_id,
            header.producer_epoch,
            partition.topic,
            partition.index,
        )
        if code is not _NONE:
            result.fail(
                code,
                f"{partition.topic}-{partition.index} is not part of an ongoing transaction of "
                f"producer {header.producer_id} epoch {header.producer_epoch}",
            )
            return 0
    try:
        if header.producer_id >= 0:
            duplicate = partition.check_producer(header, now_ms)
            if duplicate is not None:
                result.base_offset = duplicate.first_offset
                result.log_append_time = duplicate.timestamp if config.log_append_time else -1
                result.log_start_offset = log.log_start_offset
                return duplicate.last_offset + 1
        assert records is not None
        # validate_partition_records checked the keys of compacted topics already.
        info = partition.append(
            bytearray(records), headers=[header], now_ms=now_ms, keys_checked=True
        )
    except InvalidProducerEpochError as exc:
        result.fail(ErrorCode.INVALID_PRODUCER_EPOCH, str(exc))
        return 0
    except OutOfOrderSequenceError as exc:
        result.fail(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, str(exc))
        return 0
    except InvalidTxnStateError as exc:
        result.fail(ErrorCode.INVALID_TXN_STATE, str(exc))
        return 0
    except (StorageError, OSError) as exc:
        code = storage_error_code(exc)
        if code in (ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.UNKNOWN_SERVER_ERROR):
            _log.error("append to %s-%d failed: %s", partition.topic, partition.index, exc)
        result.fail(code, str(exc))
        return 0
    if metrics is not None:
        metrics.produced(partition.topic, len(records), info.last_offset - info.first_offset + 1)
    result.base_offset = info.first_offset
    result.log_append_time = info.log_append_time
    result.log_start_offset = info.log_start_offset
    return info.last_offset + 1


def _build(
    shape: _Shape, topics: list[tuple[Any, list[_Result]]], by_topic_id: bool, throttle_ms: int
) -> object:
    partition_cls = shape.partition
    record_error_cls = shape.record_error
    topic_responses = []
    for key, results in topics:
        partitions = []
        for r in results:
            kwargs: dict[str, Any] = {
                "index": r.index,
                "error_code": _KIO_CODES[r.error],
                "base_offset": r.base_offset,
                "log_append_time": (
                    None
                    if r.log_append_time < 0
                    else _EPOCH + datetime.timedelta(milliseconds=r.log_append_time)
                ),
            }
            if shape.log_start_offset:
                kwargs["log_start_offset"] = r.log_start_offset
            if shape.record_errors:
                kwargs["record_errors"] = tuple(
                    record_error_cls(batch_index=i, batch_index_error_message=m)
                    for i, m in r.record_errors
                )
                kwargs["error_message"] = r.message
            partitions.append(partition_cls(**kwargs))
        if by_topic_id:
            topic_responses.append(shape.topic(topic_id=key, partition_responses=tuple(partitions)))
        else:
            topic_responses.append(shape.topic(name=key, partition_responses=tuple(partitions)))
    throttle = (
        i32Timedelta.parse(datetime.timedelta(milliseconds=throttle_ms))
        if throttle_ms
        else ZERO_THROTTLE
    )
    return shape.response(responses=tuple(topic_responses), throttle_time=throttle)


async def _when_durable(
    shape: _Shape,
    topics: list[tuple[Any, list[_Result]]],
    by_topic_id: bool,
    waits: dict[Partition, tuple[int, list[_Result]]],
    throttle_ms: int,
) -> object:
    items = list(waits.items())
    outcomes = await asyncio.gather(
        *(partition.make_durable(end) for partition, (end, _) in items), return_exceptions=True
    )
    for (partition, (_, results)), outcome in zip(items, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
            _log.error("fsync of %s-%d failed: %s", partition.topic, partition.index, outcome)
            for result in results:
                result.fail(
                    ErrorCode.KAFKA_STORAGE_ERROR, f"the write could not be made durable: {outcome}"
                )
    return _build(shape, topics, by_topic_id, throttle_ms)


@handles(ApiKey.PRODUCE)
async def handle_produce(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    shape = _SHAPES[version]
    broker = ctx.broker
    partitions = broker.partitions
    now_ms = broker.clock()
    acks = request.acks
    acks_valid = acks in _VALID_ACKS
    by_topic_id = shape.by_topic_id
    topics: list[tuple[Any, list[_Result]]] = []
    waits: dict[Partition, tuple[int, list[_Result]]] = {}
    failed = False
    appended_bytes = 0
    metrics = broker.metrics
    verifier = broker.transaction_verifier
    transactional_id = getattr(request, "transactional_id", None)
    checks = access(ctx)
    # Kafka refuses every partition of a transactional write the id may not make.
    refused = (
        checks.transactional_id_error(AclOperation.WRITE, transactional_id)
        if transactional_id is not None
        else None
    )
    for topic_data in request.topic_data:
        results: list[_Result] = []
        unknown = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if by_topic_id:
            key = topic_data.topic_id
            name = broker.topic_name_of(key) if key is not None else None
            if name is None:
                unknown = ErrorCode.UNKNOWN_TOPIC_ID
        else:
            key = name = topic_data.name
        denied = refused or checks.topic_error(AclOperation.WRITE, name)
        for data in topic_data.partition_data:
            result = _Result(data.index)
            results.append(result)
            partition = partitions.get(name, data.index) if name is not None else None
            if partition is None or denied is not None:
                result.fail(denied or unknown)
                failed = True
                continue
            end = _produce_partition(
                partition,
                result,
                data.records,
                version,
                now_ms,
                acks_valid,
                metrics,
                verifier,
                transactional_id,
            )
            if result.error is not _NONE:
                failed = True
                continue
            appended_bytes += len(data.records or b"")
            if end > 0 and acks == -1:
                previous = waits.get(partition)
                if previous is None:
                    waits[partition] = (end, [result])
                else:
                    previous[1].append(result)
                    waits[partition] = (max(previous[0], end), previous[1])
        topics.append((key, results))
    throttle_ms = _throttle(ctx, appended_bytes)
    if acks == 0:
        if failed:
            raise CloseConnection("a Produce request with acks=0 failed on some partition")
        return NO_RESPONSE
    if waits:
        return Deferred(
            asyncio.ensure_future(_when_durable(shape, topics, by_topic_id, waits, throttle_ms))
        )
    return _build(shape, topics, by_topic_id, throttle_ms)


def _throttle(ctx: RequestContext, appended_bytes: int) -> int:
    """Record the bytes appended against the client's ``producer_byte_rate`` and mute the
    connection for the throttle time (answered at once all the same: KIP-219)."""
    quotas = ctx.broker.quotas
    if quotas is None or appended_bytes == 0:
        return 0
    throttle_ms = quotas.record(
        PRODUCER_BYTE_RATE, ctx.principal.name, ctx.client_id, appended_bytes
    )
    ctx.throttle(throttle_ms)
    return throttle_ms
