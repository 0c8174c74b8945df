"""An idempotent producer whose records carry old CreateTimes, across a SIGKILL restart.

The records are two days old, more than ``producer.id.expiration.ms`` (one day by
default). While the broker runs, its own append time keeps the producer's state; after a
SIGKILL there is no shutdown snapshot and the state is rebuilt from the log. The restart
must not make the producer expire sooner than it would have without it: the very same
batch sent again (same producer id, epoch and sequence, built by hand and sent with the
project's own protocol code) is a duplicate, the partition read back by a real client
(confluent-kafka) holds it once, and DescribeProducers still lists the producer.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from interop_broker import BrokerProcess
from system_wire import WireClient, describe_producers_request, make_batch

from tidelog.protocol import ErrorCode

TOPIC = "old-timestamps"
TWO_DAYS_MS = 2 * 86_400_000
VALUES = [b"in-doubt-0", b"in-doubt-1", b"in-doubt-2"]


def described_producers(client: WireClient) -> list[tuple[int, int, int]]:
    """(producer id, epoch, last sequence) of every producer partition 0 reports."""
    response = client.call(describe_producers_request(TOPIC, (0,)))
    (partition,) = response.topics[0].partitions
    assert partition.error_code == ErrorCode.NONE, partition
    return [
        (int(p.producer_id), int(p.producer_epoch), int(p.last_sequence))
        for p in partition.active_producers
    ]


def read_back(broker: BrokerProcess) -> list[bytes | None]:
    """Every value of partition 0, read by confluent-kafka from the start to the end."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"old-ts-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        values: list[bytes | None] = []
        deadline = time.monotonic() + 15
        while len(values) < end:
            assert time.monotonic() < deadline, f"read {len(values)} of {end} records"
            for message in consumer.consume(100, 0.2):
                assert message.error() is None, message.error()
                assert message.offset() == len(values)
                values.append(message.value())
        return values
    finally:
        consumer.close()


def test_retry_of_old_timestamp_batch_after_sigkill_is_stored_once(
    brokers: Callable[[], BrokerProcess],
) -> None:
    broker = brokers()
    old = time.time_ns() // 1_000_000 - TWO_DAYS_MS
    with WireClient(broker.host, broker.port) as client:
        client.create_topic(TOPIC, 1)
        pid, epoch = client.init_producer_id()
        batch = make_batch(VALUES, producer=(pid, epoch, 0), timestamp=old)
        first = client.produce(TOPIC, 0, batch, acks=-1)
        assert (first.error_code, first.base_offset) == (ErrorCode.NONE, 0), first
        assert described_producers(client) == [(pid, epoch, 2)]

    # The answer to that produce is "lost": the broker dies before the client sees it.
    broker.kill()
    broker.start()

    with WireClient(broker.host, broker.port) as client:
        assert described_producers(client) == [(pid, epoch, 2)]
        retry = client.produce(TOPIC, 0, batch, acks=-1)
        assert (retry.error_code, retry.base_offset) == (ErrorCode.NONE, 0), retry
        assert client.list_offset(TOPIC, 0, -1) == len(VALUES)
        assert described_producers(client) == [(pid, epoch, 2)]

    assert read_back(broker) == VALUES
