"""A consume-transform-produce loop with confluent-kafka, run as a child process by
test_transactions_eos.py so that the test can SIGKILL it anywhere.

    python eos_worker.py BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID TOTAL BATCH

It reads INPUT in group GROUP (read_committed), writes `out-<id>` for each input `in-<id>` to
the same partition of OUTPUT, and commits the output together with the consumed offsets
(send_offsets_to_transaction) every BATCH records. It prints the JSON lines the Java harness's
`eos-loop` prints: {"event": "acked", "n"} after each output record the broker acknowledged (n
counts since this process started) and {"event": "committed", "n"} after each commit, so that
the test can pick a kill point by what has happened. It exits 0 once the group's
committed offsets cover TOTAL input records; on an error it cannot go on from (fenced, or the
broker gone too long) it exits 3 and the test starts it again.

A restart with the same transactional id fences the killed process: init_transactions bumps
the epoch and aborts whatever transaction it left open.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

TIMEOUT = 10.0


def say(event: str, **fields: object) -> None:
    """One JSON line, as the Java harness's eos-loop prints them."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def bounded(call: Callable[..., object], *args: object) -> None:
    """Run `call`, giving up on the process when it does not return in time: librdkafka's
    send_offsets_to_transaction can block past its timeout when the group coordinator went
    away (confluentinc/librdkafka#5456, #5511); the test then starts a new worker, which fences
    this one, as a supervisor would."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            call(*args)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(TIMEOUT * 2)
    if thread.is_alive():
        say("giving_up", error=f"{call.__name__} did not return")
        os._exit(3)
    if failure:
        raise failure[0]


def main(argv: list[str]) -> int:
    bootstrap, source, sink, group, transactional_id, total, batch = argv
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            # a killed member must leave the group quickly for its successor to get the input
            "session.timeout.ms": 2000,
            "heartbeat.interval.ms": 300,
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            # a transaction a killed process left open must not hold the LSO back for long
            "transaction.timeout.ms": 10000,
            "linger.ms": 5,
        }
    )
    acked = 0

    def on_delivery(error: object, message: Message) -> None:
        nonlocal acked
        if error is None:
            acked += 1
            say("acked", n=acked)

    producer.init_transactions(TIMEOUT)
    consumer.subscribe([source])
    done = 0
    try:
        while True:
            messages = [m for m in consumer.consume(int(batch), 0.5) if not m.error()]
            if not messages:
                try:
                    if committed_total(consumer, source) >= int(total):
                        return 0
                except KafkaException:
                    pass  # the broker is away: ask again on the next empty poll
                continue
            try:
                producer.begin_transaction()
                for m in messages:
                    value = b"out-" + m.value().removeprefix(b"in-")
                    producer.produce(
                        sink, key=m.key(), value=value, partition=m.partition(),
                        on_delivery=on_delivery,
                    )  # fmt: skip
                    producer.poll(0)
                offsets = consumer.position(consumer.assignment())
                group_metadata = consumer.consumer_group_metadata()
                bounded(producer.send_offsets_to_transaction, offsets, group_metadata, TIMEOUT)
                producer.commit_transaction(TIMEOUT)
            except KafkaException as exc:
                error = exc.args[0]
                if not error.txn_requires_abort():
                    say("giving_up", error=str(error))
                    return 3
                try:
                    producer.abort_transaction(TIMEOUT)
                    rewind(consumer)
                except KafkaException as unrecoverable:
                    say("giving_up", error=str(unrecoverable))
                    return 3
                continue
            done += len(messages)
            say("committed", n=done)
    finally:
        consumer.close()


def committed_total(consumer: Consumer, source: str) -> int:
    partitions = consumer.list_topics(source, TIMEOUT).topics[source].partitions
    committed = consumer.committed([TopicPartition(source, p) for p in partitions], TIMEOUT)
    return sum(max(tp.offset, 0) for tp in committed)


def rewind(consumer: Consumer) -> None:
    """Back to the group's committed offsets: what the aborted transaction read is read again."""
    for tp in consumer.committed(consumer.assignment(), TIMEOUT):
        consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
