"""Searches joined with the clicks that follow them: a stream-stream join in event time.

Inputs (key = user id, JSON values):

- ``searches``: ``{"user": "u1", "query": "spark", "search_time": "2026-03-09T10:00:00Z"}``
- ``clicks``:   ``{"user": "u1", "url": "/r/1", "click_time": "2026-03-09T10:03:00Z"}``

Output: the ``search-clicks`` topic, key = user id, value = JSON ``{"user", "query",
"search_time", "url", "click_time"}`` for every click that follows a search of the same user
by at most ``--within`` minutes (a click after two such searches pairs with both).

Time: both streams carry a watermark ``--lateness`` minutes behind the latest event time seen
on that stream, and the query uses the smaller of the two (Spark's default ``min`` policy), so
a slow stream holds the other back instead of making its events late. The join keeps a search
in its state until no click at or above the watermark can match it any more, and a click until
no such search can. A record whose event time is below the watermark of the micro-batch
that reads it is late: it is dropped and shown as ``numRowsDroppedByWatermark`` in the query's
progress. Pairs are emitted as soon as both sides are there (inner join, append mode) and never
retracted.

Run::

    PYSPARK_PYTHON=.venv/bin/python spark-submit examples/pipelines/search_click_join/main.py \
        --bootstrap 127.0.0.1:9092 --checkpoint /data/search-clicks-cp --within 10 --lateness 5
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

SEARCH_SCHEMA = "user string, query string, search_time timestamp"
CLICK_SCHEMA = "user string, url string, click_time timestamp"


def parsed(records: Any, schema: str, fields: list[str]) -> Any:
    from pyspark.sql import functions as F

    value = F.from_json(F.col("value").cast("string"), schema)
    return records.select(*[value[f].alias(f) for f in fields])


def search_clicks(searches: Any, clicks: Any, within_minutes: int, lateness_minutes: int) -> Any:
    """Pairs of (search, click) of the same user, the click within the window after the
    search; columns key and value for the sink."""
    from pyspark.sql import functions as F

    lateness = f"{lateness_minutes} minutes"
    s = parsed(searches, SEARCH_SCHEMA, ["user", "query", "search_time"]).withWatermark(
        "search_time", lateness
    )
    c = (
        parsed(clicks, CLICK_SCHEMA, ["user", "url", "click_time"])
        .withColumnRenamed("user", "click_user")
        .withWatermark("click_time", lateness)
    )
    window_end = F.col("search_time") + F.expr(f"INTERVAL {within_minutes} MINUTES")
    pairs = s.join(
        c,
        (F.col("user") == F.col("click_user"))
        & (F.col("click_time") >= F.col("search_time"))
        & (F.col("click_time") <= window_end),
        "inner",
    )
    return pairs.select(
        F.col("user").alias("key"),
        F.to_json(F.struct("user", "query", "search_time", "url", "click_time")).alias("value"),
    )


def start(
    spark: Any,
    bootstrap: str,
    checkpoint: str,
    *,
    searches_topic: str = "searches",
    clicks_topic: str = "clicks",
    output_topic: str = "search-clicks",
    within_minutes: int = 10,
    lateness_minutes: int = 5,
    available_now: bool = True,
) -> Any:
    def stream(topic: str) -> Any:
        return (
            spark.readStream.format("tidelog")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
        )

    pairs = search_clicks(
        stream(searches_topic), stream(clicks_topic), within_minutes, lateness_minutes
    )
    writer = (
        pairs.writeStream.format("tidelog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", output_topic)
        .option("checkpointLocation", checkpoint)
        .queryName("search_click_join")
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
    parser.add_argument("--searches-topic", default="searches")
    parser.add_argument("--clicks-topic", default="clicks")
    parser.add_argument("--output-topic", default="search-clicks")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--within", type=int, default=10, help="minutes from search to click")
    parser.add_argument("--lateness", type=int, default=5, help="watermark delay, minutes")
    parser.add_argument("--available-now", action="store_true", help="drain and exit")
    args = parser.parse_args(argv)
    spark = session("search-click-join")
    spark.sparkContext.setLogLevel("WARN")
    query = start(
        spark,
        args.bootstrap,
        args.checkpoint,
        searches_topic=args.searches_topic,
        clicks_topic=args.clicks_topic,
        output_topic=args.output_topic,
        within_minutes=args.within,
        lateness_minutes=args.lateness,
        available_now=args.available_now,
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
