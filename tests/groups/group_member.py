"""One consumer-group member in its own process, for the group tests.

Usage: python group_member.py CLIENT 'JSON-OPTIONS'
  CLIENT: confluent | kafka-python | aiokafka
  options: {"bootstrap", "topic", "group", "assignor"?, "instance_id"?, "client_id"?,
            "session_timeout_ms"?}

The member subscribes to one topic, and after every batch of records it has processed (printed)
commits the offset after the batch's last record of each partition, synchronously. It prints
one JSON line per event on stdout and flushes each:

  {"event": "assigned"|"revoked"|"lost", "partitions": [...], "owned": [...]}
  {"event": "record", "partition": p, "offset": o, "value": "..."}
  {"event": "committed", "offsets": {"p": next_offset}}
  {"event": "commit_failed", "error": "..."}
  {"event": "closed"}

`partitions` is what the callback was given; `owned` is what the member holds afterwards (for
eager assignors a revocation takes everything, for cooperative ones only what moves).
A "stop" line on stdin (or end of input) closes the consumer, which leaves the group (a static
member, with `instance_id`, does not leave: that is what static membership is for); SIGKILL is
how the tests make a member vanish without a word.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from typing import Any

POLL_S = 0.2


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def watch_stdin() -> threading.Event:
    stop = threading.Event()

    def read() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=read, daemon=True).start()
    return stop


class Owned:
    """The member's partitions, kept from the rebalance callbacks."""

    def __init__(self) -> None:
        self.parts: set[int] = set()

    def assigned(self, parts: list[int]) -> None:
        self.parts |= set(parts)
        emit("assigned", partitions=sorted(parts), owned=sorted(self.parts))

    def revoked(self, parts: list[int], event: str = "revoked") -> None:
        self.parts -= set(parts)
        emit(event, partitions=sorted(parts), owned=sorted(self.parts))


def run_confluent(o: dict[str, Any], stop: threading.Event) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    config: dict[str, Any] = {
        "bootstrap.servers": o["bootstrap"],
        "group.id": o["group"],
        "client.id": o.get("client_id", "group-member"),
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": o.get("session_timeout_ms", 6000),
        "heartbeat.interval.ms": 500,
        "topic.metadata.refresh.interval.ms": 2000,
        "log_level": 3,
    }
    if o.get("assignor"):
        config["partition.assignment.strategy"] = o["assignor"]
    if o.get("instance_id"):
        config["group.instance.id"] = o["instance_id"]
    owned = Owned()
    consumer = Consumer(config)
    consumer.subscribe(
        [o["topic"]],
        on_assign=lambda _c, tps: owned.assigned([tp.partition for tp in tps]),
        on_revoke=lambda _c, tps: owned.revoked([tp.partition for tp in tps]),
        on_lost=lambda _c, tps: owned.revoked([tp.partition for tp in tps], "lost"),
    )
    try:
        while not stop.is_set():
            messages = consumer.consume(num_messages=500, timeout=POLL_S)
            done: dict[int, int] = {}
            for m in messages:
                if m.error():
                    continue
                emit("record", partition=m.partition(), offset=m.offset(), value=m.value().decode())
                done[m.partition()] = m.offset() + 1
            if done:
                try:
                    consumer.commit(
                        offsets=[TopicPartition(o["topic"], p, n) for p, n in done.items()],
                        asynchronous=False,
                    )
                    emit("committed", offsets={str(p): n for p, n in done.items()})
                except KafkaException as exc:
                    emit("commit_failed", error=str(exc))
    finally:
        consumer.close()
    emit("closed")


def run_kafka_python(o: dict[str, Any], stop: threading.Event) -> None:
    from kafka import ConsumerRebalanceListener, KafkaConsumer, OffsetAndMetadata, TopicPartition
    from kafka.errors import KafkaError

    owned = Owned()

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: Any) -> None:
            owned.revoked([tp.partition for tp in revoked])

        def on_partitions_assigned(self, assigned: Any) -> None:
            owned.assigned([tp.partition for tp in assigned])

    kwargs: dict[str, Any] = {}
    if o.get("assignor"):
        from kafka.coordinator.assignors.range import RangePartitionAssignor
        from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

        kwargs["partition_assignment_strategy"] = [
            {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}[
                o["assignor"]
            ]
        ]
    consumer = KafkaConsumer(
        bootstrap_servers=o["bootstrap"],
        group_id=o["group"],
        client_id=o.get("client_id", "group-member"),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=o.get("session_timeout_ms", 6000),
        heartbeat_interval_ms=500,
        metadata_max_age_ms=2000,
        **kwargs,
    )
    # The topic's metadata first. kafka-python 3.0 otherwise joins without it, assigns
    # nothing, and rejoins from its network thread once the metadata arrives; when its main
    # thread polls while that rejoin's leader SyncGroup is in flight, the (correct) answer
    # is dropped and the member hangs, never assigned, until the session times out (seen in
    # its own debug log: "Received SyncGroup response", then nothing more of the join).
    consumer.partitions_for_topic(o["topic"])
    consumer.subscribe([o["topic"]], listener=Listener())
    try:
        while not stop.is_set():
            batches = consumer.poll(timeout_ms=int(POLL_S * 1000))
            done: dict[int, int] = {}
            for tp, records in batches.items():
                for r in records:
                    emit("record", partition=tp.partition, offset=r.offset, value=r.value.decode())
                    done[tp.partition] = r.offset + 1
            if done:
                try:
                    consumer.commit(
                        {
                            TopicPartition(o["topic"], p): OffsetAndMetadata(n, None, -1)
                            for p, n in done.items()
                        }
                    )
                    emit("committed", offsets={str(p): n for p, n in done.items()})
                except KafkaError as exc:
                    emit("commit_failed", error=repr(exc))
    finally:
        consumer.close()
    emit("closed")


def run_aiokafka(o: dict[str, Any], stop: threading.Event) -> None:
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
    from aiokafka.errors import KafkaError

    owned = Owned()

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked: Any) -> None:
            owned.revoked([tp.partition for tp in revoked])

        async def on_partitions_assigned(self, assigned: Any) -> None:
            owned.assigned([tp.partition for tp in assigned])

    async def main() -> None:
        kwargs: dict[str, Any] = {}
        if o.get("assignor"):
            from aiokafka.coordinator.assignors.range import RangePartitionAssignor
            from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

            kwargs["partition_assignment_strategy"] = [
                {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}[
                    o["assignor"]
                ]
            ]
        consumer = AIOKafkaConsumer(
            bootstrap_servers=o["bootstrap"],
            group_id=o["group"],
            client_id=o.get("client_id", "group-member"),
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=o.get("session_timeout_ms", 6000),
            heartbeat_interval_ms=500,
            metadata_max_age_ms=2000,
            **kwargs,
        )
        await consumer.start()
        consumer.subscribe([o["topic"]], listener=Listener())
        try:
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=int(POLL_S * 1000))
                done: dict[int, int] = {}
                for tp, records in batches.items():
                    for r in records:
                        emit(
                            "record",
                            partition=tp.partition,
                            offset=r.offset,
                            value=r.value.decode(),
                        )
                        done[tp.partition] = r.offset + 1
                if done:
                    try:
                        await consumer.commit(
                            {TopicPartition(o["topic"], p): n for p, n in done.items()}
                        )
                        emit("committed", offsets={str(p): n for p, n in done.items()})
                    except KafkaError as exc:
                        emit("commit_failed", error=repr(exc))
        finally:
            await consumer.stop()

    asyncio.run(main())
    emit("closed")


CLIENTS = {"confluent": run_confluent, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka}


def main() -> None:
    client, options = sys.argv[1], json.loads(sys.argv[2])
    CLIENTS[client](options, watch_stdin())


if __name__ == "__main__":
    main()
