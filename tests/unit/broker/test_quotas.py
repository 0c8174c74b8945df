"""Byte-rate quotas: Kafka's sampled rate, the throttle time, and Produce/Fetch enforcing
them (throttle_time_ms in the response, the connection muted for it)."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

from tidelog.broker.broker import Broker
from tidelog.broker.handlers import HANDLERS
from tidelog.broker.handlers.produce import handle_produce
from tidelog.broker.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    ClientQuotaManager,
    RateSensor,
    throttle_time_ms,
)
from tidelog.metadata.quotas import CLIENT_ID, USER, QuotaEntity
from tidelog.protocol import ApiKey, decode_response, encode_request
from tidelog.security.principal import KafkaPrincipal

from .conftest import FakeClock, add_topic, context, make_batch, produce_request, stored_batches
from .test_fetch_helpers import Want, add_partitions, append, batch, fetch, fetch_request
from .test_server import _serve

Quotas = dict[QuotaEntity, dict[str, float]]


def _ms(value: datetime.timedelta) -> int:
    return round(value.total_seconds() * 1000)


# -- the rate ---------------------------------------------------------------------------------


def test_a_new_sensor_measures_over_samples_minus_one_windows() -> None:
    sensor = RateSensor(samples=11, window_ms=1000)
    sensor.record(1000, now_ms=0)
    assert sensor.window_length_ms(0) == 10_000
    assert sensor.rate(0) == 100.0


def test_the_window_runs_from_the_oldest_sample_padded_to_whole_windows() -> None:
    sensor = RateSensor(samples=11, window_ms=1000)
    sensor.record(1000, now_ms=0)
    sensor.record(1000, now_ms=5500)
    # 5.5 s elapsed is 5 whole windows: padded with the 5 missing ones to 10.5 s.
    assert sensor.window_length_ms(5500) == 10_500
    assert sensor.rate(5500) == pytest.approx(2000 / 10.5)


def test_the_oldest_sample_is_reused_once_every_sample_is_taken() -> None:
    sensor = RateSensor(samples=11, window_ms=1000)
    for second in range(12):
        sensor.record(100, now_ms=second * 1000)
    # The 12th record took the place of the first: 11 samples from t=1 s to now, 10 s.
    assert sensor.window_length_ms(11_000) == 10_000
    assert sensor.rate(11_000) == pytest.approx(1100 / 10)


def test_samples_older_than_the_whole_window_are_forgotten() -> None:
    sensor = RateSensor(samples=11, window_ms=1000)
    sensor.record(50_000, now_ms=0)
    assert sensor.rate(10_999) > 0
    assert sensor.rate(11_000) == 0.0


def test_throttle_time_is_the_time_back_to_the_quota() -> None:
    assert throttle_time_ms(200.0, 100.0, 10_000) == 10_000
    assert throttle_time_ms(150.5, 100.0, 1000) == 505
    # The quota itself is allowed (Kafka's bound is inclusive).
    assert throttle_time_ms(100.0, 100.0, 10_000) == 0
    assert throttle_time_ms(99.0, 100.0, 10_000) == 0


# -- the manager --------------------------------------------------------------------------------


def _manager(quotas: Quotas, clock: FakeClock) -> ClientQuotaManager:
    return ClientQuotaManager(lambda: quotas, clock)


def test_a_client_over_its_quota_gets_kafkas_throttle_time() -> None:
    clock = FakeClock(0)
    manager = _manager({((CLIENT_ID, "slow"),): {PRODUCER_BYTE_RATE: 1000.0}}, clock)
    # 20 000 bytes over the first 10 s window: 2000 B/s, twice the quota: wait 10 s.
    assert manager.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "slow", 20_000) == 10_000
    clock.advance(11_000)
    # The sample holding those bytes has left the 11 s window.
    assert manager.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "slow", 0) == 0
    # A client without a quota is not measured at all.
    assert manager.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "other", 10**9) == 0
    assert manager.rate(PRODUCER_BYTE_RATE, "ANONYMOUS", "other") == 0.0
    # The consumer quota is another key: not set, not throttled.
    assert manager.record(CONSUMER_BYTE_RATE, "ANONYMOUS", "slow", 10**9) == 0


def test_a_default_quota_is_each_clients_own_and_a_named_one_is_shared() -> None:
    clock = FakeClock(0)
    quotas: Quotas = {
        ((CLIENT_ID, None),): {PRODUCER_BYTE_RATE: 1000.0},
        ((USER, "alice"),): {PRODUCER_BYTE_RATE: 2000.0},
    }
    manager = _manager(quotas, clock)
    assert manager.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "a", 10_000) == 0
    # Another client id under /clients/<default> has a 1000 B/s quota of its own.
    assert manager.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "b", 10_000) == 0
    assert manager.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "b", 10_000) == 10_000
    # alice's own quota comes first for her, and all her client ids share it.
    assert manager.record(PRODUCER_BYTE_RATE, "alice", "a", 20_000) == 0
    assert manager.rate(PRODUCER_BYTE_RATE, "alice", "b") == 2000.0
    assert manager.record(PRODUCER_BYTE_RATE, "alice", "b", 20_000) == 10_000


def test_a_quota_changed_in_the_image_applies_to_the_next_request() -> None:
    clock = FakeClock(0)
    quotas: Quotas = {((CLIENT_ID, "c"),): {PRODUCER_BYTE_RATE: 1000.0}}
    manager = _manager(quotas, clock)
    assert manager.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "c", 20_000) == 10_000
    quotas[((CLIENT_ID, "c"),)] = {PRODUCER_BYTE_RATE: 4000.0}
    assert manager.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "c", 0) == 0
    del quotas[((CLIENT_ID, "c"),)]
    assert manager.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "c", 10**9) == 0


# -- Produce and Fetch --------------------------------------------------------------------------


def _quota_on(broker: Broker, clock: FakeClock, client_id: str, key: str, rate: float) -> None:
    broker.quotas = ClientQuotaManager(lambda: {((CLIENT_ID, client_id),): {key: rate}}, clock)


def _produce(broker: Broker, client_id: str, records: bytes, acks: int = 1) -> tuple[Any, Any]:
    ctx = context(broker, ApiKey.PRODUCE, 9, client_id=client_id)
    request = produce_request(9, {"t": {0: records}}, acks=acks)

    async def go() -> Any:
        return await handle_produce(ctx, request)

    return asyncio.run(go()), ctx.connection


def test_produce_over_quota_is_answered_with_throttle_time_and_mutes(
    broker: Broker, clock: FakeClock
) -> None:
    add_topic(broker, "t")
    records = make_batch([b"x" * 1000])
    # Half the rate one batch makes over the 10 s window: throttled for 10 s.
    _quota_on(broker, clock, "slow", PRODUCER_BYTE_RATE, len(records) / 10 / 2)
    response, connection = _produce(broker, "slow", records)
    assert _ms(response.throttle_time) == 10_000
    assert connection.muted_ms == [10_000]
    # Appended and acknowledged all the same: nothing is dropped or delayed.
    assert response.responses[0].partition_responses[0].error_code == 0
    assert len(stored_batches(broker, "t")) == 1
    # acks=0 has no answer to carry it, but the connection is muted just the same.
    _, quiet = _produce(broker, "slow", records, acks=0)
    assert quiet.muted_ms == [30_000]
    assert len(stored_batches(broker, "t")) == 2


def test_produce_without_quota_is_not_throttled(broker: Broker, clock: FakeClock) -> None:
    add_topic(broker, "t")
    records = make_batch([b"x" * 1000])
    _quota_on(broker, clock, "slow", PRODUCER_BYTE_RATE, 1.0)
    response, connection = _produce(broker, "fast", records)
    assert _ms(response.throttle_time) == 0
    assert connection.muted_ms == []


def test_a_refused_produce_counts_nothing(broker: Broker, clock: FakeClock) -> None:
    _quota_on(broker, clock, "slow", PRODUCER_BYTE_RATE, 1.0)
    response, connection = _produce(broker, "slow", make_batch([b"x" * 1000]))
    assert response.responses[0].partition_responses[0].error_code != 0  # no such topic
    assert _ms(response.throttle_time) == 0
    assert connection.muted_ms == []


def test_fetch_over_quota_reports_throttle_time(broker: Broker, clock: FakeClock) -> None:
    add_partitions(broker, "t", 1)
    partition = broker.partitions.get("t", 0)
    assert partition is not None
    append(partition, batch([b"y" * 2000]))
    returned = len(partition.log.read_bytes(0, 1 << 20))
    request = fetch_request(broker, 12, [Want("t", 0)])
    _quota_on(broker, clock, "test", CONSUMER_BYTE_RATE, returned / 10 / 4)
    response, _ = fetch(broker, request)
    assert _ms(response.throttle_time) == 30_000
    # Another client id (no quota) reads the same bytes unthrottled.
    _quota_on(broker, clock, "someone-else", CONSUMER_BYTE_RATE, 1.0)
    response, _ = fetch(broker, request)
    assert _ms(response.throttle_time) == 0


# -- the muted connection -------------------------------------------------------------------------


def test_the_request_after_a_throttled_one_is_read_only_after_the_throttle_time(
    broker: Broker, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_topic(broker, "t")
    records = make_batch([b"z" * 500])
    # Two samples of 100 ms: a new sensor measures over 100 ms, so one batch is 10 batches
    # a second, twice a quota of 5 batches a second: throttled for 100 ms.
    broker.quotas = ClientQuotaManager(
        lambda: {((CLIENT_ID, "slow"),): {PRODUCER_BYTE_RATE: len(records) * 5.0}},
        clock,
        samples=2,
        window_ms=100,
    )
    original = HANDLERS[ApiKey.PRODUCE]
    started: list[float] = []
    returned: list[float] = []

    async def timed(ctx: Any, request: Any) -> Any:
        loop = asyncio.get_running_loop()
        started.append(loop.time())
        reply = await original(ctx, request)
        returned.append(loop.time())
        return reply

    monkeypatch.setitem(HANDLERS, ApiKey.PRODUCE, timed)
    request = produce_request(9, {"t": {0: records}})

    async def scenario() -> list[int]:
        async for _, connect in _serve(broker):
            client = await connect()
            # Both requests in one write: the second is already in the broker's buffer
            # when the first is throttled.
            await client.send(
                encode_request(request, correlation_id=1, client_id="slow")
                + encode_request(request, correlation_id=2, client_id="slow")
            )
            throttles = []
            for _ in range(2):
                _, response = decode_response(
                    await client.frame(), api_key=ApiKey.PRODUCE, api_version=9
                )
                throttles.append(_ms(response.throttle_time))
            client.close()
            return throttles
        raise AssertionError("no server")

    throttles = asyncio.run(scenario())
    # The fake clock stands still: 2 batches in 100 ms are 4x the quota, 300 ms.
    assert throttles == [100, 300]
    assert len(started) == 2
    assert started[1] >= returned[0] + 0.1
    assert len(stored_batches(broker, "t")) == 2


def test_kafkaprincipal_name_is_the_user_of_the_quota(broker: Broker, clock: FakeClock) -> None:
    add_topic(broker, "t")
    records = make_batch([b"x" * 1000])
    broker.quotas = ClientQuotaManager(
        lambda: {((USER, "alice"),): {PRODUCER_BYTE_RATE: len(records) / 20}}, clock
    )
    ctx = context(
        broker, ApiKey.PRODUCE, 9, client_id="any", principal=KafkaPrincipal("User", "alice")
    )
    response = asyncio.run(handle_produce(ctx, produce_request(9, {"t": {0: records}})))
    assert _ms(response.throttle_time) == 10_000


# -- metrics ------------------------------------------------------------------------------------


def test_metrics_give_rate_and_throttle_time_per_user_and_client_id() -> None:
    from tidelog.broker.metrics import ScrapeState, scrape_families

    clock = FakeClock(0)
    quotas: Quotas = {
        ((CLIENT_ID, None),): {PRODUCER_BYTE_RATE: 1000.0},
        ((CLIENT_ID, "app"), (USER, "alice")): {CONSUMER_BYTE_RATE: 500.0},
    }
    manager = _manager(quotas, clock)
    manager.record(PRODUCER_BYTE_RATE, "bob", "p", 20_000)
    manager.record(CONSUMER_BYTE_RATE, "alice", "app", 5_000)
    families = {m.name: m for m in scrape_families(ScrapeState(quotas=manager.figures()))}
    samples = {
        (s.name, s.labels["user"], s.labels["client_id"]): s.value
        for name in (
            "kafka_server_produce_byte_rate",
            "kafka_server_produce_throttle_time_ms",
            "kafka_server_fetch_byte_rate",
            "kafka_server_fetch_throttle_time_ms",
        )
        for s in families[name].samples
    }
    assert samples == {
        # /clients/<default>: Kafka tags it with the client id only.
        ("kafka_server_produce_byte_rate", "", "p"): 2000.0,
        ("kafka_server_produce_throttle_time_ms_total", "", "p"): 10_000,
        ("kafka_server_fetch_byte_rate", "alice", "app"): 500.0,
        ("kafka_server_fetch_throttle_time_ms_total", "alice", "app"): 0,
    }
