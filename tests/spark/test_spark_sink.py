"""Writes through format("tidelog"): read back with confluent-kafka, keys on murmur2 partitions."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    StringType,
    StructField,
    StructType,
)


def consume_all(bootstrap: str, topic: str, expected: int) -> list[Any]:
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    out: list[Any] = []
    for _ in range(120):
        out.extend(m for m in consumer.consume(1000, 0.5) if m.error() is None)
        if len(out) >= expected:
            break
    consumer.close()
    return out


def test_written_rows_read_back_byte_exactly_on_murmur2_partitions(
    spark: Any, broker: Any, make_topic: Any, topic: str
) -> None:
    import confluent_kafka

    make_topic(topic, 3)
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    schema = StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("headers", ArrayType(header)),
        ]
    )
    rows = [
        (f"key-{i}".encode(), bytes([i % 256]) * (i % 50) + b"\x00end", [("n", str(i).encode())])
        for i in range(500)
    ]
    spark.createDataFrame(rows, schema).repartition(2).write.format("tidelog").option(
        "kafka.bootstrap.servers", broker.bootstrap
    ).option("topic", topic).mode("append").save()
    got = consume_all(broker.bootstrap, topic, len(rows))
    assert sorted((m.key(), m.value(), m.headers()) for m in got) == sorted(
        (k, v, [(hk, hv) for hk, hv in h]) for k, v, h in rows
    )
    # librdkafka's murmur2 partitioner is the Java client's: the same keys, same partitions.
    twin = f"{topic}-twin"
    make_topic(twin, 3)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": broker.bootstrap, "partitioner": "murmur2_random"}
    )
    for k, v, _ in rows:
        producer.produce(twin, value=v, key=k)
    assert producer.flush(30) == 0
    java_placement = {
        m.key(): m.partition() for m in consume_all(broker.bootstrap, twin, len(rows))
    }
    assert {m.key(): m.partition() for m in got} == java_placement
    assert len(set(java_placement.values())) == 3


def test_topic_and_partition_columns(spark: Any, broker: Any, make_topic: Any, topic: str) -> None:
    make_topic(topic, 3)
    df = spark.createDataFrame(
        [(topic, 2, "a", "x"), (topic, 0, None, "y")],
        "topic string, partition int, key string, value string",
    )
    df.write.format("tidelog").option("kafka.bootstrap.servers", broker.bootstrap).mode(
        "append"
    ).save()
    got = consume_all(broker.bootstrap, topic, 2)
    assert sorted((m.partition(), m.key(), m.value()) for m in got) == [
        (0, None, b"y"),
        (2, b"a", b"x"),
    ]


def test_sink_without_value_or_topic_is_refused(spark: Any, broker: Any) -> None:
    df = spark.createDataFrame([("k",)], "key string")
    with pytest.raises(Exception, match="'value' column"):
        df.write.format("tidelog").option("kafka.bootstrap.servers", broker.bootstrap).option(
            "topic", "t"
        ).mode("append").save()
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match="no topic"):
        df.write.format("tidelog").option("kafka.bootstrap.servers", broker.bootstrap).mode(
            "append"
        ).save()


def test_stream_copy_keyed_by_source_position(
    spark: Any, broker: Any, make_topic: Any, topic: str, tmp_path: Any
) -> None:
    from pyspark.sql import functions as F
    from spark_helpers import produce

    make_topic(topic, 3)
    out = f"{topic}-out"
    make_topic(out, 3)
    produce(broker.bootstrap, topic, [(i % 3, None, f"{i}".encode(), None, []) for i in range(900)])
    query = (
        spark.readStream.format("tidelog")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 250)
        .load()
        .select(F.concat_ws(":", "topic", "partition", "offset").alias("key"), F.col("value"))
        .writeStream.format("tidelog")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("topic", out)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    got = consume_all(broker.bootstrap, out, 900)
    by_key = {m.key(): m.value() for m in got}
    assert len(got) == 900
    assert by_key == {f"{topic}:{i % 3}:{i // 3}".encode(): f"{i}".encode() for i in range(900)}


def total_records(bootstrap: str, topic: str, partitions: int) -> int:
    """Records in the topic: the sum of its partitions' high watermarks."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        return sum(
            consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        )
    finally:
        consumer.close()


def test_only_append_mode_writes_and_the_other_modes_name_it(
    spark: Any, broker: Any, make_topic: Any, topic: str
) -> None:
    """Spark 4.3 refuses the default ErrorIfExists (and Ignore) for every Python data source
    before any of its code runs, so ``save()`` without ``.mode("append")`` cannot work; its
    error names Append. Overwrite reaches the source, which refuses it: a topic cannot be
    truncated. Neither refused write leaves a record behind."""
    from pyspark.errors import AnalysisException

    make_topic(topic, 2)
    df = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(20)], "key string, value string")

    def writer() -> Any:
        return (
            df.write.format("tidelog")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("topic", topic)
        )

    for mode in (None, "ignore"):
        with pytest.raises(AnalysisException) as refused:
            (writer() if mode is None else writer().mode(mode)).save()
        assert refused.value.getCondition() == "UNSUPPORTED_DATA_SOURCE_SAVE_MODE"
        assert '"Append"' in str(refused.value)
    with pytest.raises(Exception, match=r'a topic cannot be truncated; use \.mode\("append"\)'):
        writer().mode("overwrite").save()
    assert total_records(broker.bootstrap, topic, 2) == 0

    writer().mode("append").save()
    got = consume_all(broker.bootstrap, topic, 20)
    assert sorted((m.key(), m.value()) for m in got) == sorted(
        (f"k{i}".encode(), f"v{i}".encode()) for i in range(20)
    )
    assert total_records(broker.bootstrap, topic, 2) == 20
