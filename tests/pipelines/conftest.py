"""Fixtures of the pipeline tests: the Spark tests' broker and SparkSession, and the examples.

``broker``, ``spark`` and ``topic`` are the fixtures of tests/spark/conftest.py (one real
``tidelog serve`` and one ``local[2]`` SparkSession per test session), loaded from that file
and re-exported here so the two directories share their definitions. Helpers of the tests
are in pipeline_helpers.py.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


sys.path.insert(0, str(Path(__file__).parent))
# Loading it also puts tests/spark (spark_helpers) and tests/interop on sys.path and points
# PYSPARK_PYTHON at this interpreter.
_spark = _load(ROOT / "tests" / "spark" / "conftest.py", "spark_tests_conftest")
broker = _spark.broker
spark = _spark.spark
topic = _spark.topic


@pytest.fixture
def create_topic(broker: Any) -> Callable[..., str]:
    from tidelog.client import Admin, NewTopic

    def create(name: str, partitions: int = 3, configs: dict[str, str] | None = None) -> str:
        with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            admin.create_topics([NewTopic(name, partitions, 1, configs or {})])
        return name

    return create
