"""Rebuilding the groups of one ``__consumer_offsets`` partition from its records.

The records are read oldest first; for each key the newest value wins and a tombstone deletes,
exactly what compaction keeps. Then:

- a group with a metadata record and members is Stable in its last written generation, with
  each member's subscription (for the group's protocol) and assignment;
- a group whose metadata has no members is Empty since its ``currentStateTimestamp``;
- offsets whose group has no metadata (tombstoned, or never written: groups that only commit)
  make an Empty group without a protocol type;
- key versions of other group types are skipped.

A group in PreparingRebalance or CompletingRebalance when the log was written comes back as
its last Stable generation; its members then get ILLEGAL_GENERATION or REBALANCE_IN_PROGRESS
and rejoin, as with Kafka after a coordinator move.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from tidelog.coordinator.group import Group, GroupState, Member, OffsetAndMetadata
from tidelog.coordinator.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
)


class KeyValue(Protocol):
    """A record as :func:`tidelog.records.decode_records` returns it (only these matter)."""

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...


def replay_partition(records: Iterable[KeyValue], partition: int) -> dict[str, Group]:
    """The groups that ``records`` (one partition's, oldest first) describe."""
    offsets: dict[str, dict[tuple[str, int], OffsetAndMetadata]] = {}
    metadata: dict[str, GroupMetadataValue | None] = {}
    for record in records:
        key = decode_key(record.key)
        if isinstance(key, OffsetCommitKey):
            tp = (key.topic, key.partition)
            if record.value is None:
                offsets.get(key.group, {}).pop(tp, None)
            else:
                v = decode_offset_commit_value(record.value)
                offsets.setdefault(key.group, {})[tp] = OffsetAndMetadata(
                    v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, v.expire_timestamp
                )
        elif isinstance(key, GroupMetadataKey):
            metadata[key.group] = (
                None if record.value is None else decode_group_metadata_value(record.value)
            )
    groups: dict[str, Group] = {}
    for group_id, value in metadata.items():
        if value is not None:
            groups[group_id] = _group_from_metadata(group_id, partition, value)
    for group_id, group_offsets in offsets.items():
        if not group_offsets:
            continue
        group = groups.get(group_id)
        if group is None:
            group = groups[group_id] = Group(group_id, partition)
        group.offsets.update(group_offsets)
    return groups


def _group_from_metadata(group_id: str, partition: int, value: GroupMetadataValue) -> Group:
    group = Group(
        group_id,
        partition,
        state=GroupState.STABLE if value.members else GroupState.EMPTY,
        state_timestamp=value.current_state_timestamp,
        generation=value.generation,
        protocol_type=value.protocol_type or None,
        protocol_name=value.protocol if value.members else None,
    )
    for m in value.members:
        protocols = [(value.protocol, m.subscription)] if value.protocol is not None else []
        group.add_member(
            Member(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout_ms=m.rebalance_timeout_ms,
                session_timeout_ms=m.session_timeout_ms,
                protocol_type=value.protocol_type,
                protocols=protocols,
                assignment=m.assignment,
            )
        )
    group.protocol_type = value.protocol_type or None
    if value.leader is not None and value.leader in group.members:
        group.leader_id = value.leader
    group.subscribed_topics = group.compute_subscribed_topics()
    return group
