"""Spark batch reads of a Tidelog topic, beside Spark's own sources in the same run.

Starts ``tidelog serve`` on a free port with a temporary data directory, writes N records
(default 1,000,000) of 100-byte values to a 3-partition topic with confluent-kafka, then times
on ``local[2]``:

- ``format("tidelog")`` read -> ``count()``
- ``format("tidelog")`` read -> Parquet write
- ``spark.range(N)`` -> ``count()`` (Spark's cheapest source)
- a Parquet read of the same rows -> ``count()`` (forcing every column to be read)
- a Python data source of the same schema, rows and partitions that yields Arrow batches
  built before the run -> ``count()``: what any ``pyspark.sql.datasource`` source can
  reach here (Python worker round trips, Arrow transfer to the JVM, rows in the JVM)

Each figure is the best of ``--repeat`` rounds after one warm-up round; a round runs every
scenario once. Prints a table and a final JSON line. Usage: ``.venv/bin/python bench/spark_bench.py [--records N] [--repeat 3]
[--option NAME=VALUE ...] [--count-only]`` (source options for the tidelog reads, e.g.
``--option maxRecordsPerPartition=170000``; ``--count-only`` times the tidelog ``count()``
and the floor source only, for comparing two versions of the reader run after run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_broker(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    tidelog = Path(sys.executable).parent / "tidelog"
    proc = subprocess.Popen(
        [str(tidelog), "serve", "--port", str(port), "--data-dir", str(data_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the broker did not start")


def produce(bootstrap: str, topic: str, n: int) -> float:
    import confluent_kafka

    from tidelog.client import Admin, NewTopic

    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 3, 1)])
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000}
    )
    value = b"v" * 100
    started = time.perf_counter()
    for i in range(n):
        while True:
            try:
                producer.produce(topic, value=value, partition=i % 3)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(60):
        raise RuntimeError("records were not acknowledged")
    return time.perf_counter() - started


def python_floor_source(n: int, partitions: int, batch_rows: int = 65_536) -> type:
    """A Python data source (format ``arrow_floor``) of ``n`` rows of the tidelog schema in
    ``partitions`` partitions, yielding one Arrow batch built once per task, repeated."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from tidelog.spark import source_schema

    class Rows(InputPartition):
        def __init__(self, index: int, rows: int) -> None:
            self.index, self.rows = index, rows

    class Reader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            per, extra = divmod(n, partitions)
            return [Rows(i, per + (i < extra)) for i in range(partitions)]

        def read(self, partition: InputPartition) -> Any:
            import numpy as np
            import pyarrow as pa

            from tidelog.spark.arrow_decode import TIMESTAMP_TYPE, arrow_schema

            assert isinstance(partition, Rows)
            k = min(batch_rows, partition.rows)
            value = pa.array([b"v" * 100]).take(pa.array(np.zeros(k, np.int64)))
            stamps = np.full(k, 1_700_000_000_000_000, np.int64)
            full = pa.RecordBatch.from_arrays(
                [
                    pa.nulls(k, pa.binary()),
                    value,
                    pa.repeat(pa.scalar("bench"), k),
                    pa.repeat(pa.scalar(partition.index, pa.int32()), k),
                    pa.array(np.arange(k, dtype=np.int64)),
                    pa.array(stamps).cast(TIMESTAMP_TYPE),
                    pa.repeat(pa.scalar(0, pa.int32()), k),
                ],
                schema=arrow_schema(False),
            )
            left = partition.rows
            while left > 0:
                yield full.slice(0, min(k, left))
                left -= k

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "arrow_floor"

        def schema(self) -> str:
            return source_schema(False)

        def reader(self, schema: Any) -> DataSourceReader:
            return Reader()

    return Floor


def timed_rounds(rounds: int, scenarios: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """The best time of each scenario over ``rounds`` rounds, each round running every
    scenario once, in order, after one warm-up round.

    Rounds rather than one scenario's runs back to back: the JVM keeps compiling the code
    that turns Arrow batches into rows for many queries, and a scenario measured after
    others would otherwise find it faster than the one measured first.
    """
    for action in scenarios.values():
        action()  # warm-up: Python workers, JIT, page cache
    times: dict[str, list[float]] = {name: [] for name in scenarios}
    for _ in range(rounds):
        for name, action in scenarios.items():
            started = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - started)
    return {name: min(t) for name, t in times.items()}


def expect_rows(what: str, action: Callable[[], int], n: int) -> Callable[[], int]:
    """``action``, checked to count ``n`` rows every time it runs."""

    def checked() -> int:
        rows = action()
        if rows != n:
            raise RuntimeError(f"{what} counted {rows} rows, expected {n}")
        return rows

    return checked


def scenarios(
    spark: Any, df: Any, floor: Any, parquet: Path, n: int, count_only: bool
) -> dict[str, Callable[[], Any]]:
    """What is timed, by figure name: the tidelog read into ``count()`` (and into Parquet),
    Spark's own sources (``range``, that Parquet read back) and the floor source."""
    timed: dict[str, Callable[[], Any]] = {
        "tidelog_count": expect_rows("the tidelog source", df.count, n)
    }
    if not count_only:
        timed["tidelog_to_parquet"] = lambda: df.write.mode("overwrite").parquet(str(parquet))
        timed["spark_range_count"] = lambda: spark.range(n).count()
        # Touch every column so the scan cannot be answered from metadata.
        timed["parquet_read_count"] = expect_rows(
            "the Parquet read",
            lambda: int(spark.read.parquet(str(parquet)).where("length(value) >= 0").count()),
            n,
        )
    timed["python_source_floor_count"] = expect_rows("the floor source", floor.count, n)
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--option", action="append", default=[], metavar="NAME=VALUE", help="a source option"
    )
    parser.add_argument(
        "--count-only", action="store_true", help="time the count() and the floor source only"
    )
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.option)
    n = args.records
    os.environ["PYSPARK_PYTHON"] = sys.executable
    work = Path(tempfile.mkdtemp(prefix="tidelog-spark-bench-"))
    port = free_port()
    broker = start_broker(work / "data", port)
    bootstrap = f"127.0.0.1:{port}"
    try:
        produce_s = produce(bootstrap, "bench", n)
        from pyspark.sql import SparkSession

        from tidelog.spark import register

        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        df = (
            spark.read.format("tidelog")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", "bench")
            .options(**extra)
            .load()
        )
        spark.dataSource.register(python_floor_source(n, 3))
        floor = spark.read.format("arrow_floor").load()
        timed = scenarios(spark, df, floor, work / "parquet", n, args.count_only)
        figures = {name: n / seconds for name, seconds in timed_rounds(args.repeat, timed).items()}
        spark.stop()
    finally:
        broker.terminate()
        broker.wait(30)
        shutil.rmtree(work, ignore_errors=True)

    print(f"records: {n:,} x 100-byte values, 3 partitions, local[2]; produced in {produce_s:.2f}s")
    if extra:
        print(f"source options: {extra}")
    print(f"{'what':28} {'rows/s':>14}")
    for name, rate in figures.items():
        print(f"{name:28} {rate:>14,.0f}")
    print(
        json.dumps(
            {
                "records": n,
                "options": extra,
                "rows_per_s": {k: round(v) for k, v in figures.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
