"""InitProducerId and DescribeProducers handlers."""

from __future__ import annotations

import datetime
import importlib
from typing import Any

import pytest
from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
from kio.static.primitive import i32Timedelta

from tidelog.broker.handlers.produce import handle_produce
from tidelog.broker.handlers.producers import (
    handle_describe_producers,
    handle_init_producer_id,
)
from tidelog.protocol import ApiKey, ErrorCode

from .conftest import add_topic, context, make_batch, produce_request, run


@pytest.fixture
def ids(broker: Any) -> list[int]:
    allocated: list[int] = []

    async def allocate() -> int:
        allocated.append(1000 + len(allocated))
        return allocated[-1]

    broker.allocate_producer_id = allocate
    return allocated


def init(broker: Any, version: int, **fields: Any) -> Any:
    module = importlib.import_module(f"kio.schema.init_producer_id.v{version}.request")
    fields.setdefault("transactional_id", None)
    request = module.InitProducerIdRequest(
        transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)), **fields
    )
    return run(handle_init_producer_id(context(broker, ApiKey.INIT_PRODUCER_ID, version), request))


@pytest.mark.parametrize("version", range(0, 7))
def test_init_producer_id_allocates_new_ids(broker: Any, ids: list[int], version: int) -> None:
    first = init(broker, version)
    second = init(broker, version)
    assert first.error_code == ErrorCode.NONE
    assert (first.producer_id, first.producer_epoch) == (1000, 0)
    assert (second.producer_id, second.producer_epoch) == (1001, 0)
    assert type(first).__module__ == f"kio.schema.init_producer_id.v{version}.response"


def test_init_producer_id_with_existing_id_gets_a_fresh_one(broker: Any, ids: list[int]) -> None:
    response = init(broker, 4, producer_id=77, producer_epoch=3)
    assert response.error_code == ErrorCode.NONE
    assert (response.producer_id, response.producer_epoch) == (1000, 0)


@pytest.mark.parametrize(("pid", "epoch"), [(-1, 3), (77, -1)])
def test_init_producer_id_half_set_pair_is_invalid(
    broker: Any, ids: list[int], pid: int, epoch: int
) -> None:
    response = init(broker, 4, producer_id=pid, producer_epoch=epoch)
    assert response.error_code == ErrorCode.INVALID_REQUEST
    assert ids == []


def test_init_producer_id_transactional_without_a_coordinator(broker: Any, ids: list[int]) -> None:
    # This broker has no transaction coordinator driver: retriable, and no id is spent.
    # (The coordinator's answers are in test_transactions_api.py.)
    response = init(broker, 4, transactional_id="tx-1")
    assert response.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert (response.producer_id, response.producer_epoch) == (-1, -1)
    assert init(broker, 4, transactional_id="").error_code == ErrorCode.INVALID_REQUEST
    assert ids == []


def test_init_producer_id_two_phase_commit_refused(broker: Any, ids: list[int]) -> None:
    response = init(broker, 6, transactional_id="tx-1", enable2_pc=True)
    assert response.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert ids == []


def test_init_producer_id_allocation_failure(broker: Any) -> None:
    async def unavailable() -> int:
        raise TimeoutError("controller unavailable")

    broker.allocate_producer_id = unavailable
    assert init(broker, 4).error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE


def describe(broker: Any, topics: dict[str, list[int]]) -> Any:
    request = DescribeProducersRequest(
        topics=tuple(TopicRequest(name=n, partition_indexes=tuple(p)) for n, p in topics.items())
    )
    return run(handle_describe_producers(context(broker, ApiKey.DESCRIBE_PRODUCERS, 0), request))


def test_describe_producers(broker: Any, clock: Any) -> None:
    add_topic(broker, "t", 2)
    now = clock()
    for pid, epoch, seq, n in [(9, 1, 0, 3), (5, 0, 0, 2), (9, 1, 3, 4)]:
        batch = make_batch([b"x"] * n, producer=(pid, epoch, seq), timestamp=now + pid)
        request = produce_request(9, {"t": {0: batch}})
        run(handle_produce(context(broker, ApiKey.PRODUCE, 9), request))
    response = describe(broker, {"t": [0, 1, 7], "missing": [0]})
    p0, p1, p7 = response.topics[0].partitions
    assert p0.error_code == ErrorCode.NONE
    assert [
        (p.producer_id, p.producer_epoch, p.last_sequence, p.last_timestamp)
        for p in p0.active_producers
    ] == [(5, 0, 1, now + 5), (9, 1, 6, now + 9)]
    assert all(
        (p.coordinator_epoch, p.current_txn_start_offset) == (-1, -1) for p in p0.active_producers
    )
    assert p1.error_code == ErrorCode.NONE and p1.active_producers == ()
    assert p7.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert response.topics[1].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
