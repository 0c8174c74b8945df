"""Reliable event logging for offline statistics: events -> hourly counts and sums -> Parquet.

Input: a Tidelog topic whose record values are JSON events

    {"type": "purchase", "user": "u7", "amount": "12.50", "event_time": "2026-03-09T10:15:00Z"}

Output: a Parquet table, partitioned by ``hour`` and ``event_type``, with one row per event type
and hour of event time: ``events`` (count) and ``amount`` (exact decimal sum). A record whose
value is not such an event is not dropped: it is counted under the type ``_invalid`` in the hour
of its record timestamp, so the counts of the table always add up to the records read.

Exactly once across crashes
---------------------------
The query is a streaming aggregation in update mode: each micro-batch emits the full current
totals of the (hour, type) groups it touched. ``foreachBatch`` writes them with a dynamic
partition overwrite, which replaces exactly the ``hour=/event_type=`` directories present in
the batch and leaves every other group alone. The write is idempotent for a batch id: when the
driver dies during or after the write but before the batch is committed, the restarted query
re-runs the same batch id over the same offsets (from the offset log) on the same state
(version batch_id - 1 of the state store), so it produces the same rows and overwrites the
same directories again. Nothing is appended twice and nothing is lost.

Why not the other choices: complete mode rewrites the whole table every batch (cost grows with
history); append mode needs a watermark, so an hour is written only once a later event moves
the watermark past it, and an event later than the watermark would be dropped, which is
exactly what reliable logging must not do. The state here is one row per (hour, type), small
enough to keep without a watermark; add one (``withWatermark("event_time", "2 days")``) when
hours must be forgotten. A reader that runs while a batch is being written can see that
batch's groups half-replaced; a restarted query repairs them.

Run::

    PYSPARK_PYTHON=.venv/bin/python spark-submit examples/pipelines/hourly_aggregates/main.py \
        --bootstrap 127.0.0.1:9092 --topic events --output /data/hourly \
        --checkpoint /data/hourly-cp --available-now
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

EVENT_SCHEMA = "type string, user string, amount decimal(12,2), event_time timestamp"
OUTPUT_SCHEMA = "events long, amount decimal(22,2), hour timestamp, event_type string"
INVALID = "_invalid"


def hourly_totals(records: Any) -> Any:
    """Per (hour, event_type): events and amount, from raw records of the source."""
    from pyspark.sql import functions as F

    event = F.from_json(F.col("value").cast("string"), EVENT_SCHEMA)
    valid = event.isNotNull() & event["type"].isNotNull() & event["event_time"].isNotNull()
    events = records.select(
        F.when(valid, event["type"]).otherwise(F.lit(INVALID)).alias("event_type"),
        F.when(valid, event["event_time"]).otherwise(F.col("timestamp")).alias("event_time"),
        F.when(valid, F.coalesce(event["amount"], F.lit(0).cast("decimal(12,2)")))
        .otherwise(F.lit(0).cast("decimal(12,2)"))
        .alias("amount"),
    )
    return events.groupBy(
        F.date_trunc("hour", "event_time").alias("hour"), F.col("event_type")
    ).agg(F.count(F.lit(1)).alias("events"), F.sum("amount").alias("amount"))


def overwrite_groups(output: str) -> Any:
    """The foreachBatch function: replace the partitions of the groups in the batch."""

    def write(batch: Any, batch_id: int) -> None:
        (
            batch.select("events", "amount", "hour", "event_type")
            .write.mode("overwrite")
            .option("partitionOverwriteMode", "dynamic")
            .partitionBy("hour", "event_type")
            .parquet(output)
        )

    return write


def start(
    spark: Any,
    bootstrap: str,
    topic: str,
    output: str,
    checkpoint: str,
    *,
    available_now: bool = True,
    max_offsets_per_trigger: int | None = None,
) -> Any:
    """Start the query; returns the StreamingQuery."""
    reader = (
        spark.readStream.format("tidelog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", max_offsets_per_trigger)
    writer = (
        hourly_totals(reader.load())
        .writeStream.outputMode("update")
        .foreachBatch(overwrite_groups(output))
        .option("checkpointLocation", checkpoint)
        .queryName("hourly_aggregates")
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="500 milliseconds")
    return writer.start()


def read_table(spark: Any, output: str) -> Any:
    """The output table with its partition columns typed (not inferred from paths)."""
    return spark.read.schema(OUTPUT_SCHEMA).parquet(output)


def session(app: str) -> Any:
    # Python workers must import tidelog: default them to this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from tidelog.spark import register

    spark = (
        SparkSession.builder.appName(app)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    register(spark)
    return spark


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--topic", default="events")
    parser.add_argument("--output", required=True, help="Parquet table directory")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--available-now", action="store_true", help="drain and exit")
    parser.add_argument("--max-offsets-per-trigger", type=int)
    args = parser.parse_args(argv)
    spark = session("hourly-aggregates")
    spark.sparkContext.setLogLevel("WARN")
    query = start(
        spark,
        args.bootstrap,
        args.topic,
        args.output,
        args.checkpoint,
        available_now=args.available_now,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
