"""Configuration that reaches a partition when the broker opens it: producer expiry."""

from __future__ import annotations

from typing import Any

from tidelog.broker.handlers.produce import handle_produce
from tidelog.broker.partitions import PRODUCER_EXPIRATION_CHECK_INTERVAL_MS
from tidelog.metadata.configs import ConfigResourceType
from tidelog.metadata.controller import AlterConfigOp, IncrementalAlterConfigsResource
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.storage import LogConfig

from .conftest import context, make_batch, produce_request, run


def _produce_idempotent(broker: Any, topic: str, producer_id: int, timestamp: int) -> None:
    batch = make_batch([b"x"], producer=(producer_id, 0, 0), timestamp=timestamp)
    request = produce_request(9, {topic: {0: batch}})
    response = run(handle_produce(context(broker, ApiKey.PRODUCE, 9), request))
    assert response.responses[0].partition_responses[0].error_code == ErrorCode.NONE


def test_ensure_passes_producer_id_expiration(broker: Any, clock: Any) -> None:
    short = broker.partitions.ensure(
        "short",
        0,
        config=LogConfig(),
        topic_id=None,
        leader_epoch=0,
        producer_id_expiration_ms=1000,
    )
    default = broker.partitions.ensure(
        "default", 0, config=LogConfig(), topic_id=None, leader_epoch=0
    )
    now = clock()
    _produce_idempotent(broker, "short", 7, now)
    _produce_idempotent(broker, "default", 7, now)
    # Expiry runs at most once per check interval; the produce above ran one.
    later = now + PRODUCER_EXPIRATION_CHECK_INTERVAL_MS
    assert [p.producer_id for p in short.active_producers(later)] == []
    assert [p.producer_id for p in default.active_producers(later)] == [7]


def test_broker_opens_partitions_with_its_producer_id_expiration(start_admin_broker: Any) -> None:
    broker = start_admin_broker({"producer.id.expiration.ms": "1234"})
    assert broker.controller.auto_create_topic("t").error.ok
    (partition,) = broker.partitions.of_topic("t")
    assert partition.producers.producer_id_expiration_ms == 1234


def test_dynamic_producer_id_expiration_reaches_open_partitions(start_admin_broker: Any) -> None:
    broker = start_admin_broker()
    assert broker.controller.auto_create_topic("t").error.ok
    (partition,) = broker.partitions.of_topic("t")
    assert partition.producers.producer_id_expiration_ms == 86_400_000
    change = [("producer.id.expiration.ms", AlterConfigOp.SET, "5000")]
    (result,) = broker.controller.incremental_alter_configs(
        [IncrementalAlterConfigsResource(ConfigResourceType.BROKER, "", change)]
    )
    assert result.error.ok, result.error
    assert partition.producers.producer_id_expiration_ms == 5000
