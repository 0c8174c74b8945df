"""Leader and ISR changes that follow a broker's membership (Kafka's
``ReplicationControlManager.generateLeaderAndIsrUpdates``).

A broker that is fenced, enters controlled shutdown or is unregistered is taken out of
every ISR it is in, and each partition it leads gets another leader: the first replica, in
replica order, that is in the ISR and active (unfenced, not shutting down). Without
eligible leader replicas (KIP-966, not implemented) Kafka never empties an ISR: when the
broker is the last member it stays in the ISR and the partition is left without a leader
(-1), offline, until that broker comes back. A broker that is unfenced gives a leader to
every leaderless partition whose ISR holds it (or another active broker).

Unclean election (``unclean.leader.election.enable``, the topic's config or the broker
default, off by default): when no ISR member can lead, the first active replica in
replica order becomes leader and the ISR shrinks to it alone. Whatever the other replicas
held beyond its log is lost, so each such election is logged as a warning.

Only the records are computed here; the image changes when they are replayed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from tidelog.metadata.image import MetadataImage, PartitionImage
from tidelog.metadata.records import PartitionChangeRecord

__all__ = [
    "NO_LEADER",
    "UncleanPolicy",
    "choose_leader",
    "elect_leaderless",
    "is_active",
    "leads_any",
    "remove_from_leadership",
]

_log = logging.getLogger(__name__)

#: The leader of a partition that has none.
NO_LEADER = -1

#: Whether unclean election is allowed for a topic (by name).
UncleanPolicy = Callable[[str], bool]


def _never(topic: str) -> bool:
    return False


def is_active(image: MetadataImage, broker_id: int) -> bool:
    registration = image.brokers.get(broker_id)
    return registration is not None and registration.active


def _elect(
    replicas: Sequence[int], isr: Sequence[int], current: int, acceptable: Callable[[int], bool]
) -> int:
    """Kafka's clean election: keep an acceptable current leader, else the first
    acceptable replica in the ISR, else none."""
    if current in isr and acceptable(current):
        return current
    for replica in replicas:
        if replica in isr and acceptable(replica):
            return replica
    return NO_LEADER


def choose_leader(
    topic: str,
    part: PartitionImage,
    isr: tuple[int, ...],
    acceptable: Callable[[int], bool],
    *,
    unclean: bool = False,
) -> tuple[int, tuple[int, ...]]:
    """The leader and ISR after an election over ``isr``: clean when an ISR member is
    acceptable; otherwise, with ``unclean``, the first acceptable replica alone (logged)."""
    leader = _elect(part.replicas, isr, part.leader, acceptable)
    if leader != NO_LEADER or not unclean:
        return leader, isr
    for replica in part.replicas:
        if acceptable(replica):
            _log.warning(
                "unclean leader election: %s-%d gets leader %d, outside its ISR %s; "
                "records only the old ISR held are lost",
                topic,
                part.partition,
                replica,
                list(isr),
            )
            return replica, (replica,)
    return NO_LEADER, isr


def remove_from_leadership(
    image: MetadataImage, broker_id: int, unclean: UncleanPolicy = _never
) -> list[PartitionChangeRecord]:
    """Records that take ``broker_id`` out of every ISR (never emptying one) and move each
    of its leaderships to another active ISR member (or, where ``unclean`` allows, any
    active replica), or to no leader."""

    def acceptable(b: int) -> bool:
        return b != broker_id and is_active(image, b)

    records: list[PartitionChangeRecord] = []
    for name in sorted(image.topics_by_name):
        topic = image.topics_by_name[name]
        for part in topic.partitions.values():
            if broker_id not in part.isr and part.leader != broker_id:
                continue
            isr = tuple(b for b in part.isr if b != broker_id) or part.isr
            leader, isr = choose_leader(name, part, isr, acceptable, unclean=unclean(name))
            if isr == part.isr and leader == part.leader:
                continue
            records.append(
                PartitionChangeRecord(
                    topic.topic_id,
                    part.partition,
                    leader=None if leader == part.leader else leader,
                    isr=None if isr == part.isr else isr,
                )
            )
    return records


def elect_leaderless(
    image: MetadataImage, broker_id: int, unclean: UncleanPolicy = _never
) -> list[PartitionChangeRecord]:
    """Records that give a leader to every leaderless partition whose ISR holds an active
    broker or ``broker_id`` (which is being unfenced); where ``unclean`` allows, to any
    leaderless partition with such a replica."""

    def acceptable(b: int) -> bool:
        return b == broker_id or is_active(image, b)

    records: list[PartitionChangeRecord] = []
    for name in sorted(image.topics_by_name):
        topic = image.topics_by_name[name]
        for part in topic.partitions.values():
            if part.leader != NO_LEADER:
                continue
            leader, isr = choose_leader(name, part, part.isr, acceptable, unclean=unclean(name))
            if leader != NO_LEADER:
                records.append(
                    PartitionChangeRecord(
                        topic.topic_id,
                        part.partition,
                        leader,
                        isr=None if isr == part.isr else isr,
                    )
                )
    return records


def leads_any(image: MetadataImage, broker_id: int) -> bool:
    return any(
        part.leader == broker_id
        for topic in image.topics_by_name.values()
        for part in topic.partitions.values()
    )
