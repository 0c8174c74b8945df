"""Helpers of the Spark tests: a local SparkSession with the format registered, producing with
confluent-kafka, source options, draining a stream with Trigger.AvailableNow."""

from __future__ import annotations

from typing import Any


def local_session(**conf: str) -> Any:
    """A ``local[2]`` SparkSession (UI off, 2 shuffle partitions, ``conf`` on top) with
    ``format("tidelog")`` registered."""
    from pyspark.sql import SparkSession

    from tidelog.spark import register

    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


def produce(
    bootstrap: str,
    topic: str,
    records: list[tuple[int, bytes | None, bytes | None, int | None, list[tuple[str, bytes]]]],
) -> None:
    """(partition, key, value, timestamp ms or None, headers) records via confluent-kafka."""
    import confluent_kafka

    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 262144}
    )
    errors: list[Any] = []
    for partition, key, value, ts, headers in records:
        while True:
            try:
                producer.produce(
                    topic,
                    value=value,
                    key=key,
                    partition=partition,
                    timestamp=ts or 0,
                    headers=headers or None,
                    on_delivery=lambda err, _m: err and errors.append(err),
                )
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(30) == 0
    assert not errors, errors


def options(bootstrap: str, **extra: Any) -> dict[str, str]:
    return {"kafka.bootstrap.servers": bootstrap, **{k: str(v) for k, v in extra.items()}}


def run_available_now(spark: Any, opts: dict[str, str], checkpoint: str) -> list[list[tuple]]:
    """Run a stream of ``opts`` with Trigger.AvailableNow on ``checkpoint``; the sorted
    (partition, offset) pairs of every non-empty micro-batch."""
    batches: list[list[tuple]] = []

    def collect(df: Any, _batch_id: int) -> None:
        batches.append(
            sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
        )

    query = (
        spark.readStream.format("tidelog")
        .options(**opts)
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return [b for b in batches if b]
