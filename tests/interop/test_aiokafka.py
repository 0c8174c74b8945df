"""aiokafka against a real broker: admin, produce, consume, offsets, configs, groups.

Each test is a coroutine run with asyncio.run(): the broker fixture stays synchronous.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.structs import ConsumerRecord, RecordMetadata
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
)

TIMEOUT_MS = 20_000
T = TypeVar("T")


def run(coroutine: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coroutine(), 60)

    return asyncio.run(bounded())


async def started_admin(broker: BrokerProcess) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=TIMEOUT_MS)
    await admin.start()
    return admin


async def create_topic(
    admin: AIOKafkaAdminClient, name: str, partitions: int, configs: dict[str, str] | None = None
) -> None:
    answer = await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs or {})])
    assert [(t[0], t[1]) for t in answer.topic_errors] == [(name, 0)]


async def produce_outcomes(
    broker: BrokerProcess, topic: str, records: Sequence[Rec], **config: Any
) -> list[RecordMetadata | BaseException]:
    """Sends `records` with one producer (`config` added to or overriding its defaults) and
    waits for all of them; returns every record's outcome, in order: its RecordMetadata, or
    the exception its send failed with."""
    producer = AIOKafkaProducer(**{"bootstrap_servers": broker.bootstrap, "linger_ms": 5, **config})
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                value=rec.value,
                key=rec.key,
                partition=rec.partition,
                timestamp_ms=rec.timestamp,
                headers=list(rec.headers),
            )
            for rec in records
        ]
        return list(await asyncio.gather(*futures, return_exceptions=True))
    finally:
        await producer.stop()


async def produce(
    broker: BrokerProcess, topic: str, records: Sequence[Rec], **config: Any
) -> list[tuple[int, int]]:
    """Writes `records`, every one of which must be stored (the first failure is raised);
    returns each one's (partition, offset), in order."""
    metadata = []
    for outcome in await produce_outcomes(broker, topic, records, **config):
        if isinstance(outcome, BaseException):
            raise outcome
        metadata.append((outcome.partition, outcome.offset))
    return metadata


def to_got(record: ConsumerRecord[bytes, bytes]) -> Got:
    return Got(
        record.partition,
        record.offset,
        record.timestamp,
        record.key,
        record.value,
        tuple(record.headers),
    )


async def poll_n(consumer: AIOKafkaConsumer, count: int, max_idle_polls: int = 20) -> list[Got]:
    got: list[Got] = []
    idle = 0
    while len(got) < count and idle < max_idle_polls:
        batches = await consumer.getmany(timeout_ms=500, max_records=count - len(got))
        idle = 0 if batches else idle + 1
        for records in batches.values():
            got.extend(to_got(r) for r in records)
    return got


def consumer_for(broker: BrokerProcess, **config: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        request_timeout_ms=TIMEOUT_MS,
        **config,
    )


async def read(
    broker: BrokerProcess, topic: str, partitions: int, count: int, start: int | None = None
) -> list[Got]:
    consumer = consumer_for(broker)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            if start is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, start)
        return await poll_n(consumer, count)
    finally:
        await consumer.stop()


def test_create_topic_and_metadata(broker: BrokerProcess, topic_name: str) -> None:
    async def scenario() -> None:
        admin = await started_admin(broker)
        try:
            await create_topic(admin, topic_name, 3)
            cluster = await admin.describe_cluster()
            described = await admin.describe_topics([topic_name])
            names = await admin.list_topics()
        finally:
            await admin.close()
        brokers = cluster["brokers"]
        assert [(b["host"], b["port"]) for b in brokers] == [("127.0.0.1", broker.port)]
        node = brokers[0]["node_id"]
        (topic,) = described
        assert topic["error_code"] == 0
        partitions = sorted(topic["partitions"], key=lambda p: p["partition"])
        assert [p["partition"] for p in partitions] == [0, 1, 2]
        for partition in partitions:
            assert (partition["error_code"], partition["leader"]) == (0, node)
            assert partition["replicas"] == [node]
            assert partition["isr"] == [node]
        assert topic_name in names

    run(scenario)


@pytest.mark.parametrize("idempotence", [False, True], ids=["plain", "idempotent"])
@pytest.mark.parametrize("codec", CODECS)
def test_produce_and_read_back(
    broker: BrokerProcess, topic_name: str, codec: str, idempotence: bool
) -> None:
    records = make_records(15, seed=41, partitions=3, base_timestamp=base_timestamp())

    async def scenario() -> None:
        admin = await started_admin(broker)
        try:
            await create_topic(admin, topic_name, 3)
        finally:
            await admin.close()
        delivered = await produce(
            broker,
            topic_name,
            records,
            compression_type=None if codec == "none" else codec,
            enable_idempotence=idempotence,
            acks="all" if idempotence else 1,
        )
        assert delivered == [(i % 3, i // 3) for i in range(15)]
        assert_read_back(records, await read(broker, topic_name, 3, len(records)))

    run(scenario)


def test_read_from_offset(broker: BrokerProcess, topic_name: str) -> None:
    records = make_records(10, seed=42, base_timestamp=base_timestamp())

    async def scenario() -> None:
        admin = await started_admin(broker)
        try:
            await create_topic(admin, topic_name, 1)
        finally:
            await admin.close()
        await produce(broker, topic_name, records)
        got = await read(broker, topic_name, 1, 4, start=6)
        assert_read_back(records[6:], got, first_offset=6)

    run(scenario)


def test_offsets_earliest_latest_and_for_times(broker: BrokerProcess, topic_name: str) -> None:
    records = make_records(12, seed=43, partitions=2, base_timestamp=base_timestamp())
    target = records[7].timestamp  # partition 1, its 4th record
    assert target is not None

    async def scenario() -> None:
        admin = await started_admin(broker)
        try:
            await create_topic(admin, topic_name, 2)
        finally:
            await admin.close()
        await produce(broker, topic_name, records, compression_type="snappy")
        tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
        consumer = consumer_for(broker)
        await consumer.start()
        try:
            assert await consumer.beginning_offsets([tp0, tp1]) == {tp0: 0, tp1: 0}
            assert await consumer.end_offsets([tp0, tp1]) == {tp0: 6, tp1: 6}
            found = await consumer.offsets_for_times({tp1: target - 5, tp0: target + 10_000})
            assert found[tp0] is None  # nothing at or after that time
            assert found[tp1] is not None
            assert found[tp1].offset == offset_at_or_after(records, 1, target - 5) == 3
            assert found[tp1].timestamp == target
            consumer.assign([tp1])
            consumer.seek(tp1, found[tp1].offset)
            got = await poll_n(consumer, 3)
        finally:
            await consumer.stop()
        assert_read_back(records[7::2], got, first_offset=3)

    run(scenario)


async def topic_configs(admin: AIOKafkaAdminClient, topic: str) -> dict[str, str]:
    (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    (resource,) = response.resources
    error_code, _message, _type, name, entries = resource[:5]
    assert (error_code, name) == (0, topic)
    return {entry[0]: entry[1] for entry in entries}


def test_describe_and_alter_configs(broker: BrokerProcess, topic_name: str) -> None:
    async def scenario() -> None:
        admin = await started_admin(broker)
        try:
            await create_topic(admin, topic_name, 1, {"retention.ms": "3600000"})
            assert (await topic_configs(admin, topic_name))["retention.ms"] == "3600000"
            # aiokafka alters with the (non-incremental) AlterConfigs request.
            resource = ConfigResource(
                ConfigResourceType.TOPIC, topic_name, configs={"retention.ms": "7200000"}
            )
            (response,) = await admin.alter_configs([resource])
            assert [(r[0], r[3]) for r in response.resources] == [(0, topic_name)]
            assert (await topic_configs(admin, topic_name))["retention.ms"] == "7200000"
        finally:
            await admin.close()

    run(scenario)


async def broker_configs(admin: AIOKafkaAdminClient) -> dict[str, str]:
    (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "1")])
    (resource,) = response.resources
    error_code, _message, _type, name, entries = resource[:5]
    assert (error_code, name) == (0, "1")
    return {entry[0]: entry[1] for entry in entries}


async def alter_broker_config(admin: AIOKafkaAdminClient, name: str, value: str) -> int:
    """Alters one config of broker 1; returns the error code the broker answered for it.

    aiokafka has no IncrementalAlterConfigs: alter_configs sends the legacy AlterConfigs, one
    request for the broker resources and one (here empty) for all the others.
    """
    resource = ConfigResource(ConfigResourceType.BROKER, "1", configs={name: value})
    responses = await admin.alter_configs([resource])
    answered = [(r[0], r[2], r[3]) for response in responses for r in response.resources]
    ((error_code, resource_type, resource_name),) = answered
    assert (resource_type, resource_name) == (ConfigResourceType.BROKER, "1")
    return int(error_code)


def test_alter_kafka_broker_config_without_effect(broker: BrokerProcess) -> None:
    # A Kafka broker config Tidelog accepts and stores but does not act on.
    async def scenario() -> None:
        admin = await started_admin(broker)
        try:
            assert (await broker_configs(admin))[KERBEROS_RELOGIN] == "60000"
            assert await alter_broker_config(admin, KERBEROS_RELOGIN, "120000") == 0
            assert (await broker_configs(admin))[KERBEROS_RELOGIN] == "120000"
        finally:
            await admin.close()

    run(scenario)


@pytest.mark.parametrize(
    ("name", "value", "error"), BROKER_CONFIG_REFUSALS, ids=BROKER_CONFIG_REFUSAL_IDS
)
def test_alter_broker_config_refusals(
    broker: BrokerProcess, name: str, value: str, error: int
) -> None:
    async def scenario() -> None:
        admin = await started_admin(broker)
        try:
            assert await alter_broker_config(admin, name, value) == error
            assert (await broker_configs(admin)).get(name) != value
        finally:
            await admin.close()

    run(scenario)


def test_create_partitions(broker: BrokerProcess, topic_name: str) -> None:
    records = make_records(6, seed=44, partitions=3, base_timestamp=base_timestamp())

    async def scenario() -> None:
        admin = await started_admin(broker)
        try:
            await create_topic(admin, topic_name, 1)
            answer = await admin.create_partitions({topic_name: NewPartitions(3)})
            assert [(r[0], r[1]) for r in answer.topic_errors] == [(topic_name, 0)]
            for _ in range(100):
                (topic,) = await admin.describe_topics([topic_name])
                if len(topic["partitions"]) == 3:
                    break
                await asyncio.sleep(0.1)
            assert len(topic["partitions"]) == 3
        finally:
            await admin.close()
        assert await produce(broker, topic_name, records) == [(i % 3, i // 3) for i in range(6)]
        assert_read_back(records, await read(broker, topic_name, 3, len(records)))

    run(scenario)


def test_delete_topic(broker: BrokerProcess, topic_name: str) -> None:
    async def scenario() -> None:
        admin = await started_admin(broker)
        try:
            await create_topic(admin, topic_name, 2)
            await produce(broker, topic_name, make_records(4, seed=45, partitions=2))
            answer = await admin.delete_topics([topic_name])
            assert [(t[0], t[1]) for t in answer.topic_error_codes] == [(topic_name, 0)]
            for _ in range(100):
                if topic_name not in await admin.list_topics():
                    break
                await asyncio.sleep(0.1)
            assert topic_name not in await admin.list_topics()
        finally:
            await admin.close()

    run(scenario)


def test_group_consumer_commits(broker: BrokerProcess, topic_name: str) -> None:
    records = make_records(10, seed=46, partitions=2, base_timestamp=base_timestamp())

    async def scenario() -> None:
        admin = await started_admin(broker)
        try:
            await create_topic(admin, topic_name, 2)
        finally:
            await admin.close()
        await produce(broker, topic_name, records)
        # Kafka's smallest session timeout: a new group then forms in seconds on every broker.
        consumer = consumer_for(
            broker,
            group_id=f"it-group-{uuid.uuid4().hex[:8]}",
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
        )
        await consumer.start()
        try:
            consumer.subscribe([topic_name])
            got = await poll_n(consumer, len(records), max_idle_polls=40)
            assert_read_back(records, got)
            await consumer.commit()
            tps = [TopicPartition(topic_name, p) for p in (0, 1)]
            committed = {tp.partition: await consumer.committed(tp) for tp in tps}
        finally:
            await consumer.stop()
        assert committed == {0: 5, 1: 5}

    run(scenario)
