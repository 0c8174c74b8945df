"""The group coordinator's settings, with Kafka's names and defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidelog.metadata.configs import BrokerConfig

INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """``offsets.*`` and ``group.*`` broker settings the coordinator uses."""

    offsets_topic_num_partitions: int = 50
    #: ``offsets.retention.minutes`` (default 7 days) in milliseconds
    offsets_retention_ms: int = 10080 * 60_000
    offsets_retention_check_interval_ms: int = 600_000
    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    group_max_size: int = INT32_MAX
    #: ``offset.metadata.max.bytes``: longest metadata string of a committed offset
    offset_metadata_max_bytes: int = 4096
    #: How long a member that joined for the first time may wait in JoinGroup (Kafka's fixed
    #: ``NewMemberJoinTimeoutMs``) before it is dropped: it covers new members whose client
    #: gave up on a join that the rebalance never completed.
    new_member_join_timeout_ms: int = 300_000

    @classmethod
    def from_broker_config(cls, config: BrokerConfig) -> GroupConfig:
        # offset.metadata.max.bytes is not in the broker's config table yet: Kafka's default.
        return cls(
            offsets_topic_num_partitions=config.offsets_topic_num_partitions,
            offsets_retention_ms=config.offsets_retention_ms,
            offsets_retention_check_interval_ms=config.offsets_retention_check_interval_ms,
            group_initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            group_min_session_timeout_ms=config.group_min_session_timeout_ms,
            group_max_session_timeout_ms=config.group_max_session_timeout_ms,
            group_max_size=config.group_max_size,
        )
