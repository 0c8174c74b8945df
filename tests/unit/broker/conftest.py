"""Fixtures for calling broker handlers directly, without sockets."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidelog.broker.broker import Broker
from tidelog.broker.connection import RequestContext
from tidelog.broker.partitions import Partitions
from tidelog.protocol import ApiKey, RequestHeader
from tidelog.security.principal import ANONYMOUS, KafkaPrincipal
from tidelog.storage import LogConfig, LogManager


class FakeClock:
    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


class _NoConnection:
    peer = "test:0"
    listener = "PLAINTEXT"
    principal = ANONYMOUS
    #: the throttle times a handler muted this connection for (quotas)
    muted_ms: list[int]

    def __init__(self) -> None:
        self.muted_ms = []

    def mute_for(self, throttle_ms: int) -> None:
        self.muted_ms.append(throttle_ms)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(tmp_path: Path, clock: FakeClock) -> Iterator[Broker]:
    logs = LogManager([tmp_path / "data"], clock=clock)
    logs.open()
    b = Broker(node_id=1, partitions=Partitions(logs), clock=clock)
    yield b
    logs.close()


def add_topic(
    broker: Broker, topic: str, partitions: int = 1, config: LogConfig | None = None
) -> uuid.UUID:
    """Create the partitions of ``topic`` directly (no controller involved)."""
    topic_id = uuid.uuid4()
    for index in range(partitions):
        broker.partitions.ensure(
            topic, index, config=config or LogConfig(), topic_id=topic_id, leader_epoch=0
        )
    return topic_id


def context(
    broker: Broker,
    api_key: ApiKey,
    version: int,
    client_id: str = "test",
    principal: KafkaPrincipal = ANONYMOUS,
    peer: str = "test:0",
) -> Any:
    connection = _NoConnection()
    connection.principal = principal
    connection.peer = peer
    header = RequestHeader(int(api_key), version, 1, client_id)
    return RequestContext(broker, connection, header)  # type: ignore[arg-type]


# -- Produce / idempotent producer helpers ------------------------------------------------


def run(coro: Any) -> Any:
    """Run a handler coroutine (and whatever it defers) on a fresh event loop."""
    import asyncio

    return asyncio.run(coro)


def make_batch(
    values: list[bytes] | None = None,
    *,
    keys: list[bytes | None] | None = None,
    timestamp: int = 1_700_000_000_000,
    timestamps: list[int] | None = None,
    producer: tuple[int, int, int] | None = None,
    compression: int = 0,
    transactional: bool = False,
    control: bool = False,
) -> bytes:
    """One RecordBatch v2 as a producer sends it; ``producer`` = (id, epoch, base seq)."""
    from tidelog.records import BatchBuilder

    builder = BatchBuilder(compression=compression, transactional=transactional, control=control)
    if producer is not None:
        builder.set_producer(*producer)
    if values is None:
        values = [b"v%d" % i for i in range(len(timestamps) if timestamps else 3)]
    for index, value in enumerate(values):
        key = keys[index] if keys is not None else b"k%d" % index
        ts = timestamps[index] if timestamps is not None else timestamp
        builder.append(key, value, timestamp=ts)
    return builder.close()


def produce_request(
    version: int,
    topics: dict[Any, dict[int, bytes | None]],
    *,
    acks: int = 1,
    transactional_id: str | None = None,
) -> Any:
    """A kio ProduceRequest of ``version``; topic keys are names (v3-12) or UUIDs (v13)."""
    import datetime
    import importlib

    from kio.static.primitive import i32Timedelta

    module = importlib.import_module(f"kio.schema.produce.v{version}.request")
    topic_data = []
    for key, partitions in topics.items():
        data = tuple(
            module.PartitionProduceData(index=index, records=records)
            for index, records in partitions.items()
        )
        if version >= 13:
            topic_data.append(module.TopicProduceData(topic_id=key, partition_data=data))
        else:
            topic_data.append(module.TopicProduceData(name=key, partition_data=data))
    return module.ProduceRequest(
        transactional_id=transactional_id,
        acks=acks,
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=tuple(topic_data),
    )


def stored_batches(broker: Broker, topic: str, index: int = 0) -> list[Any]:
    """Headers of every batch in the partition's log."""
    from tidelog.records import iter_batches

    log = broker.partitions.get(topic, index).log  # type: ignore[union-attr]
    if log.log_end_offset == log.log_start_offset:
        return []
    data = log.read_bytes(log.log_start_offset, 1 << 30)
    return [header for _, header in iter_batches(data)]


# -- a broker with a real controller (admin API tests) ------------------------------------


@pytest.fixture
def start_admin_broker(tmp_path: Path, clock: FakeClock) -> Iterator[Any]:
    """Start a Broker backed by a real Controller in ``tmp_path``; call with extra config.

    Metadata changes reach the broker synchronously, inside each controller operation.
    """
    from tidelog.metadata.configs import BrokerConfig
    from tidelog.metadata.log import METADATA_PARTITION, METADATA_TOPIC
    from tidelog.metadata.node import build_metadata_node
    from tidelog.runtime.system import Runtime

    started: list[tuple[Any, LogManager, Broker]] = []

    def start(extra: dict[str, str] | None = None, *, fsync: Any = os.fsync) -> Broker:
        """``fsync``: what the partition logs sync with (a failing disk, in some tests)."""
        values = {"log.dirs": str(tmp_path / "data")}
        values.update(extra or {})
        node = build_metadata_node(BrokerConfig(values), Runtime.system(clock))
        controller = node.controller
        config = controller.config
        logs = LogManager(
            config.log_dirs,
            clock=clock,
            default_config=config.default_log_config,
            reserved_dirs={f"{METADATA_TOPIC}-{METADATA_PARTITION}"},
            fsync=fsync,
        )
        logs.open()
        b = Broker(
            node_id=config.node_id, partitions=Partitions(logs), clock=clock, controller=controller
        )
        b.apply_metadata(controller.image, None)
        node.loader.add_publisher(b.apply_metadata)
        started.append((node, logs, b))
        return b

    yield start
    for node, logs, b in reversed(started):
        b.partitions.close()
        logs.close()
        node.close()


@pytest.fixture
def admin_broker(start_admin_broker: Any) -> Broker:
    return start_admin_broker()  # type: ignore[no-any-return]
