"""Records one client writes are read byte-exactly by another, through the same broker.

The write and read helpers are those of the per-client test modules.
"""

from __future__ import annotations

import test_aiokafka as aio
import test_confluent_kafka as ck
import test_kafka_python as kp
import test_kcat as kc
from interop_broker import BrokerProcess
from interop_data import Got, assert_read_back, base_timestamp, make_records
from java_harness import JavaClient, consume_step, step, to_gots

COUNT = 12


def test_confluent_to_java(broker: BrokerProcess, java: JavaClient, topic_name: str) -> None:
    ck.create_topic(broker, topic_name, 3)
    records = make_records(COUNT, seed=61, partitions=3, base_timestamp=base_timestamp())
    ck.produce(
        broker, topic_name, records, **{"compression.type": "lz4", "enable.idempotence": True}
    )
    (consumed,) = java.batch(consume_step(topic_name, max_records=COUNT))
    assert_read_back(records, to_gots(consumed))


def test_java_to_kafka_python(broker: BrokerProcess, java: JavaClient, topic_name: str) -> None:
    records = make_records(COUNT, seed=62, partitions=3, base_timestamp=base_timestamp())
    java.batch(step("create-topic", topic=topic_name, partitions=3))
    java.produce(topic_name, records, compression="zstd", idempotence=True)
    assert_read_back(records, kp.read(broker, topic_name, 3, COUNT))


def test_kafka_python_to_aiokafka(broker: BrokerProcess, topic_name: str) -> None:
    ck.create_topic(broker, topic_name, 3)
    records = make_records(COUNT, seed=63, partitions=3, base_timestamp=base_timestamp())
    kp.produce(broker, topic_name, records, compression_type="gzip")

    async def read() -> list[Got]:
        return await aio.read(broker, topic_name, 3, COUNT)

    assert_read_back(records, aio.run(read))


def test_aiokafka_to_confluent(broker: BrokerProcess, topic_name: str) -> None:
    ck.create_topic(broker, topic_name, 3)
    records = make_records(COUNT, seed=64, partitions=3, base_timestamp=base_timestamp())

    async def write() -> list[tuple[int, int]]:
        return await aio.produce(broker, topic_name, records, compression_type="snappy")

    aio.run(write)
    assert_read_back(records, ck.read(broker, topic_name, 3, COUNT))


def test_java_to_kcat(broker: BrokerProcess, java: JavaClient, topic_name: str) -> None:
    # kcat prints headers as text: this data has none.
    records = make_records(COUNT, seed=65, base_timestamp=base_timestamp(), headers=False)
    java.batch(step("create-topic", topic=topic_name, partitions=1))
    java.produce(topic_name, records, compression="gzip", idempotence=False, acks="1")
    assert_read_back(records, kc.consume(broker, topic_name, 0, COUNT))


def test_kcat_to_java(broker: BrokerProcess, java: JavaClient, topic_name: str) -> None:
    records = make_records(COUNT, seed=66, partitions=2, headers=False)
    ck.create_topic(broker, topic_name, 2)
    kc.produce(broker, topic_name, records, "-z", "snappy")
    (consumed,) = java.batch(consume_step(topic_name, max_records=COUNT))
    assert_read_back(records, to_gots(consumed), check_timestamps=False)
