"""The single-node controller: every operation, every error path, and restarts."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from metadata_helpers import ControllerFactory

from tidelog.metadata.configs import ConfigResourceType, ConfigSource
from tidelog.metadata.controller import (
    MAX_RECORDS_PER_BATCH,
    PRODUCER_ID_BLOCK_SIZE,
    AlterConfigOp,
    AlterConfigsResource,
    Controller,
    DescribeConfigsResource,
    IncrementalAlterConfigsResource,
    NewPartitions,
    NewTopic,
    validate_topic_name,
)
from tidelog.metadata.errors import ApiError
from tidelog.metadata.image import MetadataDelta, MetadataImage
from tidelog.metadata.log import MetadataLog
from tidelog.protocol.error_codes import ErrorCode

TOPIC = ConfigResourceType.TOPIC
BROKER = ConfigResourceType.BROKER
SET, DELETE, APPEND, SUBTRACT = (
    AlterConfigOp.SET,
    AlterConfigOp.DELETE,
    AlterConfigOp.APPEND,
    AlterConfigOp.SUBTRACT,
)


def codes(results: list) -> list[ErrorCode]:  # type: ignore[type-arg]
    return [r.error.code for r in results]


# -- start -------------------------------------------------------------------------------------


def test_start_registers_broker_and_writes_meta_properties(
    controller: Controller, data_dir: Path
) -> None:
    image = controller.image
    assert image.cluster_id is not None and len(image.cluster_id) == 22
    assert (data_dir / "meta.properties").exists()
    registration = image.brokers[1]
    assert registration.epoch == controller.broker_epoch == 0
    assert [(e.name, e.host, e.port) for e in registration.endpoints] == [
        ("PLAINTEXT", "127.0.0.1", 9092)
    ]
    assert (data_dir / "__cluster_metadata-0").is_dir()


def test_restart_gives_same_image(start_controller: ControllerFactory) -> None:
    first = start_controller()
    created = first.create_topics([NewTopic("a", 3, configs={"retention.ms": "60000"})])
    first.incremental_alter_configs(
        [IncrementalAlterConfigsResource(BROKER, "", [("num.partitions", SET, "4")])]
    )
    block = first.allocate_producer_ids(1, first.broker_epoch)
    first.delete_topics(["a"])
    first.create_topics([NewTopic("a"), NewTopic("b", 2)])
    before = first.image
    first.close()

    second = start_controller()
    after = second.image
    assert after.cluster_id == before.cluster_id
    assert after.topics_by_name == before.topics_by_name
    assert after.topic("a").topic_id != created[0].topic_id  # type: ignore[union-attr]
    assert after.topic_configs == before.topic_configs
    assert after.broker_configs == before.broker_configs
    assert after.next_producer_id == before.next_producer_id
    # The restart registered again: a new epoch, the old one is stale.
    assert second.broker_epoch > first.broker_epoch
    assert second.config.num_partitions == 4
    assert after.topic("b").num_partitions == 2  # type: ignore[union-attr]
    again = second.allocate_producer_ids(1, second.broker_epoch)
    assert again.first_producer_id == block.first_producer_id + PRODUCER_ID_BLOCK_SIZE


def test_restart_with_torn_metadata_tail(
    start_controller: ControllerFactory, data_dir: Path
) -> None:
    first = start_controller()
    first.create_topics([NewTopic("kept")])
    first.create_topics([NewTopic("torn", 2)])
    first.close()
    segment = data_dir / "__cluster_metadata-0" / "00000000000000000000.log"
    with open(segment, "r+b") as file:
        file.truncate(segment.stat().st_size - 3)
    second = start_controller()
    assert second.image.topic("kept") is not None
    assert second.image.topic("torn") is None
    assert codes(second.create_topics([NewTopic("torn")])) == [ErrorCode.NONE]


def test_listeners_get_image_and_delta(controller: Controller) -> None:
    seen: list[tuple[MetadataImage, MetadataDelta]] = []
    controller.add_listener(lambda image, delta: seen.append((image, delta)))
    controller.create_topics([NewTopic("a", 2)])
    assert len(seen) == 1
    image, delta = seen[0]
    assert image is controller.image
    assert delta.created_partitions == (("a", 0), ("a", 1))


def test_failing_listener_does_not_fail_the_operation(controller: Controller) -> None:
    def broken(image: MetadataImage, delta: MetadataDelta) -> None:
        raise RuntimeError("boom")

    controller.add_listener(broken)
    assert codes(controller.create_topics([NewTopic("a")])) == [ErrorCode.NONE]


# -- create topics -----------------------------------------------------------------------------


def test_create_topic_defaults(start_controller: ControllerFactory) -> None:
    controller = start_controller(num_partitions="3")
    [result] = controller.create_topics([NewTopic("orders")])
    assert result.error.code is ErrorCode.NONE and result.topic_id is not None
    assert (result.num_partitions, result.replication_factor) == (3, 1)
    topic = controller.image.topic("orders")
    assert topic is not None and topic.topic_id == result.topic_id
    for p in range(3):
        part = controller.image.partition("orders", p)
        assert part is not None
        assert (part.replicas, part.isr, part.leader, part.leader_epoch) == ((1,), (1,), 1, 0)
    configs = {entry.name: entry for entry in result.configs}
    assert configs["retention.ms"].config_source is ConfigSource.DEFAULT_CONFIG


def test_create_topic_with_configs(controller: Controller) -> None:
    [result] = controller.create_topics(
        [NewTopic("c", 1, 1, configs={"cleanup.policy": "compact", "segment.bytes": "4096"})]
    )
    assert result.error.code is ErrorCode.NONE
    assert controller.image.topic_config("c") == {
        "cleanup.policy": "compact",
        "segment.bytes": "4096",
    }
    configs = {entry.name: entry for entry in result.configs}
    assert configs["cleanup.policy"].value == "compact"
    assert configs["cleanup.policy"].config_source is ConfigSource.TOPIC_CONFIG


def test_create_validate_only_writes_nothing(controller: Controller) -> None:
    end = controller.metadata_log.end_offset
    [result] = controller.create_topics([NewTopic("v", 4)], validate_only=True)
    assert result.error.code is ErrorCode.NONE and result.num_partitions == 4
    assert result.topic_id is None
    assert controller.image.topic("v") is None
    assert controller.metadata_log.end_offset == end
    [bad] = controller.create_topics([NewTopic("v", 0)], validate_only=True)
    assert bad.error.code is ErrorCode.INVALID_PARTITIONS


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("a", True),
        ("A.b_c-9", True),
        ("x" * 249, True),
        ("", False),
        (".", False),
        ("..", False),
        ("x" * 250, False),
        ("with space", False),
        ("slash/", False),
        ("ünïcode", False),
        ("__cluster_metadata", False),
    ],
)
def test_topic_names(name: str, ok: bool) -> None:
    error = validate_topic_name(name)
    assert (error is None) == ok
    if error is not None:
        assert error.code is ErrorCode.INVALID_TOPIC_EXCEPTION and error.message


def test_create_topic_errors(controller: Controller) -> None:
    controller.create_topics([NewTopic("exists"), NewTopic("dot.name")])
    requests = [
        NewTopic("bad name"),
        NewTopic("exists"),
        NewTopic("dot_name"),
        NewTopic("dup"),
        NewTopic("dup"),
        NewTopic("p0", 0),
        NewTopic("p-2", -2),
        NewTopic("rf0", 1, 0),
        NewTopic("rf-5", 1, -5),
        NewTopic("rf2", 1, 2),
        NewTopic("cfg", configs={"retention.ms": "never"}),
        NewTopic("cfg2", configs={"no.such.config": "1"}),
        NewTopic("cfg3", configs={"retention.ms": None}),
        NewTopic("huge", MAX_RECORDS_PER_BATCH + 1),
        NewTopic("fine"),
    ]
    results = controller.create_topics(requests)
    assert codes(results) == [
        ErrorCode.INVALID_TOPIC_EXCEPTION,
        ErrorCode.TOPIC_ALREADY_EXISTS,
        ErrorCode.INVALID_TOPIC_EXCEPTION,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_PARTITIONS,
        ErrorCode.INVALID_PARTITIONS,
        ErrorCode.INVALID_REPLICATION_FACTOR,
        ErrorCode.INVALID_REPLICATION_FACTOR,
        ErrorCode.INVALID_REPLICATION_FACTOR,
        ErrorCode.INVALID_CONFIG,
        ErrorCode.INVALID_CONFIG,
        ErrorCode.INVALID_CONFIG,
        ErrorCode.INVALID_PARTITIONS,
        ErrorCode.NONE,
    ]
    assert all(r.error.message for r in results[:-1])
    assert "dot.name" in (results[2].error.message or "")
    assert set(controller.image.topics_by_name) == {"exists", "dot.name", "fine"}


def test_collision_inside_one_request(controller: Controller) -> None:
    results = controller.create_topics([NewTopic("a.b"), NewTopic("a_b")])
    assert codes(results) == [ErrorCode.NONE, ErrorCode.INVALID_TOPIC_EXCEPTION]


def test_default_replication_factor_too_large(start_controller: ControllerFactory) -> None:
    controller = start_controller(default_replication_factor="3")
    [result] = controller.create_topics([NewTopic("a")])
    assert result.error.code is ErrorCode.INVALID_REPLICATION_FACTOR


def test_explicit_assignments(controller: Controller) -> None:
    results = controller.create_topics(
        [
            NewTopic("ok", assignments={0: [1], 1: [1]}),
            NewTopic("both", 2, assignments={0: [1]}),
            NewTopic("gap", assignments={0: [1], 2: [1]}),
            NewTopic("empty", assignments={0: []}),
            NewTopic("twice", assignments={0: [1, 1]}),
            NewTopic("unknown", assignments={0: [7]}),
        ]
    )
    assert codes(results) == [
        ErrorCode.NONE,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
    ]
    assert controller.image.topic("ok").num_partitions == 2  # type: ignore[union-attr]


def test_many_topics_are_split_into_bounded_batches(controller: Controller) -> None:
    count = 4
    partitions = MAX_RECORDS_PER_BATCH // 2
    results = controller.create_topics([NewTopic(f"t{i}", partitions) for i in range(count)])
    assert codes(results) == [ErrorCode.NONE] * count
    batches = list(controller.metadata_log.read_batches())
    assert max(len(batch) for batch in batches) <= MAX_RECORDS_PER_BATCH
    assert all(controller.image.topic(f"t{i}").num_partitions == partitions for i in range(count))  # type: ignore[union-attr]


# -- auto-create -------------------------------------------------------------------------------


def test_auto_create(start_controller: ControllerFactory) -> None:
    controller = start_controller(num_partitions="2")
    result = controller.auto_create_topic("auto")
    assert result.error.code is ErrorCode.NONE and result.num_partitions == 2
    assert controller.auto_create_topic("auto").error.code is ErrorCode.TOPIC_ALREADY_EXISTS
    assert controller.auto_create_topic("bad name").error.code is ErrorCode.INVALID_TOPIC_EXCEPTION


def test_auto_create_disabled_but_internal_topics_created(
    start_controller: ControllerFactory,
) -> None:
    controller = start_controller(
        auto_create_topics_enable="false", offsets_topic_num_partitions="5"
    )
    assert controller.auto_create_topic("x").error.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    offsets = controller.auto_create_topic("__consumer_offsets")
    assert offsets.error.code is ErrorCode.NONE and offsets.num_partitions == 5
    assert controller.image.topic_config("__consumer_offsets")["cleanup.policy"] == "compact"
    txn = controller.auto_create_topic("__transaction_state")
    assert txn.error.code is ErrorCode.NONE and txn.num_partitions == 50


# -- delete topics -----------------------------------------------------------------------------


def test_delete_by_name_and_id(controller: Controller) -> None:
    created = controller.create_topics([NewTopic("a"), NewTopic("b"), NewTopic("c")])
    b_id = created[1].topic_id
    assert b_id is not None
    results = controller.delete_topics(["a", "missing"], [b_id, uuid.uuid4()])
    assert codes(results) == [
        ErrorCode.NONE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NONE,
        ErrorCode.UNKNOWN_TOPIC_ID,
    ]
    assert results[2].name == "b" and results[0].topic_id == created[0].topic_id
    assert set(controller.image.topics_by_name) == {"c"}


def test_delete_duplicates(controller: Controller) -> None:
    created = controller.create_topics([NewTopic("a"), NewTopic("b")])
    results = controller.delete_topics(["a", "a"])
    assert codes(results) == [ErrorCode.INVALID_REQUEST] * 2
    b_id = created[1].topic_id
    assert b_id is not None
    results = controller.delete_topics(["b"], [b_id])
    assert codes(results) == [ErrorCode.INVALID_REQUEST] * 2
    assert set(controller.image.topics_by_name) == {"a", "b"}


def test_delete_disabled(start_controller: ControllerFactory) -> None:
    controller = start_controller(delete_topic_enable="false")
    controller.create_topics([NewTopic("a")])
    assert codes(controller.delete_topics(["a"])) == [ErrorCode.TOPIC_DELETION_DISABLED]
    assert controller.image.topic("a") is not None


# -- create partitions -------------------------------------------------------------------------


def test_create_partitions(controller: Controller) -> None:
    controller.create_topics([NewTopic("a", 2), NewTopic("b", 1)])
    results = controller.create_partitions(
        [
            NewPartitions("a", 4),
            NewPartitions("b", 3, [[1], [1]]),
            NewPartitions("missing", 3),
        ]
    )
    assert codes(results) == [ErrorCode.NONE, ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    assert controller.image.topic("a").num_partitions == 4  # type: ignore[union-attr]
    assert controller.image.topic("b").num_partitions == 3  # type: ignore[union-attr]


def test_create_partitions_errors(controller: Controller) -> None:
    controller.create_topics([NewTopic("a", 3)])
    requests = [
        NewPartitions("a", 2),
        NewPartitions("a", 3),
    ]
    assert codes(controller.create_partitions(requests)) == [ErrorCode.INVALID_REQUEST] * 2
    cases = [
        (NewPartitions("a", 2), ErrorCode.INVALID_PARTITIONS),
        (NewPartitions("a", 3), ErrorCode.INVALID_PARTITIONS),
        (NewPartitions("a", 5, [[1]]), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (NewPartitions("a", 4, [[9]]), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (NewPartitions("a", 4, [[]]), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (NewPartitions("a", 4, [[1, 1]]), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (NewPartitions("a", 3 + MAX_RECORDS_PER_BATCH + 1), ErrorCode.INVALID_PARTITIONS),
    ]
    for request, code in cases:
        [result] = controller.create_partitions([request])
        assert result.error.code is code, request
        assert result.error.message
    assert controller.image.topic("a").num_partitions == 3  # type: ignore[union-attr]


def test_create_partitions_validate_only(controller: Controller) -> None:
    controller.create_topics([NewTopic("a", 1)])
    [result] = controller.create_partitions([NewPartitions("a", 5)], validate_only=True)
    assert result.error.code is ErrorCode.NONE
    assert controller.image.topic("a").num_partitions == 1  # type: ignore[union-attr]


# -- configs -----------------------------------------------------------------------------------


def test_alter_configs_replaces_all(controller: Controller) -> None:
    controller.create_topics(
        [NewTopic("a", configs={"retention.ms": "1", "segment.bytes": "4096"})]
    )
    results = controller.alter_configs(
        [AlterConfigsResource(TOPIC, "a", {"retention.ms": "2", "flush.messages": "10"})]
    )
    assert codes(results) == [ErrorCode.NONE]
    assert controller.image.topic_config("a") == {"retention.ms": "2", "flush.messages": "10"}


def test_alter_configs_errors(controller: Controller) -> None:
    controller.create_topics([NewTopic("a")])
    results = controller.alter_configs(
        [
            AlterConfigsResource(TOPIC, "missing", {"retention.ms": "1"}),
            AlterConfigsResource(TOPIC, "a", {"retention.ms": "x"}),
            AlterConfigsResource(BROKER, "abc", {}),
            AlterConfigsResource(ConfigResourceType.BROKER_LOGGER, "1", {}),
            AlterConfigsResource(BROKER, "", {"listeners": "PLAINTEXT://h:1"}),
            AlterConfigsResource(BROKER, "1", {"num.partitions": None}),
        ]
    )
    assert codes(results) == [
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.INVALID_CONFIG,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_REQUEST,
        # A read-only broker key: Kafka's broker-side check answers INVALID_REQUEST.
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_REQUEST,
    ]
    dup = controller.alter_configs(
        [AlterConfigsResource(TOPIC, "a", {}), AlterConfigsResource(TOPIC, "a", {})]
    )
    assert codes(dup) == [ErrorCode.INVALID_REQUEST] * 2


def test_alter_configs_validate_only(controller: Controller) -> None:
    controller.create_topics([NewTopic("a")])
    results = controller.alter_configs(
        [AlterConfigsResource(TOPIC, "a", {"retention.ms": "5"})], validate_only=True
    )
    assert codes(results) == [ErrorCode.NONE]
    assert controller.image.topic_config("a") == {}


def test_incremental_alter_topic(controller: Controller) -> None:
    controller.create_topics([NewTopic("a", configs={"segment.bytes": "4096"})])
    ops = [
        ("retention.ms", SET, "100"),
        ("segment.bytes", DELETE, None),
        ("cleanup.policy", APPEND, "compact"),
    ]
    results = controller.incremental_alter_configs(
        [IncrementalAlterConfigsResource(TOPIC, "a", ops)]
    )
    assert codes(results) == [ErrorCode.NONE]
    assert controller.image.topic_config("a") == {
        "retention.ms": "100",
        "cleanup.policy": "delete,compact",
    }
    results = controller.incremental_alter_configs(
        [IncrementalAlterConfigsResource(TOPIC, "a", [("cleanup.policy", SUBTRACT, "delete")])]
    )
    assert codes(results) == [ErrorCode.NONE]
    assert controller.image.topic_config("a")["cleanup.policy"] == "compact"
    # Subtracting the last item leaves an empty list, which is not a valid policy.
    results = controller.incremental_alter_configs(
        [IncrementalAlterConfigsResource(TOPIC, "a", [("cleanup.policy", SUBTRACT, "compact")])]
    )
    assert codes(results) == [ErrorCode.INVALID_CONFIG]


def test_incremental_alter_errors(controller: Controller) -> None:
    controller.create_topics([NewTopic("a")])
    cases = [
        ([("retention.ms", APPEND, "1")], ErrorCode.INVALID_CONFIG),
        ([("retention.ms", SUBTRACT, "1")], ErrorCode.INVALID_CONFIG),
        ([("nope", SET, "1")], ErrorCode.INVALID_CONFIG),
        ([("retention.ms", SET, None)], ErrorCode.INVALID_REQUEST),
        ([("retention.ms", SET, "1"), ("retention.ms", DELETE, None)], ErrorCode.INVALID_REQUEST),
        ([("retention.ms", 9, "1")], ErrorCode.INVALID_REQUEST),
        ([("retention.ms", SET, "-7")], ErrorCode.INVALID_CONFIG),
    ]
    for changes, code in cases:
        [result] = controller.incremental_alter_configs(
            [IncrementalAlterConfigsResource(TOPIC, "a", changes)]
        )
        assert result.error.code is code, changes
    assert controller.image.topic_config("a") == {}
    [missing] = controller.incremental_alter_configs(
        [IncrementalAlterConfigsResource(TOPIC, "zz", [("retention.ms", SET, "1")])]
    )
    assert missing.error.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_incremental_alter_validate_only(controller: Controller) -> None:
    controller.create_topics([NewTopic("a")])
    [result] = controller.incremental_alter_configs(
        [IncrementalAlterConfigsResource(TOPIC, "a", [("retention.ms", SET, "9")])],
        validate_only=True,
    )
    assert result.error.code is ErrorCode.NONE
    assert controller.image.topic_config("a") == {}


def test_dynamic_broker_configs(controller: Controller) -> None:
    results = controller.incremental_alter_configs(
        [
            IncrementalAlterConfigsResource(BROKER, "", [("log.retention.ms", SET, "5000")]),
            IncrementalAlterConfigsResource(BROKER, "1", [("num.partitions", SET, "6")]),
        ]
    )
    assert codes(results) == [ErrorCode.NONE, ErrorCode.NONE]
    assert controller.config.num_partitions == 6
    assert controller.config.log_retention_ms == 5000
    controller.create_topics([NewTopic("a")])
    assert controller.image.topic("a").num_partitions == 6  # type: ignore[union-attr]
    [entry] = controller.describe_configs(
        [DescribeConfigsResource(TOPIC, "a", ["retention.ms"])], include_synonyms=True
    )[0].entries
    assert entry.value == "5000"
    assert entry.config_source is ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
    results = controller.incremental_alter_configs(
        [IncrementalAlterConfigsResource(BROKER, "", [("log.cleanup.policy", APPEND, "compact")])]
    )
    assert codes(results) == [ErrorCode.NONE]
    assert controller.image.broker_config("") == {
        "log.retention.ms": "5000",
        "log.cleanup.policy": "delete,compact",
    }
    controller.incremental_alter_configs(
        [IncrementalAlterConfigsResource(BROKER, "1", [("num.partitions", DELETE, None)])]
    )
    assert controller.config.num_partitions == 1
    [readonly] = controller.incremental_alter_configs(
        [IncrementalAlterConfigsResource(BROKER, "", [("node.id", SET, "3")])]
    )
    assert readonly.error.code is ErrorCode.INVALID_REQUEST
    assert readonly.error.message == "Cannot update these configs dynamically: Set(node.id)"


def test_describe_configs(controller: Controller) -> None:
    controller.create_topics([NewTopic("a", configs={"retention.ms": "7"})])
    results = controller.describe_configs(
        [
            DescribeConfigsResource(TOPIC, "a"),
            DescribeConfigsResource(TOPIC, "missing"),
            DescribeConfigsResource(BROKER, "1", ["num.partitions"]),
            DescribeConfigsResource(BROKER, ""),
            DescribeConfigsResource(BROKER, "2"),
            DescribeConfigsResource(BROKER, "x"),
            DescribeConfigsResource(ConfigResourceType.BROKER_LOGGER, "1"),
        ],
        include_documentation=True,
    )
    assert codes(results) == [
        ErrorCode.NONE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NONE,
        ErrorCode.NONE,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_REQUEST,
    ]
    topic = {e.name: e for e in results[0].entries}
    assert topic["retention.ms"].value == "7" and topic["retention.ms"].documentation
    assert [e.name for e in results[2].entries] == ["num.partitions"]
    assert len(results[3].entries) > 50


# -- producer ids ------------------------------------------------------------------------------


def test_producer_id_blocks(controller: Controller) -> None:
    first = controller.allocate_producer_ids(1, controller.broker_epoch)
    second = controller.allocate_producer_ids(1)
    assert (first.first_producer_id, first.length) == (0, PRODUCER_ID_BLOCK_SIZE)
    assert second.first_producer_id == PRODUCER_ID_BLOCK_SIZE
    assert controller.image.next_producer_id == 2 * PRODUCER_ID_BLOCK_SIZE
    stale = controller.allocate_producer_ids(1, controller.broker_epoch + 100)
    assert stale.error.code is ErrorCode.STALE_BROKER_EPOCH and stale.length == 0
    unknown = controller.allocate_producer_ids(9)
    assert unknown.error.code is ErrorCode.STALE_BROKER_EPOCH


def test_producer_ids_after_restart_are_new(start_controller: ControllerFactory) -> None:
    seen: set[int] = set()
    for _ in range(3):
        controller = start_controller()
        for _ in range(2):
            block = controller.allocate_producer_ids(1, controller.broker_epoch)
            ids = set(range(block.first_producer_id, block.first_producer_id + block.length))
            assert not ids & seen
            seen |= ids
        controller.close()


# -- failures ----------------------------------------------------------------------------------


def test_failed_metadata_write_fences_the_controller(controller: Controller) -> None:
    log = controller.metadata_log

    def failing_append(records: object, *, leader_epoch: int = 0) -> int:
        raise OSError(28, "No space left on device")

    log.append = failing_append  # type: ignore[method-assign]
    [result] = controller.create_topics([NewTopic("a")])
    assert result.error.code is ErrorCode.KAFKA_STORAGE_ERROR
    assert controller.image.topic("a") is None
    [later] = controller.create_topics([NewTopic("b")])
    assert later.error.code is ErrorCode.UNKNOWN_SERVER_ERROR


def test_replay_of_foreign_log_refuses_to_start(
    start_controller: ControllerFactory, data_dir: Path, clock: object
) -> None:
    start_controller().close()
    log = MetadataLog.open(data_dir, clock=lambda: 0)
    from tidelog.metadata.records import PartitionRecord

    log.append([PartitionRecord(uuid.uuid4(), 0, (1,), (1,), 1)])
    log.close()
    from tidelog.metadata.errors import MetadataReplayError

    with pytest.raises(MetadataReplayError):
        start_controller()


# -- the seams: results, the commit path, the injected runtime ---------------------------------


def test_operations_return_records_and_change_nothing(controller: Controller) -> None:
    import random

    from tidelog.metadata.controller import ControllerView, producer_ids, topics
    from tidelog.metadata.records import PartitionRecord, ProducerIdsRecord, TopicRecord

    view = ControllerView(
        controller.image, controller.config, controller.static_config, random.Random(3)
    )
    end = controller.metadata_log.end_offset
    created = topics.create_topics(view, [NewTopic("a", 2), NewTopic("bad", 0)])
    assert [type(r) for r in created.records] == [TopicRecord, PartitionRecord, PartitionRecord]
    assert [index for index, _ in created.items] == [0]
    assert codes(created.response) == [ErrorCode.NONE, ErrorCode.INVALID_PARTITIONS]
    block = producer_ids.allocate_producer_ids(view, 1)
    assert [type(r) for r in block.records] == [ProducerIdsRecord]
    # Nothing was written or applied: that is the commit path's job.
    assert controller.image is view.image and controller.image.topic("a") is None
    assert controller.metadata_log.end_offset == end
    # A failed commit turns the planned reply into the failure's.
    assert created.failed is not None
    failed = created.failed({0: ApiError(ErrorCode.KAFKA_STORAGE_ERROR, "disk")})
    assert codes(failed) == [ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.INVALID_PARTITIONS]


def test_reply_comes_after_the_records_are_committed_and_loaded(controller: Controller) -> None:
    log = controller.metadata_log
    seen: list[tuple[int, int]] = []
    controller.add_listener(lambda image, delta: seen.append((image.offset, log.end_offset)))
    [result] = controller.create_topics([NewTopic("a", 3)])
    # The publisher saw the image at the log's end: appended (and fsynced) before applied.
    assert seen == [(log.end_offset - 1, log.end_offset)]
    assert result.topic_id == controller.image.topic("a").topic_id  # type: ignore[union-attr]


def test_seeded_runtime_draws_the_same_ids(tmp_path: Path) -> None:
    from tidelog.metadata.configs import BrokerConfig
    from tidelog.metadata.node import build_metadata_node
    from tidelog.runtime.system import Runtime

    def run(name: str, seed: int) -> tuple[uuid.UUID, uuid.UUID | None]:
        config = BrokerConfig({"log.dirs": str(tmp_path / name), "cluster.id": "c" * 22})
        node = build_metadata_node(config, Runtime.seeded(seed, clock=lambda: 1000))
        try:
            [created] = node.controller.create_topics([NewTopic("t")])
            return node.controller.image.brokers[1].incarnation_id, created.topic_id
        finally:
            node.close()

    assert run("one", 7) == run("two", 7)
    assert run("three", 8) != run("one", 7)
