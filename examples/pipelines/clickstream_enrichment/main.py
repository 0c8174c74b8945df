"""Clickstream enrichment: a stream-table join of clicks with a compacted ``users`` topic.

Inputs:

- ``users``: a topic with ``cleanup.policy=compact``, key = user id, value = JSON attributes
  ``{"name": "Ada", "country": "NZ", "tier": "gold"}``; a record with a null value (tombstone)
  deletes the user. It is the change stream of a table: the table is the latest value per key.
- ``clicks``: key = user id, value = JSON ``{"user": "u1", "url": "/a", "click_time": "..."}``.

Output: the ``clicks-enriched`` topic, key = user id, value = the click's JSON with the user's
``name``, ``country`` and ``tier`` (null for a user the table does not know).

The table side is a batch read of the whole ``users`` topic reduced to the latest record per
key (highest offset; a key always lives on one partition, so offsets order its versions),
tombstones removed. Compaction only makes that read shorter: the reduction gives the same
table before and after the cleaner ran. In a stream-static join Spark plans the static side
again for every micro-batch, so each batch of clicks joins the users table as it is when the
batch runs: a user changed before a click's batch is seen with the new attributes, earlier
output is never rewritten.

Run::

    PYSPARK_PYTHON=.venv/bin/python spark-submit examples/pipelines/clickstream_enrichment/main.py \
        --bootstrap 127.0.0.1:9092 --checkpoint /data/enrich-cp
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

USER_SCHEMA = "name string, country string, tier string"
CLICK_SCHEMA = "user string, url string, click_time timestamp"


def users_table(spark: Any, bootstrap: str, users_topic: str) -> Any:
    """The latest attributes of every live user: user, name, country, tier."""
    from pyspark.sql import functions as F

    log = (
        spark.read.format("tidelog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", users_topic)
        .load()
    )
    latest = log.groupBy(F.col("key").cast("string").alias("user")).agg(
        F.max_by(F.col("value"), F.col("offset")).alias("value")
    )
    attributes = F.from_json(F.col("value").cast("string"), USER_SCHEMA)
    return latest.where(F.col("value").isNotNull()).select(
        "user",
        attributes["name"].alias("name"),
        attributes["country"].alias("country"),
        attributes["tier"].alias("tier"),
    )


def enriched_clicks(clicks: Any, users: Any) -> Any:
    """Clicks (source rows) joined with users; columns key and value for the sink."""
    from pyspark.sql import functions as F

    click = F.from_json(F.col("value").cast("string"), CLICK_SCHEMA)
    parsed = clicks.select(
        click["user"].alias("user"),
        click["url"].alias("url"),
        click["click_time"].alias("click_time"),
    )
    joined = parsed.join(users, on="user", how="left")
    return joined.select(
        F.col("user").alias("key"),
        F.to_json(F.struct("user", "url", "click_time", "name", "country", "tier")).alias("value"),
    )


def start(
    spark: Any,
    bootstrap: str,
    checkpoint: str,
    *,
    clicks_topic: str = "clicks",
    users_topic: str = "users",
    output_topic: str = "clicks-enriched",
    available_now: bool = True,
) -> Any:
    clicks = (
        spark.readStream.format("tidelog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", clicks_topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    writer = (
        enriched_clicks(clicks, users_table(spark, bootstrap, users_topic))
        .writeStream.format("tidelog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", output_topic)
        .option("checkpointLocation", checkpoint)
        .queryName("clickstream_enrichment")
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="1 second")
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
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--clicks-topic", default="clicks")
    parser.add_argument("--users-topic", default="users")
    parser.add_argument("--output-topic", default="clicks-enriched")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--available-now", action="store_true", help="drain and exit")
    args = parser.parse_args(argv)
    spark = session("clickstream-enrichment")
    spark.sparkContext.setLogLevel("WARN")
    query = start(
        spark,
        args.bootstrap,
        args.checkpoint,
        clicks_topic=args.clicks_topic,
        users_topic=args.users_topic,
        output_topic=args.output_topic,
        available_now=args.available_now,
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
