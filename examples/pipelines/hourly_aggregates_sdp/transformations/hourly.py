"""Definitions of the hourly aggregates pipeline (run by ``spark-pipelines run``).

``events_raw`` is a streaming table: every record of the events topic, appended once (its
offsets live in the flow's checkpoint under the spec's ``storage``). ``hourly_stats`` is a
materialized view recomputed from ``events_raw`` on each run with the same grouping as the
streaming pipeline in ../hourly_aggregates (imported from there).

The CLI runs this file in its own Python process against a Spark Connect server, with a
``spark`` session in the module's globals. The tidelog source is registered with that
session, and its readers run in the server's Python workers (PYSPARK_PYTHON must import
tidelog). Where to read from comes from the environment: TIDELOG_BOOTSTRAP (default
127.0.0.1:9092) and TIDELOG_EVENTS_TOPIC (default ``events``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from pyspark import pipelines as dp

from tidelog.spark import TidelogDataSource

_streaming = Path(__file__).resolve().parents[2] / "hourly_aggregates" / "main.py"
_spec = importlib.util.spec_from_file_location("hourly_aggregates_main", _streaming)
assert _spec is not None and _spec.loader is not None
hourly_aggregates = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hourly_aggregates)

# The pipelines CLI puts the session into this module's globals before running it.
spark: Any = globals()["spark"]
spark.dataSource.register(TidelogDataSource)

BOOTSTRAP = os.environ.get("TIDELOG_BOOTSTRAP", "127.0.0.1:9092")
TOPIC = os.environ.get("TIDELOG_EVENTS_TOPIC", "events")


@dp.table(comment="Every record of the events topic, once.")
def events_raw() -> Any:
    return (
        spark.readStream.format("tidelog")
        .option("kafka.bootstrap.servers", BOOTSTRAP)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
        .select("partition", "offset", "timestamp", "value")
    )


@dp.materialized_view(comment="Events and amount per event type and hour of event time.")
def hourly_stats() -> Any:
    return hourly_aggregates.hourly_totals(spark.read.table("events_raw")).select(
        "events", "amount", "hour", "event_type"
    )
