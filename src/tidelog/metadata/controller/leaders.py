"""Leader and ISR changes that follow a broker's membership (Kafka's
``ReplicationControlManager.generateLeaderAndIsrUpdates``).

A broker that is fenced, enters controlled shutdown or is unregistered is taken out of
every ISR it is in, and each partition it leads gets another leader: the first replica, in
replica order, that is in the ISR and active (unfenced, not shutting down). Without
eligible leader replicas (KIP-966, not implemented) Kafka never empties an ISR: when the
broker is the last member it stays in the ISR and the partition is left without a leader
(-1), offline, until that broker comes back. A broker that is unfenced gives a leader to
every leaderless partition whose ISR holds it (or another active broker).

Only the records are computed here; the image changes when they are replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tidelog.metadata.image import MetadataImage
from tidelog.metadata.records import PartitionChangeRecord

__all__ = ["NO_LEADER", "elect_leaderless", "leads_any", "remove_from_leadership"]

#: The leader of a partition that has none.
NO_LEADER = -1


def _active(image: MetadataImage, broker_id: int) -> bool:
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


def remove_from_leadership(image: MetadataImage, broker_id: int) -> list[PartitionChangeRecord]:
    """Records that take ``broker_id`` out of every ISR (never emptying one) and move each
    of its leaderships to another active ISR member, or to no leader."""

    def acceptable(b: int) -> bool:
        return b != broker_id and _active(image, b)

    records: list[PartitionChangeRecord] = []
    for name in sorted(image.topics_by_name):
        topic = image.topics_by_name[name]
        for part in topic.partitions.values():
            if broker_id not in part.isr and part.leader != broker_id:
                continue
            isr = tuple(b for b in part.isr if b != broker_id) or part.isr
            leader = _elect(part.replicas, isr, part.leader, acceptable)
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


def elect_leaderless(image: MetadataImage, broker_id: int) -> list[PartitionChangeRecord]:
    """Records that give a leader to every leaderless partition whose ISR holds an active
    broker or ``broker_id`` (which is being unfenced)."""

    def acceptable(b: int) -> bool:
        return b == broker_id or _active(image, b)

    records: list[PartitionChangeRecord] = []
    for name in sorted(image.topics_by_name):
        topic = image.topics_by_name[name]
        for part in topic.partitions.values():
            if part.leader != NO_LEADER:
                continue
            leader = _elect(part.replicas, part.isr, NO_LEADER, acceptable)
            if leader != NO_LEADER:
                records.append(PartitionChangeRecord(topic.topic_id, part.partition, leader))
    return records


def leads_any(image: MetadataImage, broker_id: int) -> bool:
    return any(
        part.leader == broker_id
        for topic in image.topics_by_name.values()
        for part in topic.partitions.values()
    )
