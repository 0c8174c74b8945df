"""Helpers of the pipeline tests: importing the examples, reading topics back, producing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pipelines"


def pipeline(name: str) -> ModuleType:
    """The main module of examples/pipelines/<name>."""
    module_name = f"pipeline_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / name / "main.py")
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def read_topic(spark: Any, bootstrap: str, topic: str) -> list[Any]:
    """Every record of ``topic`` (batch read through format("tidelog")), in offset order."""
    return (
        spark.read.format("tidelog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .load()
        .orderBy("partition", "offset")
        .collect()
    )


def produce_keyed(
    bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None, int | None]]
) -> None:
    """(key, value or None for a tombstone, timestamp ms or None) records; the partition is
    the key's murmur2 partition, as Java clients and the tidelog sink choose it."""
    import confluent_kafka

    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "linger.ms": 10}
    )
    errors: list[Any] = []
    for key, value, ts in records:
        producer.produce(
            topic,
            value=value,
            key=key,
            timestamp=ts or 0,
            on_delivery=lambda err, _m: err and errors.append(err),
        )
    assert producer.flush(30) == 0
    assert not errors, errors
