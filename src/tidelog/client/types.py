"""Plain value types of the client's public API."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

Headers = tuple[tuple[str, bytes | None], ...]


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class RecordMetadata(NamedTuple):
    """Where an acknowledged record was written (offset -1 with acks=0: not known)."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create; -1 partitions / replication factor take the broker's defaults."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConfigResource:
    """A topic (``type="topic"``) or broker (``type="broker"``, name = node id) config."""

    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.type} {self.name!r}"


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: str
    is_default: bool
    read_only: bool
    is_sensitive: bool


@dataclass(frozen=True, slots=True)
class AlterConfigOp:
    """One change of IncrementalAlterConfigs: ``op`` is set, delete, append or subtract."""

    name: str
    value: str | None = None
    op: str = "set"


@dataclass(frozen=True, slots=True)
class LogDirDescription:
    """One log dir of a broker (DescribeLogDirs): its path, the bytes of each partition it
    holds, and its file system's total and usable bytes (-1 where the broker does not say)."""

    path: str
    partition_sizes: dict[TopicPartition, int]
    total_bytes: int = -1
    usable_bytes: int = -1
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    """A reassignment under way (ListPartitionReassignments, KIP-455): the replicas now
    (the target followed by those being removed), and which are being added and removed."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()


class ListOffsetsResult(NamedTuple):
    offset: int
    timestamp: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class QuorumReplica:
    """A voter or observer of the metadata quorum as its leader sees it (DescribeQuorum):
    its log end offset and when it last fetched and was last caught up, in epoch
    milliseconds (-1 where the leader has not seen it yet)."""

    replica_id: int
    log_end_offset: int
    last_fetch_timestamp: int = -1
    last_caught_up_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class QuorumInfo:
    """The metadata quorum as its leader describes it (Kafka's ``QuorumInfo``)."""

    leader_id: int
    leader_epoch: int
    high_watermark: int
    voters: tuple[QuorumReplica, ...]
    observers: tuple[QuorumReplica, ...] = ()


@dataclass(frozen=True, slots=True)
class TransactionListing:
    """A transactional id as its coordinator lists it (ListTransactions)."""

    transactional_id: str
    producer_id: int
    state: str
    #: the broker coordinating it
    coordinator_id: int


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """A transactional id as its coordinator describes it (DescribeTransactions): the
    current producer, its transaction's timeout, start (-1: no transaction open) and the
    partitions in it (those still waiting for a marker while it ends)."""

    transactional_id: str
    coordinator_id: int
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_ms: int
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class ProducerState:
    """A producer a partition keeps state for (DescribeProducers); the coordinator epoch is
    -1 until a marker of it was written there, the transaction start offset -1 while it
    has no open transaction on that partition."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int
