"""confluent-kafka (librdkafka) against a real broker: admin, produce, consume, offsets, configs."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from interop_broker import BrokerProcess
from interop_data import (
    BROKER_CONFIG_REFUSAL_IDS,
    BROKER_CONFIG_REFUSALS,
    CODECS,
    KERBEROS_RELOGIN,
    Got,
    Rec,
    assert_read_back,
    base_timestamp,
    make_records,
    offset_at_or_after,
    wait_until,
)

TIMEOUT = 20.0


def admin_for(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create_topic(
    broker: BrokerProcess, name: str, partitions: int, config: dict[str, str] | None = None
) -> None:
    # The admin client must outlive its futures: its handle is destroyed with it.
    admin = admin_for(broker)
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
        operation_timeout=TIMEOUT,
    )
    futures[name].result(TIMEOUT)


# A delivery report: the KafkaError of a failed record, or a stored one's (partition, offset).
DeliveryReport = KafkaError | tuple[int, int]


def produce_reports(
    broker: BrokerProcess,
    topic: str,
    records: Sequence[Rec],
    *,
    topic_known: bool = False,
    **config: object,
) -> list[DeliveryReport]:
    """Writes `records` with one producer (`config` added to or overriding its defaults) and
    flushes it; returns every record's delivery report, in order, failed ones included.

    `topic_known`: the producer loads the topic's metadata before the first record, so that
    each record goes straight to its partition's queue and waits out `linger.ms` there.
    Otherwise librdkafka holds the records it cannot place yet and moves them to the
    partition one at a time once the metadata arrives; during flush() (no linger) its
    broker thread may send each moved record on its own, so records meant for one batch
    can travel in several (seen on a loaded CI machine)."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, **config})
    if topic_known:
        await_partitions(producer, topic, {r.partition for r in records if r.partition is not None})
    reports: dict[int, DeliveryReport] = {}

    def on_delivery(index: int) -> object:
        def report(err: KafkaError | None, msg: Message) -> None:
            reports[index] = err if err is not None else (msg.partition(), msg.offset())

        return report

    for index, rec in enumerate(records):
        producer.produce(
            topic,
            value=rec.value,
            key=rec.key,
            partition=rec.partition,
            timestamp=rec.timestamp or 0,
            headers=list(rec.headers) or None,
            on_delivery=on_delivery(index),
        )
    assert producer.flush(TIMEOUT) == 0, "records still queued after flush"
    return [reports[i] for i in range(len(records))]


def await_partitions(producer: Producer, topic: str, partitions: set[int]) -> None:
    """Waits until `producer`'s metadata has a leader for each of `partitions` of `topic`."""

    def led() -> bool:
        found = producer.list_topics(topic, timeout=TIMEOUT).topics.get(topic)
        if found is None or found.error is not None:
            return False
        return all(p in found.partitions and found.partitions[p].leader >= 0 for p in partitions)

    wait_until(led, f"a leader for {topic} {sorted(partitions)}", TIMEOUT)


def produce(
    broker: BrokerProcess, topic: str, records: Sequence[Rec], **config: object
) -> list[tuple[int, int]]:
    """Writes `records`, every one of which must be delivered; returns the (partition, offset)
    each delivery report gave, in order."""
    reports = produce_reports(broker, topic, records, **config)
    errors = {i: r for i, r in enumerate(reports) if isinstance(r, KafkaError)}
    assert not errors, f"delivery failed: {errors}"
    return [r for r in reports if not isinstance(r, KafkaError)]


def consumer_for(broker: BrokerProcess, **config: object) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"it-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **config,
        }
    )


def to_got(msg: Message) -> Got:
    assert msg.error() is None, msg.error()
    headers = tuple(msg.headers() or ())
    return Got(msg.partition(), msg.offset(), msg.timestamp()[1], msg.key(), msg.value(), headers)


def poll_n(consumer: Consumer, count: int) -> list[Got]:
    """Reads until `count` records arrived or nothing more comes for a while."""
    got: list[Got] = []
    idle = 0
    while len(got) < count and idle < 20:
        batch = consumer.consume(count - len(got), timeout=0.5)
        idle = 0 if batch else idle + 1
        for msg in batch:
            if msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF:
                continue
            got.append(to_got(msg))
    return got


def read(
    broker: BrokerProcess, topic: str, partitions: int, count: int, start: int = 0
) -> list[Got]:
    consumer = consumer_for(broker)
    try:
        consumer.assign([TopicPartition(topic, p, start) for p in range(partitions)])
        return poll_n(consumer, count)
    finally:
        consumer.close()


def test_create_topic_and_metadata(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, 3)
    metadata = admin_for(broker).list_topics(topic_name, timeout=TIMEOUT)
    assert len(metadata.brokers) == 1
    (node,) = metadata.brokers.values()
    assert (node.host, node.port) == ("127.0.0.1", broker.port)
    topic = metadata.topics[topic_name]
    assert topic.error is None
    assert sorted(topic.partitions) == [0, 1, 2]
    for partition in topic.partitions.values():
        assert partition.error is None
        assert partition.leader == node.id
        assert list(partition.replicas) == [node.id]
        assert list(partition.isrs) == [node.id]


def test_create_existing_topic_is_refused(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, 1)
    admin = admin_for(broker)
    futures = admin.create_topics([NewTopic(topic_name, 1, 1)])
    with pytest.raises(Exception) as caught:
        futures[topic_name].result(TIMEOUT)
    assert caught.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS


@pytest.mark.parametrize("idempotence", [False, True], ids=["plain", "idempotent"])
@pytest.mark.parametrize("codec", CODECS)
def test_produce_and_read_back(
    broker: BrokerProcess, topic_name: str, codec: str, idempotence: bool
) -> None:
    create_topic(broker, topic_name, 3)
    records = make_records(15, seed=11, partitions=3, base_timestamp=base_timestamp())
    acks = "all" if idempotence else "1"
    delivered = produce(
        broker,
        topic_name,
        records,
        **{"compression.type": codec, "enable.idempotence": idempotence, "acks": acks},
    )
    assert delivered == [(i % 3, i // 3) for i in range(15)]
    assert_read_back(records, read(broker, topic_name, 3, len(records)))


def test_read_from_offset(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, 1)
    records = make_records(10, seed=12, base_timestamp=base_timestamp())
    produce(broker, topic_name, records)
    assert_read_back(records[6:], read(broker, topic_name, 1, 4, start=6), first_offset=6)


def test_watermarks_and_list_offsets(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, 2)
    records = make_records(9, seed=13, partitions=2, base_timestamp=base_timestamp())
    produce(broker, topic_name, records, **{"compression.type": "lz4"})
    consumer = consumer_for(broker)
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic_name, 0), TIMEOUT) == (0, 5)
        assert consumer.get_watermark_offsets(TopicPartition(topic_name, 1), TIMEOUT) == (0, 4)
    finally:
        consumer.close()
    admin = admin_for(broker)
    for spec, expected in (
        (OffsetSpec.earliest(), {0: 0, 1: 0}),
        (OffsetSpec.latest(), {0: 5, 1: 4}),
    ):
        futures = admin.list_offsets({TopicPartition(topic_name, p): spec for p in (0, 1)})
        answer = {tp.partition: f.result(TIMEOUT).offset for tp, f in futures.items()}
        assert answer == expected


def test_offsets_for_times(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, 2)
    records = make_records(12, seed=14, partitions=2, base_timestamp=base_timestamp())
    produce(broker, topic_name, records, **{"compression.type": "gzip"})
    target = records[7].timestamp  # partition 1, its 4th record
    assert target is not None
    consumer = consumer_for(broker)
    try:
        # librdkafka keeps one query per partition and call (the last), so each call asks
        # about a partition once.
        answers = consumer.offsets_for_times(
            [
                TopicPartition(topic_name, 1, target - 5),  # between records 5 and 7
                TopicPartition(topic_name, 0, 0),  # before everything: the first offset
            ],
            TIMEOUT,
        )
        answers.insert(
            1, consumer.offsets_for_times([TopicPartition(topic_name, 1, target)], TIMEOUT)[0]
        )
        answers += consumer.offsets_for_times(
            [TopicPartition(topic_name, 0, target + 10_000)],
            TIMEOUT,  # after everything
        )
        assert [a.error for a in answers] == [None] * 4
        assert answers[0].offset == offset_at_or_after(records, 1, target - 5) == 3
        assert answers[1].offset == 3
        assert answers[2].offset == 0
        # Kafka answers -1 when no record has a timestamp at or after the one asked for.
        assert answers[3].offset == -1
        # Reading from the offset found yields the record with that timestamp.
        consumer.assign([TopicPartition(topic_name, 1, answers[0].offset)])
        got = poll_n(consumer, 3)
    finally:
        consumer.close()
    assert_read_back(records[7::2], got, first_offset=3)
    admin = admin_for(broker)
    futures = admin.list_offsets(
        {TopicPartition(topic_name, 1): OffsetSpec.for_timestamp(target - 5)}
    )
    assert next(iter(futures.values())).result(TIMEOUT).offset == 3


def describe_topic_configs(broker: BrokerProcess, topic: str) -> dict[str, str | None]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    admin = admin_for(broker)
    futures = admin.describe_configs([resource])
    entries = next(iter(futures.values())).result(TIMEOUT)
    return {name: entry.value for name, entry in entries.items()}


def test_describe_and_alter_configs(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, 1, {"retention.ms": "3600000"})
    assert describe_topic_configs(broker, topic_name)["retention.ms"] == "3600000"
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic_name,
        incremental_configs=[
            ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin = admin_for(broker)
    futures = admin.incremental_alter_configs([resource])
    next(iter(futures.values())).result(TIMEOUT)
    assert describe_topic_configs(broker, topic_name)["retention.ms"] == "7200000"


def test_describe_configs_lists_defaults(broker: BrokerProcess, topic_name: str) -> None:
    """Like Kafka, DescribeConfigs answers every topic config, defaults included."""
    create_topic(broker, topic_name, 1)
    configs = describe_topic_configs(broker, topic_name)
    assert configs.get("cleanup.policy") == "delete"
    assert configs.get("retention.ms") == "604800000"


def test_create_partitions(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, 1)
    admin = admin_for(broker)
    futures = admin.create_partitions([NewPartitions(topic_name, 3)])
    futures[topic_name].result(TIMEOUT)

    def partitions() -> int:
        return len(admin.list_topics(topic_name, timeout=TIMEOUT).topics[topic_name].partitions)

    wait_until(lambda: partitions() == 3, "3 partitions in metadata")
    records = make_records(6, seed=15, partitions=3, base_timestamp=base_timestamp())
    assert produce(broker, topic_name, records) == [(i % 3, i // 3) for i in range(6)]
    assert_read_back(records, read(broker, topic_name, 3, len(records)))


def test_delete_topic(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, 2)
    produce(broker, topic_name, make_records(4, seed=16, partitions=2))
    admin = admin_for(broker)
    assert topic_name in admin.list_topics(timeout=TIMEOUT).topics
    admin.delete_topics([topic_name], operation_timeout=TIMEOUT)[topic_name].result(TIMEOUT)
    wait_until(
        lambda: topic_name not in admin.list_topics(timeout=TIMEOUT).topics, "topic to disappear"
    )


def test_group_consumer_commits(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, 2)
    records = make_records(10, seed=17, partitions=2, base_timestamp=base_timestamp())
    produce(broker, topic_name, records)
    group = f"it-group-{uuid.uuid4().hex[:8]}"
    # Kafka's smallest session timeout: a new group then forms in seconds on every broker.
    consumer = consumer_for(broker, **{"group.id": group, "session.timeout.ms": 6000})
    try:
        consumer.subscribe([topic_name])
        got = poll_n(consumer, len(records))
        assert_read_back(records, got)
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(topic_name, p) for p in (0, 1)], TIMEOUT)
    finally:
        consumer.close()
    assert {tp.partition: tp.offset for tp in committed} == {0: 5, 1: 5}


def _broker_configs(admin: AdminClient) -> dict[str, str | None]:
    futures = admin.describe_configs([ConfigResource(ResourceType.BROKER, "1")])
    entries = next(iter(futures.values())).result(TIMEOUT)
    return {name: entry.value for name, entry in entries.items()}


def test_alter_kafka_broker_config_without_effect(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    assert _broker_configs(admin)[KERBEROS_RELOGIN] == "60000"
    legacy = ConfigResource(ResourceType.BROKER, "1", set_config={KERBEROS_RELOGIN: "120000"})
    next(iter(admin.alter_configs([legacy]).values())).result(TIMEOUT)
    assert _broker_configs(admin)[KERBEROS_RELOGIN] == "120000"
    incremental = ConfigResource(
        ResourceType.BROKER,
        "1",
        incremental_configs=[
            ConfigEntry(KERBEROS_RELOGIN, "90000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    next(iter(admin.incremental_alter_configs([incremental]).values())).result(TIMEOUT)
    assert _broker_configs(admin)[KERBEROS_RELOGIN] == "90000"


@pytest.mark.parametrize(
    ("name", "value", "error"), BROKER_CONFIG_REFUSALS, ids=BROKER_CONFIG_REFUSAL_IDS
)
def test_alter_broker_config_refusals(
    broker: BrokerProcess, name: str, value: str, error: int
) -> None:
    admin = admin_for(broker)
    resource = ConfigResource(
        ResourceType.BROKER,
        "1",
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )
    future = next(iter(admin.incremental_alter_configs([resource]).values()))
    with pytest.raises(KafkaException) as refused:
        future.result(TIMEOUT)
    assert refused.value.args[0].code() == error
