"""kafka-python against a real broker: admin, produce, consume, offsets, configs, groups."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence

import pytest
from interop_broker import BrokerProcess
from interop_data import (
    BROKER_CONFIG_REFUSAL_IDS,
    BROKER_CONFIG_REFUSALS,
    CODECS,
    INVALID_CONFIG,
    INVALID_REQUEST,
    KERBEROS_RELOGIN,
    Got,
    Rec,
    assert_read_back,
    base_timestamp,
    make_records,
    offset_at_or_after,
    wait_until,
)
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import InvalidConfigurationError, InvalidRequestError, KafkaError
from kafka.producer.future import RecordMetadata

TIMEOUT_MS = 20_000


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=TIMEOUT_MS)
    yield client
    client.close()


def create_topic(
    admin: KafkaAdminClient, name: str, partitions: int, configs: dict[str, str] | None = None
) -> None:
    answer = admin.create_topics(
        {name: {"num_partitions": partitions, "replication_factor": 1, "configs": configs or {}}},
        timeout_ms=TIMEOUT_MS,
    )
    assert [(t["name"], t["error_code"]) for t in answer["topics"]] == [(name, 0)]


def produce_outcomes(
    broker: BrokerProcess, topic: str, records: Sequence[Rec], **config: object
) -> list[RecordMetadata | KafkaError]:
    """Sends `records` with one producer (`config` added to or overriding its defaults) and
    flushes it; returns every record's outcome, in order: its RecordMetadata, or the KafkaError
    its send failed with."""
    producer = KafkaProducer(**{"bootstrap_servers": broker.bootstrap, "linger_ms": 5, **config})
    try:
        futures = [
            producer.send(
                topic,
                value=rec.value,
                key=rec.key,
                headers=list(rec.headers),
                partition=rec.partition,
                timestamp_ms=rec.timestamp,
            )
            for rec in records
        ]
        producer.flush(timeout=TIMEOUT_MS / 1000)
        outcomes: list[RecordMetadata | KafkaError] = []
        for future in futures:
            try:
                outcomes.append(future.get(timeout=TIMEOUT_MS / 1000))
            except KafkaError as exc:
                outcomes.append(exc)
        return outcomes
    finally:
        producer.close(timeout=5)


def produce(
    broker: BrokerProcess, topic: str, records: Sequence[Rec], **config: object
) -> list[tuple[int, int]]:
    """Writes `records`, every one of which must be stored (the first failure is raised);
    returns each one's (partition, offset), in order."""
    metadata = []
    for outcome in produce_outcomes(broker, topic, records, **config):
        if isinstance(outcome, KafkaError):
            raise outcome
        metadata.append((outcome.partition, outcome.offset))
    return metadata


def to_got(record: ConsumerRecord) -> Got:
    return Got(
        record.partition,
        record.offset,
        record.timestamp,
        record.key,
        record.value,
        tuple(record.headers),
    )


def poll_n(consumer: KafkaConsumer, count: int, max_idle_polls: int = 20) -> list[Got]:
    got: list[Got] = []
    idle = 0
    while len(got) < count and idle < max_idle_polls:
        batches = consumer.poll(timeout_ms=500, max_records=count - len(got))
        idle = 0 if batches else idle + 1
        for records in batches.values():
            got.extend(to_got(r) for r in records)
    return got


def consumer_for(broker: BrokerProcess, **config: object) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        request_timeout_ms=TIMEOUT_MS + 5000,
        **config,
    )


def read(
    broker: BrokerProcess, topic: str, partitions: int, count: int, start: int | None = None
) -> list[Got]:
    consumer = consumer_for(broker)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            if start is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, start)
        return poll_n(consumer, count)
    finally:
        consumer.close()


def test_create_topic_and_metadata(
    broker: BrokerProcess, admin: KafkaAdminClient, topic_name: str
) -> None:
    create_topic(admin, topic_name, 3)
    cluster = admin.describe_cluster()
    assert [(b["host"], b["port"]) for b in cluster["brokers"]] == [("127.0.0.1", broker.port)]
    node = cluster["brokers"][0]["broker_id"]
    assert cluster["controller_id"] == node
    (topic,) = admin.describe_topics([topic_name])
    assert topic["error_code"] == 0
    partitions = sorted(topic["partitions"], key=lambda p: p["partition_index"])
    assert [p["partition_index"] for p in partitions] == [0, 1, 2]
    for partition in partitions:
        assert partition["error_code"] == 0
        assert partition["leader_id"] == node
        assert partition["replica_nodes"] == [node]
        assert partition["isr_nodes"] == [node]
    assert topic_name in admin.list_topics()


@pytest.mark.parametrize("idempotence", [False, True], ids=["plain", "idempotent"])
@pytest.mark.parametrize("codec", CODECS)
def test_produce_and_read_back(
    broker: BrokerProcess, admin: KafkaAdminClient, topic_name: str, codec: str, idempotence: bool
) -> None:
    create_topic(admin, topic_name, 3)
    records = make_records(15, seed=31, partitions=3, base_timestamp=base_timestamp())
    delivered = produce(
        broker,
        topic_name,
        records,
        compression_type=None if codec == "none" else codec,
        enable_idempotence=idempotence,
        acks="all" if idempotence else 1,
    )
    assert delivered == [(i % 3, i // 3) for i in range(15)]
    assert_read_back(records, read(broker, topic_name, 3, len(records)))


def test_read_from_offset(broker: BrokerProcess, admin: KafkaAdminClient, topic_name: str) -> None:
    create_topic(admin, topic_name, 1)
    records = make_records(10, seed=32, base_timestamp=base_timestamp())
    produce(broker, topic_name, records)
    assert_read_back(records[6:], read(broker, topic_name, 1, 4, start=6), first_offset=6)


def test_offsets_earliest_latest_and_for_times(
    broker: BrokerProcess, admin: KafkaAdminClient, topic_name: str
) -> None:
    create_topic(admin, topic_name, 2)
    records = make_records(12, seed=33, partitions=2, base_timestamp=base_timestamp())
    produce(broker, topic_name, records, compression_type="zstd")
    tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    target = records[7].timestamp  # partition 1, its 4th record
    assert target is not None
    consumer = consumer_for(broker)
    try:
        assert consumer.beginning_offsets([tp0, tp1]) == {tp0: 0, tp1: 0}
        assert consumer.end_offsets([tp0, tp1]) == {tp0: 6, tp1: 6}
        found = consumer.offsets_for_times({tp1: target - 5, tp0: target + 10_000})
        assert found[tp0] is None  # nothing at or after that time
        assert found[tp1] is not None
        assert found[tp1].offset == offset_at_or_after(records, 1, target - 5) == 3
        assert found[tp1].timestamp == target
        consumer.assign([tp1])
        consumer.seek(tp1, found[tp1].offset)
        got = poll_n(consumer, 3)
    finally:
        consumer.close()
    assert_read_back(records[7::2], got, first_offset=3)


def topic_configs(admin: KafkaAdminClient, topic: str) -> dict[str, str | None]:
    answer = admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all"
    )
    return {name: entry["value"] for name, entry in answer["topic"][topic].items()}


def test_describe_and_alter_configs(admin: KafkaAdminClient, topic_name: str) -> None:
    create_topic(admin, topic_name, 1, {"retention.ms": "3600000"})
    assert topic_configs(admin, topic_name)["retention.ms"] == "3600000"
    answer = admin.alter_configs(
        [ConfigResource(ConfigResourceType.TOPIC, topic_name, configs={"retention.ms": "7200000"})]
    )
    assert answer == {"topic": {topic_name: "OK"}}
    assert topic_configs(admin, topic_name)["retention.ms"] == "7200000"


def broker_configs(admin: KafkaAdminClient) -> dict[str, str | None]:
    answer = admin.describe_configs(
        [ConfigResource(ConfigResourceType.BROKER, "1")], config_filter="all"
    )
    return {name: entry["value"] for name, entry in answer["broker"]["1"].items()}


def alter_broker_config(
    admin: KafkaAdminClient, name: str, value: str, *, incremental: bool
) -> dict[str, dict[str, str]]:
    """Alters one config of broker 1 with AlterConfigs or IncrementalAlterConfigs; returns
    kafka-python's answer, {"broker": {"1": "OK" or the error as text}}.

    raise_on_unknown=False leaves every check to the broker: kafka-python would otherwise
    refuse names its own DescribeConfigs does not list as dynamic before sending anything.
    """
    resource = ConfigResource(ConfigResourceType.BROKER, "1", configs={name: value})
    answer: dict[str, dict[str, str]] = admin.alter_configs(
        [resource], raise_on_unknown=False, incremental=incremental
    )
    return answer


def test_alter_kafka_broker_config_without_effect(admin: KafkaAdminClient) -> None:
    # A Kafka broker config Tidelog accepts and stores but does not act on. kafka-python 3 has
    # no incremental_alter_configs method: alter_configs(incremental=False) sends the legacy
    # AlterConfigs, incremental=True IncrementalAlterConfigs.
    assert broker_configs(admin)[KERBEROS_RELOGIN] == "60000"
    for incremental, value in ((False, "120000"), (True, "90000")):
        answer = alter_broker_config(admin, KERBEROS_RELOGIN, value, incremental=incremental)
        assert answer == {"broker": {"1": "OK"}}
        assert broker_configs(admin)[KERBEROS_RELOGIN] == value


@pytest.mark.parametrize("incremental", [False, True], ids=["legacy", "incremental"])
@pytest.mark.parametrize(
    ("name", "value", "error"), BROKER_CONFIG_REFUSALS, ids=BROKER_CONFIG_REFUSAL_IDS
)
def test_alter_broker_config_refusals(
    admin: KafkaAdminClient, name: str, value: str, error: int, incremental: bool
) -> None:
    answer = alter_broker_config(admin, name, value, incremental=incremental)
    # kafka-python answers a refused resource with its error as text: "[Error 42] Name: ...".
    name_of = {INVALID_REQUEST: InvalidRequestError, INVALID_CONFIG: InvalidConfigurationError}
    assert answer["broker"]["1"].startswith(f"[Error {error}] {name_of[error].__name__}:"), answer
    assert broker_configs(admin).get(name) != value


def test_create_partitions(broker: BrokerProcess, admin: KafkaAdminClient, topic_name: str) -> None:
    create_topic(admin, topic_name, 1)
    admin.create_partitions({topic_name: 3}, timeout_ms=TIMEOUT_MS)

    def partitions() -> int:
        (topic,) = admin.describe_topics([topic_name])
        return len(topic["partitions"])

    wait_until(lambda: partitions() == 3, "3 partitions in metadata")
    records = make_records(6, seed=34, partitions=3, base_timestamp=base_timestamp())
    assert produce(broker, topic_name, records) == [(i % 3, i // 3) for i in range(6)]
    assert_read_back(records, read(broker, topic_name, 3, len(records)))


def test_delete_topic(broker: BrokerProcess, admin: KafkaAdminClient, topic_name: str) -> None:
    create_topic(admin, topic_name, 2)
    produce(broker, topic_name, make_records(4, seed=35, partitions=2))
    answer = admin.delete_topics([topic_name], timeout_ms=TIMEOUT_MS)
    assert [(t["name"], t["error_code"]) for t in answer["topics"]] == [(topic_name, 0)]
    wait_until(lambda: topic_name not in admin.list_topics(), "topic to disappear")


def test_group_consumer_commits(
    broker: BrokerProcess, admin: KafkaAdminClient, topic_name: str
) -> None:
    create_topic(admin, topic_name, 2)
    records = make_records(10, seed=36, partitions=2, base_timestamp=base_timestamp())
    produce(broker, topic_name, records)
    group = f"it-group-{uuid.uuid4().hex[:8]}"
    # Kafka's smallest session timeout: a new group then forms in seconds on every broker.
    consumer = consumer_for(
        broker, group_id=group, session_timeout_ms=6000, heartbeat_interval_ms=1000
    )
    try:
        consumer.subscribe([topic_name])
        got = poll_n(consumer, len(records), max_idle_polls=40)
        assert_read_back(records, got)
        consumer.commit()
        tps = [TopicPartition(topic_name, p) for p in (0, 1)]
        assert {tp.partition: consumer.committed(tp) for tp in tps} == {0: 5, 1: 5}
    finally:
        consumer.close()
