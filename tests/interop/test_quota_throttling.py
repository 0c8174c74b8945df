"""Byte-rate quotas enforced against a real `tidelog serve`: a confluent-kafka producer
over its ``producer_byte_rate`` (set with `tidelog configs`, as kafka-configs sets it) is
told to wait (throttle_time_ms, which librdkafka reports through ``throttle_cb``), waits,
and so keeps to the quota; everything it sent is stored. A consumer over its
``consumer_byte_rate`` likewise, reading everything. A client without a quota is never
throttled.

The broker here measures over ``quota.window.num=3`` samples of 1 s instead of Kafka's 11:
a sampled rate lets a client burst (samples - 1) windows' worth of quota before it is
throttled, so with 11 samples the average only comes near the quota after 20-30 s. The
mechanism is the same; :func:`produce_flat_out` is also what measures the 30-s figure with
the default window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from interop_broker import BrokerProcess

from tidelog.cli.main import main

QUOTA = 100 * 1024
MESSAGE = 8 * 1024


@dataclass
class Run:
    sent_bytes: int
    elapsed_s: float
    delivered: int
    failed: int
    #: throttle times (s) the client was told, in order
    throttles: list[float]

    @property
    def rate(self) -> float:
        return self.sent_bytes / self.elapsed_s


def produce_flat_out(
    bootstrap: str,
    topic: str,
    client_id: str,
    total_bytes: int,
    settings: Mapping[str, object] | None = None,
) -> Run:
    """Produce ``total_bytes`` in ``MESSAGE``-sized records as fast as the client may
    (``settings``: more producer configs, e.g. ``batch.size``)."""
    throttles: list[float] = []
    outcome = {"delivered": 0, "failed": 0}

    def delivered(err: object, _msg: object) -> None:
        outcome["failed" if err is not None else "delivered"] += 1

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "linger.ms": 5,
            **(settings or {}),
            "throttle_cb": lambda event: throttles.append(event.throttle_time),
        }
    )
    payload = b"q" * MESSAGE
    count = total_bytes // MESSAGE
    started = time.monotonic()
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, payload, on_delivery=delivered)
                break
            except BufferError:
                # The client's own queue is full (it is waiting out a throttle): serve
                # callbacks until there is room.
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(300) == 0
    elapsed = time.monotonic() - started
    return Run(count * MESSAGE, elapsed, outcome["delivered"], outcome["failed"], throttles)


def set_producer_quota(bootstrap: str, client_id: str, rate: int) -> None:
    status = main(
        [
            "configs", "--bootstrap-server", bootstrap, "--alter",
            "--entity-type", "clients", "--entity-name", client_id,
            "--add-config", f"producer_byte_rate={rate}",
        ]
    )  # fmt: skip
    assert status == 0


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)


def stored(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-count"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    finally:
        consumer.close()
    return int(high - low)


@pytest.fixture(scope="module")
def short_window_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(
        tmp_path_factory.mktemp("quota-broker"),
        extra_args=["--override", "quota.window.num=3"],
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_a_producer_over_its_byte_rate_is_held_to_it(
    short_window_broker: BrokerProcess, tmp_path: Path
) -> None:
    bootstrap = short_window_broker.bootstrap
    create_topic(bootstrap, "throttled")
    set_producer_quota(bootstrap, "slow-producer", QUOTA)
    # Eight seconds' worth at the quota (plus the two seconds' burst the window allows).
    run = produce_flat_out(bootstrap, "throttled", "slow-producer", 10 * QUOTA)
    assert run.failed == 0
    assert run.delivered == run.sent_bytes // MESSAGE
    assert stored(bootstrap, "throttled") == run.delivered
    assert any(t > 0 for t in run.throttles), "the client was never told to wait"
    assert run.rate <= 1.5 * QUOTA, f"{run.rate:.0f} B/s against a quota of {QUOTA} B/s"


def test_a_client_without_quota_is_not_throttled(short_window_broker: BrokerProcess) -> None:
    bootstrap = short_window_broker.bootstrap
    create_topic(bootstrap, "unthrottled")
    set_producer_quota(bootstrap, "some-other-client", QUOTA)
    run = produce_flat_out(bootstrap, "unthrottled", "free-producer", 10 * QUOTA)
    assert run.failed == 0
    assert stored(bootstrap, "unthrottled") == run.delivered == run.sent_bytes // MESSAGE
    assert [t for t in run.throttles if t > 0] == []


def test_a_consumer_over_its_byte_rate_is_held_to_it(short_window_broker: BrokerProcess) -> None:
    bootstrap = short_window_broker.bootstrap
    create_topic(bootstrap, "to-read")
    written = produce_flat_out(bootstrap, "to-read", "unlimited-writer", 10 * QUOTA)
    assert written.failed == 0
    status = main(
        [
            "configs", "--bootstrap-server", bootstrap, "--alter",
            "--entity-type", "clients", "--entity-name", "slow-consumer",
            "--add-config", f"consumer_byte_rate={QUOTA}",
        ]
    )  # fmt: skip
    assert status == 0
    throttles: list[float] = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "slow-readers",
            "client.id": "slow-consumer",
            "auto.offset.reset": "earliest",
            # Small fetches, so that the quota paces many of them rather than one.
            "max.partition.fetch.bytes": 64 * 1024,
            "throttle_cb": lambda event: throttles.append(event.throttle_time),
        }
    )
    read_bytes = 0
    read = 0
    try:
        consumer.subscribe(["to-read"])
        started = time.monotonic()
        deadline = started + 120
        while read < written.delivered and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None or message.error() is not None:
                continue
            read += 1
            read_bytes += len(message.value() or b"")
        elapsed = time.monotonic() - started
    finally:
        consumer.close()
    assert read == written.delivered
    assert any(t > 0 for t in throttles), "the consumer was never told to wait"
    assert read_bytes / elapsed <= 1.5 * QUOTA, f"{read_bytes / elapsed:.0f} B/s"
