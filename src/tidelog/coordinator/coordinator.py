"""The group coordinator: Kafka's classic group protocol and committed offsets, sans-io.

Time is injected: every operation takes ``now_ms``, and :meth:`GroupCoordinator.tick` fires the
deadlines that are due (session timeouts, rebalance timeouts, the initial rebalance delay, member
ids handed out with MEMBER_ID_REQUIRED, members that never sent SyncGroup, offset retention).
Deadlines are processed in time order at their own timestamps, so the outcome does not depend on
how often the driver ticks; :meth:`GroupCoordinator.next_deadline` says when to tick next.

Driver protocol (see :mod:`tidelog.coordinator.api`)::

    effects = coordinator.join_group(token, now_ms, request)   # or sync_group, tick, ...
    for write in effects.writes:            # in order, per partition
        append write.to_batch(now_ms) to __consumer_offsets partition write.partition
        then: effects2 = coordinator.write_completed(write.write_id, now_ms, error)
    for completion in effects.completions:  # answer the request that carried completion.token
        send completion.response

Kafka writes group metadata when the leader's assignment arrives (SyncGroup), when a static
member is replaced in a Stable group, and when a group becomes Empty; offsets on commit; and
tombstones for deleted or expired offsets and groups. Those writes come back as :class:`Write`
values; responses that depend on them are completed by :meth:`write_completed`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from tidelog.coordinator.api import (
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
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResult,
    OffsetDeleteResult,
    OffsetFetchGroup,
    OffsetFetchResult,
    PartitionError,
    SyncGroupRequest,
    SyncGroupResult,
    TxnOffsetCommitRequest,
    Write,
)
from tidelog.coordinator.config import GroupConfig
from tidelog.coordinator.group import (
    CONSUMER_PROTOCOL_TYPE,
    Group,
    GroupState,
    Member,
    OffsetAndMetadata,
    PendingCommit,
)
from tidelog.coordinator.hashing import partition_for_group
from tidelog.coordinator.records import (
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
)
from tidelog.coordinator.replay import KeyValue, replay_partition
from tidelog.coordinator.timers import Timers
from tidelog.coordinator.writes import PendingWrites
from tidelog.protocol.error_codes import ErrorCode

E = ErrorCode
WriteCallback = Callable[[ErrorCode, int], Effects]
TopicPartition = tuple[str, int]

_SESSION = "session"
_PENDING = "pending"
_JOIN = "join"
_SYNC = "sync"


def _default_member_id(client_id: str) -> str:
    # Kafka's form: client id, a dash, a random UUID
    return f"{client_id}-{uuid.uuid4()}"


def _utf16_length(text: str) -> int:
    """``String.length()`` in Java, which is what ``offset.metadata.max.bytes`` limits."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def map_append_error(error: ErrorCode, *, offsets: bool) -> ErrorCode:
    """The error a client sees when the append to ``__consumer_offsets`` failed (Kafka's map)."""
    if error in (
        E.UNKNOWN_TOPIC_OR_PARTITION,
        E.NOT_ENOUGH_REPLICAS,
        E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        E.REQUEST_TIMED_OUT,
    ):
        return E.COORDINATOR_NOT_AVAILABLE
    if error in (E.NOT_LEADER_OR_FOLLOWER, E.KAFKA_STORAGE_ERROR):
        return E.NOT_COORDINATOR
    if error in (E.MESSAGE_TOO_LARGE, E.RECORD_LIST_TOO_LARGE, E.INVALID_FETCH_SIZE):
        return E.INVALID_COMMIT_OFFSET_SIZE if offsets else E.UNKNOWN_SERVER_ERROR
    return error


@dataclass(frozen=True, slots=True)
class MemberSnapshot:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupSnapshot:
    """The persistent part of a group's state: what a replay of its records rebuilds."""

    group_id: str
    state: str
    generation: int
    protocol_type: str | None
    protocol_name: str | None
    leader: str | None
    #: when the group became Empty (only for Empty groups with a protocol type)
    empty_since: int | None
    members: tuple[MemberSnapshot, ...]
    offsets: tuple[tuple[str, int, OffsetAndMetadata], ...]


def snapshot_group(group: Group) -> GroupSnapshot:
    members = tuple(
        MemberSnapshot(
            m.member_id,
            m.group_instance_id,
            m.client_id,
            m.client_host,
            m.rebalance_timeout_ms,
            m.session_timeout_ms,
            m.metadata_for(group.protocol_name),
            m.assignment,
        )
        for m in sorted(group.members.values(), key=lambda m: m.member_id)
    )
    empty_since = (
        group.state_timestamp
        if group.state is GroupState.EMPTY and group.protocol_type is not None
        else None
    )
    offsets = tuple((t, p, o) for (t, p), o in sorted(group.offsets.items()))
    return GroupSnapshot(
        group.group_id,
        group.state.value,
        group.generation,
        group.protocol_type,
        group.protocol_name,
        group.leader_id,
        empty_since,
        members,
        offsets,
    )


class GroupCoordinator:
    """Groups and offsets of the ``__consumer_offsets`` partitions this broker leads.

    ``owned_partitions``: partitions owned from the start with empty state (``None``: all of
    them, which suits a single node with an empty offsets topic); others are taken over with
    :meth:`load_partition`. ``topic_exists(topic, partition)`` tells whether an offset may be
    committed for a partition (UNKNOWN_TOPIC_OR_PARTITION otherwise). ``member_id_factory``
    makes member ids from client ids (the randomness is injected for tests).
    """

    def __init__(
        self,
        config: GroupConfig | None = None,
        *,
        owned_partitions: Iterable[int] | None = None,
        topic_exists: Callable[[str, int], bool] | None = None,
        member_id_factory: Callable[[str], str] | None = None,
    ) -> None:
        self.config = config or GroupConfig()
        n = self.config.offsets_topic_num_partitions
        self._owned: set[int] = set(range(n) if owned_partitions is None else owned_partitions)
        self._loading: set[int] = set()
        self._groups: dict[str, Group] = {}
        self._timers = Timers()
        self._writes: PendingWrites[Effects] = PendingWrites()
        self._topic_exists = topic_exists
        self._new_member_id = member_id_factory or _default_member_id
        self._next_retention_check: int | None = None

    # -- ownership and loading

    def partition_for(self, group_id: str) -> int:
        return partition_for_group(group_id, self.config.offsets_topic_num_partitions)

    def owned_partitions(self) -> frozenset[int]:
        return frozenset(self._owned)

    def begin_loading(self, partition: int) -> None:
        """Requests for groups of ``partition`` get COORDINATOR_LOAD_IN_PROGRESS until loaded."""
        self._loading.add(partition)

    def load_partition(self, partition: int, records: Iterable[KeyValue], now_ms: int) -> Effects:
        """Take over ``partition``, rebuilding its groups from its records (oldest first).

        ``records`` are the data records of the partition (control batches skipped), e.g. the
        :class:`tidelog.records.Record` values of ``decode_records``.
        """
        effects = self.unload_partition(partition)
        for group in replay_partition(records, partition).values():
            self._groups[group.group_id] = group
            for member in group.members.values():
                self._schedule_session(group, member, now_ms + member.session_timeout_ms)
        self._loading.discard(partition)
        self._owned.add(partition)
        return effects

    def unload_partition(self, partition: int) -> Effects:
        """Give ``partition`` up (leadership moved): waiting requests get NOT_COORDINATOR."""
        effects = Effects()
        for gid in [g for g, grp in self._groups.items() if grp.partition == partition]:
            group = self._groups.pop(gid)
            group.deleted = True
            for member in group.members.values():
                self._timers.cancel((_SESSION, gid, member.member_id))
                self._fail_waiting(member, E.NOT_COORDINATOR, effects)
            for pending in group.pending_members:
                self._timers.cancel((_PENDING, gid, pending))
            self._timers.cancel((_JOIN, gid))
            self._timers.cancel((_SYNC, gid))
        self._owned.discard(partition)
        self._loading.discard(partition)
        return effects

    def _coordinator_error(self, group_id: str) -> ErrorCode:
        group = self._groups.get(group_id)
        # a cached group knows its partition: no string hash on the heartbeat path
        p = group.partition if group is not None else self.partition_for(group_id)
        if p in self._loading:
            return E.COORDINATOR_LOAD_IN_PROGRESS
        if p not in self._owned:
            return E.NOT_COORDINATOR
        return E.NONE

    # -- writes

    def write_completed(self, write_id: int, now_ms: int, error: ErrorCode = E.NONE) -> Effects:
        """The driver appended (or failed to append) write ``write_id``."""
        effects = self._writes.complete(write_id, error, now_ms)
        return effects if effects is not None else Effects()

    def pending_write_count(self) -> int:
        return len(self._writes)

    def _write(
        self,
        effects: Effects,
        partition: int,
        records: list[GroupRecord],
        callback: WriteCallback,
        *,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> int:
        write_id = self._writes.add(callback)
        effects.writes.append(
            Write(write_id, partition, tuple(records), producer_id, producer_epoch)
        )
        return write_id

    @staticmethod
    def _ignore_write(error: ErrorCode, now_ms: int) -> Effects:
        # Writes nobody waits for (a group became Empty); a failed one is repaired by the next
        # write of the same group, as in Kafka.
        return Effects()

    def _group_metadata_record(
        self, group: Group, assignments: dict[str, bytes] | None = None
    ) -> GroupRecord:
        members = tuple(
            MemberMetadataValue(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.rebalance_timeout_ms,
                m.session_timeout_ms,
                m.metadata_for(group.protocol_name),
                assignments.get(m.member_id, b"") if assignments is not None else m.assignment,
            )
            for m in group.members.values()
        )
        value = GroupMetadataValue(
            group.protocol_type or "",
            group.generation,
            group.protocol_name,
            group.leader_id,
            group.state_timestamp,
            members,
        )
        return GroupRecord(
            encode_group_metadata_key(group.group_id), encode_group_metadata_value(value)
        )

    @staticmethod
    def _offset_record(group_id: str, tp: TopicPartition, o: OffsetAndMetadata) -> GroupRecord:
        value = OffsetCommitValue(
            o.offset, o.metadata, o.commit_timestamp, o.leader_epoch, o.expire_timestamp
        )
        return GroupRecord(
            encode_offset_commit_key(group_id, tp[0], tp[1]), encode_offset_commit_value(value)
        )

    @staticmethod
    def _offset_tombstone(group_id: str, tp: TopicPartition) -> GroupRecord:
        return GroupRecord(encode_offset_commit_key(group_id, tp[0], tp[1]), None)

    # -- timers

    def next_deadline(self) -> int | None:
        """The earliest time at which :meth:`tick` has something to do."""
        candidates = (self._timers.next_deadline(), self._next_retention_check)
        deadlines = [d for d in candidates if d is not None]
        return min(deadlines) if deadlines else None

    def _schedule_session(self, group: Group, member: Member, deadline: int) -> None:
        self._timers.schedule((_SESSION, group.group_id, member.member_id), deadline)

    def _reset_session(self, group: Group, member: Member, now_ms: int) -> None:
        self._schedule_session(group, member, now_ms + member.session_timeout_ms)

    def tick(self, now_ms: int) -> Effects:
        """Fire every deadline at or before ``now_ms``, each at its own time."""
        effects = Effects()
        while (due := self._timers.pop_due(now_ms)) is not None:
            key, at = due
            assert isinstance(key, tuple)
            kind, gid = key[0], key[1]
            group = self._groups.get(gid)
            if group is None:
                continue
            if kind == _SESSION:
                self._on_session_expired(group, key[2], at, effects)
            elif kind == _PENDING:
                self._on_pending_member_expired(group, key[2], at, effects)
            elif kind == _JOIN:
                self._on_join_deadline(group, at, effects)
            elif kind == _SYNC:
                self._on_sync_deadline(group, at, effects)
        if self._next_retention_check is None:
            self._next_retention_check = now_ms + self.config.offsets_retention_check_interval_ms
        elif now_ms >= self._next_retention_check:
            self._next_retention_check = now_ms + self.config.offsets_retention_check_interval_ms
            effects.extend(self.expire_offsets(now_ms))
        return effects

    def _on_session_expired(self, group: Group, member_id: str, at: int, effects: Effects) -> None:
        member = group.members.get(member_id)
        if member is None:
            return
        # Members waiting in JoinGroup or SyncGroup are covered by the rebalance timeouts,
        # except new ones, which wait at most the new-member join timeout.
        if not member.is_new and (member.awaiting_join or member.awaiting_sync):
            return
        self._remove_member_and_update_group(group, member_id, at, effects)

    def _on_pending_member_expired(
        self, group: Group, member_id: str, at: int, effects: Effects
    ) -> None:
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self._try_complete_join(group, at, effects)
            self._maybe_drop_unused(group)

    def _on_join_deadline(self, group: Group, at: int, effects: Effects) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        if group.initial_delay_active:
            remaining = group.initial_delay_remaining_ms
            if group.new_member_added and remaining > 0:
                # Members keep arriving: wait another delay, within the rebalance timeout.
                delay = self.config.group_initial_rebalance_delay_ms
                group.new_member_added = False
                group.initial_delay_remaining_ms = max(remaining - delay, 0)
                self._timers.schedule((_JOIN, group.group_id), at + min(delay, remaining))
                return
        self._complete_join(group, at, effects)

    def _on_sync_deadline(self, group: Group, at: int, effects: Effects) -> None:
        if not group.is_in(GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        if not group.pending_sync:
            return
        # Members that got the JoinGroup response but never sent SyncGroup are dropped.
        for member_id in list(group.pending_sync):
            member = group.remove_member(member_id)
            if member is not None:
                self._timers.cancel((_SESSION, group.group_id, member_id))
                self._fail_waiting(member, E.UNKNOWN_MEMBER_ID, effects)
        self._prepare_rebalance(group, at, effects)

    # -- membership helpers

    @staticmethod
    def _validate_member(group: Group, member_id: str, instance_id: str | None) -> ErrorCode:
        if instance_id is not None:
            existing = group.static_members.get(instance_id)
            if existing is None:
                return E.UNKNOWN_MEMBER_ID
            if existing != member_id:
                return E.FENCED_INSTANCE_ID
            return E.NONE
        return E.NONE if member_id in group.members else E.UNKNOWN_MEMBER_ID

    def _accept_joining(self, group: Group, req: JoinGroupRequest) -> bool:
        if req.group_instance_id is not None and req.group_instance_id in group.static_members:
            return True
        limit = self.config.group_max_size
        member = group.members.get(req.member_id)
        if group.state is GroupState.PREPARING_REBALANCE:
            awaiting = sum(1 for m in group.members.values() if m.awaiting_join)
            return (member is not None and member.awaiting_join) or awaiting < limit
        if group.is_in(GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return member is not None or len(group.members) < limit
        return True

    def _fail_waiting(self, member: Member, error: ErrorCode, effects: Effects) -> None:
        if member.join_token is not None:
            effects.complete(member.join_token, JoinGroupResult(error, member_id=member.member_id))
            member.join_token = None
        if member.sync_token is not None:
            effects.complete(member.sync_token, SyncGroupResult(error))
            member.sync_token = None

    def _remove_member_and_update_group(
        self, group: Group, member_id: str, now_ms: int, effects: Effects
    ) -> None:
        member = group.remove_member(member_id)
        if member is None:
            return
        self._timers.cancel((_SESSION, group.group_id, member_id))
        self._fail_waiting(member, E.UNKNOWN_MEMBER_ID, effects)
        if group.is_in(GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now_ms, effects)
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group, now_ms, effects)

    def _maybe_drop_unused(self, group: Group) -> None:
        """A group that a failed request created and that holds nothing is not kept."""
        if (
            group.state is GroupState.EMPTY
            and group.generation == 0
            and not group.members
            and not group.pending_members
            and not group.has_offsets()
            and self._groups.get(group.group_id) is group
        ):
            del self._groups[group.group_id]

    # -- rebalance

    def _prepare_rebalance(self, group: Group, now_ms: int, effects: Effects) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(group, E.REBALANCE_IN_PROGRESS, effects)
        group.pending_sync.clear()
        group.pending_assignment_write = None
        self._timers.cancel((_SYNC, group.group_id))
        delay = self.config.group_initial_rebalance_delay_ms
        if group.state is GroupState.EMPTY and delay > 0:
            group.initial_delay_active = True
            group.new_member_added = False
            group.initial_delay_remaining_ms = max(group.rebalance_timeout_ms() - delay, 0)
            group.transition(GroupState.PREPARING_REBALANCE, now_ms)
            self._timers.schedule((_JOIN, group.group_id), now_ms + delay)
            return
        group.initial_delay_active = False
        group.transition(GroupState.PREPARING_REBALANCE, now_ms)
        self._timers.schedule((_JOIN, group.group_id), now_ms + group.rebalance_timeout_ms())
        self._try_complete_join(group, now_ms, effects)

    def _reset_and_propagate_assignment_error(
        self, group: Group, error: ErrorCode, effects: Effects
    ) -> None:
        for member in group.members.values():
            member.assignment = b""
            if member.sync_token is not None:
                effects.complete(member.sync_token, SyncGroupResult(error))
                member.sync_token = None

    def _prepare_or_try_complete(self, group: Group, now_ms: int, effects: Effects) -> None:
        if group.is_in(GroupState.EMPTY, GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now_ms, effects)
        else:
            self._try_complete_join(group, now_ms, effects)

    def _try_complete_join(self, group: Group, now_ms: int, effects: Effects) -> None:
        if (
            group.state is GroupState.PREPARING_REBALANCE
            and not group.initial_delay_active
            and group.all_joined()
        ):
            self._complete_join(group, now_ms, effects)

    def _join_response(self, group: Group, member: Member) -> JoinGroupResult:
        is_leader = member.member_id == group.leader_id
        members: tuple[JoinGroupMember, ...] = ()
        if is_leader:
            members = tuple(
                JoinGroupMember(
                    m.member_id, m.group_instance_id, m.metadata_for(group.protocol_name)
                )
                for m in group.members.values()
            )
        return JoinGroupResult(
            E.NONE,
            generation_id=group.generation,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader=group.leader_id or "",
            member_id=member.member_id,
            members=members,
        )

    def _complete_join(self, group: Group, now_ms: int, effects: Effects) -> None:
        self._timers.cancel((_JOIN, group.group_id))
        group.initial_delay_active = False
        group.new_member_added = False
        for member in list(group.members.values()):
            if not member.awaiting_join:
                group.remove_member(member.member_id)
                self._timers.cancel((_SESSION, group.group_id, member.member_id))
                self._fail_waiting(member, E.UNKNOWN_MEMBER_ID, effects)
        if group.leader_id is not None and group.leader_id not in group.members:
            group.leader_id = next(iter(group.members), None)
        group.generation += 1
        if not group.members:
            group.protocol_name = None
            group.subscribed_topics = None
            group.transition(GroupState.EMPTY, now_ms)
            self._write(
                effects, group.partition, [self._group_metadata_record(group)], self._ignore_write
            )
            return
        group.protocol_name = group.select_protocol()
        group.subscribed_topics = group.compute_subscribed_topics()
        group.transition(GroupState.COMPLETING_REBALANCE, now_ms)
        group.pending_sync = set(group.members)
        self._timers.schedule((_SYNC, group.group_id), now_ms + group.rebalance_timeout_ms())
        for member in group.members.values():
            token = member.join_token
            member.join_token = None
            member.is_new = False
            self._reset_session(group, member, now_ms)
            effects.complete(token, self._join_response(group, member))

    # -- JoinGroup

    def join_group(self, token: object, now_ms: int, req: JoinGroupRequest) -> Effects:
        effects = Effects()

        def fail(error: ErrorCode, member_id: str = req.member_id) -> Effects:
            effects.complete(token, JoinGroupResult(error, member_id=member_id))
            return effects

        if not req.group_id:
            return fail(E.INVALID_GROUP_ID)
        if (err := self._coordinator_error(req.group_id)) is not E.NONE:
            return fail(err)
        cfg = self.config
        if not (
            cfg.group_min_session_timeout_ms
            <= req.session_timeout_ms
            <= cfg.group_max_session_timeout_ms
        ):
            return fail(E.INVALID_SESSION_TIMEOUT)
        group = self._groups.get(req.group_id)
        if group is None:
            if req.member_id:
                return fail(E.UNKNOWN_MEMBER_ID)
            group = Group(req.group_id, self.partition_for(req.group_id), state_timestamp=now_ms)
            self._groups[req.group_id] = group
        if not self._accept_joining(group, req):
            fail(E.GROUP_MAX_SIZE_REACHED)
        elif not req.member_id:
            self._join_unknown_member(group, token, now_ms, req, effects)
        else:
            self._join_known_member(group, token, now_ms, req, effects)
        self._maybe_drop_unused(group)
        return effects

    @staticmethod
    def _rebalance_timeout(req: JoinGroupRequest) -> int:
        return req.rebalance_timeout_ms if req.rebalance_timeout_ms >= 0 else req.session_timeout_ms

    def _join_unknown_member(
        self, group: Group, token: object, now_ms: int, req: JoinGroupRequest, effects: Effects
    ) -> None:
        names = [name for name, _ in req.protocols]
        if not group.supports_protocols(req.protocol_type, names):
            effects.complete(token, JoinGroupResult(E.INCONSISTENT_GROUP_PROTOCOL))
            return
        new_id = self._new_member_id(req.client_id)
        instance = req.group_instance_id
        if instance is not None and instance in group.static_members:
            self._replace_static_member(group, token, now_ms, req, new_id, effects)
        elif instance is None and req.api_version >= 4:
            # KIP-394: hand out the id first; the member must come back with it.
            group.pending_members.add(new_id)
            self._timers.schedule(
                (_PENDING, group.group_id, new_id), now_ms + req.session_timeout_ms
            )
            effects.complete(token, JoinGroupResult(E.MEMBER_ID_REQUIRED, member_id=new_id))
        else:
            self._add_member_and_rebalance(group, token, now_ms, req, new_id, effects)

    def _join_known_member(
        self, group: Group, token: object, now_ms: int, req: JoinGroupRequest, effects: Effects
    ) -> None:
        member_id = req.member_id
        names = [name for name, _ in req.protocols]
        if not group.supports_protocols(req.protocol_type, names):
            effects.complete(
                token, JoinGroupResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
            )
            return
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self._timers.cancel((_PENDING, group.group_id, member_id))
            self._add_member_and_rebalance(group, token, now_ms, req, member_id, effects)
            return
        err = self._validate_member(group, member_id, req.group_instance_id)
        if err is not E.NONE:
            effects.complete(token, JoinGroupResult(err, member_id=member_id))
            return
        member = group.members[member_id]
        state = group.state
        if state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, token, now_ms, req, effects)
        elif state is GroupState.COMPLETING_REBALANCE:
            if member.matches(req.protocols):
                # The member lost our JoinGroup response: send it again.
                self._reset_session(group, member, now_ms)
                effects.complete(token, self._join_response(group, member))
            else:
                self._update_member_and_rebalance(group, member, token, now_ms, req, effects)
        elif state is GroupState.STABLE:
            if member_id == group.leader_id or not member.matches(req.protocols):
                # The leader rejoins to rebalance (e.g. topic metadata changed); a follower
                # with new metadata needs a new assignment.
                self._update_member_and_rebalance(group, member, token, now_ms, req, effects)
            else:
                self._reset_session(group, member, now_ms)
                effects.complete(
                    token,
                    JoinGroupResult(
                        E.NONE,
                        generation_id=group.generation,
                        protocol_type=group.protocol_type,
                        protocol_name=group.protocol_name,
                        leader=group.leader_id or "",
                        member_id=member_id,
                    ),
                )
        else:
            effects.complete(token, JoinGroupResult(E.UNKNOWN_MEMBER_ID, member_id=member_id))

    def _add_member_and_rebalance(
        self,
        group: Group,
        token: object,
        now_ms: int,
        req: JoinGroupRequest,
        member_id: str,
        effects: Effects,
    ) -> None:
        member = Member(
            member_id=member_id,
            group_instance_id=req.group_instance_id,
            client_id=req.client_id,
            client_host=req.client_host,
            rebalance_timeout_ms=self._rebalance_timeout(req),
            session_timeout_ms=req.session_timeout_ms,
            protocol_type=req.protocol_type,
            protocols=[(n, bytes(m)) for n, m in req.protocols],
            join_token=token,
            is_new=True,
        )
        group.add_member(member)
        if group.state is GroupState.PREPARING_REBALANCE and group.generation == 0:
            group.new_member_added = True
        self._schedule_session(group, member, now_ms + self.config.new_member_join_timeout_ms)
        self._prepare_or_try_complete(group, now_ms, effects)

    def _update_member_and_rebalance(
        self,
        group: Group,
        member: Member,
        token: object,
        now_ms: int,
        req: JoinGroupRequest,
        effects: Effects,
    ) -> None:
        if member.join_token is not None and member.join_token is not token:
            # A second JoinGroup replaces the first, which its client has given up on.
            effects.complete(
                member.join_token,
                JoinGroupResult(E.REBALANCE_IN_PROGRESS, member_id=member.member_id),
            )
        member.protocols = [(n, bytes(m)) for n, m in req.protocols]
        member.rebalance_timeout_ms = self._rebalance_timeout(req)
        member.session_timeout_ms = req.session_timeout_ms
        member.join_token = token
        self._prepare_or_try_complete(group, now_ms, effects)

    def _swap_member_id(self, group: Group, old_id: str, new_id: str) -> None:
        """Rename a member in place (keeping its position, leadership and pending sync)."""
        group.members = {(new_id if mid == old_id else mid): m for mid, m in group.members.items()}
        member = group.members[new_id]
        member.member_id = new_id
        if group.leader_id == old_id:
            group.leader_id = new_id
        if old_id in group.pending_sync:
            group.pending_sync.discard(old_id)
            group.pending_sync.add(new_id)
        if member.group_instance_id is not None:
            group.static_members[member.group_instance_id] = new_id
        self._timers.cancel((_SESSION, group.group_id, old_id))

    def _replace_static_member(
        self,
        group: Group,
        token: object,
        now_ms: int,
        req: JoinGroupRequest,
        new_id: str,
        effects: Effects,
    ) -> None:
        """KIP-345: a static member came back with a new member id; the old id is fenced."""
        instance = req.group_instance_id
        assert instance is not None
        old_id = group.static_members[instance]
        member = group.members[old_id]
        self._fail_waiting(member, E.FENCED_INSTANCE_ID, effects)
        old_leader = group.leader_id
        previous = (
            member.protocols,
            member.rebalance_timeout_ms,
            member.session_timeout_ms,
            member.client_id,
            member.client_host,
        )
        self._swap_member_id(group, old_id, new_id)
        member.protocols = [(n, bytes(m)) for n, m in req.protocols]
        member.rebalance_timeout_ms = self._rebalance_timeout(req)
        member.session_timeout_ms = req.session_timeout_ms
        member.client_id = req.client_id
        member.client_host = req.client_host
        self._reset_session(group, member, now_ms)
        # Kafka's rule: a Stable group keeps its generation unless the protocol it would
        # select now differs. Comparing the metadata bytes instead would rebalance on every
        # Java restart, whose subscription carries the generation it last held (KIP-792).
        candidates = group.candidate_protocols()
        keeps_protocol = bool(candidates) and group.select_protocol() == group.protocol_name
        if group.state is GroupState.STABLE and keeps_protocol:
            self._persist_static_replacement(
                group, member, token, req, old_id, old_leader, previous, effects
            )
            return
        member.join_token = token
        if group.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group, now_ms, effects)
        else:
            # Stable with changed metadata, or CompletingRebalance where the leader may be
            # assigning to the old member id: a new generation is needed.
            self._prepare_rebalance(group, now_ms, effects)

    def _persist_static_replacement(
        self,
        group: Group,
        member: Member,
        token: object,
        req: JoinGroupRequest,
        old_id: str,
        old_leader: str | None,
        previous: tuple[list[tuple[str, bytes]], int, int, str, str],
        effects: Effects,
    ) -> None:
        """No rebalance: record the new member id, then answer with the current generation."""
        epoch = group.epoch
        new_id = member.member_id
        api_version = req.api_version

        def done(error: ErrorCode, now_ms: int) -> Effects:
            out = Effects()
            current = (
                self._groups.get(group.group_id) is group
                and group.epoch == epoch
                and group.members.get(new_id) is member
            )
            if error is not E.NONE:
                if current and old_id not in group.members:
                    self._swap_member_id(group, new_id, old_id)
                    (
                        member.protocols,
                        member.rebalance_timeout_ms,
                        member.session_timeout_ms,
                        member.client_id,
                        member.client_host,
                    ) = previous
                    self._reset_session(group, member, now_ms)
                out.complete(token, JoinGroupResult(map_append_error(error, offsets=False)))
                return out
            if not current:
                out.complete(token, JoinGroupResult(E.REBALANCE_IN_PROGRESS, member_id=new_id))
                return out
            was_leader = old_leader == old_id
            if was_leader and api_version >= 9:
                # KIP-814: the leader learns the members but must not reassign.
                result = self._join_response(group, member)
                out.complete(
                    token,
                    JoinGroupResult(
                        E.NONE,
                        generation_id=result.generation_id,
                        protocol_type=result.protocol_type,
                        protocol_name=result.protocol_name,
                        leader=new_id,
                        member_id=new_id,
                        skip_assignment=True,
                        members=result.members,
                    ),
                )
            else:
                # Older clients get the old leader id, so a restarted leader does not take
                # itself for the leader and reassign in a Stable group.
                out.complete(
                    token,
                    JoinGroupResult(
                        E.NONE,
                        generation_id=group.generation,
                        protocol_type=group.protocol_type,
                        protocol_name=group.protocol_name,
                        leader=old_leader or "",
                        member_id=new_id,
                    ),
                )
            return out

        self._write(effects, group.partition, [self._group_metadata_record(group)], done)

    # -- SyncGroup

    def sync_group(self, token: object, now_ms: int, req: SyncGroupRequest) -> Effects:
        effects = Effects()

        def fail(error: ErrorCode) -> Effects:
            effects.complete(token, SyncGroupResult(error))
            return effects

        if not req.group_id:
            return fail(E.INVALID_GROUP_ID)
        if (err := self._coordinator_error(req.group_id)) is not E.NONE:
            return fail(err)
        group = self._groups.get(req.group_id)
        if group is None:
            return fail(E.UNKNOWN_MEMBER_ID)
        if (
            err := self._validate_member(group, req.member_id, req.group_instance_id)
        ) is not E.NONE:
            return fail(err)
        if req.generation_id != group.generation:
            return fail(E.ILLEGAL_GENERATION)
        if req.protocol_type is not None and req.protocol_type != group.protocol_type:
            return fail(E.INCONSISTENT_GROUP_PROTOCOL)
        if req.protocol_name is not None and req.protocol_name != group.protocol_name:
            return fail(E.INCONSISTENT_GROUP_PROTOCOL)
        member = group.members[req.member_id]
        if group.state is GroupState.EMPTY:
            return fail(E.UNKNOWN_MEMBER_ID)
        if group.state is GroupState.PREPARING_REBALANCE:
            return fail(E.REBALANCE_IN_PROGRESS)
        group.pending_sync.discard(member.member_id)
        self._reset_session(group, member, now_ms)
        if group.state is GroupState.STABLE:
            effects.complete(
                token,
                SyncGroupResult(
                    E.NONE, member.assignment, group.protocol_type, group.protocol_name
                ),
            )
            return effects
        # CompletingRebalance: wait for the leader's assignment to be written.
        if member.sync_token is not None and member.sync_token is not token:
            effects.complete(member.sync_token, SyncGroupResult(E.REBALANCE_IN_PROGRESS))
        member.sync_token = token
        if member.member_id == group.leader_id and group.pending_assignment_write is None:
            # Only the leader's assignment counts; others' are ignored, as in Kafka.
            assignments = {mid: bytes(a) for mid, a in req.assignments if mid in group.members}
            for mid in group.members:
                assignments.setdefault(mid, b"")
            group.pending_assignment_write = self._write(
                effects,
                group.partition,
                [self._group_metadata_record(group, assignments)],
                self._assignment_written(group, group.epoch, assignments),
            )
        return effects

    def _assignment_written(
        self, group: Group, epoch: int, assignments: dict[str, bytes]
    ) -> WriteCallback:
        def done(error: ErrorCode, now_ms: int) -> Effects:
            out = Effects()
            if (
                self._groups.get(group.group_id) is not group
                or group.epoch != epoch
                or group.state is not GroupState.COMPLETING_REBALANCE
            ):
                return out  # the group moved on; its waiters were answered then
            group.pending_assignment_write = None
            if error is not E.NONE:
                self._reset_and_propagate_assignment_error(
                    group, map_append_error(error, offsets=False), out
                )
                self._prepare_rebalance(group, now_ms, out)
                return out
            for member in group.members.values():
                member.assignment = assignments.get(member.member_id, b"")
                if member.sync_token is not None:
                    out.complete(
                        member.sync_token,
                        SyncGroupResult(
                            E.NONE, member.assignment, group.protocol_type, group.protocol_name
                        ),
                    )
                    member.sync_token = None
                    self._reset_session(group, member, now_ms)
            group.transition(GroupState.STABLE, now_ms)
            return out

        return done

    # -- Heartbeat

    def heartbeat(self, now_ms: int, req: HeartbeatRequest) -> ErrorCode:
        if not req.group_id:
            return E.INVALID_GROUP_ID
        if (err := self._coordinator_error(req.group_id)) is not E.NONE:
            return err
        group = self._groups.get(req.group_id)
        if group is None:
            return E.UNKNOWN_MEMBER_ID
        if (
            err := self._validate_member(group, req.member_id, req.group_instance_id)
        ) is not E.NONE:
            return err
        if req.generation_id != group.generation:
            return E.ILLEGAL_GENERATION
        if group.state is GroupState.EMPTY:
            return E.UNKNOWN_MEMBER_ID
        self._reset_session(group, group.members[req.member_id], now_ms)
        if group.state is GroupState.PREPARING_REBALANCE:
            return E.REBALANCE_IN_PROGRESS
        return E.NONE

    # -- LeaveGroup

    def leave_group(self, token: object, now_ms: int, req: LeaveGroupRequest) -> Effects:
        effects = Effects()
        if not req.group_id:
            effects.complete(token, LeaveGroupResult(E.INVALID_GROUP_ID))
            return effects
        if (err := self._coordinator_error(req.group_id)) is not E.NONE:
            effects.complete(token, LeaveGroupResult(err))
            return effects
        group = self._groups.get(req.group_id)
        results: list[LeaveMemberResult] = []
        for ident in req.members:
            error = self._leave_one(
                group, ident.member_id, ident.group_instance_id, now_ms, effects
            )
            results.append(LeaveMemberResult(ident.member_id, ident.group_instance_id, error))
        effects.complete(token, LeaveGroupResult(E.NONE, tuple(results)))
        return effects

    def _leave_one(
        self,
        group: Group | None,
        member_id: str,
        instance_id: str | None,
        now_ms: int,
        effects: Effects,
    ) -> ErrorCode:
        if group is None:
            return E.UNKNOWN_MEMBER_ID
        if not member_id:
            # Administrative removal of a static member by its instance id alone.
            target = group.static_members.get(instance_id) if instance_id is not None else None
            if target is None:
                return E.UNKNOWN_MEMBER_ID
            self._remove_member_and_update_group(group, target, now_ms, effects)
            return E.NONE
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self._timers.cancel((_PENDING, group.group_id, member_id))
            self._try_complete_join(group, now_ms, effects)
            return E.NONE
        err = self._validate_member(group, member_id, instance_id)
        if err is not E.NONE:
            return err
        self._remove_member_and_update_group(group, member_id, now_ms, effects)
        return E.NONE

    # -- OffsetCommit

    def _validate_offset_commit(self, group: Group, req: OffsetCommitRequest) -> ErrorCode:
        if req.generation_id < 0 and group.state is GroupState.EMPTY:
            return E.NONE  # simple commits (admin client, standalone consumers)
        if req.generation_id >= 0 or req.member_id or req.group_instance_id is not None:
            err = self._validate_member(group, req.member_id, req.group_instance_id)
            if err is not E.NONE:
                return err
            if req.generation_id != group.generation:
                return E.ILLEGAL_GENERATION
        elif group.state is not GroupState.EMPTY:
            return E.UNKNOWN_MEMBER_ID
        if group.state is GroupState.COMPLETING_REBALANCE:
            # The member has the new generation but no assignment yet.
            return E.REBALANCE_IN_PROGRESS
        return E.NONE

    @staticmethod
    def _commit_failed(
        effects: Effects, token: object, partitions: Sequence[OffsetCommitPartition], error: E
    ) -> Effects:
        """Answer a commit with ``error`` for every partition."""
        effects.complete(
            token,
            OffsetCommitResult(
                tuple(PartitionError(p.topic, p.partition, error) for p in partitions)
            ),
        )
        return effects

    def commit_offsets(self, token: object, now_ms: int, req: OffsetCommitRequest) -> Effects:
        effects = Effects()

        def respond_all(error: ErrorCode) -> Effects:
            return self._commit_failed(effects, token, req.partitions, error)

        if (err := self._coordinator_error(req.group_id)) is not E.NONE:
            return respond_all(err)
        group = self._groups.get(req.group_id)
        if group is None:
            if req.generation_id >= 0:
                return respond_all(
                    E.GROUP_ID_NOT_FOUND if req.api_version >= 9 else E.ILLEGAL_GENERATION
                )
            group = Group(req.group_id, self.partition_for(req.group_id), state_timestamp=now_ms)
            self._groups[req.group_id] = group
        elif (err := self._validate_offset_commit(group, req)) is not E.NONE:
            return respond_all(err)
        member = group.members.get(req.member_id)
        if member is not None:
            self._reset_session(group, member, now_ms)
        errors, accepted = self._accept_offsets(req.partitions, now_ms, req.retention_time_ms)

        def result(write_error: ErrorCode) -> OffsetCommitResult:
            return OffsetCommitResult(
                tuple(
                    PartitionError(
                        p.topic,
                        p.partition,
                        write_error if e is E.NONE else e,
                    )
                    for p, e in zip(req.partitions, errors, strict=True)
                )
            )

        if not accepted:
            self._maybe_drop_unused(group)
            effects.complete(token, result(E.NONE))
            return effects
        pending = PendingCommit(dict(accepted))
        group.pending_commits.append(pending)
        records = [self._offset_record(group.group_id, tp, o) for tp, o in accepted.items()]

        def done(error: ErrorCode, now: int) -> Effects:
            out = Effects()
            if pending in group.pending_commits:
                group.pending_commits.remove(pending)
            if error is E.NONE:
                if self._groups.get(group.group_id) is group and not group.deleted:
                    for o in pending.offsets.values():
                        o.appended_at = write_id
                    group.offsets.update(pending.offsets)
                out.complete(token, result(E.NONE))
            else:
                out.complete(token, result(map_append_error(error, offsets=True)))
                self._maybe_drop_unused(group)
            return out

        write_id = self._write(effects, group.partition, records, done)
        return effects

    def _accept_offsets(
        self, partitions: Sequence[OffsetCommitPartition], now_ms: int, retention_time_ms: int
    ) -> tuple[list[ErrorCode], dict[TopicPartition, OffsetAndMetadata]]:
        """Each partition's error and the offsets that may be written."""
        errors: list[ErrorCode] = []
        accepted: dict[TopicPartition, OffsetAndMetadata] = {}
        max_metadata = self.config.offset_metadata_max_bytes
        for p in partitions:
            metadata = p.metadata or ""
            if self._topic_exists is not None and not self._topic_exists(p.topic, p.partition):
                errors.append(E.UNKNOWN_TOPIC_OR_PARTITION)
            elif _utf16_length(metadata) > max_metadata:
                errors.append(E.OFFSET_METADATA_TOO_LARGE)
            else:
                errors.append(E.NONE)
                accepted[(p.topic, p.partition)] = OffsetAndMetadata(
                    offset=p.offset,
                    leader_epoch=p.leader_epoch,
                    metadata=metadata,
                    commit_timestamp=p.commit_timestamp if p.commit_timestamp >= 0 else now_ms,
                    expire_timestamp=(now_ms + retention_time_ms if retention_time_ms >= 0 else -1),
                )
        return errors, accepted

    # -- TxnOffsetCommit and transaction markers

    def commit_transactional_offsets(
        self, token: object, now_ms: int, req: TxnOffsetCommitRequest
    ) -> Effects:
        """TxnOffsetCommit: write the offsets in the producer's transaction. They become the
        group's offsets when the transaction's COMMIT marker reaches the group's partition
        (:meth:`complete_transaction`) and are dropped at its ABORT marker.

        KIP-447 fencing, Kafka's rules for a transactional commit: a member id the group
        does not know: UNKNOWN_MEMBER_ID; a generation other than the group's:
        ILLEGAL_GENERATION; a static member whose instance id maps to another member:
        FENCED_INSTANCE_ID. No member and generation -1 (v0-v2, or a producer that does
        not name its consumer) skips the check."""
        effects = Effects()

        def respond_all(error: ErrorCode) -> Effects:
            return self._commit_failed(effects, token, req.partitions, error)

        if (err := self._coordinator_error(req.group_id)) is not E.NONE:
            return respond_all(err)
        group = self._groups.get(req.group_id)
        if group is None:
            group = Group(req.group_id, self.partition_for(req.group_id), state_timestamp=now_ms)
            self._groups[req.group_id] = group
        if group.state is GroupState.DEAD:
            return respond_all(E.COORDINATOR_NOT_AVAILABLE)
        if req.member_id and req.member_id not in group.members:
            return respond_all(E.UNKNOWN_MEMBER_ID)
        if (
            req.member_id
            and (err := self._validate_member(group, req.member_id, req.group_instance_id))
            is not E.NONE
        ):
            return respond_all(err)
        if req.generation_id >= 0 and req.generation_id != group.generation:
            return respond_all(E.ILLEGAL_GENERATION)
        errors, accepted = self._accept_offsets(req.partitions, now_ms, -1)

        def result(write_error: ErrorCode) -> OffsetCommitResult:
            return OffsetCommitResult(
                tuple(
                    PartitionError(p.topic, p.partition, write_error if e is E.NONE else e)
                    for p, e in zip(req.partitions, errors, strict=True)
                )
            )

        if not accepted:
            self._maybe_drop_unused(group)
            effects.complete(token, result(E.NONE))
            return effects
        records = [self._offset_record(group.group_id, tp, o) for tp, o in accepted.items()]

        def done(error: ErrorCode, now: int) -> Effects:
            out = Effects()
            if error is E.NONE:
                if self._groups.get(group.group_id) is group:
                    for o in accepted.values():
                        o.appended_at = write_id
                    group.pending_txn_offsets.setdefault(req.producer_id, {}).update(accepted)
                out.complete(token, result(E.NONE))
            else:
                out.complete(token, result(map_append_error(error, offsets=True)))
                self._maybe_drop_unused(group)
            return out

        # the batch is the producer's: its transaction's marker decides the records' fate
        write_id = self._write(
            effects,
            group.partition,
            records,
            done,
            producer_id=req.producer_id,
            producer_epoch=req.producer_epoch,
        )
        return effects

    def complete_transaction(self, partition: int, producer_id: int, commit: bool) -> None:
        """A COMMIT or ABORT marker of ``producer_id`` was written to ``partition`` of
        ``__consumer_offsets``: its pending transactional offsets there are committed or
        dropped. A committed one does not replace an offset that a regular commit appended
        after it (Kafka compares where the two records sit in the log)."""
        for group in list(self._groups.values()):
            if group.partition != partition:
                continue
            offsets = group.pending_txn_offsets.pop(producer_id, None)
            if offsets is None:
                continue
            if commit:
                for tp, o in offsets.items():
                    # a regular commit appended after the transaction's record wins (Kafka)
                    current = group.offsets.get(tp)
                    if current is None or current.appended_at <= o.appended_at:
                        group.offsets[tp] = o
            else:
                self._maybe_drop_unused(group)

    def load_transactional_offsets(
        self, partition: int, producer_id: int, records: Iterable[KeyValue]
    ) -> None:
        """At load: offsets of ``producer_id``'s transaction found with no marker yet wait
        for it again."""
        for record in records:
            key = decode_key(record.key)
            if not isinstance(key, OffsetCommitKey) or record.value is None:
                continue
            v = decode_offset_commit_value(record.value)
            group = self._groups.get(key.group)
            if group is None:
                group = self._groups[key.group] = Group(key.group, partition)
            group.pending_txn_offsets.setdefault(producer_id, {})[(key.topic, key.partition)] = (
                OffsetAndMetadata(v.offset, v.leader_epoch, v.metadata, v.commit_timestamp)
            )

    # -- OffsetFetch

    def fetch_offsets(
        self,
        group_id: str,
        partitions: Sequence[tuple[str, int]] | None = None,
        *,
        require_stable: bool = False,
    ) -> OffsetFetchResult:
        """Committed offsets of one group (OffsetFetch v8+ calls this once per group).

        ``require_stable`` (OffsetFetch v7+, KIP-447) reports UNSTABLE_OFFSET_COMMIT for a
        partition with transactional offsets waiting for their marker, so the consumer asks
        again instead of reading an offset about to change. Commits whose append is in
        flight are not visible yet, as in Kafka.
        """
        if (err := self._coordinator_error(group_id)) is not E.NONE:
            return OffsetFetchResult(group_id, err)
        group = self._groups.get(group_id)
        offsets = group.offsets if group is not None else {}
        if partitions is None:
            found = tuple(
                FetchedOffset(t, p, o.offset, o.leader_epoch, o.metadata)
                for (t, p), o in sorted(offsets.items())
            )
            return OffsetFetchResult(group_id, E.NONE, found)
        out: list[FetchedOffset] = []
        for t, p in partitions:
            o = offsets.get((t, p))
            if require_stable and group is not None and group.has_pending_txn_offset((t, p)):
                out.append(FetchedOffset(t, p, -1, -1, "", E.UNSTABLE_OFFSET_COMMIT))
            elif o is None:
                out.append(FetchedOffset(t, p, -1, -1, ""))
            else:
                out.append(FetchedOffset(t, p, o.offset, o.leader_epoch, o.metadata))
        return OffsetFetchResult(group_id, E.NONE, tuple(out))

    def fetch_offsets_many(
        self, groups: Sequence[OffsetFetchGroup], *, require_stable: bool = False
    ) -> list[OffsetFetchResult]:
        """OffsetFetch v8+: several groups in one request, answered in request order."""
        return [
            self.fetch_offsets(g.group_id, g.partitions, require_stable=require_stable)
            for g in groups
        ]

    # -- OffsetDelete

    def delete_offsets(
        self,
        token: object,
        now_ms: int,
        group_id: str,
        partitions: Sequence[tuple[str, int]],
    ) -> Effects:
        effects = Effects()
        if (err := self._coordinator_error(group_id)) is not E.NONE:
            effects.complete(token, OffsetDeleteResult(err))
            return effects
        group = self._groups.get(group_id)
        if group is None:
            effects.complete(token, OffsetDeleteResult(E.GROUP_ID_NOT_FOUND))
            return effects
        if (
            group.protocol_type is not None
            and group.protocol_type != CONSUMER_PROTOCOL_TYPE
            and group.state is not GroupState.EMPTY
        ):
            effects.complete(token, OffsetDeleteResult(E.NON_EMPTY_GROUP))
            return effects
        errors: list[ErrorCode] = []
        removed: dict[TopicPartition, OffsetAndMetadata | None] = {}
        for topic, partition in partitions:
            tp = (topic, partition)
            if self._topic_exists is not None and not self._topic_exists(topic, partition):
                errors.append(E.UNKNOWN_TOPIC_OR_PARTITION)
            elif group.is_subscribed_to(topic):
                errors.append(E.GROUP_SUBSCRIBED_TO_TOPIC)
            else:
                errors.append(E.NONE)
                if tp in group.offsets or group.has_pending_commit(tp):
                    removed[tp] = group.offsets.pop(tp, None)
                    for pending in group.pending_commits:
                        pending.offsets.pop(tp, None)

        def result(write_error: ErrorCode) -> OffsetDeleteResult:
            return OffsetDeleteResult(
                E.NONE,
                tuple(
                    PartitionError(t, p, write_error if e is E.NONE else e)
                    for (t, p), e in zip(partitions, errors, strict=True)
                ),
            )

        if not removed:
            effects.complete(token, result(E.NONE))
            return effects

        def done(error: ErrorCode, now: int) -> Effects:
            out = Effects()
            if error is not E.NONE:
                # Nothing was deleted: put back what the tombstones would have removed.
                if self._groups.get(group.group_id) is group:
                    for tp, o in removed.items():
                        if o is not None:
                            group.offsets.setdefault(tp, o)
                out.complete(token, result(map_append_error(error, offsets=True)))
            else:
                out.complete(token, result(E.NONE))
            return out

        records = [self._offset_tombstone(group.group_id, tp) for tp in removed]
        self._write(effects, group.partition, records, done)
        return effects

    # -- DeleteGroups

    def delete_groups(self, token: object, now_ms: int, group_ids: Sequence[str]) -> Effects:
        effects = Effects()
        errors: dict[str, ErrorCode] = {}
        by_partition: dict[int, list[GroupRecord]] = {}
        for gid in group_ids:
            if (err := self._coordinator_error(gid)) is not E.NONE:
                errors[gid] = err
                continue
            group = self._groups.get(gid)
            if group is None:
                errors[gid] = E.GROUP_ID_NOT_FOUND
            elif group.state is not GroupState.EMPTY or group.members:
                errors[gid] = E.NON_EMPTY_GROUP
            else:
                errors[gid] = E.NONE
                by_partition.setdefault(group.partition, []).extend(self._kill_group(group, now_ms))

        def result(write_errors: dict[int, ErrorCode]) -> DeleteGroupsResult:
            out: list[DeleteGroupResult] = []
            for gid in group_ids:
                e = errors[gid]
                if e is E.NONE:
                    e = map_append_error(
                        write_errors.get(self.partition_for(gid), E.NONE), offsets=False
                    )
                out.append(DeleteGroupResult(gid, e))
            return DeleteGroupsResult(tuple(out))

        if not by_partition:
            effects.complete(token, result({}))
            return effects
        outstanding = set(by_partition)
        write_errors: dict[int, ErrorCode] = {}
        for partition, records in by_partition.items():

            def done(error: ErrorCode, now: int, partition: int = partition) -> Effects:
                out = Effects()
                outstanding.discard(partition)
                if error is not E.NONE:
                    write_errors[partition] = error
                if not outstanding:
                    out.complete(token, result(write_errors))
                return out

            self._write(effects, partition, records, done)
        return effects

    def _kill_group(self, group: Group, now_ms: int) -> list[GroupRecord]:
        """Remove an Empty group: tombstones for its offsets (committed or in flight) and for
        its metadata."""
        tps = set(group.offsets)
        for pending in group.pending_commits:
            tps.update(pending.offsets)
            pending.offsets.clear()
        records = [self._offset_tombstone(group.group_id, tp) for tp in sorted(tps)]
        records.append(GroupRecord(encode_group_metadata_key(group.group_id), None))
        group.offsets.clear()
        group.transition(GroupState.DEAD, now_ms)
        group.deleted = True
        for pending_id in group.pending_members:
            self._timers.cancel((_PENDING, group.group_id, pending_id))
        self._timers.cancel((_JOIN, group.group_id))
        self._timers.cancel((_SYNC, group.group_id))
        if self._groups.get(group.group_id) is group:
            del self._groups[group.group_id]
        return records

    # -- expiration

    def expire_offsets(self, now_ms: int) -> Effects:
        """Kafka's offset retention: drop expired offsets, and groups left with nothing.

        An Empty group's offsets expire ``offsets.retention.minutes`` after the group became
        Empty (or after the commit, for groups without that timestamp); a group that only
        stores offsets (no protocol type) expires each offset by its commit time; a Stable
        consumer group expires, by commit time, offsets of topics it no longer subscribes to.
        Offsets committed with an explicit retention expire at their own expire timestamp.
        """
        effects = Effects()
        retention = self.config.offsets_retention_ms
        by_partition: dict[int, list[GroupRecord]] = {}
        for group in list(self._groups.values()):
            if group.deleted or group.partition not in self._owned:
                continue
            base: Callable[[OffsetAndMetadata], int] | None = None
            keep_topics: frozenset[str] = frozenset()
            if group.protocol_type is not None and group.state is GroupState.EMPTY:
                state_ts = group.state_timestamp

                def base(o: OffsetAndMetadata, state_ts: int = state_ts) -> int:
                    return state_ts if state_ts >= 0 else o.commit_timestamp

            elif (
                group.protocol_type == CONSUMER_PROTOCOL_TYPE
                and group.subscribed_topics is not None
                and group.state is GroupState.STABLE
            ):
                keep_topics = group.subscribed_topics

                def base(o: OffsetAndMetadata) -> int:
                    return o.commit_timestamp

            elif group.protocol_type is None:

                def base(o: OffsetAndMetadata) -> int:
                    return o.commit_timestamp

            records: list[GroupRecord] = []
            if base is not None:
                for tp, o in list(group.offsets.items()):
                    if tp[0] in keep_topics or group.has_pending_commit(tp):
                        continue
                    if o.expire_timestamp >= 0:
                        expired = now_ms >= o.expire_timestamp
                    else:
                        expired = now_ms - base(o) >= retention
                    if expired:
                        del group.offsets[tp]
                        records.append(self._offset_tombstone(group.group_id, tp))
            if (
                group.state is GroupState.EMPTY
                and not group.members
                and not group.pending_members
                and not group.has_offsets()
            ):
                records.extend(self._kill_group(group, now_ms))
            if records:
                by_partition.setdefault(group.partition, []).extend(records)
        for partition, records in by_partition.items():
            self._write(effects, partition, records, self._ignore_write)
        return effects

    # -- ListGroups / DescribeGroups

    def list_groups(
        self, states_filter: Sequence[str] = (), types_filter: Sequence[str] = ()
    ) -> ListGroupsResult:
        """ListGroups: ``states_filter`` (v4+) and ``types_filter`` (v5+) are
        case-insensitive; an empty filter matches everything."""
        error = E.COORDINATOR_LOAD_IN_PROGRESS if self._loading else E.NONE
        states = {s.lower() for s in states_filter}
        types = {t.lower() for t in types_filter}
        if types and "classic" not in types:
            return ListGroupsResult(error)
        listed = tuple(
            ListedGroup(g.group_id, g.protocol_type or "", g.state.value)
            for g in sorted(self._groups.values(), key=lambda g: g.group_id)
            if g.state is not GroupState.DEAD and (not states or g.state.value.lower() in states)
        )
        return ListGroupsResult(error, listed)

    def describe_group(self, group_id: str, *, api_version: int = 5) -> DescribedGroup:
        """DescribeGroups for one group. A missing group is "Dead" with no error before v6 and
        GROUP_ID_NOT_FOUND from v6, as in Kafka."""
        if (err := self._coordinator_error(group_id)) is not E.NONE:
            return DescribedGroup(group_id, err, "")
        group = self._groups.get(group_id)
        if group is None:
            missing = E.GROUP_ID_NOT_FOUND if api_version >= 6 else E.NONE
            return DescribedGroup(group_id, missing, GroupState.DEAD.value)
        stable = group.state is GroupState.STABLE
        members = tuple(
            DescribedMember(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata_for(group.protocol_name) if stable else b"",
                m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
        return DescribedGroup(
            group_id,
            E.NONE,
            group.state.value,
            group.protocol_type or "",
            (group.protocol_name or "") if stable else "",
            members,
        )

    # -- inspection

    def group_ids(self) -> list[str]:
        return sorted(self._groups)

    def group(self, group_id: str) -> Group | None:
        """The live group object (read it, do not change it)."""
        return self._groups.get(group_id)

    def snapshot(self) -> dict[str, GroupSnapshot]:
        return {gid: snapshot_group(g) for gid, g in sorted(self._groups.items())}
