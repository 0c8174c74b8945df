"""Client-side partition assignors of the classic consumer group protocol.

The group leader runs one assignor over every member's subscription and the partition counts
of the subscribed topics; the result goes back to the coordinator in SyncGroup. Assignors are
named by the protocol name members vote on in JoinGroup, so their output must match what other
clients' assignors of the same name would produce for the group to behave the same whichever
member leads.

``range``: per topic, the members subscribed to it in member order (members with a
``group.instance.id`` first, by that id; then the rest by member id) each take a contiguous run
of partitions; the first ``partitions % members`` members take one partition more.

``cooperative-sticky``: every member keeps the partitions it owned in the latest generation
(a partition claimed by several members stays with the claim of the highest generation; a tie
at that generation gives it to nobody), partitions nobody keeps go to the least loaded
subscribed member, then partitions move from the most to the least loaded members until no two
members that could own the same partition differ by more than one. Under the cooperative
protocol a partition that changes owner is first only taken away: it is left out of this
round's assignment, the old owner revokes it and rejoins, and the next round hands it over.
Its subscription user data is the member's generation as an int32, which is what members of
older subscription versions (without a generation field) carry it in.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tidelog.client.groups import Subscription
from tidelog.client.types import TopicPartition

EAGER = "eager"
COOPERATIVE = "cooperative"


@dataclass(frozen=True, slots=True)
class GroupMember:
    """One member as the leader sees it in the JoinGroup response."""

    member_id: str
    group_instance_id: str | None
    subscription: Subscription


def member_order(member: GroupMember) -> tuple[int, str]:
    """Kafka's order of members: static members by instance id, then dynamic by member id."""
    if member.group_instance_id is not None:
        return (0, member.group_instance_id)
    return (1, member.member_id)


class Assignor(ABC):
    name: str
    rebalance_protocol: str = EAGER

    def user_data(self, generation: int, owned: Sequence[TopicPartition]) -> bytes | None:
        """What this member adds to its subscription for the leader's assignor."""
        return None

    @abstractmethod
    def assign(
        self, partitions_per_topic: Mapping[str, int], members: Sequence[GroupMember]
    ) -> dict[str, list[TopicPartition]]:
        """Partitions for each member id (every member has an entry, possibly empty)."""


class RangeAssignor(Assignor):
    name = "range"

    def assign(
        self, partitions_per_topic: Mapping[str, int], members: Sequence[GroupMember]
    ) -> dict[str, list[TopicPartition]]:
        out: dict[str, list[TopicPartition]] = {m.member_id: [] for m in members}
        ordered = sorted(members, key=member_order)
        topics = sorted({t for m in members for t in m.subscription.topics})
        for topic in topics:
            count = partitions_per_topic.get(topic)
            if not count:
                continue
            takers = [m for m in ordered if topic in m.subscription.topics]
            each, extra = divmod(count, len(takers))
            start = 0
            for i, member in enumerate(takers):
                length = each + (1 if i < extra else 0)
                out[member.member_id].extend(
                    TopicPartition(topic, p) for p in range(start, start + length)
                )
                start += length
        return out


def _generation_of(subscription: Subscription) -> int:
    if subscription.generation_id >= 0:
        return subscription.generation_id
    data = subscription.user_data
    if data is not None and len(data) >= 4:
        value: int = struct.unpack_from(">i", data)[0]
        return value
    return -1


class CooperativeStickyAssignor(Assignor):
    name = "cooperative-sticky"
    rebalance_protocol = COOPERATIVE

    def user_data(self, generation: int, owned: Sequence[TopicPartition]) -> bytes | None:
        return struct.pack(">i", generation)

    def assign(
        self, partitions_per_topic: Mapping[str, int], members: Sequence[GroupMember]
    ) -> dict[str, list[TopicPartition]]:
        ordered = sorted(members, key=member_order)
        subscribed = {m.member_id: frozenset(m.subscription.topics) for m in ordered}
        previous = self._previous_owners(partitions_per_topic, ordered, subscribed)
        current: dict[str, list[TopicPartition]] = {m.member_id: [] for m in ordered}
        for tp, owner in sorted(previous.items()):
            current[owner].append(tp)
        every = [
            TopicPartition(topic, p)
            for topic in sorted({t for s in subscribed.values() for t in s})
            for p in range(partitions_per_topic.get(topic, 0))
        ]
        rank = {m.member_id: i for i, m in enumerate(ordered)}

        def least_loaded(candidates: Iterable[str]) -> str | None:
            return min(candidates, key=lambda mid: (len(current[mid]), rank[mid]), default=None)

        for tp in every:
            if tp in previous:
                continue
            taker = least_loaded(mid for mid, topics in subscribed.items() if tp.topic in topics)
            if taker is not None:
                current[taker].append(tp)
        self._balance(current, subscribed, rank)
        out = {mid: sorted(tps) for mid, tps in current.items()}
        # Cooperative protocol: a partition changing owner is only revoked in this round.
        for mid, tps in out.items():
            out[mid] = [tp for tp in tps if previous.get(tp, mid) == mid]
        return {m.member_id: out[m.member_id] for m in members}

    @staticmethod
    def _previous_owners(
        partitions_per_topic: Mapping[str, int],
        ordered: Sequence[GroupMember],
        subscribed: Mapping[str, frozenset[str]],
    ) -> dict[TopicPartition, str]:
        best: dict[TopicPartition, tuple[int, str | None]] = {}
        for member in ordered:
            generation = _generation_of(member.subscription)
            for tp in member.subscription.owned_partitions:
                if tp.topic not in subscribed[member.member_id]:
                    continue
                if not 0 <= tp.partition < partitions_per_topic.get(tp.topic, 0):
                    continue
                held = best.get(tp)
                if held is None or generation > held[0]:
                    best[tp] = (generation, member.member_id)
                elif generation == held[0] and held[1] != member.member_id:
                    best[tp] = (generation, None)  # claimed twice in one generation
        return {tp: owner for tp, (_, owner) in best.items() if owner is not None}

    @staticmethod
    def _balance(
        current: dict[str, list[TopicPartition]],
        subscribed: Mapping[str, frozenset[str]],
        rank: Mapping[str, int],
    ) -> None:
        """Move partitions from fuller to emptier members until no move narrows a gap of more
        than one; the partitions a member got last move first."""
        moved = True
        while moved:
            moved = False
            for giver in sorted(current, key=lambda mid: (-len(current[mid]), rank[mid])):
                load = len(current[giver])
                for tp in reversed(current[giver]):
                    takers = [
                        mid
                        for mid, topics in subscribed.items()
                        if tp.topic in topics and len(current[mid]) < load - 1
                    ]
                    if takers:
                        taker = min(takers, key=lambda mid: (len(current[mid]), rank[mid]))
                        current[giver].remove(tp)
                        current[taker].append(tp)
                        moved = True
                        break
                if moved:
                    break


ASSIGNORS: Mapping[str, type[Assignor]] = {
    RangeAssignor.name: RangeAssignor,
    CooperativeStickyAssignor.name: CooperativeStickyAssignor,
}


def assignors_for(names: Iterable[str]) -> list[Assignor]:
    """Assignor instances for ``partition.assignment.strategy`` names, in preference order."""
    out: list[Assignor] = []
    for name in names:
        cls = ASSIGNORS.get(name)
        if cls is None:
            raise ValueError(f"unknown assignor {name!r} (known: {', '.join(ASSIGNORS)})")
        out.append(cls())
    return out


def rebalance_protocol(assignors: Sequence[Assignor]) -> str:
    """Cooperative only when every configured assignor supports it, as Kafka's consumer does
    (a group may pick any of them)."""
    if assignors and all(a.rebalance_protocol == COOPERATIVE for a in assignors):
        return COOPERATIVE
    return EAGER


__all__ = [
    "ASSIGNORS",
    "COOPERATIVE",
    "EAGER",
    "Assignor",
    "CooperativeStickyAssignor",
    "GroupMember",
    "RangeAssignor",
    "assignors_for",
    "member_order",
    "rebalance_protocol",
]
