"""Top 10 movers of the day, in two stages joined by a single-partition topic.

Input: ``trades``, key = symbol, value = JSON
``{"symbol": "ACME", "price": "101.25", "trade_time": "2026-03-09T10:00:00Z"}``, spread over
any number of partitions.

Stage 1 (``main.py stage1``), parallel: per day and symbol, the first and last price by trade
time, the number of trades and the change in percent. A streaming aggregation in update mode:
every micro-batch writes the new summary of each (day, symbol) it touched to the intermediate
topic ``movers-daily`` (key ``day|symbol``). That topic has one partition and
``cleanup.policy=compact`` (stage 1 creates it so when it is missing): it holds only small
summaries, one live value per key, so one reader sees all of them in order.

Stage 2 (``main.py stage2``), one reader: the latest summary per key (highest offset of the
one partition) kept by a complete-mode aggregation, then, in ``foreachBatch``, the ten largest
changes per day (ties: by symbol). Each ranking is written to ``top-movers`` with key = day
and value = JSON ``{"day", "movers": [{"rank", "symbol", "change_pct", "open", "last"}]}``; the
latest record of a day is its current ranking.

Both stages write from ``foreachBatch``: on Spark 4.3 a Python data source sink accepts append
and complete mode but not update mode (its write builder lacks the update-as-append
capability), so ``writeStream.format("tidelog").outputMode("update")`` fails at start. A
micro-batch replayed after a crash writes its summaries or rankings again; they are whole
values per key, so a reader that keeps the latest record per key sees the same result.

Run::

    export PYSPARK_PYTHON=.venv/bin/python
    spark-submit examples/pipelines/top_movers/main.py stage1 --checkpoint /data/movers1-cp
    spark-submit examples/pipelines/top_movers/main.py stage2 --checkpoint /data/movers2-cp
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

TRADE_SCHEMA = "symbol string, price decimal(12,2), trade_time timestamp"
SUMMARY_SCHEMA = (
    "day date, symbol string, open decimal(12,2), last decimal(12,2), trades long, "
    "change_pct double"
)
TOP = 10


def ensure_intermediate_topic(bootstrap: str, topic: str) -> None:
    """Create the one-partition, compacted intermediate topic unless it exists."""
    from tidelog.client import Admin, NewTopic

    with Admin({"bootstrap.servers": bootstrap}) as admin:
        if topic in admin.list_topics():
            partitions = len(admin.describe_topics([topic])[topic].partitions)
            if partitions != 1:
                raise SystemExit(f"{topic} has {partitions} partitions; stage 2 needs one")
            return
        admin.create_topics([NewTopic(topic, 1, -1, {"cleanup.policy": "compact"})])


def daily_summaries(trades: Any) -> Any:
    """Stage 1: per (day, symbol) summary rows as key and JSON value."""
    from pyspark.sql import functions as F

    trade = F.from_json(F.col("value").cast("string"), TRADE_SCHEMA)
    rows = trades.select(
        trade["symbol"].alias("symbol"),
        trade["price"].alias("price"),
        trade["trade_time"].alias("trade_time"),
    )
    summary = rows.groupBy(F.to_date("trade_time").alias("day"), "symbol").agg(
        F.min_by("price", "trade_time").alias("open"),
        F.max_by("price", "trade_time").alias("last"),
        F.count(F.lit(1)).alias("trades"),
    )
    change = F.round((F.col("last") - F.col("open")) / F.col("open") * 100, 4).cast("double")
    return summary.select(
        F.concat_ws("|", F.col("day").cast("string"), "symbol").alias("key"),
        F.to_json(
            F.struct("day", "symbol", "open", "last", "trades", change.alias("change_pct"))
        ).alias("value"),
    )


def rankings(latest: Any) -> Any:
    """Stage 2 on a batch of latest summaries (key, value): the top movers per day."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    s = F.from_json(F.col("value").cast("string"), SUMMARY_SCHEMA)
    summaries = latest.select(s.alias("s")).select("s.*")
    by_change = Window.partitionBy("day").orderBy(F.desc("change_pct"), F.asc("symbol"))
    ranked = summaries.withColumn("rank", F.row_number().over(by_change)).where(
        F.col("rank") <= TOP
    )
    mover = F.struct("rank", "symbol", "change_pct", "open", "last")
    return (
        ranked.groupBy("day")
        .agg(F.sort_array(F.collect_list(mover)).alias("movers"))
        .select(
            F.col("day").cast("string").alias("key"),
            F.to_json(F.struct("day", "movers")).alias("value"),
        )
    )


def write_topic(rows: Any, bootstrap: str, topic: str) -> None:
    """Append key/value rows of a batch DataFrame to a topic."""
    (
        rows.write.format("tidelog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .mode("append")
        .save()
    )


def start_stage1(
    spark: Any,
    bootstrap: str,
    checkpoint: str,
    *,
    trades_topic: str = "trades",
    intermediate_topic: str = "movers-daily",
    max_offsets_per_trigger: int | None = None,
    available_now: bool = True,
) -> Any:
    ensure_intermediate_topic(bootstrap, intermediate_topic)
    reader = (
        spark.readStream.format("tidelog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", trades_topic)
        .option("startingOffsets", "earliest")
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", max_offsets_per_trigger)

    def publish(batch: Any, batch_id: int) -> None:
        write_topic(batch, bootstrap, intermediate_topic)

    # A Python data source sink takes append and complete mode only (see the module doc), so
    # the update-mode rows go through foreachBatch and a batch write.
    writer = (
        daily_summaries(reader.load())
        .writeStream.outputMode("update")
        .foreachBatch(publish)
        .option("checkpointLocation", checkpoint)
        .queryName("top_movers_stage1")
    )
    writer = writer.trigger(availableNow=True) if available_now else writer
    return writer.start()


def start_stage2(
    spark: Any,
    bootstrap: str,
    checkpoint: str,
    *,
    intermediate_topic: str = "movers-daily",
    output_topic: str = "top-movers",
    available_now: bool = True,
) -> Any:
    from pyspark.sql import functions as F

    summaries = (
        spark.readStream.format("tidelog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", intermediate_topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    latest = summaries.groupBy("key").agg(F.max_by("value", "offset").alias("value"))

    def publish(batch: Any, batch_id: int) -> None:
        write_topic(rankings(batch), bootstrap, output_topic)

    writer = (
        latest.writeStream.outputMode("complete")
        .foreachBatch(publish)
        .option("checkpointLocation", checkpoint)
        .queryName("top_movers_stage2")
    )
    writer = writer.trigger(availableNow=True) if available_now else writer
    return writer.start()


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
    parser.add_argument("stage", choices=["stage1", "stage2"])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--trades-topic", default="trades")
    parser.add_argument("--intermediate-topic", default="movers-daily")
    parser.add_argument("--output-topic", default="top-movers")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--available-now", action="store_true", help="drain and exit")
    args = parser.parse_args(argv)
    spark = session(f"top-movers-{args.stage}")
    spark.sparkContext.setLogLevel("WARN")
    if args.stage == "stage1":
        query = start_stage1(
            spark,
            args.bootstrap,
            args.checkpoint,
            trades_topic=args.trades_topic,
            intermediate_topic=args.intermediate_topic,
            available_now=args.available_now,
        )
    else:
        query = start_stage2(
            spark,
            args.bootstrap,
            args.checkpoint,
            intermediate_topic=args.intermediate_topic,
            output_topic=args.output_topic,
            available_now=args.available_now,
        )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
