"""AlterPartition (API 56): a partition leader asks the controller to change its ISR
(Kafka's ``ReplicationControlManager.alterPartition``).

The request is refused whole with STALE_BROKER_EPOCH when the broker epoch is not the
sender's registration's. Then each partition is checked, in Kafka's order:

1. UNKNOWN_TOPIC_ID / UNKNOWN_TOPIC_OR_PARTITION: no such topic id / partition;
2. NOT_CONTROLLER: a leader or partition epoch *newer* than this controller's image (this
   controller is behind: the sender should find the active one);
3. INVALID_REQUEST: the sender is not the partition's leader (Kafka answers
   INVALID_REQUEST here, not NOT_LEADER_OR_FOLLOWER);
4. FENCED_LEADER_EPOCH: an older leader epoch;
5. INVALID_UPDATE_VERSION: an older partition epoch (another change came first);
6. INVALID_REQUEST: an ISR that names a broker twice, a broker that is not a replica, or
   leaves the leader out;
7. INELIGIBLE_REPLICA: an ISR member that is not registered, fenced, in controlled
   shutdown, or (v3) not of the broker epoch given for it.

A partition that passes gets a PartitionChangeRecord (none when the ISR does not change)
and is answered with the leader, leader epoch, partition epoch and ISR it has once that
commits. When the new ISR holds every target replica of a reassignment under way, the
same record completes it (see :mod:`.reassignment`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace

from tidelog.metadata.controller.base import ControllerResult, ControllerView
from tidelog.metadata.controller.leaders import is_active
from tidelog.metadata.controller.reassignment import completion, settle_record
from tidelog.metadata.errors import OK, ApiError
from tidelog.metadata.image import MetadataImage, PartitionImage
from tidelog.metadata.records import MetadataRecord, PartitionChangeRecord
from tidelog.protocol.error_codes import ErrorCode

__all__ = [
    "AlterPartitionItem",
    "AlterPartitionReply",
    "AlterPartitionRequest",
    "AlterPartitionResult",
    "IsrMember",
    "alter_partition",
]


@dataclass(frozen=True)
class IsrMember:
    broker_id: int
    #: The member's broker epoch as the leader knows it (-1: not checked; v2 and older).
    broker_epoch: int = -1


@dataclass(frozen=True)
class AlterPartitionItem:
    topic_id: uuid.UUID
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[IsrMember, ...]


@dataclass(frozen=True)
class AlterPartitionRequest:
    broker_id: int
    broker_epoch: int
    items: tuple[AlterPartitionItem, ...]


@dataclass(frozen=True)
class AlterPartitionResult:
    topic_id: uuid.UUID
    partition: int
    error: ApiError
    leader: int = -1
    leader_epoch: int = -1
    partition_epoch: int = -1
    isr: tuple[int, ...] = ()


@dataclass(frozen=True)
class AlterPartitionReply:
    error: ApiError
    results: tuple[AlterPartitionResult, ...] = ()


def _ineligible(image: MetadataImage, member: IsrMember) -> str | None:
    registration = image.brokers.get(member.broker_id)
    if registration is None:
        return f"broker {member.broker_id} is not registered"
    if registration.fenced:
        return f"broker {member.broker_id} is fenced"
    if registration.in_controlled_shutdown:
        return f"broker {member.broker_id} is in controlled shutdown"
    if member.broker_epoch != -1 and member.broker_epoch != registration.epoch:
        return (
            f"broker {member.broker_id} is at epoch {registration.epoch}, not {member.broker_epoch}"
        )
    return None


def _check(
    image: MetadataImage, broker_id: int, part: PartitionImage, item: AlterPartitionItem
) -> ApiError | None:
    if item.leader_epoch > part.leader_epoch or item.partition_epoch > part.partition_epoch:
        return ApiError(
            ErrorCode.NOT_CONTROLLER,
            f"epochs ({item.leader_epoch}, {item.partition_epoch}) are newer than this "
            f"controller's ({part.leader_epoch}, {part.partition_epoch})",
        )
    if broker_id != part.leader:
        return ApiError(
            ErrorCode.INVALID_REQUEST,
            f"broker {broker_id} is not the leader of the partition ({part.leader} is)",
        )
    if item.leader_epoch < part.leader_epoch:
        return ApiError(
            ErrorCode.FENCED_LEADER_EPOCH,
            f"leader epoch {item.leader_epoch} is older than {part.leader_epoch}",
        )
    if item.partition_epoch < part.partition_epoch:
        return ApiError(
            ErrorCode.INVALID_UPDATE_VERSION,
            f"partition epoch {item.partition_epoch} is older than {part.partition_epoch}",
        )
    isr = [m.broker_id for m in item.new_isr]
    if len(set(isr)) != len(isr):
        return ApiError(ErrorCode.INVALID_REQUEST, "the new ISR names a broker twice")
    strangers = [b for b in isr if b not in part.replicas]
    if strangers:
        return ApiError(
            ErrorCode.INVALID_REQUEST,
            f"the new ISR names brokers that are not replicas: {strangers}",
        )
    if part.leader not in isr:
        return ApiError(ErrorCode.INVALID_REQUEST, "the new ISR leaves the leader out")
    for member in item.new_isr:
        reason = _ineligible(image, member)
        if reason is not None:
            return ApiError(ErrorCode.INELIGIBLE_REPLICA, reason)
    return None


def _record(
    image: MetadataImage, name: str, topic_id: uuid.UUID, part: PartitionImage, isr: tuple[int, ...]
) -> PartitionChangeRecord | None:
    done = completion(name, part, isr, lambda b: is_active(image, b))
    if done is not None:
        return settle_record(topic_id, part, done)
    if isr == part.isr:
        return None
    return PartitionChangeRecord(topic_id, part.partition, isr=isr)


def alter_partition(
    view: ControllerView, request: AlterPartitionRequest
) -> ControllerResult[AlterPartitionReply]:
    """AlterPartition: the reply once the changes commit, one result per partition."""
    image = view.image
    registration = image.brokers.get(request.broker_id)
    if registration is None or registration.epoch != request.broker_epoch:
        return ControllerResult(
            AlterPartitionReply(
                ApiError(
                    ErrorCode.STALE_BROKER_EPOCH,
                    f"broker {request.broker_id} is not registered at epoch {request.broker_epoch}",
                )
            )
        )
    seen: set[tuple[uuid.UUID, int]] = set()
    results: list[AlterPartitionResult] = []
    planned: list[tuple[int, tuple[MetadataRecord, ...]]] = []
    for index, item in enumerate(request.items):
        topic = image.topic_by_id(item.topic_id)
        part = None if topic is None else topic.partitions.get(item.partition)
        error: ApiError | None
        if topic is None:
            error = ApiError(ErrorCode.UNKNOWN_TOPIC_ID, f"no topic has id {item.topic_id}")
        elif part is None:
            error = ApiError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {topic.name} has no partition {item.partition}",
            )
        elif (item.topic_id, item.partition) in seen:
            error = ApiError(ErrorCode.INVALID_REQUEST, "the partition is listed twice")
        else:
            error = _check(image, request.broker_id, part, item)
        seen.add((item.topic_id, item.partition))
        if error is not None or topic is None or part is None:
            results.append(AlterPartitionResult(item.topic_id, item.partition, error or OK))
            continue
        isr = tuple(m.broker_id for m in item.new_isr)
        record = _record(image, topic.name, topic.topic_id, part, isr)
        after = part if record is None else part.changed(record)
        if record is not None:
            planned.append((index, (record,)))
        results.append(
            AlterPartitionResult(
                item.topic_id,
                item.partition,
                OK,
                after.leader,
                after.leader_epoch,
                after.partition_epoch,
                after.isr,
            )
        )

    def failed(errors: Mapping[int, ApiError]) -> AlterPartitionReply:
        return AlterPartitionReply(
            OK,
            tuple(
                replace(r, error=errors[i], leader=-1, leader_epoch=-1, partition_epoch=-1, isr=())
                if i in errors
                else r
                for i, r in enumerate(results)
            ),
        )

    return ControllerResult(AlterPartitionReply(OK, tuple(results)), tuple(planned), failed)
