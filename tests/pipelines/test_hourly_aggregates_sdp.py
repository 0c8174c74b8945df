"""Pipeline 5: the hourly aggregates as a Spark Declarative Pipeline, run twice by the CLI.

The example directory and the streaming example it imports are copied under tmp_path with the
spec's storage pointed there; the CLI runs with tmp_path as working directory, so the tables
(spark-warehouse) and the Hive catalog (metastore_db) are the test's own. The Hive catalog is
what lets the second run find the tables of the first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import UTC
from pathlib import Path
from typing import Any

from hourly_data import INVALID, Expected, expected, make_events, records
from pipeline_helpers import EXAMPLES
from spark_helpers import produce

CLI = Path(sys.executable).parent / "spark-pipelines"
# pyspark 4.3's CLI can end a COMPLETED run with this error (a Python accumulator update
# reaches the client after the run) and exit status 1.
ACCUMULATOR_TRAP = "Unknown response: Plan observed(__python_accumulator__"


def copy_example(root: Path) -> Path:
    for name in ("hourly_aggregates", "hourly_aggregates_sdp"):
        shutil.copytree(EXAMPLES / name, root / "pipelines" / name)
    spec = root / "pipelines" / "hourly_aggregates_sdp" / "spark-pipeline.yml"
    text = spec.read_text()
    assert "file:///tmp/tidelog-hourly-sdp/storage" in text
    spec.write_text(
        text.replace("file:///tmp/tidelog-hourly-sdp/storage", (root / "storage").as_uri())
    )
    return spec


def run_pipeline(spec: Path, cwd: Path, bootstrap: str, topic: str) -> str:
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONDONTWRITEBYTECODE": "1",
        "TIDELOG_BOOTSTRAP": bootstrap,
        "TIDELOG_EVENTS_TOPIC": topic,
    }
    done = subprocess.run(
        [str(CLI), "run", "--spec", str(spec), "--conf", "spark.sql.catalogImplementation=hive"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = done.stdout + done.stderr
    assert "Run is COMPLETED." in log, log[-4000:]
    assert done.returncode == 0 or ACCUMULATOR_TRAP in log, log[-4000:]
    return log


def table(spark: Any, path: Path) -> Expected:
    got: Expected = {}
    for r in spark.read.parquet(str(path)).collect():
        group = (r.hour.replace(tzinfo=UTC), r.event_type)
        assert group not in got, f"two rows for {group}"
        got[group] = (r.events, r.amount)
    return got


def test_cli_runs_compute_the_hourly_table_and_append_each_record_once(
    spark: Any, broker: Any, create_topic: Any, topic: str, tmp_path: Path
) -> None:
    create_topic(topic, 3)
    first = make_events(200)
    produce(broker.bootstrap, topic, records(first, INVALID))
    spec = copy_example(tmp_path)
    run_pipeline(spec, tmp_path, broker.bootstrap, topic)
    warehouse = tmp_path / "spark-warehouse"
    assert table(spark, warehouse / "hourly_stats") == expected(first, INVALID)

    more = make_events(60, start=200)
    produce(broker.bootstrap, topic, records(more, []))
    run_pipeline(spec, tmp_path, broker.bootstrap, topic)
    assert table(spark, warehouse / "hourly_stats") == expected(first + more, INVALID)
    raw = spark.read.parquet(str(warehouse / "events_raw")).select("partition", "offset").collect()
    positions = [(r.partition, r.offset) for r in raw]
    assert len(positions) == len(set(positions)) == len(first) + len(INVALID) + len(more)
