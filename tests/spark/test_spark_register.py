"""``register(spark)`` points the source's Python workers at the interpreter that has tidelog.

pyspark starts Python workers with ``PYSPARK_PYTHON``, else ``python3`` from PATH, which is
often an interpreter without tidelog (a virtualenv's python run by its path, not activated).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

CHILD = Path(__file__).parent / "plain_python_child.py"


def test_job_without_pyspark_python_reads_and_writes_when_path_python3_lacks_tidelog(
    broker: Any, make_topic: Any, topic: str, tmp_path: Path
) -> None:
    # The venv's base interpreter: same CPython, none of the venv's packages.
    bare = sys._base_executable
    assert subprocess.run([bare, "-c", "import tidelog"], capture_output=True).returncode != 0
    path_dir = tmp_path / "bin"
    path_dir.mkdir()
    (path_dir / "python3").symlink_to(bare)
    env = {
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PATH": f"{path_dir}:/usr/bin:/bin",
        **{k: os.environ[k] for k in ("JAVA_HOME", "TMPDIR") if k in os.environ},
    }
    assert "PYSPARK_PYTHON" not in env and "PYSPARK_DRIVER_PYTHON" not in env
    make_topic(topic, 2)

    job = subprocess.run(
        [sys.executable, str(CHILD), broker.bootstrap, topic, "50"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert job.returncode == 0, job.stderr[-3000:]
    assert sorted(job.stdout.split()) == sorted(f"value-{i}" for i in range(50))


def test_register_changes_only_the_sources_interpreter(spark: Any, monkeypatch: Any) -> None:
    from tidelog.spark import register, worker_python

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    context = spark.sparkContext
    before = context.pythonExec
    assert worker_python(spark) == sys.executable
    register(spark)
    # UDFs created afterwards still get pyspark's own choice.
    assert context.pythonExec == before


def test_a_named_interpreter_or_a_cluster_keeps_pysparks_choice(monkeypatch: Any) -> None:
    from types import SimpleNamespace

    from tidelog.spark import worker_python

    def session(master: str, conf: dict[str, str]) -> Any:
        return SimpleNamespace(_sc=SimpleNamespace(master=master, getConf=lambda: conf))

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert worker_python(session("local[*]", {})) == sys.executable
    assert worker_python(session("local-cluster[2,1,1024]", {})) == sys.executable
    assert worker_python(session("spark://host:7077", {})) is None
    assert worker_python(session("yarn", {})) is None
    assert worker_python(session("local[2]", {"spark.pyspark.python": "./venv/bin/python"})) is None
    assert worker_python(SimpleNamespace()) is None  # a Spark Connect session has no context
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python")
    assert worker_python(session("local[2]", {})) is None
