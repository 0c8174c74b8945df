"""Fixtures of the Spark tests: one broker process and one SparkSession for the whole session.

The broker is a real ``tidelog serve`` (tests/interop/interop_broker.py); the SparkSession is
``local[2]`` with the UI off, few shuffle partitions, and Python workers running this
interpreter (so they import the project and pyarrow from the same venv).
"""

from __future__ import annotations

import gc
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "interop"))

from interop_broker import BrokerProcess

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("spark-broker"), kind="tidelog")
    process.start()
    try:
        yield process
    finally:
        gc.collect()
        process.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from spark_helpers import local_session

    session = local_session(
        **{
            "spark.app.name": "tidelog-spark-tests",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.streaming.schemaInference": "false",
        }
    )
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name[:40]}-{uuid.uuid4().hex[:8]}".replace("[", "-").replace("]", "")


@pytest.fixture
def make_topic(broker: BrokerProcess) -> Callable[..., str]:
    from tidelog.client import Admin, NewTopic

    def make(name: str, partitions: int = 3) -> str:
        with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            admin.create_topics([NewTopic(name, partitions, 1)])
        return name

    return make
