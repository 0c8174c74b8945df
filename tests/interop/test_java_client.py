"""The Apache Kafka Java client (kafka-clients.jar) against a real broker, through InteropClient.

Each test runs its steps in one JVM where it can (`JavaClient.batch`, see java_harness.py):
create and describe topics, produce with every codec with idempotence on and off, consume by
offset, ListOffsets (earliest, latest, by timestamp), offsetsForTimes, describe and
incrementally alter topic and broker configs (and Kafka's refusals), CreatePartitions,
DeleteTopics and a consumer group.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from interop_broker import BrokerProcess
from interop_data import (
    BROKER_CONFIG_REFUSAL_IDS,
    BROKER_CONFIG_REFUSALS,
    CODECS,
    INVALID_CONFIG,
    INVALID_REQUEST,
    KERBEROS_RELOGIN,
    assert_read_back,
    base_timestamp,
    make_records,
    offset_at_or_after,
    wait_until,
)
from java_harness import (
    JavaClient,
    JavaClientError,
    consume_step,
    delivered,
    produce_step,
    step,
    to_gots,
)


def test_create_topic_and_metadata(
    broker: BrokerProcess, java: JavaClient, topic_name: str
) -> None:
    _, (metadata,), (listed,) = java.batch(
        step("create-topic", topic=topic_name, partitions=3),
        step("metadata", topic=topic_name),
        step("list-topics"),
    )
    nodes = metadata["nodes"]
    assert [(n["host"], n["port"]) for n in nodes] == [("127.0.0.1", broker.port)]
    node = nodes[0]["id"]
    assert metadata["controller"] == node
    partitions = metadata["topics"][topic_name]
    assert [p["partition"] for p in partitions] == [0, 1, 2]
    for partition in partitions:
        assert partition["leader"] == node
        assert partition["replicas"] == [node]
        assert partition["isr"] == [node]
    assert topic_name in listed["topics"]


@pytest.mark.parametrize("idempotence", [False, True], ids=["plain", "idempotent"])
@pytest.mark.parametrize("codec", CODECS)
def test_produce_and_read_back(
    java: JavaClient, topic_name: str, codec: str, idempotence: bool
) -> None:
    records = make_records(15, seed=51, partitions=3, base_timestamp=base_timestamp())
    _, produced, consumed = java.batch(
        step("create-topic", topic=topic_name, partitions=3),
        produce_step(
            topic_name,
            records,
            compression=codec,
            idempotence=idempotence,
            acks="all" if idempotence else "1",
        ),
        consume_step(topic_name, max_records=len(records)),
    )
    assert delivered(produced) == [(i % 3, i // 3) for i in range(15)]
    assert_read_back(records, to_gots(consumed))


def test_read_from_offset(java: JavaClient, topic_name: str) -> None:
    records = make_records(10, seed=52, base_timestamp=base_timestamp())
    *_, consumed = java.batch(
        step("create-topic", topic=topic_name, partitions=1),
        produce_step(topic_name, records),
        consume_step(topic_name, max_records=4, partitions=[0], offsets={0: 6}),
    )
    assert_read_back(records[6:], to_gots(consumed), first_offset=6)


def test_list_offsets(java: JavaClient, topic_name: str) -> None:
    records = make_records(12, seed=53, partitions=2, base_timestamp=base_timestamp())
    target = records[7].timestamp  # partition 1, its 4th record
    assert target is not None
    assert offset_at_or_after(records, 1, target - 5) == 3
    _, _, (earliest,), (latest,), (by_time,), (too_late,) = java.batch(
        step("create-topic", topic=topic_name, partitions=2),
        produce_step(topic_name, records, compression="lz4"),
        step("list-offsets", topic=topic_name, partitions=[0, 1], spec="earliest"),
        step("list-offsets", topic=topic_name, partitions=[0, 1], spec="latest"),
        step(
            "list-offsets", topic=topic_name, partitions=[1], spec="timestamp", timestamp=target - 5
        ),
        step(
            "list-offsets",
            topic=topic_name,
            partitions=[0],
            spec="timestamp",
            timestamp=target + 10**4,
        ),
    )
    assert {p: v["offset"] for p, v in earliest.items()} == {"0": 0, "1": 0}
    assert {p: v["offset"] for p, v in latest.items()} == {"0": 6, "1": 6}
    assert by_time == {"1": {"offset": 3, "timestamp": target}}
    # Kafka answers offset -1 (timestamp -1) when no record is at or after the time asked for.
    assert too_late == {"0": {"offset": -1, "timestamp": -1}}


def test_offsets_for_times(java: JavaClient, topic_name: str) -> None:
    records = make_records(12, seed=54, partitions=2, base_timestamp=base_timestamp())
    target = records[7].timestamp
    assert target is not None
    *_, (answer,), consumed = java.batch(
        step("create-topic", topic=topic_name, partitions=2),
        produce_step(topic_name, records, compression="zstd"),
        step(
            "offsets-for-times", topic=topic_name, timestamps={"0": target + 10**4, "1": target - 5}
        ),
        consume_step(topic_name, max_records=3, partitions=[1], offsets={1: 3}),
    )
    # No record at or after that time in partition 0: offsetsForTimes maps it to null.
    assert answer["0"] == {"offset": None, "timestamp": None, "beginning": 0, "end": 6}
    assert answer["1"] == {"offset": 3, "timestamp": target, "beginning": 0, "end": 6}
    assert_read_back(records[7::2], to_gots(consumed), first_offset=3)


def test_describe_and_alter_configs(java: JavaClient, topic_name: str) -> None:
    _, (before,), _, (after,) = java.batch(
        step(
            "create-topic",
            topic=topic_name,
            partitions=1,
            topic_configs={"retention.ms": "3600000"},
        ),
        step("describe-configs", topic=topic_name),
        step("alter-configs", topic=topic_name, set={"retention.ms": "7200000"}),
        step("describe-configs", topic=topic_name),
    )
    assert before["configs"]["retention.ms"] == "3600000"
    assert after["configs"]["retention.ms"] == "7200000"


#: The exception the Java admin client raises for each Kafka error code.
JAVA_EXCEPTION = {
    INVALID_REQUEST: "org.apache.kafka.common.errors.InvalidRequestException",
    INVALID_CONFIG: "org.apache.kafka.common.errors.InvalidConfigurationException",
}


def test_alter_kafka_broker_config_without_effect(java: JavaClient) -> None:
    # A Kafka broker config Tidelog accepts and stores but does not act on.
    (before,), _, (after,) = java.batch(
        step("describe-configs", broker="1"),
        step("alter-configs", broker="1", set={KERBEROS_RELOGIN: "90000"}),
        step("describe-configs", broker="1"),
    )
    assert before["configs"][KERBEROS_RELOGIN] == "60000"
    assert after["configs"][KERBEROS_RELOGIN] == "90000"


@pytest.mark.parametrize(
    ("resource", "name", "value", "error"),
    [
        *(("1", *refusal) for refusal in BROKER_CONFIG_REFUSALS),
        # A per-broker key has no cluster-wide default in Kafka.
        ("", KERBEROS_RELOGIN, "150000", INVALID_REQUEST),
    ],
    ids=[*BROKER_CONFIG_REFUSAL_IDS, "per-broker-on-default"],
)
def test_alter_broker_config_refusals(
    java: JavaClient, resource: str, name: str, value: str, error: int
) -> None:
    with pytest.raises(JavaClientError) as refused:
        java.one("alter-configs", {"broker": resource, "set": {name: value}})
    assert refused.value.error == JAVA_EXCEPTION[error], refused.value
    # Nothing of a refused request is stored.
    assert java.one("describe-configs", {"broker": resource})["configs"].get(name) != value


def test_create_partitions(java: JavaClient, topic_name: str) -> None:
    records = make_records(6, seed=55, partitions=3, base_timestamp=base_timestamp())
    _, _, (described,), produced, consumed = java.batch(
        step("create-topic", topic=topic_name, partitions=1),
        step("create-partitions", topic=topic_name, total=3),
        step("describe-topic", topic=topic_name),
        produce_step(topic_name, records),
        consume_step(topic_name, max_records=len(records)),
    )
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    assert delivered(produced) == [(i % 3, i // 3) for i in range(6)]
    assert_read_back(records, to_gots(consumed))


def test_delete_topic(java: JavaClient, topic_name: str) -> None:
    *_, (listed,) = java.batch(
        step("create-topic", topic=topic_name, partitions=2),
        produce_step(topic_name, make_records(4, seed=56, partitions=2)),
        step("delete-topic", topic=topic_name),
        step("list-topics"),
    )
    if topic_name in listed["topics"]:
        # Deletion may complete after the response, as in Kafka; it must complete, though.
        wait_until(
            lambda: topic_name not in java.one("list-topics", {})["topics"], "topic to disappear"
        )


def test_group_consumer_commits(broker: BrokerProcess, java: JavaClient, topic_name: str) -> None:
    records = make_records(10, seed=57, partitions=2, base_timestamp=base_timestamp())
    group = f"it-group-{uuid.uuid4().hex[:8]}"
    *_, consumed = java.batch(
        step("create-topic", topic=topic_name, partitions=2),
        produce_step(topic_name, records),
        consume_step(
            topic_name,
            max_records=len(records),
            group=group,
            timeout_ms=30000,
            # Kafka's smallest session timeout: a new group then forms in seconds.
            configs={"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"},
        ),
    )
    assert_read_back(records, to_gots(consumed))
    # The harness commits what it read; another client sees the group's committed offsets.
    reader = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        committed = reader.committed([TopicPartition(topic_name, p) for p in (0, 1)], 20)
    finally:
        reader.close()
    assert {tp.partition: tp.offset for tp in committed} == {0: 5, 1: 5}
