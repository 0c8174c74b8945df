"""tidelog.coordinator: the group coordinator (classic protocol, committed offsets) and, in
``transactions/``, the transaction coordinator (``docs/transactions.md``).

Modules: ``coordinator`` (the sans-io state machine, :class:`GroupCoordinator`), ``api``
(requests, results, :class:`Effects` and :class:`Write`), ``group`` (the group model and its
states), ``records`` (Kafka's ``__consumer_offsets`` key and value schemas), ``replay``
(rebuilding groups from a partition's records), ``hashing`` (which partition coordinates a
group), ``timers``, ``writes`` (writes handed to the driver until it reports them) and
``config``. See ``docs/groups.md``.
"""

from tidelog.coordinator.api import (
    Completion,
    DeleteGroupResult,
    DeleteGroupsResult,
    DescribedGroup,
    DescribedMember,
    Effects,
    FetchedOffset,
    GroupRecord,
    HeartbeatRequest,
    JoinGroupMember,
    JoinGroupRequest,
    JoinGroupResult,
    LeaveGroupRequest,
    LeaveGroupResult,
    LeaveMemberResult,
    ListedGroup,
    ListGroupsResult,
    MemberIdentity,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResult,
    OffsetDeleteResult,
    OffsetFetchGroup,
    OffsetFetchResult,
    PartitionError,
    Response,
    SyncGroupRequest,
    SyncGroupResult,
    TxnOffsetCommitRequest,
    Write,
)
from tidelog.coordinator.config import GroupConfig
from tidelog.coordinator.coordinator import (
    GroupCoordinator,
    GroupSnapshot,
    MemberSnapshot,
    map_append_error,
)
from tidelog.coordinator.errors import CoordinatorError, GroupRecordError
from tidelog.coordinator.group import GroupState
from tidelog.coordinator.hashing import java_string_hash_code, kafka_abs, partition_for_group
from tidelog.coordinator.replay import replay_partition

__all__ = [
    "Completion",
    "CoordinatorError",
    "DeleteGroupResult",
    "DeleteGroupsResult",
    "DescribedGroup",
    "DescribedMember",
    "Effects",
    "FetchedOffset",
    "GroupConfig",
    "GroupCoordinator",
    "GroupRecord",
    "GroupRecordError",
    "GroupSnapshot",
    "GroupState",
    "HeartbeatRequest",
    "JoinGroupMember",
    "JoinGroupRequest",
    "JoinGroupResult",
    "LeaveGroupRequest",
    "LeaveGroupResult",
    "LeaveMemberResult",
    "ListGroupsResult",
    "ListedGroup",
    "MemberIdentity",
    "MemberSnapshot",
    "OffsetCommitPartition",
    "OffsetCommitRequest",
    "OffsetCommitResult",
    "OffsetDeleteResult",
    "OffsetFetchGroup",
    "OffsetFetchResult",
    "PartitionError",
    "Response",
    "SyncGroupRequest",
    "SyncGroupResult",
    "TxnOffsetCommitRequest",
    "Write",
    "java_string_hash_code",
    "kafka_abs",
    "map_append_error",
    "partition_for_group",
    "replay_partition",
]
