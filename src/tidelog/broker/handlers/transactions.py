"""The transaction APIs: AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit,
DescribeTransactions and ListTransactions (InitProducerId is in ``producers``).

Each handler turns the version's request into the transaction coordinator's request
(:mod:`tidelog.coordinator.transactions`), runs it through the driver
(:mod:`tidelog.broker.transactions`) and builds the response of the request's version. The
rules (states, fencing, errors) are the coordinator's, see ``docs/transactions.md``.

* PRODUCER_FENCED exists from AddPartitionsToTxn, AddOffsetsToTxn and EndTxn v2 and
  TxnOffsetCommit v3 on (KIP-588); older versions get INVALID_PRODUCER_EPOCH instead, as
  Kafka answers them.
* AddPartitionsToTxn v0-v3 add one producer's partitions; a partition of a topic the
  metadata does not have gets UNKNOWN_TOPIC_OR_PARTITION and the others
  OPERATION_NOT_ATTEMPTED, with nothing added (Kafka's rule). v4 (KIP-890) carries a
  batch of transactions; those marked ``verify_only`` are only checked (is the partition
  in the ongoing transaction?), the others added one after another.
* AddOffsetsToTxn adds the group's ``__consumer_offsets`` partition.
* TxnOffsetCommit writes the offsets through the group coordinator in the producer's
  transaction (they count once its COMMIT marker is written); it is refused with the
  verification's error when the group's offsets partition was not added with
  AddOffsetsToTxn first (KIP-890), and v3+ is fenced by generation and member (KIP-447).
* DescribeTransactions answers each id; ListTransactions filters by state (unknown
  states are echoed back), producer id, v1's minimum duration and v2's id pattern.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tidelog.broker.authorization import access
from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.groups import driver_of
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE, make, response_module
from tidelog.broker.reply import Deferred
from tidelog.coordinator import (
    OffsetCommitPartition,
    OffsetCommitResult,
    PartitionError,
    TxnOffsetCommitRequest,
)
from tidelog.coordinator.transactions import (
    AddPartitionsRequest,
    AddPartitionsResult,
    EndTxnRequest,
    EndTxnResult,
)
from tidelog.metadata.acls import AclOperation, ResourceType
from tidelog.metadata.controller import OFFSETS_TOPIC
from tidelog.protocol import ApiKey, ErrorCode

if TYPE_CHECKING:
    from tidelog.broker.transactions import TransactionDriver

_UNAVAILABLE = ErrorCode.COORDINATOR_NOT_AVAILABLE

TopicPartition = tuple[str, int]


def txn_driver_of(ctx: RequestContext) -> TransactionDriver | None:
    return ctx.broker.transactions


def fenced_code(error: ErrorCode, *, fenced_from: int, version: int) -> ErrorCode:
    """PRODUCER_FENCED as the request's version knows it (KIP-588)."""
    if error is ErrorCode.PRODUCER_FENCED and version < fenced_from:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return error


async def _ready(reply: object) -> Any:
    """The value of a driver reply, waiting for it if it is deferred."""
    if isinstance(reply, Deferred):
        return await reply.waiter
    return reply


# -- AddPartitionsToTxn --------------------------------------------------------------------


def _requested(topics: Sequence[Any]) -> list[TopicPartition]:
    return [(t.name, int(p)) for t in topics for p in t.partitions]


def _by_topic(module: Any, results: Sequence[tuple[TopicPartition, ErrorCode]]) -> tuple[Any, ...]:
    topics: dict[str, list[Any]] = {}
    for (topic, index), error in results:
        topics.setdefault(topic, []).append(
            module.AddPartitionsToTxnPartitionResult(
                partition_index=index, partition_error_code=error.to_kio()
            )
        )
    return tuple(
        module.AddPartitionsToTxnTopicResult(name=name, results_by_partition=tuple(parts))
        for name, parts in topics.items()
    )


async def _add_partitions(
    ctx: RequestContext,
    driver: TransactionDriver | None,
    req: AddPartitionsRequest,
    version: int,
) -> list[tuple[TopicPartition, ErrorCode]]:
    image = ctx.broker.image
    checks = access(ctx)
    denied = checks.transactional_id_error(AclOperation.WRITE, req.transactional_id)
    if denied is not None:
        return [(tp, denied) for tp in req.partitions]
    # Partitions added to nothing, with why: Write on the topic denied, or no such partition.
    topic_error = checks.topic_errors(AclOperation.WRITE)
    refused = {
        tp: error
        for tp in req.partitions
        if (
            error := topic_error(tp[0])
            or (
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if (topic := image.topic(tp[0])) is None or tp[1] not in topic.partitions
                else None
            )
        )
        is not None
    }
    if refused:
        return [(tp, refused.get(tp, ErrorCode.OPERATION_NOT_ATTEMPTED)) for tp in req.partitions]
    fallback = AddPartitionsResult(tuple((tp, _UNAVAILABLE) for tp in req.partitions))
    if driver is None:
        result = fallback
    else:
        coordinator = driver.coordinator
        result = await _ready(
            driver.respond(
                lambda token, now: coordinator.add_partitions(token, now, req),
                fallback,
                lambda r: r,
            )
        )
    return [
        (tp, fenced_code(error, fenced_from=2, version=version)) for tp, error in result.partitions
    ]


@handles(ApiKey.ADD_PARTITIONS_TO_TXN)
async def handle_add_partitions_to_txn(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    module = response_module("add_partitions_to_txn", version)
    driver = txn_driver_of(ctx)
    if version <= 3:
        req = AddPartitionsRequest(
            request.v3_and_below_transactional_id,
            int(request.v3_and_below_producer_id),
            int(request.v3_and_below_producer_epoch),
            _requested(request.v3_and_below_topics),
        )
        results = await _add_partitions(ctx, driver, req, version)
        return make(
            module.AddPartitionsToTxnResponse,
            throttle_time=ZERO_THROTTLE,
            results_by_topic_v3_and_below=_by_topic(module, results),
        )
    # v4 is sent by brokers only (KIP-890), as Kafka requires ClusterAction for it.
    if (denied := access(ctx).cluster_error(AclOperation.CLUSTER_ACTION)) is not None:
        return make(
            module.AddPartitionsToTxnResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=denied.to_kio(),
            results_by_transaction=(),
        )
    answered = []
    for txn in request.transactions:
        tps = _requested(txn.topics)
        if driver is None:
            results = [(tp, _UNAVAILABLE) for tp in tps]
        elif txn.verify_only:
            verified = driver.coordinator.verify_partitions(
                txn.transactional_id, int(txn.producer_id), int(txn.producer_epoch), tps
            )
            results = [(tp, verified[tp]) for tp in tps]
        else:
            req = AddPartitionsRequest(
                txn.transactional_id, int(txn.producer_id), int(txn.producer_epoch), tps
            )
            results = await _add_partitions(ctx, driver, req, version)
        answered.append(
            module.AddPartitionsToTxnResult(
                transactional_id=txn.transactional_id, topic_results=_by_topic(module, results)
            )
        )
    return make(
        module.AddPartitionsToTxnResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=ErrorCode.NONE.to_kio(),
        results_by_transaction=tuple(answered),
    )


# -- AddOffsetsToTxn -----------------------------------------------------------------------


@handles(ApiKey.ADD_OFFSETS_TO_TXN)
async def handle_add_offsets_to_txn(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    module = response_module("add_offsets_to_txn", version)

    def build(error: ErrorCode) -> object:
        return make(
            module.AddOffsetsToTxnResponse, throttle_time=ZERO_THROTTLE, error_code=error.to_kio()
        )

    checks = access(ctx)
    denied = checks.transactional_id_error(
        AclOperation.WRITE, request.transactional_id
    ) or checks.group_error(AclOperation.READ, request.group_id)
    if denied is not None:
        return build(denied)
    driver = txn_driver_of(ctx)
    groups = driver_of(ctx)
    if driver is None or groups is None:
        return build(_UNAVAILABLE)
    offsets_partition = groups.coordinator.partition_for(request.group_id)
    req = AddPartitionsRequest(
        request.transactional_id,
        int(request.producer_id),
        int(request.producer_epoch),
        [(OFFSETS_TOPIC, offsets_partition)],
    )
    coordinator = driver.coordinator
    fallback = AddPartitionsResult(tuple((tp, _UNAVAILABLE) for tp in req.partitions))
    return driver.respond(
        lambda token, now: coordinator.add_partitions(token, now, req),
        fallback,
        lambda r: build(fenced_code(r.error, fenced_from=2, version=version)),
    )


# -- EndTxn --------------------------------------------------------------------------------


@handles(ApiKey.END_TXN)
async def handle_end_txn(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    module = response_module("end_txn", version)

    def build(result: EndTxnResult) -> object:
        return make(
            module.EndTxnResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=fenced_code(result.error, fenced_from=2, version=version).to_kio(),
            producer_id=result.producer_id,
            producer_epoch=result.producer_epoch,
        )

    denied = access(ctx).transactional_id_error(AclOperation.WRITE, request.transactional_id)
    if denied is not None:
        return build(EndTxnResult(denied))
    driver = txn_driver_of(ctx)
    if driver is None:
        return build(EndTxnResult(_UNAVAILABLE))
    req = EndTxnRequest(
        request.transactional_id,
        int(request.producer_id),
        int(request.producer_epoch),
        bool(request.committed),
    )
    coordinator = driver.coordinator
    return driver.respond(
        lambda token, now: coordinator.end_txn(token, now, req),
        EndTxnResult(_UNAVAILABLE),
        build,
    )


# -- TxnOffsetCommit -----------------------------------------------------------------------


@handles(ApiKey.TXN_OFFSET_COMMIT)
async def handle_txn_offset_commit(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    module = response_module("txn_offset_commit", version)
    checks = access(ctx)
    topic_error = checks.topic_errors(AclOperation.READ)
    # The partitions of topics that may not be read are answered apart, the others committed.
    refused: list[PartitionError] = []
    partitions = []
    for t in request.topics:
        denied = topic_error(t.name)
        for p in t.partitions:
            if denied is not None:
                refused.append(PartitionError(t.name, int(p.partition_index), denied))
                continue
            partitions.append(
                OffsetCommitPartition(
                    topic=t.name,
                    partition=int(p.partition_index),
                    offset=int(p.committed_offset),
                    metadata=p.committed_metadata,
                    leader_epoch=int(getattr(p, "committed_leader_epoch", -1)),
                )
            )

    def build(result: OffsetCommitResult) -> object:
        topics: dict[str, list[Any]] = {}
        for r in (*result.partitions, *refused):
            error = fenced_code(r.error, fenced_from=3, version=version)
            topics.setdefault(r.topic, []).append(
                module.TxnOffsetCommitResponsePartition(
                    partition_index=r.partition, error_code=error.to_kio()
                )
            )
        return make(
            module.TxnOffsetCommitResponse,
            throttle_time=ZERO_THROTTLE,
            topics=tuple(
                module.TxnOffsetCommitResponseTopic(name=name, partitions=tuple(parts))
                for name, parts in topics.items()
            ),
        )

    def all_failed(error: ErrorCode) -> OffsetCommitResult:
        return OffsetCommitResult(
            tuple(PartitionError(p.topic, p.partition, error) for p in partitions)
        )

    denied = checks.transactional_id_error(
        AclOperation.WRITE, request.transactional_id
    ) or checks.group_error(AclOperation.READ, request.group_id)
    if denied is not None:
        refused = [PartitionError(r.topic, r.partition, denied) for r in refused]
        return build(all_failed(denied))
    driver = txn_driver_of(ctx)
    groups = driver_of(ctx)
    if driver is None or groups is None:
        return build(all_failed(_UNAVAILABLE))
    producer_id = int(request.producer_id)
    producer_epoch = int(request.producer_epoch)
    offsets_partition = groups.coordinator.partition_for(request.group_id)
    verified = driver.verify(
        request.transactional_id, producer_id, producer_epoch, OFFSETS_TOPIC, offsets_partition
    )
    if verified is ErrorCode.INVALID_PRODUCER_EPOCH:
        verified = ErrorCode.PRODUCER_FENCED
    if verified is not ErrorCode.NONE:
        return build(all_failed(verified))
    commit = TxnOffsetCommitRequest(
        transactional_id=request.transactional_id,
        group_id=request.group_id,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        partitions=tuple(partitions),
        generation_id=int(getattr(request, "generation_id", -1)),
        member_id=getattr(request, "member_id", "") or "",
        group_instance_id=getattr(request, "group_instance_id", None),
    )
    coordinator = groups.coordinator
    return groups.respond(
        lambda token, now: coordinator.commit_transactional_offsets(token, now, commit),
        all_failed(_UNAVAILABLE),
        build,
    )


# -- DescribeTransactions and ListTransactions ---------------------------------------------


def _timestamp(ms_since_epoch: int) -> datetime.datetime:
    # -1 (no transaction) is written as -1 ms, which Kafka's tools show as "none"
    return datetime.datetime.fromtimestamp(ms_since_epoch / 1000, tz=datetime.UTC)


@handles(ApiKey.DESCRIBE_TRANSACTIONS)
async def handle_describe_transactions(ctx: RequestContext, request: Any) -> object:
    module = response_module("describe_transactions", ctx.api_version)
    driver = txn_driver_of(ctx)
    checks = access(ctx)
    states = []
    for tid in request.transactional_ids:
        denied = checks.transactional_id_error(AclOperation.DESCRIBE, tid)
        if driver is None or denied is not None:
            states.append(
                module.TransactionState(
                    error_code=(denied or _UNAVAILABLE).to_kio(),
                    transactional_id=tid,
                    transaction_state="",
                    transaction_timeout=datetime.timedelta(0),
                    transaction_start_time=_timestamp(0),
                    producer_id=-1,
                    producer_epoch=-1,
                    topics=(),
                )
            )
            continue
        d = driver.coordinator.describe(tid)
        # An error entry carries Kafka's defaults (start time 0); a transaction that has not
        # started carries -1, as Kafka's coordinator reports it.
        start = d.start_timestamp if d.error is ErrorCode.NONE else 0
        topics: dict[str, list[int]] = {}
        for topic, index in d.partitions:
            # Kafka leaves out the topics the principal may not describe.
            if checks.topic(AclOperation.DESCRIBE, topic, audit=False):
                topics.setdefault(topic, []).append(index)
        states.append(
            module.TransactionState(
                error_code=d.error.to_kio(),
                transactional_id=tid,
                transaction_state=d.state,
                transaction_timeout=datetime.timedelta(milliseconds=d.timeout_ms),
                transaction_start_time=_timestamp(start),
                producer_id=d.producer_id,
                producer_epoch=d.producer_epoch,
                topics=tuple(
                    module.TopicData(topic=name, partitions=tuple(ids))
                    for name, ids in topics.items()
                ),
            )
        )
    return module.DescribeTransactionsResponse(
        throttle_time=ZERO_THROTTLE, transaction_states=tuple(states)
    )


@handles(ApiKey.LIST_TRANSACTIONS)
async def handle_list_transactions(ctx: RequestContext, request: Any) -> object:
    module = response_module("list_transactions", ctx.api_version)
    # The transactions listed are those the principal may describe.
    checks = access(ctx)
    driver = txn_driver_of(ctx)
    if driver is None:
        return make(
            module.ListTransactionsResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=_UNAVAILABLE.to_kio(),
            unknown_state_filters=(),
            transaction_states=(),
        )
    error, listed, unknown = driver.coordinator.list_transactions(
        driver.now(),
        states=tuple(request.state_filters),
        producer_ids=tuple(int(p) for p in request.producer_id_filters),
        duration_filter_ms=int(getattr(request, "duration_filter", -1)),
        transactional_id_pattern=getattr(request, "transactional_id_pattern", None),
    )
    return make(
        module.ListTransactionsResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=error.to_kio(),
        unknown_state_filters=tuple(unknown),
        transaction_states=tuple(
            module.TransactionState(
                transactional_id=t.transactional_id,
                producer_id=t.producer_id,
                transaction_state=t.state,
            )
            for t in listed
            if checks.allows(
                AclOperation.DESCRIBE,
                ResourceType.TRANSACTIONAL_ID,
                t.transactional_id,
                audit=False,
            )
        ),
    )
