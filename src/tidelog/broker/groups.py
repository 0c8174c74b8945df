"""The asyncio driver of the group coordinator.

:class:`GroupDriver` owns the sans-io :class:`~tidelog.coordinator.GroupCoordinator` and is
the only code that calls it. What it shares with the transaction coordinator's driver
(requests and their tokens, timers, durable appends, creating and loading the topic,
shutdown) is :class:`~tidelog.broker.coordinator_driver.CoordinatorDriver`; see there.

Requests. Operations Kafka answers later (JoinGroup waits for the rebalance, SyncGroup
followers for the leader, writes for the append to ``__consumer_offsets``) go through
:meth:`GroupDriver.respond`; operations Kafka answers directly (Heartbeat, OffsetFetch,
ListGroups, DescribeGroups) call the coordinator through :attr:`GroupDriver.coordinator`
without a token.

The offsets topic. ``__consumer_offsets`` is created on the first FindCoordinator for a group
(``offsets.topic.num.partitions`` partitions, compacted).

Loading. Each partition's newest committed record per key is replayed by
:meth:`GroupCoordinator.load_partition` (records that cannot be decoded are dropped with a
warning); transactional offsets whose transaction has no marker yet wait for it again
(:meth:`GroupCoordinator.load_transactional_offsets`), and offsets of aborted transactions
are left out.

Shutdown: waiting JoinGroup/SyncGroup requests are answered NOT_COORDINATOR as their
partitions are unloaded. The group state is in the log.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from tidelog.broker.coordinator_driver import CoordinatorDriver, LoadedRecords
from tidelog.coordinator import (
    GroupConfig,
    GroupCoordinator,
    GroupRecordError,
)
from tidelog.coordinator.records import (
    GroupMetadataKey,
    OffsetCommitKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
)
from tidelog.metadata.controller import OFFSETS_TOPIC

if TYPE_CHECKING:
    from tidelog.broker.broker import Broker


def _decodable(key: bytes, value: bytes | None) -> bool:
    """Whether replay can read this record (it raises on malformed ones)."""
    try:
        decoded = decode_key(key)
        if value is not None:
            if isinstance(decoded, OffsetCommitKey):
                decode_offset_commit_value(value)
            elif isinstance(decoded, GroupMetadataKey):
                decode_group_metadata_value(value)
    except GroupRecordError:
        return False
    return True


class GroupDriver(CoordinatorDriver[GroupCoordinator]):
    """Runs the group coordinator of one broker (see the module docstring)."""

    topic = OFFSETS_TOPIC

    def __init__(
        self,
        broker: Broker,
        config: GroupConfig | None = None,
        *,
        member_id_factory: Callable[[str], str] | None = None,
    ) -> None:
        self._config = (
            config if config is not None else GroupConfig.from_broker_config(broker.config)
        )
        self._member_id_factory = member_id_factory
        super().__init__(broker, self._new_coordinator(self._config))

    def _new_coordinator(self, config: GroupConfig) -> GroupCoordinator:
        return GroupCoordinator(
            config,
            owned_partitions=(),
            topic_exists=self._topic_exists,
            member_id_factory=self._member_id_factory,
        )

    def _topic_exists(self, topic: str, partition: int) -> bool:
        found = self._broker.image.topic(topic)
        return found is not None and partition in found.partitions

    def _configured_partitions(self) -> int:
        return self.coordinator.config.offsets_topic_num_partitions

    def _resize(self, count: int) -> None:
        self._config = dataclasses.replace(self._config, offsets_topic_num_partitions=count)
        self.coordinator = self._new_coordinator(self._config)

    def _decodable(self, key: bytes, value: bytes | None) -> bool:
        return _decodable(key, value)

    def _load_partition(self, p: int, loaded: LoadedRecords) -> None:
        self._dispatch(self.coordinator.load_partition(p, loaded.records, self.now()))
        for producer_id, records in loaded.open.items():
            self.coordinator.load_transactional_offsets(p, producer_id, records)

    def transaction_completed(self, partition: int, producer_id: int, commit: bool) -> None:
        """A marker of ``producer_id`` was written to ``__consumer_offsets`` partition
        ``partition``: its transactional offsets there are committed or dropped."""
        self.coordinator.complete_transaction(partition, producer_id, commit)
