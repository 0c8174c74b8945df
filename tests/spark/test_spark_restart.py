"""A streaming query whose driver is killed with SIGKILL resumes from its checkpoint with no
gap and no duplicate (source offsets in the checkpoint, Parquet's exactly-once file sink)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from spark_helpers import produce

CHILD = Path(__file__).parent / "stream_child.py"


def start_child(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


def test_sigkill_of_the_driver_then_restart_has_no_gap_and_no_duplicate(
    spark: Any, broker: Any, make_topic: Any, topic: str, tmp_path: Path
) -> None:
    make_topic(topic, 3)
    n = 6000
    produce(broker.bootstrap, topic, [(i % 3, None, f"{i}".encode(), None, []) for i in range(n)])
    output, checkpoint, log = tmp_path / "out", tmp_path / "cp", tmp_path / "child.log"
    args = [broker.bootstrap, topic, str(output), str(checkpoint)]
    child = start_child([*args, "forever"], log)
    try:
        deadline = time.monotonic() + 120
        while committed_batches(checkpoint) < 3:
            assert child.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
    done_before = committed_batches(checkpoint)
    assert done_before < n // 400, "the query finished before it was killed"
    again = start_child([*args, "available-now"], log)
    assert again.wait(180) == 0, log.read_text()[-3000:]
    rows = spark.read.parquet(str(output)).select("topic", "partition", "offset", "value").collect()
    keys = [(r.topic, r.partition, r.offset) for r in rows]
    assert len(keys) == len(set(keys)) == n
    assert set(keys) == {(topic, p, o) for p in range(3) for o in range(n // 3)}
    assert all(int(r.value) == r.offset * 3 + r.partition for r in rows)
