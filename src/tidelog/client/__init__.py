"""tidelog.client: a Kafka client in Python, asyncio at the core, synchronous facades on top.

Layout: :mod:`.connection` (one broker connection: framing, correlation ids, version
negotiation), :mod:`.cluster` (connections per broker and the metadata cache),
:mod:`.aio` (AIOProducer, AIOConsumer, AIOAdmin), :mod:`.sync` (Producer, Consumer, Admin,
each running its core on a loop in a background thread), :mod:`.config` (Kafka's property
names and defaults), :mod:`.partitioner` (Java-compatible murmur2 partitioning),
:mod:`.messages` (building kio requests of any version). Only tidelog.protocol and
tidelog.records are used from the rest of Tidelog.
"""

from tidelog.client.aio.admin import ClusterDescription
from tidelog.client.cluster import BrokerInfo, PartitionInfo, TopicInfo
from tidelog.client.errors import (
    BrokerConnectionError,
    ClientClosedError,
    ClientError,
    ConfigError,
    PartialFailureError,
    RequestTimeoutError,
    UnsupportedApiError,
)
from tidelog.client.groups import (
    ConsumerGroupMetadata,
    ConsumerProtocolError,
    GroupDescription,
    GroupListing,
    MemberDescription,
    OffsetAndMetadata,
)
from tidelog.client.membership import CommitFailedError, RebalanceListener, WakeupError
from tidelog.client.sync import Admin, Consumer, Producer
from tidelog.client.types import (
    AlterConfigOp,
    ConfigEntry,
    ConfigResource,
    ConsumerRecord,
    ListOffsetsResult,
    LogDirDescription,
    NewTopic,
    PartitionReassignment,
    ProducerState,
    QuorumInfo,
    QuorumReplica,
    RecordMetadata,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)

__all__ = [
    "Admin",
    "AlterConfigOp",
    "BrokerConnectionError",
    "BrokerInfo",
    "ClientClosedError",
    "ClientError",
    "ClusterDescription",
    "CommitFailedError",
    "ConfigEntry",
    "ConfigError",
    "ConfigResource",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerProtocolError",
    "ConsumerRecord",
    "GroupDescription",
    "GroupListing",
    "ListOffsetsResult",
    "LogDirDescription",
    "MemberDescription",
    "NewTopic",
    "OffsetAndMetadata",
    "PartialFailureError",
    "PartitionInfo",
    "PartitionReassignment",
    "Producer",
    "ProducerState",
    "QuorumInfo",
    "QuorumReplica",
    "RebalanceListener",
    "RecordMetadata",
    "RequestTimeoutError",
    "TopicInfo",
    "TopicPartition",
    "TransactionDescription",
    "TransactionListing",
    "UnsupportedApiError",
    "WakeupError",
]
