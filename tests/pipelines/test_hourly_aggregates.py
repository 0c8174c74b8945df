"""Pipeline 1: JSON events -> hourly counts and sums per type -> Parquet, exactly once.

The expected table is computed in Python from the produced events (decimal amounts, so sums
are exact whatever order Spark adds them in). The crash test runs the pipeline's main script in
a child process, SIGKILLs it after some micro-batches and restarts it from the same checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path
from typing import Any

from hourly_data import INVALID, Expected, expected, make_events, records
from pipeline_helpers import EXAMPLES, pipeline
from spark_helpers import produce


def table(spark: Any, output: Path) -> Expected:
    rows = pipeline("hourly_aggregates").read_table(spark, str(output)).collect()
    got: Expected = {}
    for r in rows:
        group = (r.hour.replace(tzinfo=UTC), r.event_type)
        assert group not in got, f"two rows for {group}"
        got[group] = (r.events, r.amount)
    return got


def test_hourly_totals_in_several_batches_then_more_events_update_their_hours(
    spark: Any, broker: Any, create_topic: Any, topic: str, tmp_path: Path
) -> None:
    main = pipeline("hourly_aggregates")
    create_topic(topic, 3)
    first = make_events(160)
    produce(broker.bootstrap, topic, records(first, INVALID))
    output, checkpoint = tmp_path / "hourly", tmp_path / "cp"
    args = (spark, broker.bootstrap, topic, str(output), str(checkpoint))
    query = main.start(*args, max_offsets_per_trigger=60)
    query.awaitTermination()
    assert query.exception() is None
    want = expected(first, INVALID)
    assert table(spark, output) == want
    assert sum(n for n, _ in want.values()) == len(first) + len(INVALID)
    assert ("_invalid" in {t for _, t in want}) and len(want) > 10

    # More events of hours already written: those groups are replaced, the others kept.
    more = make_events(60, start=160)
    produce(broker.bootstrap, topic, records(more, []))
    query = main.start(*args)
    query.awaitTermination()
    assert query.exception() is None
    assert table(spark, output) == expected(first + more, INVALID)


def start_child(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(EXAMPLES / "hourly_aggregates" / "main.py"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def batches(checkpoint: Path, log: str) -> int:
    """How many batches the offset log (planned) or the commit log (done) holds."""
    folder = checkpoint / log
    return len([p for p in folder.iterdir() if p.name.isdigit()]) if folder.exists() else 0


def test_sigkill_of_the_driver_and_restart_give_exactly_the_expected_table(
    spark: Any, broker: Any, create_topic: Any, topic: str, tmp_path: Path
) -> None:
    create_topic(topic, 3)
    events = make_events(900)
    produce(broker.bootstrap, topic, records(events, INVALID))
    output, checkpoint, log = tmp_path / "hourly", tmp_path / "cp", tmp_path / "child.log"
    args = ["--bootstrap", broker.bootstrap, "--topic", topic]
    args += ["--output", str(output), "--checkpoint", str(checkpoint)]
    per_batch = 100
    child = start_child([*args, "--max-offsets-per-trigger", str(per_batch)], log)
    try:
        deadline = time.monotonic() + 120
        # Kill while a batch is in flight (planned, not committed) after two committed ones,
        # so that the restart replays a batch whose write may have begun.
        while batches(checkpoint, "commits") < 2 or (
            batches(checkpoint, "offsets") <= batches(checkpoint, "commits")
        ):
            assert child.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
    done = batches(checkpoint, "commits")
    assert done < (len(events) + len(INVALID)) // per_batch, "finished before the kill"
    partial = table(spark, output)
    assert sum(n for n, _ in partial.values()) < len(events) + len(INVALID)

    again = start_child([*args, "--available-now"], log)
    assert again.wait(180) == 0, log.read_text()[-3000:]
    assert table(spark, output) == expected(events, INVALID)
