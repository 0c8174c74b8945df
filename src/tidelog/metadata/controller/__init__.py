"""The controller: admin operations checked against the image, committed as records.

Split by concern, as Kafka's controller is: :mod:`.topics` (topics and partitions),
:mod:`.configs` (dynamic configs; describe), :mod:`.producer_ids`, :mod:`.cluster`
(broker registration), :mod:`.scram` (SCRAM credentials), :mod:`.quotas` (client quotas), and for replicas
:mod:`.placement`, :mod:`.leaders`, :mod:`.isr` (AlterPartition), :mod:`.elections`
(ElectLeaders, unclean election, rebalance) and :mod:`.reassignment` (KIP-455). Each is a set of functions from a
:class:`~tidelog.metadata.controller.base.ControllerView` and a request to a
:class:`~tidelog.metadata.controller.base.ControllerResult` (records to commit, reply to
give once committed). :class:`~tidelog.metadata.controller.core.Controller` owns the one
commit path. See ``docs/metadata.md``.
"""

from tidelog.metadata.controller.base import (
    MAX_RECORDS_PER_BATCH,
    ControllerResult,
    ControllerView,
)
from tidelog.metadata.controller.configs import (
    AlterConfigOp,
    AlterConfigsResource,
    ConfigResourceResult,
    DescribeConfigsResource,
    DescribeConfigsResult,
    IncrementalAlterConfigsResource,
    describe_configs,
    effective_broker_config,
)
from tidelog.metadata.controller.core import (
    Controller,
    Listener,
    NotControllerError,
    QuorumCommit,
)
from tidelog.metadata.controller.producer_ids import PRODUCER_ID_BLOCK_SIZE, ProducerIdBlock
from tidelog.metadata.controller.quotas import (
    AlterQuotaResult,
    QuotaAlteration,
    QuotaFilterComponent,
)
from tidelog.metadata.controller.scram import (
    AlterScramResult,
    DescribeScramResult,
    ScramDeletion,
    ScramUpsertion,
)
from tidelog.metadata.controller.topics import (
    INTERNAL_TOPICS,
    OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    CreatePartitionsResult,
    CreateTopicResult,
    DeleteTopicResult,
    NewPartitions,
    NewTopic,
    validate_topic_name,
)

__all__ = [
    "INTERNAL_TOPICS",
    "MAX_RECORDS_PER_BATCH",
    "OFFSETS_TOPIC",
    "PRODUCER_ID_BLOCK_SIZE",
    "TRANSACTION_STATE_TOPIC",
    "AlterConfigOp",
    "AlterConfigsResource",
    "AlterQuotaResult",
    "AlterScramResult",
    "ConfigResourceResult",
    "Controller",
    "ControllerResult",
    "ControllerView",
    "CreatePartitionsResult",
    "CreateTopicResult",
    "DeleteTopicResult",
    "DescribeConfigsResource",
    "DescribeConfigsResult",
    "DescribeScramResult",
    "IncrementalAlterConfigsResource",
    "Listener",
    "NewPartitions",
    "NewTopic",
    "NotControllerError",
    "ProducerIdBlock",
    "QuorumCommit",
    "QuotaAlteration",
    "QuotaFilterComponent",
    "ScramDeletion",
    "ScramUpsertion",
    "describe_configs",
    "effective_broker_config",
    "validate_topic_name",
]
