"""tidelog.metadata: cluster metadata as a log of records, and the single-node controller.

Modules: ``configs`` (broker and topic configuration: definitions, layering, describe,
validation), ``records`` (metadata record types and their encoding), ``image`` (the
immutable MetadataImage and the delta of each change), ``log`` (the metadata log on
disk), ``loader`` (committed batches to images, deltas and publishers),
``meta_properties`` (cluster and node identity of each log dir), ``controller`` (admin
operations as records to commit, split by concern, and the commit path) and ``node``
(builds log, loader and controller from a config and a runtime). See
``docs/metadata.md`` and ``docs/configuration.md``.

Typical start of a broker::

    config = BrokerConfig.load("server.properties", overrides)
    node = build_metadata_node(config, Runtime.system())
    node.loader.add_publisher(on_metadata_change)   # (image, delta) after each change
"""

from tidelog.metadata.configs import (
    BROKER_CONFIGS,
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigEntry,
    ConfigResourceType,
    ConfigSource,
    ConfigSynonym,
    ConfigType,
    Endpoint,
    describe_broker_configs,
    describe_topic_configs,
    topic_log_config,
    validate_topic_configs,
)
from tidelog.metadata.controller import (
    AlterConfigOp,
    AlterConfigsResource,
    ConfigResourceResult,
    Controller,
    CreatePartitionsResult,
    CreateTopicResult,
    DeleteTopicResult,
    DescribeConfigsResource,
    DescribeConfigsResult,
    IncrementalAlterConfigsResource,
    NewPartitions,
    NewTopic,
    ProducerIdBlock,
    describe_configs,
    validate_topic_name,
)
from tidelog.metadata.errors import (
    ApiError,
    ConfigError,
    MetadataError,
    MetadataRecordError,
    MetadataReplayError,
    MetaPropertiesError,
)
from tidelog.metadata.image import (
    BrokerRegistration,
    MetadataDelta,
    MetadataImage,
    PartitionImage,
    TopicImage,
)
from tidelog.metadata.loader import MetadataLoader
from tidelog.metadata.log import METADATA_TOPIC, MetadataBatch, MetadataLog
from tidelog.metadata.node import MetadataNode, build_metadata_node

__all__ = [
    "BROKER_CONFIGS",
    "METADATA_TOPIC",
    "TOPIC_CONFIGS",
    "AlterConfigOp",
    "AlterConfigsResource",
    "ApiError",
    "BrokerConfig",
    "BrokerRegistration",
    "ConfigEntry",
    "ConfigError",
    "ConfigResourceResult",
    "ConfigResourceType",
    "ConfigSource",
    "ConfigSynonym",
    "ConfigType",
    "Controller",
    "CreatePartitionsResult",
    "CreateTopicResult",
    "DeleteTopicResult",
    "DescribeConfigsResource",
    "DescribeConfigsResult",
    "Endpoint",
    "IncrementalAlterConfigsResource",
    "MetaPropertiesError",
    "MetadataBatch",
    "MetadataDelta",
    "MetadataError",
    "MetadataImage",
    "MetadataLoader",
    "MetadataLog",
    "MetadataNode",
    "MetadataRecordError",
    "MetadataReplayError",
    "NewPartitions",
    "NewTopic",
    "PartitionImage",
    "ProducerIdBlock",
    "TopicImage",
    "build_metadata_node",
    "describe_broker_configs",
    "describe_configs",
    "describe_topic_configs",
    "topic_log_config",
    "validate_topic_configs",
    "validate_topic_name",
]
