"""Batch and streaming reads through format("tidelog") against a real broker."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from spark_helpers import options, produce, run_available_now

BASE_FIELDS = [
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
]
T0 = 1_700_000_000_000


def read(spark: Any, opts: dict[str, str]) -> Any:
    return spark.read.format("tidelog").options(**opts).load()


def rows_of(df: Any) -> list[tuple[int, int, bytes]]:
    return sorted((r.partition, r.offset, bytes(r.value)) for r in df.collect())


def test_batch_read_of_three_partitions_returns_exactly_the_records(
    spark: Any, broker: Any, make_topic: Any, topic: str
) -> None:
    make_topic(topic, 3)
    n = 100_000
    records = [
        (i % 3, (f"k{i}".encode() if i % 7 else None), f"v-{i % 3}-{i // 3}".encode(), T0 + i, [])
        for i in range(n)
    ]
    produce(broker.bootstrap, topic, records)
    df = read(spark, options(broker.bootstrap, subscribe=topic))
    assert df.schema == StructType(BASE_FIELDS)
    stats = df.agg(
        F.count("*").alias("rows"),
        F.countDistinct("partition", "offset").alias("distinct"),
        F.sum(
            (
                F.col("value")
                != F.concat(
                    F.lit("v-"),
                    F.col("partition").cast("string"),
                    F.lit("-"),
                    F.col("offset").cast("string"),
                ).cast("binary")
            ).cast("int")
        ).alias("bad_values"),
        F.sum(F.col("key").isNull().cast("int")).alias("null_keys"),
        F.sum((F.col("topic") != topic).cast("int")).alias("bad_topics"),
        F.sum((F.col("timestampType") != 0).cast("int")).alias("bad_types"),
    ).collect()[0]
    assert stats.rows == n
    assert stats.distinct == n
    assert stats.bad_values == 0
    assert stats.null_keys == len([i for i in range(n) if i % 7 == 0])
    assert stats.bad_topics == 0 and stats.bad_types == 0
    per_partition = {
        r.partition: (r.lo, r.hi, r.c)
        for r in df.groupBy("partition")
        .agg(F.min("offset").alias("lo"), F.max("offset").alias("hi"), F.count("*").alias("c"))
        .collect()
    }
    assert per_partition == {p: (0, len(range(p, n, 3)) - 1, len(range(p, n, 3))) for p in range(3)}
    # Keys and timestamps, byte for byte, of a sample.
    sample = (
        df.where(F.col("offset").isin(0, 1, 33_332))
        .select("partition", "offset", "key", (F.unix_micros("timestamp")).alias("us"))
        .collect()
    )
    for r in sample:
        i = r.offset * 3 + r.partition
        assert (bytes(r.key) if r.key is not None else None) == records[i][1]
        assert r.us == (T0 + i) * 1000


def test_starting_and_ending_offsets_json_select_ranges(
    spark: Any, broker: Any, make_topic: Any, topic: str
) -> None:
    make_topic(topic, 2)
    produce(
        broker.bootstrap,
        topic,
        [(p, None, f"{p}:{i}".encode(), None, []) for p in (0, 1) for i in range(50)],
    )
    df = read(
        spark,
        options(
            broker.bootstrap,
            subscribe=topic,
            startingOffsets=f'{{"{topic}": {{"0": 10, "1": -2}}}}',
            endingOffsets=f'{{"{topic}": {{"0": 20, "1": 5}}}}',
        ),
    )
    assert rows_of(df) == [(0, i, f"0:{i}".encode()) for i in range(10, 20)] + [
        (1, i, f"1:{i}".encode()) for i in range(5)
    ]
    assign = read(
        spark,
        options(
            broker.bootstrap,
            assign=f'{{"{topic}": [1]}}',
            startingOffsets=f'{{"{topic}": {{"1": 45}}}}',
            endingOffsets="latest",
            minPartitions=4,
        ),
    )
    assert rows_of(assign) == [(1, i, f"1:{i}".encode()) for i in range(45, 50)]
    pattern = read(spark, options(broker.bootstrap, subscribePattern=topic[:30] + ".*"))
    assert len(rows_of(pattern)) == 100


def test_timestamps_select_ranges(spark: Any, broker: Any, make_topic: Any, topic: str) -> None:
    make_topic(topic, 2)
    produce(
        broker.bootstrap,
        topic,
        [(p, None, f"{p}:{i}".encode(), T0 + 1000 * i, []) for p in (0, 1) for i in range(20)],
    )
    df = read(
        spark,
        options(
            broker.bootstrap,
            subscribe=topic,
            startingTimestamp=T0 + 5000,
            endingTimestamp=T0 + 8000,
        ),
    )
    assert rows_of(df) == [(p, i, f"{p}:{i}".encode()) for p in (0, 1) for i in range(5, 8)]
    by_partition = read(
        spark,
        options(
            broker.bootstrap,
            subscribe=topic,
            startingOffsetsByTimestamp=f'{{"{topic}": {{"0": {T0 + 18_500}, "1": {T0}}}}}',
            endingOffsetsByTimestamp=f'{{"{topic}": {{"0": {T0 + 60_000}, "1": {T0 + 2000}}}}}',
        ),
    )
    assert rows_of(by_partition) == [(0, 19, b"0:19"), (1, 0, b"1:0"), (1, 1, b"1:1")]
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy"):
        read(
            spark, options(broker.bootstrap, subscribe=topic, startingTimestamp=T0 + 10**9)
        ).count()


def test_include_headers(spark: Any, broker: Any, make_topic: Any, topic: str) -> None:
    make_topic(topic, 1)
    produce(
        broker.bootstrap,
        topic,
        [
            (0, b"a", b"1", None, [("h1", b"x"), ("h2", b"")]),
            (0, b"b", b"2", None, []),
            (0, b"c", b"3", None, [("only", b"\x00\xff")]),
        ],
    )
    df = read(spark, options(broker.bootstrap, subscribe=topic, includeHeaders="true"))
    assert df.schema == StructType(
        [
            *BASE_FIELDS,
            StructField(
                "headers",
                ArrayType(
                    StructType(
                        [StructField("key", StringType()), StructField("value", BinaryType())]
                    )
                ),
            ),
        ]
    )
    got = [
        (bytes(r.value), [(h.key, bytes(h.value)) for h in r.headers])
        for r in df.orderBy("offset").collect()
    ]
    assert got == [
        (b"1", [("h1", b"x"), ("h2", b"")]),
        (b"2", []),
        (b"3", [("only", b"\x00\xff")]),
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "exactly one of"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, "exactly one of"),
        ({"subscribe": "a", "startingOffsets": "{not json"}, "not valid JSON"),
        ({"subscribe": "a", "startingOffsets": "latest"}, "cannot be latest"),
        ({"subscribe": "a", "failOnDataLoss": "maybe"}, "true or false"),
        ({"assign": '{"a": ["x"]}'}, "not a number"),
    ],
)
def test_bad_options_get_clear_errors(
    spark: Any, broker: Any, extra: dict[str, str], message: str
) -> None:
    with pytest.raises(Exception, match=message):
        read(spark, options(broker.bootstrap, **extra)).count()


def test_ending_offsets_on_a_stream_is_refused(spark: Any, broker: Any) -> None:
    with pytest.raises(Exception, match="batch queries only"):
        (
            spark.readStream.format("tidelog")
            .options(**options(broker.bootstrap, subscribe="a", endingOffsets="latest"))
            .load()
            .writeStream.format("noop")
            .start()
            .awaitTermination(30)
        )


def test_stream_respects_max_offsets_per_trigger_with_available_now(
    spark: Any, broker: Any, make_topic: Any, topic: str, tmp_path: Any
) -> None:
    make_topic(topic, 3)
    produce(broker.bootstrap, topic, [(i % 3, None, b"x", None, []) for i in range(1000)])
    opts = options(
        broker.bootstrap, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger=300
    )
    batches = run_available_now(spark, opts, str(tmp_path / "cp"))
    assert [len(b) for b in batches] == [300, 300, 300, 100]
    everything = sorted(x for b in batches for x in b)
    assert everything == sorted((p, o) for p in range(3) for o in range(len(range(p, 1000, 3))))
    # More data, same checkpoint: only the new records.
    produce(broker.bootstrap, topic, [(i % 3, None, b"y", None, []) for i in range(90)])
    again = run_available_now(spark, opts, str(tmp_path / "cp"))
    assert [len(b) for b in again] == [90]
    assert min(o for _, o in again[0]) >= 333


def test_data_loss_after_delete_records(
    spark: Any, broker: Any, make_topic: Any, topic: str, tmp_path: Any
) -> None:
    import confluent_kafka
    from confluent_kafka.admin import AdminClient

    make_topic(topic, 1)
    produce(broker.bootstrap, topic, [(0, None, str(i).encode(), None, []) for i in range(100)])
    opts = options(broker.bootstrap, subscribe=topic, startingOffsets="earliest")
    first = run_available_now(spark, opts, str(tmp_path / "cp"))
    assert sum(len(b) for b in first) == 100
    produce(
        broker.bootstrap, topic, [(0, None, str(i).encode(), None, []) for i in range(100, 200)]
    )
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.delete_records([confluent_kafka.TopicPartition(topic, 0, 150)])
    for f in futures.values():
        f.result(30)
    with pytest.raises(Exception, match="failOnDataLoss"):
        run_available_now(spark, opts, str(tmp_path / "cp"))
    lenient = {**opts, "failOnDataLoss": "false"}
    rest = run_available_now(spark, lenient, str(tmp_path / "cp"))
    assert sorted(o for b in rest for _, o in b) == list(range(150, 200))
    # Batch reads: an explicit start below the log start.
    below = {**opts, "startingOffsets": f'{{"{topic}": {{"0": 10}}}}'}
    with pytest.raises(Exception, match="failOnDataLoss"):
        read(spark, below).count()
    assert read(spark, {**below, "failOnDataLoss": "false"}).count() == 50


def test_read_range_fetches_grow_and_yield_every_offset_once(
    broker: Any, make_topic: Any, topic: str
) -> None:
    """Outside Spark: the first fetch is small and later ones double up to fetchMaxBytes;
    a range that starts and ends inside batches yields exactly its offsets, in order."""
    from tidelog.spark.options import parse_source_options
    from tidelog.spark.source import FIRST_FETCH_BYTES, read_range

    make_topic(topic, 1)
    n = 30_000
    produce(broker.bootstrap, topic, [(0, None, b"%099d" % i, T0 + i, []) for i in range(n)])
    opts = parse_source_options(
        options(broker.bootstrap, subscribe=topic, fetchMaxBytes=4 * FIRST_FETCH_BYTES),
        streaming=False,
    )
    batches = list(read_range(opts, topic, 0, 7, n - 5))
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(7, n - 5))
    values = [v for b in batches for v in b.column("value").to_pylist()]
    assert values == [b"%099d" % i for i in range(7, n - 5)]
    sizes = [b.num_rows for b in batches]
    assert sizes[0] < max(sizes)  # ~1 MiB first, then 2 and 4 MiB


def test_readers_prepare_the_worker_once() -> None:
    """In a fresh interpreter (both settings are process-wide): the first call freezes what
    is alive, later calls leave objects created since to the collector; large blocks freed
    are kept, so allocating one again faults in no new pages."""
    import subprocess
    import sys

    code = (
        "import gc, resource\n"
        "from tidelog.spark.source import prepare_worker\n"
        "assert gc.get_freeze_count() == 0\n"
        "prepare_worker()\n"
        "frozen = gc.get_freeze_count()\n"
        "assert frozen > 10_000, frozen\n"
        "later = [[i] for i in range(1000)]\n"
        "prepare_worker()\n"
        "assert gc.get_freeze_count() == frozen\n"
        # A fetch's buffers: a few blocks of megabytes, freed together.
        "def faults():\n"
        "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    blocks = [bytearray(8 << 20) for _ in range(3)]\n"
        "    del blocks\n"
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before\n"
        "first = faults()\n"
        "assert first > 5000, first\n"
        "again = [faults() for _ in range(4)]\n"
        "assert max(again) < 100, again\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("level", ["read_committed", "read_uncommitted"])
def test_isolation_level_read_committed_leaves_out_aborted_transactions(
    spark: Any, broker: Any, make_topic: Any, topic: str, level: str
) -> None:
    """kafka.isolation.level as Spark's Kafka connector reads it: read_committed rows are
    the committed transactions' only; read_uncommitted has the aborted ones too."""
    from tidelog.client import Producer

    make_topic(topic, 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": topic})
    try:
        producer.init_transactions(30)
        for outcome in ("committed-1", "aborted", "committed-2"):
            producer.begin_transaction()
            for i in range(4):
                producer.send(topic, f"{outcome}-{i}".encode(), partition=i % 2)
            if outcome == "aborted":
                assert producer.flush(30) == 0  # in the log, then aborted
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)
    finally:
        producer.close()
    df = read(spark, options(broker.bootstrap, subscribe=topic, **{"kafka.isolation.level": level}))
    values = sorted(bytes(r.value).decode() for r in df.collect())
    committed = [f"committed-{n}-{i}" for n in (1, 2) for i in range(4)]
    aborted = [f"aborted-{i}" for i in range(4)]
    assert values == sorted(committed if level == "read_committed" else committed + aborted)
