"""Helpers of the agent tests: topics created and read back with confluent-kafka."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable


def create_topic(
    bootstrap: str, name: str, partitions: int, config: dict[str, str] | None = None
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, config=config or {})])
    futures[name].result(30)


def add_partitions(bootstrap: str, name: str, total: int) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(name, total)])[name].result(30)


def delete_topic(bootstrap: str, name: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the answer
    admin.delete_topics([name])[name].result(30)


def read_topic(
    bootstrap: str, topic: str, partitions: int
) -> dict[int, list[tuple[int, bytes | None, bytes | None]]]:
    """Every record of ``topic``: partition -> [(offset, key, value)] in offset order."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    out: dict[int, list[tuple[int, bytes | None, bytes | None]]] = {}
    try:
        ends = {}
        for p in range(partitions):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            ends[p] = high
            out[p] = []
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        remaining = {p for p, end in ends.items() if end > 0}
        while remaining:
            message = consumer.poll(10)
            assert message is not None, f"no record within 10 s; still waiting for {remaining}"
            assert message.error() is None, message.error()
            p = message.partition()
            out[p].append((message.offset(), message.key(), message.value()))
            if message.offset() + 1 >= ends[p]:
                remaining.discard(p)
    finally:
        consumer.close()
    return out


def wait_for(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)
