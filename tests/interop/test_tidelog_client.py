"""Tidelog's own client against the other clients, through a real broker: what our producer
writes every other client reads byte-exactly, what they write our consumer reads
byte-exactly, and our default partitioner picks the Java producer's partition for every key.

The records are the edge cases of `interop_data` (null and empty keys and values, non-UTF-8
bytes, duplicate and null-valued headers, explicit timestamps); the readers and writers are
those of the per-client modules.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import test_aiokafka as aio
import test_confluent_kafka as ck
import test_kafka_python as kp
import test_kcat as kc
from interop_broker import BrokerProcess
from interop_data import Got, Rec, assert_read_back, base_timestamp, make_records
from java_harness import JavaClient, consume_step, step, to_gots

from tidelog.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from tidelog.client.partitioner import partition_for_key

COUNT = 12
PARTITIONS = 3


def create_topic(broker: BrokerProcess, name: str, partitions: int) -> None:
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])


def produce(broker: BrokerProcess, topic: str, records: list[Rec], codec: str) -> None:
    config = {"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 5}
    with Producer(config) as producer:
        assert producer.idempotent
        futures = [
            producer.send(
                topic,
                r.value,
                key=r.key,
                headers=list(r.headers),
                partition=r.partition,
                timestamp=r.timestamp,
            )
            for r in records
        ]
        producer.flush(30)
        for future in futures:
            future.result(30)


def read(broker: BrokerProcess, topic: str, partitions: int, count: int) -> list[Got]:
    config = {"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest"}
    got: list[Got] = []
    with Consumer(config) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        for _ in range(200):
            for r in consumer.poll(0.1):
                got.append(Got(r.partition, r.offset, r.timestamp, r.key, r.value, r.headers))
            if len(got) >= count:
                break
    return got


def read_with_kcat(broker: BrokerProcess, topic: str, partitions: int, count: int) -> list[Got]:
    per_partition = count // partitions  # the records go round-robin
    return [g for p in range(partitions) for g in kc.consume(broker, topic, p, per_partition)]


READERS = {
    "confluent-kafka": lambda b, t, n: ck.read(b, t, PARTITIONS, n),
    "kafka-python": lambda b, t, n: kp.read(b, t, PARTITIONS, n),
    "aiokafka": lambda b, t, n: asyncio.run(aio.read(b, t, PARTITIONS, n)),
    "kcat": lambda b, t, n: read_with_kcat(b, t, PARTITIONS, n),
}


@pytest.mark.parametrize(
    ("reader", "codec"),
    [
        ("confluent-kafka", "zstd"),
        ("kafka-python", "gzip"),
        ("aiokafka", "lz4"),
        ("kcat", "snappy"),
    ],
)
def test_other_clients_read_what_ours_writes(
    broker: BrokerProcess, topic_name: str, reader: str, codec: str
) -> None:
    create_topic(broker, topic_name, PARTITIONS)
    records = make_records(COUNT, seed=71, partitions=PARTITIONS, base_timestamp=base_timestamp())
    produce(broker, topic_name, records, codec)
    got = READERS[reader](broker, topic_name, COUNT)
    # kcat prints no null header values apart from empty ones; its own module checks headers.
    assert_read_back(records, got, check_headers=reader != "kcat")


def test_java_reads_what_ours_writes(
    broker: BrokerProcess, java: JavaClient, topic_name: str
) -> None:
    create_topic(broker, topic_name, PARTITIONS)
    records = make_records(COUNT, seed=72, partitions=PARTITIONS, base_timestamp=base_timestamp())
    produce(broker, topic_name, records, "lz4")
    (consumed,) = java.batch(consume_step(topic_name, max_records=COUNT))
    assert_read_back(records, to_gots(consumed))


@pytest.mark.parametrize("writer", ["confluent-kafka", "kafka-python", "aiokafka", "java"])
def test_ours_reads_what_other_clients_write(
    broker: BrokerProcess, java_client: JavaClient, topic_name: str, writer: str
) -> None:
    records = make_records(COUNT, seed=73, partitions=PARTITIONS, base_timestamp=base_timestamp())
    if writer == "java":
        java = java_client.bound(broker.bootstrap)
        java.batch(step("create-topic", topic=topic_name, partitions=PARTITIONS))
        java.produce(topic_name, records, compression="zstd", idempotence=True)
    else:
        create_topic(broker, topic_name, PARTITIONS)
        if writer == "confluent-kafka":
            ck.produce(broker, topic_name, records, **{"compression.type": "snappy"})
        elif writer == "kafka-python":
            kp.produce(broker, topic_name, records, compression_type="gzip")
        else:
            asyncio.run(aio.produce(broker, topic_name, records, compression_type="lz4"))
    assert_read_back(records, read(broker, topic_name, PARTITIONS, COUNT))


def test_our_partitioner_picks_the_java_producers_partition(
    broker: BrokerProcess, java: JavaClient, topic_name: str
) -> None:
    partitions = 7
    rng = random.Random(2026)
    keys = list({rng.randbytes(rng.randint(1, 48)) for _ in range(10_000)})
    records = [Rec(key, b"", partition=None) for key in keys]  # the producer's partitioner
    java.batch(step("create-topic", topic=topic_name, partitions=partitions))
    chosen = [partition for partition, _ in java.produce(topic_name, records)]
    assert len(chosen) == len(keys)
    mismatches = [
        (key, partition)
        for key, partition in zip(keys, chosen, strict=True)
        if partition_for_key(key, partitions) != partition
    ]
    assert mismatches == []
    # And our producer sends each key where the Java producer did.
    with Producer({"bootstrap.servers": broker.bootstrap}) as producer:
        futures = [producer.send(topic_name, b"", key=key) for key in keys[:500]]
        producer.flush(30)
        assert [f.result(30).partition for f in futures] == chosen[:500]
