"""Tidelog topics as a PySpark data source and sink: ``format("tidelog")``.

    from tidelog.spark import register
    register(spark)
    df = (spark.readStream.format("tidelog")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "events").load())

The options, the output schema and the sink columns are those of Spark's Kafka connector
(see ``docs/spark.md``). Modules: :mod:`.options` (parsing and checking options),
:mod:`.source` (batch and streaming readers, offsets, data-loss policy), :mod:`.arrow_decode`
(record batches to Arrow columns), :mod:`.sink` (writers). Everything talks to the cluster
through :mod:`tidelog.client`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from tidelog.spark.options import TidelogOptionError, parse_sink_options, parse_source_options
from tidelog.spark.sink import TidelogBatchWriter, TidelogStreamWriter, check_sink_schema
from tidelog.spark.source import DataLossError, TidelogBatchReader, TidelogStreamReader

FORMAT = "tidelog"

_BASE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
_HEADERS = "headers array<struct<key: string, value: binary>>"


def source_schema(include_headers: bool) -> str:
    """The DDL schema of what the source reads."""
    return f"{_BASE_SCHEMA}, {_HEADERS}" if include_headers else _BASE_SCHEMA


class TidelogDataSource(DataSource):
    """The ``tidelog`` format: Kafka-compatible topics for Spark reads and writes."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        include = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return source_schema(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        return TidelogBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TidelogStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            # Spark's own error for the default mode suggests Overwrite; a topic cannot be
            # truncated, so refuse it (as Spark's Kafka sink does) instead of appending.
            raise TidelogOptionError(
                'save mode Overwrite is not allowed: a topic cannot be truncated; use .mode("append")'
            )
        options = parse_sink_options(self.options)
        check_sink_schema(schema, options)
        return TidelogBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = parse_sink_options(self.options)
        check_sink_schema(schema, options)
        return TidelogStreamWriter(options)


def worker_python(spark: Any) -> str | None:
    """The interpreter the Python workers of ``format("tidelog")`` must run, when pyspark
    would otherwise start ``python3`` from PATH (which may lack tidelog); None to keep
    pyspark's choice.

    Only when nothing names an interpreter (``PYSPARK_PYTHON``, ``spark.pyspark.python``),
    and only for a local master, whose workers run on this machine and can start
    ``sys.executable``; a cluster's nodes may not have that path."""
    context = getattr(spark, "_sc", None)  # None for a Spark Connect session
    if context is None or os.environ.get("PYSPARK_PYTHON"):
        return None
    if context.getConf().get("spark.pyspark.python") or not context.master.startswith("local"):
        return None
    return sys.executable


def register(spark: Any) -> None:
    """Register the ``tidelog`` format with ``spark`` (a SparkSession).

    The registered data source carries the interpreter its Python workers start; see
    :func:`worker_python`. Other Python code of the session keeps pyspark's choice."""
    python = worker_python(spark)
    if python is None:
        spark.dataSource.register(TidelogDataSource)
        return
    # pyspark stamps the context's pythonExec into the registered function, and every
    # reader and writer of the source inherits it; restore it so UDFs are not affected.
    context = spark._sc
    previous = context.pythonExec
    context.pythonExec = python
    try:
        spark.dataSource.register(TidelogDataSource)
    finally:
        context.pythonExec = previous


__all__ = [
    "FORMAT",
    "DataLossError",
    "TidelogDataSource",
    "TidelogOptionError",
    "register",
    "source_schema",
    "worker_python",
]
