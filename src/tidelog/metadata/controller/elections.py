"""Leader elections asked for: ElectLeaders (API 43) and the automatic preferred-leader
rebalance (Kafka's ``ReplicationControlManager.electLeaders`` and the controller's
``auto.leader.rebalance.enable`` task).

* **PREFERRED** moves a partition's leadership to its preferred replica (the first of its
  replicas) when that broker is active and in the ISR: ELECTION_NOT_NEEDED when it leads
  already, PREFERRED_LEADER_NOT_AVAILABLE when it cannot (the leader then stays).
* **UNCLEAN** gives a leaderless partition a leader: an active ISR member when there is
  one, else any active replica, which becomes the only ISR member (data only the old ISR
  held is lost; logged). ELECTION_NOT_NEEDED when the partition has a leader,
  ELIGIBLE_LEADERS_NOT_AVAILABLE when no replica is active. It does not need
  ``unclean.leader.election.enable``: asking is the operator's consent, as in Kafka.
* A null partition list means every partition; the answer then leaves out the
  partitions whose election was not needed, as Kafka's does.
* **Rebalance**: a broker whose preferred leaderships are held elsewhere for more than
  ``leader.imbalance.per.broker.percentage`` percent of them gets them back, each by a
  preferred election that can succeed (the preferred replica active and in the ISR, no
  reassignment under way).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from tidelog.metadata.configs import topic_config_value
from tidelog.metadata.controller.base import ControllerResult, ControllerView, per_item
from tidelog.metadata.controller.leaders import (
    NO_LEADER,
    UncleanPolicy,
    choose_leader,
    is_active,
)
from tidelog.metadata.errors import OK, ApiError
from tidelog.metadata.image import MetadataImage, PartitionImage, TopicImage
from tidelog.metadata.records import MetadataRecord, PartitionChangeRecord
from tidelog.protocol.error_codes import ErrorCode

__all__ = [
    "ElectionResult",
    "ElectionType",
    "elect_leaders",
    "imbalanced_partitions",
    "rebalance_leaders",
    "unclean_election_enabled",
    "unclean_policy",
]


class ElectionType(enum.IntEnum):
    """Kafka's ``ElectionType`` as ElectLeaders carries it."""

    PREFERRED = 0
    UNCLEAN = 1


@dataclass(frozen=True)
class ElectionResult:
    topic: str
    partition: int
    error: ApiError


def unclean_election_enabled(view: ControllerView, topic: str) -> bool:
    """``unclean.leader.election.enable`` of ``topic``: its override, else the broker's
    (dynamic, then static) value, else false."""
    value, _ = topic_config_value(
        view.config, view.image.topic_config(topic), "unclean.leader.election.enable"
    )
    return value is True


def unclean_policy(view: ControllerView) -> UncleanPolicy:
    return lambda topic: unclean_election_enabled(view, topic)


def _preferred(
    image: MetadataImage, topic: TopicImage, part: PartitionImage
) -> PartitionChangeRecord | ApiError:
    preferred = part.replicas[0]
    if part.leader == preferred:
        return ApiError(ErrorCode.ELECTION_NOT_NEEDED, f"broker {preferred} leads already")
    if preferred not in part.isr or not is_active(image, preferred):
        return ApiError(
            ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
            f"preferred leader {preferred} is not an active member of the ISR",
        )
    return PartitionChangeRecord(topic.topic_id, part.partition, leader=preferred)


def _unclean(
    image: MetadataImage, topic: TopicImage, part: PartitionImage
) -> PartitionChangeRecord | ApiError:
    if part.leader != NO_LEADER:
        return ApiError(ErrorCode.ELECTION_NOT_NEEDED, f"broker {part.leader} leads already")
    leader, isr = choose_leader(
        topic.name, part, part.isr, lambda b: is_active(image, b), unclean=True
    )
    if leader == NO_LEADER:
        return ApiError(
            ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, "no replica of the partition is active"
        )
    return PartitionChangeRecord(
        topic.topic_id, part.partition, leader, isr=None if isr == part.isr else isr
    )


def elect_leaders(
    view: ControllerView,
    election_type: ElectionType,
    partitions: Sequence[tuple[str, int]] | None,
) -> ControllerResult[list[ElectionResult]]:
    """ElectLeaders: one result per partition asked for (each once, in request order),
    or, for ``partitions`` None, per partition of the cluster that needed an election."""
    image = view.image
    elect_all = partitions is None
    if partitions is None:
        partitions = [
            (name, index)
            for name in sorted(image.topics_by_name)
            for index in image.topics_by_name[name].partitions
        ]
    results: list[ElectionResult] = []
    planned: list[tuple[int, list[MetadataRecord]]] = []
    for name, index in dict.fromkeys(partitions):
        topic = image.topic(name)
        part = None if topic is None else topic.partitions.get(index)
        if topic is None or part is None:
            outcome: PartitionChangeRecord | ApiError = ApiError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {name}-{index}"
            )
        elif election_type is ElectionType.PREFERRED:
            outcome = _preferred(image, topic, part)
        else:
            outcome = _unclean(image, topic, part)
        if isinstance(outcome, ApiError):
            if elect_all and outcome.code is ErrorCode.ELECTION_NOT_NEEDED:
                continue
            results.append(ElectionResult(name, index, outcome))
        else:
            planned.append((len(results), [outcome]))
            results.append(ElectionResult(name, index, OK))
    return per_item(results, planned, lambda r, error: ElectionResult(r.topic, r.partition, error))


def imbalanced_partitions(view: ControllerView) -> list[tuple[str, int]]:
    """The partitions a rebalance moves back to their preferred leader: those of every
    broker over ``leader.imbalance.per.broker.percentage``, where the move can succeed."""
    image = view.image
    percentage = view.config.get_int("leader.imbalance.per.broker.percentage")
    by_preferred: dict[int, list[tuple[str, PartitionImage]]] = {}
    for name in sorted(image.topics_by_name):
        for part in image.topics_by_name[name].partitions.values():
            by_preferred.setdefault(part.replicas[0], []).append((name, part))
    moves: list[tuple[str, int]] = []
    for broker, parts in sorted(by_preferred.items()):
        elsewhere = [(name, part) for name, part in parts if part.leader != broker]
        if len(elsewhere) * 100 <= percentage * len(parts):
            continue
        if not is_active(image, broker):
            continue
        moves += [
            (name, part.partition)
            for name, part in elsewhere
            if broker in part.isr and not part.reassigning
        ]
    return moves


def rebalance_leaders(view: ControllerView) -> ControllerResult[list[ElectionResult]]:
    """The automatic rebalance: preferred elections for :func:`imbalanced_partitions`."""
    moves = imbalanced_partitions(view)
    if not moves:
        return ControllerResult([])
    return elect_leaders(view, ElectionType.PREFERRED, moves)
