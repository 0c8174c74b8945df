"""The in-memory model of one classic group: members, generation, state and offsets.

State machine (Kafka's names; :attr:`GroupState.value` is what DescribeGroups and ListGroups show)::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
      ^                  ^    |                                       |
      |                  |    +--no member left--> Empty              | leader's SyncGroup
      |                  +------- join / leave / expiry --------------+ written
      |                  +------- join / leave / expiry ---------- Stable <-+
    Dead: deleted, or expired with no offsets; the group leaves the cache.

Invariants: the leader (when set) is a member; every member awaiting join or sync holds exactly
one driver token; ``generation`` never decreases; a static member's instance id maps to its
current member id in ``static_members``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from tidelog.coordinator.errors import GroupRecordError
from tidelog.coordinator.records import parse_subscription_topics

CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    #: -1 unless the commit asked for its own retention (OffsetCommit v2-v4)
    expire_timestamp: int = -1
    #: where its record sits in the partition (the coordinator's write order, which is the
    #: log's within a partition; -1: loaded): a transaction's offsets replace a regular
    #: commit only if they were appended after it, as Kafka compares batch offsets
    appended_at: int = field(default=-1, compare=False)


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    #: (name, metadata) in the member's order of preference
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    #: the driver token of the member's JoinGroup waiting for the rebalance
    join_token: object | None = None
    #: the driver token of the member's SyncGroup waiting for the leader
    sync_token: object | None = None
    #: joined during the current rebalance for the first time (expires by the new-member
    #: join timeout rather than by its session)
    is_new: bool = False

    @property
    def awaiting_join(self) -> bool:
        return self.join_token is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_token is not None

    def metadata_for(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def matches(self, protocols: Sequence[tuple[str, bytes]]) -> bool:
        return [(n, bytes(m)) for n, m in protocols] == self.protocols

    def vote(self, candidates: set[str]) -> str:
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise AssertionError("a member votes only among protocols it supports")


@dataclass(slots=True)
class PendingCommit:
    """Offsets whose records are being appended; applied when the append succeeds."""

    offsets: dict[tuple[str, int], OffsetAndMetadata]


@dataclass(slots=True)
class Group:
    group_id: str
    partition: int
    state: GroupState = GroupState.EMPTY
    state_timestamp: int = -1
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    #: member ids handed out with MEMBER_ID_REQUIRED that have not joined yet
    pending_members: set[str] = field(default_factory=set)
    #: members that got the JoinGroup response of this generation but have not synced yet
    pending_sync: set[str] = field(default_factory=set)
    static_members: dict[str, str] = field(default_factory=dict)
    offsets: dict[tuple[str, int], OffsetAndMetadata] = field(default_factory=dict)
    pending_commits: list[PendingCommit] = field(default_factory=list)
    #: TxnOffsetCommit offsets written and waiting for their transaction's marker, by
    #: producer id: a COMMIT marker makes them the group's offsets, an ABORT drops them
    pending_txn_offsets: dict[int, dict[tuple[str, int], OffsetAndMetadata]] = field(
        default_factory=dict
    )
    #: topics the members subscribe to, from the consumer protocol; ``None`` when unknown
    subscribed_topics: frozenset[str] | None = None
    #: the rebalance of an Empty group is in its initial delay
    initial_delay_active: bool = False
    #: a member joined during the initial delay (which then extends)
    new_member_added: bool = False
    initial_delay_remaining_ms: int = 0
    #: write id of the leader's assignment being appended
    pending_assignment_write: int | None = None
    #: bumped on every state change; lets a late event see that its group moved on
    epoch: int = 0
    deleted: bool = False

    def transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_timestamp = now_ms
        self.epoch += 1

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    def add_member(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove_member(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        self.pending_sync.discard(member_id)
        instance = member.group_instance_id
        if instance is not None and self.static_members.get(instance) == member_id:
            del self.static_members[instance]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def supports_protocols(self, protocol_type: str, names: Sequence[str]) -> bool:
        if self.state is GroupState.EMPTY or not self.members:
            return bool(protocol_type) and bool(names)
        if protocol_type != self.protocol_type:
            return False
        candidates = self.candidate_protocols()
        return any(name in candidates for name in names)

    def candidate_protocols(self) -> set[str]:
        """Protocols every member supports."""
        result: set[str] | None = None
        for member in self.members.values():
            names = set(member.protocol_names())
            result = names if result is None else result & names
        return result or set()

    def select_protocol(self) -> str:
        """Kafka's vote: each member picks its most preferred protocol among those all
        members support; most votes wins. Ties go to the protocol the earliest-joined member
        prefers, so the choice is deterministic."""
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = member.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        best = max(votes.values())
        first = next(iter(self.members.values()))
        for name in first.protocol_names():
            if votes.get(name) == best:
                return name
        raise AssertionError("the vote always has a winner")

    def all_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE or self.protocol_name is None:
            return None
        topics: set[str] = set()
        try:
            for member in self.members.values():
                topics |= parse_subscription_topics(member.metadata_for(self.protocol_name))
        except GroupRecordError:
            return None
        return frozenset(topics)

    def is_subscribed_to(self, topic: str) -> bool:
        if self.state is GroupState.EMPTY or not self.members:
            return False
        if self.subscribed_topics is None:
            # unknown subscriptions: assume subscribed, as Kafka does, so nothing is lost
            return True
        return topic in self.subscribed_topics

    def has_offsets(self) -> bool:
        return (
            bool(self.offsets)
            or any(p.offsets for p in self.pending_commits)
            or any(self.pending_txn_offsets.values())
        )

    def has_pending_commit(self, tp: tuple[str, int]) -> bool:
        return any(tp in p.offsets for p in self.pending_commits)

    def has_pending_txn_offset(self, tp: tuple[str, int]) -> bool:
        return any(tp in offsets for offsets in self.pending_txn_offsets.values())
