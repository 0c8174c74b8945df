"""Partition reassignment (KIP-455): AlterPartitionReassignments and
ListPartitionReassignments (Kafka's ``PartitionReassignmentReplicas`` and
``PartitionReassignmentRevert``).

A reassignment moves a partition from its replicas (the *original* set) to a *target*
set. While it runs, the partition's ``replicas`` are the target followed by the original
replicas that are not in it (``removing_replicas``); ``adding_replicas`` are the target
replicas that are not original. The new replicas fetch from the leader like any follower
and join the ISR through AlterPartition; the reassignment **completes** when every
target replica is in the ISR (:func:`completion`, called on each ISR change and when the
reassignment starts): the replicas become the target, the ISR keeps only target
replicas, and a leader outside the target hands over to an active target ISR member.

* A target already in the ISR completes at once (reordering replicas, or moving to
  replicas that are all in sync); a target equal to the current replicas changes nothing.
* A new target while one runs replaces it: the original set is what it was before
  (``replicas`` without ``adding_replicas``).
* Cancelling (null replicas) returns to the original set: adding replicas leave, the ISR
  keeps only original replicas; if none of them is in the ISR the first active original
  replica becomes the only ISR member and leader (Kafka's unclean revert).
  NO_REASSIGNMENT_IN_PROGRESS when none runs.
* A target that is empty, lists a broker twice or names a broker that is not registered:
  INVALID_REPLICA_ASSIGNMENT. A number of replicas other than the original's, when the
  request disallows replication factor changes (v1), or beyond what this cluster allows:
  INVALID_REPLICATION_FACTOR. Changing a topic's replication factor is reassigning each
  of its partitions to a set of the new size.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tidelog.metadata.controller.base import ControllerResult, ControllerView, per_item
from tidelog.metadata.controller.leaders import choose_leader, is_active
from tidelog.metadata.controller.topics import replication_limit_error
from tidelog.metadata.errors import OK, ApiError
from tidelog.metadata.image import MetadataImage, PartitionImage
from tidelog.metadata.records import MetadataRecord, PartitionChangeRecord
from tidelog.protocol.error_codes import ErrorCode

__all__ = [
    "Completed",
    "OngoingReassignment",
    "ReassignmentRequest",
    "ReassignmentResult",
    "alter_partition_reassignments",
    "completion",
    "list_partition_reassignments",
    "original_replicas",
    "settle_record",
    "target_replicas",
]


@dataclass(frozen=True)
class ReassignmentRequest:
    """One partition of AlterPartitionReassignments; ``replicas`` None cancels."""

    topic: str
    partition: int
    replicas: tuple[int, ...] | None


@dataclass(frozen=True)
class ReassignmentResult:
    topic: str
    partition: int
    error: ApiError


@dataclass(frozen=True)
class OngoingReassignment:
    topic: str
    partition: int
    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]


def target_replicas(part: PartitionImage) -> tuple[int, ...]:
    return tuple(b for b in part.replicas if b not in part.removing_replicas)


def original_replicas(part: PartitionImage) -> tuple[int, ...]:
    return tuple(b for b in part.replicas if b not in part.adding_replicas)


@dataclass(frozen=True)
class Completed:
    """The partition's state once its reassignment completes."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int


def completion(
    name: str,
    part: PartitionImage,
    isr: tuple[int, ...],
    acceptable: Callable[[int], bool],
) -> Completed | None:
    """The state that completes ``part``'s reassignment once its ISR is ``isr``, or None
    while a target replica is not in it (or nothing is being reassigned)."""
    if not part.reassigning:
        return None
    target = target_replicas(part)
    if not all(b in isr for b in target):
        return None
    return _settled(name, part, target, tuple(b for b in isr if b in target), acceptable)


def _settled(
    name: str,
    part: PartitionImage,
    replicas: tuple[int, ...],
    isr: tuple[int, ...],
    acceptable: Callable[[int], bool],
) -> Completed:
    """``part`` on ``replicas`` with ``isr``: its leader kept when it is one of them and
    acceptable, else elected among them."""
    settled = PartitionImage(
        part.partition, replicas, isr, part.leader, part.leader_epoch, part.partition_epoch
    )

    def among(b: int) -> bool:
        return b in replicas and acceptable(b)

    leader, isr = choose_leader(name, settled, isr, among)
    return Completed(replicas, isr, leader)


def settle_record(
    topic_id: uuid.UUID, part: PartitionImage, done: Completed
) -> PartitionChangeRecord:
    """The record that takes ``part`` to ``done``, its reassignment over."""
    return PartitionChangeRecord(
        topic_id,
        part.partition,
        leader=None if done.leader == part.leader else done.leader,
        isr=None if done.isr == part.isr else done.isr,
        replicas=None if done.replicas == part.replicas else done.replicas,
        adding_replicas=() if part.adding_replicas else None,
        removing_replicas=() if part.removing_replicas else None,
    )


def _check_target(
    view: ControllerView,
    part: PartitionImage,
    target: Sequence[int],
    allow_replication_factor_change: bool,
) -> ApiError | None:
    if not target:
        return ApiError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "the target replica list is empty")
    if len(set(target)) != len(target):
        return ApiError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "the target lists a broker twice")
    unknown = [b for b in target if b not in view.image.brokers]
    if unknown:
        return ApiError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"the target names brokers that are not registered: {unknown[:5]}",
        )
    original = original_replicas(part)
    if not allow_replication_factor_change and len(target) != len(original):
        return ApiError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"the target has {len(target)} replicas, the partition {len(original)}, and "
            "the request does not allow changing the replication factor",
        )
    return replication_limit_error(view, len(target))


def _plan(
    view: ControllerView, name: str, part: PartitionImage, target: tuple[int, ...] | None
) -> ApiError | PartitionChangeRecord | None:
    """The record that starts, replaces, completes or cancels ``part``'s reassignment;
    None when nothing changes; an error when it cannot."""
    image = view.image
    topic_id = image.topics_by_name[name].topic_id

    def acceptable(b: int) -> bool:
        return is_active(image, b)

    if target is None:
        if not part.reassigning:
            return ApiError(
                ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
                f"no reassignment of {name}-{part.partition} is under way",
            )
        original = original_replicas(part)
        isr = tuple(b for b in part.isr if b in original)
        if not isr:
            active = [b for b in original if acceptable(b)]
            isr = (active[0] if active else original[0],)
        return settle_record(topic_id, part, _settled(name, part, original, isr, acceptable))
    original = original_replicas(part)
    removing = tuple(b for b in original if b not in target)
    adding = tuple(b for b in target if b not in original)
    if all(b in part.isr for b in target):
        done = _settled(name, part, target, tuple(b for b in part.isr if b in target), acceptable)
        if (done.replicas, done.isr, done.leader) == (part.replicas, part.isr, part.leader) and (
            not part.reassigning
        ):
            return None
        return settle_record(topic_id, part, done)
    return PartitionChangeRecord(
        topic_id,
        part.partition,
        replicas=target + removing,
        adding_replicas=adding,
        removing_replicas=removing,
    )


def alter_partition_reassignments(
    view: ControllerView,
    requests: Sequence[ReassignmentRequest],
    *,
    allow_replication_factor_change: bool = True,
) -> ControllerResult[list[ReassignmentResult]]:
    """AlterPartitionReassignments: one result per partition, in request order. A
    partition listed twice gets INVALID_REQUEST (its first entry too)."""
    counts: dict[tuple[str, int], int] = {}
    for request in requests:
        key = (request.topic, request.partition)
        counts[key] = counts.get(key, 0) + 1
    results: list[ReassignmentResult] = []
    planned: list[tuple[int, list[MetadataRecord]]] = []
    for index, request in enumerate(requests):
        name, number = request.topic, request.partition
        topic = view.image.topic(name)
        part = None if topic is None else topic.partitions.get(number)
        outcome: ApiError | PartitionChangeRecord | None
        if counts[(name, number)] > 1:
            outcome = ApiError(ErrorCode.INVALID_REQUEST, f"{name}-{number} is listed twice")
        elif part is None:
            outcome = ApiError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {name}-{number}"
            )
        else:
            outcome = None
            if request.replicas is not None:
                outcome = _check_target(
                    view, part, request.replicas, allow_replication_factor_change
                )
            if outcome is None:
                outcome = _plan(view, name, part, request.replicas)
        if isinstance(outcome, ApiError):
            results.append(ReassignmentResult(name, number, outcome))
            continue
        if outcome is not None:
            planned.append((index, [outcome]))
        results.append(ReassignmentResult(name, number, OK))
    return per_item(
        results, planned, lambda r, error: ReassignmentResult(r.topic, r.partition, error)
    )


def list_partition_reassignments(
    image: MetadataImage, topics: Sequence[tuple[str, Sequence[int]]] | None
) -> list[OngoingReassignment]:
    """ListPartitionReassignments: the reassignments under way among the partitions asked
    for (all for None); partitions that do not exist or are not being reassigned are left
    out, as Kafka does."""
    if topics is None:
        topics = [
            (name, list(image.topics_by_name[name].partitions))
            for name in sorted(image.topics_by_name)
        ]
    ongoing: list[OngoingReassignment] = []
    for name, indexes in topics:
        topic = image.topic(name)
        if topic is None:
            continue
        for index in indexes:
            part = topic.partitions.get(index)
            if part is not None and part.reassigning:
                ongoing.append(
                    OngoingReassignment(
                        name, index, part.replicas, part.adding_replicas, part.removing_replicas
                    )
                )
    return ongoing
