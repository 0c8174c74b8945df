"""What goes into and comes out of the group coordinator.

Requests are plain values the API handlers build from the decoded Kafka request (with the
connection's client id and host); results carry every field any version of the matching response
needs, and the handler picks what its version has.

Operations that Kafka answers later (JoinGroup waits for the rebalance, SyncGroup followers wait
for the leader, writes wait for the append to ``__consumer_offsets``) take an opaque ``token``
from the driver and return :class:`Effects`: the completions that are ready now (for this token
or for others that were waiting) and the writes to append. A write's waiters complete when the
driver reports the append with :meth:`GroupCoordinator.write_completed`. Every token given to
the coordinator is completed exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tidelog.protocol.error_codes import ErrorCode
from tidelog.records.builder import BatchBuilder
from tidelog.records.compression import Compression

# -- requests


@dataclass(frozen=True, slots=True)
class JoinGroupRequest:
    group_id: str
    member_id: str
    protocol_type: str
    #: (name, metadata) in the member's order of preference
    protocols: Sequence[tuple[str, bytes]]
    session_timeout_ms: int
    #: -1 (JoinGroup v0, which has no such field): the session timeout is used
    rebalance_timeout_ms: int = -1
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    reason: str | None = None
    #: the JoinGroup version: v4+ gets MEMBER_ID_REQUIRED (KIP-394), v9+ may skip assignment
    api_version: int = 9


@dataclass(frozen=True, slots=True)
class SyncGroupRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None
    #: v5+: checked against the group's when given
    protocol_type: str | None = None
    protocol_name: str | None = None
    #: (member id, assignment); only the leader's are used
    assignments: Sequence[tuple[str, bytes]] = ()


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class MemberIdentity:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest:
    group_id: str
    #: v0-v2: one member (member id only); v3+: a batch, possibly by instance id alone
    members: Sequence[MemberIdentity]


@dataclass(frozen=True, slots=True)
class OffsetCommitPartition:
    topic: str
    partition: int
    offset: int
    metadata: str | None = ""
    #: v6+; -1 when absent
    leader_epoch: int = -1
    #: v1 only: the client's commit timestamp; -1 means "now"
    commit_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class OffsetCommitRequest:
    group_id: str
    partitions: Sequence[OffsetCommitPartition]
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None
    #: v2-v4 ``retention_time_ms``; -1: the broker's retention applies
    retention_time_ms: int = -1
    api_version: int = 8


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitRequest:
    """TxnOffsetCommit: offsets written in ``producer_id``'s transaction (KIP-98); v3+
    carries the member's generation, id and instance id for KIP-447 fencing (-1/"": none)."""

    transactional_id: str
    group_id: str
    producer_id: int
    producer_epoch: int
    partitions: Sequence[OffsetCommitPartition]
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class OffsetFetchGroup:
    group_id: str
    #: ``None``: every partition the group has offsets for
    partitions: Sequence[tuple[str, int]] | None = None


# -- results


@dataclass(frozen=True, slots=True)
class JoinGroupMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinGroupResult:
    error: ErrorCode
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    skip_assignment: bool = False
    #: all members for the leader, empty for followers
    members: tuple[JoinGroupMember, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncGroupResult:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveMemberResult:
    member_id: str
    group_instance_id: str | None
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class LeaveGroupResult:
    error: ErrorCode
    members: tuple[LeaveMemberResult, ...] = ()

    @property
    def legacy_error(self) -> ErrorCode:
        """The single error of LeaveGroup v0-v2: the top-level one, else the member's."""
        if self.error is not ErrorCode.NONE:
            return self.error
        for m in self.members:
            if m.error is not ErrorCode.NONE:
                return m.error
        return ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class PartitionError:
    topic: str
    partition: int
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class OffsetCommitResult:
    #: in request order
    partitions: tuple[PartitionError, ...]


@dataclass(frozen=True, slots=True)
class FetchedOffset:
    topic: str
    partition: int
    #: -1 when the group has no offset for the partition
    offset: int
    leader_epoch: int
    metadata: str
    error: ErrorCode = ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class OffsetFetchResult:
    group_id: str
    error: ErrorCode
    partitions: tuple[FetchedOffset, ...] = ()


@dataclass(frozen=True, slots=True)
class OffsetDeleteResult:
    error: ErrorCode
    partitions: tuple[PartitionError, ...] = ()


@dataclass(frozen=True, slots=True)
class DeleteGroupResult:
    group_id: str
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class DeleteGroupsResult:
    groups: tuple[DeleteGroupResult, ...]


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    #: "" for groups that only store offsets
    protocol_type: str
    #: "Empty", "PreparingRebalance", "CompletingRebalance", "Stable"
    state: str
    #: ListGroups v5: always "classic" here
    group_type: str = "classic"


@dataclass(frozen=True, slots=True)
class ListGroupsResult:
    error: ErrorCode
    groups: tuple[ListedGroup, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    #: the metadata of the group's protocol, and the assignment: only while Stable (as Kafka)
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    group_id: str
    error: ErrorCode
    state: str
    protocol_type: str = ""
    #: the protocol name while Stable, "" otherwise
    protocol_data: str = ""
    members: tuple[DescribedMember, ...] = ()


Response = (
    JoinGroupResult
    | SyncGroupResult
    | LeaveGroupResult
    | OffsetCommitResult
    | OffsetDeleteResult
    | DeleteGroupsResult
)

# -- effects


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """One ``__consumer_offsets`` record; ``value`` ``None`` is a tombstone."""

    key: bytes
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Write:
    """Records to append, as one batch, to ``__consumer_offsets`` partition ``partition``.

    Writes to one partition must be appended in the order the coordinator returns them.
    """

    write_id: int
    partition: int
    records: tuple[GroupRecord, ...]
    #: TxnOffsetCommit: the batch belongs to this producer's transaction, and counts only
    #: once the transaction's COMMIT marker follows it in the partition (as in Kafka)
    producer_id: int = -1
    producer_epoch: int = -1

    @property
    def transactional(self) -> bool:
        return self.producer_id >= 0

    def to_batch(self, timestamp_ms: int, compression: Compression = Compression.NONE) -> bytes:
        if self.transactional:
            # Kafka's coordinator writes sequence 0: the log skips sequence checks for it.
            builder = BatchBuilder(
                compression=compression,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                base_sequence=0,
                transactional=True,
            )
        else:
            builder = BatchBuilder(compression=compression)
        for record in self.records:
            builder.append(record.key, record.value, timestamp=timestamp_ms)
        return builder.close()


@dataclass(frozen=True, slots=True)
class Completion:
    token: object
    response: Response


@dataclass(slots=True)
class Effects:
    completions: list[Completion] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)

    def complete(self, token: object, response: Response) -> None:
        self.completions.append(Completion(token, response))

    def extend(self, other: Effects) -> None:
        self.completions.extend(other.completions)
        self.writes.extend(other.writes)

    def response_for(self, token: object) -> Response | None:
        """The response completed here for ``token``, if any (a convenience for tests)."""
        for c in self.completions:
            if c.token is token or c.token == token:
                return c.response
        return None
