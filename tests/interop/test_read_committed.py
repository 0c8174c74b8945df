"""read_committed against a real `tidelog serve`: confluent-kafka, kafka-python, aiokafka,
kcat and the Java client.

The transaction coordinator is not part of these tests: transactional batches (built with
the project's BatchBuilder) go in with Produce, and the test ends their transactions with
WriteTxnMarkers, as a coordinator would. The broker runs through
``txn_unverified_serve.py``, which only bypasses KIP-890's "is this partition in the
transaction" question (there is no coordinator to ask).

Partition 0 holds, in offset order::

    0-1   plain          "before-0", "before-1"
    2-3   producer A     "aborted-2", "aborted-3"      (aborted at 6)
    4-5   producer B     "committed-4", "committed-5"  (committed at 9)
    6     ABORT A
    7-8   producer C     "open-7", "open-8"             (open: the LSO is 7)
    9     COMMIT B
    10    plain          "after-0"

A read_committed consumer gets "before-*" and "committed-*" and stops at offset 7 until
C commits, then gets "open-*" and "after-0"; it never gets "aborted-*". A read_uncommitted
consumer gets every record up to the high watermark.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from interop_broker import BrokerProcess, send_request
from interop_data import wait_until
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition
from test_kcat import KCAT

from tidelog.protocol import ErrorCode
from tidelog.records import BatchBuilder

A, B, C = 9001, 9002, 9003
LSO = 7
HIGH_WATERMARK = 11
COMMITTED_PREFIX = [b"before-0", b"before-1", b"committed-4", b"committed-5"]
EVERYTHING = [
    b"before-0",
    b"before-1",
    b"aborted-2",
    b"aborted-3",
    b"committed-4",
    b"committed-5",
    b"open-7",
    b"open-8",
    b"after-0",
]
LAUNCHER = Path(__file__).with_name("txn_unverified_serve.py")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(
        tmp_path_factory.mktemp("txn-broker"), prefix=[sys.executable, str(LAUNCHER)]
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


# -- the wire, by hand (what a transactional producer and a coordinator send) ---------------


def send(broker: BrokerProcess, request: Any) -> Any:
    return send_request(broker.host, broker.port, request, client_id="txn-test")


def produce(broker: BrokerProcess, topic: str, batch: bytes, transactional_id: str | None) -> int:
    """Produce one batch to partition 0 (acks=all); its base offset."""
    import datetime

    from kio.schema.produce.v9 import request as schema
    from kio.static.primitive import i32Timedelta

    response = send(
        broker,
        schema.ProduceRequest(
            transactional_id=transactional_id,
            acks=-1,
            timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
            topic_data=(
                schema.TopicProduceData(
                    name=topic,
                    partition_data=(schema.PartitionProduceData(index=0, records=batch),),
                ),
            ),
        ),
    )
    (answer,) = response.responses[0].partition_responses
    assert answer.error_code.value == 0, answer
    return int(answer.base_offset)


def batch(values: list[bytes], producer: tuple[int, int, int] | None = None) -> bytes:
    builder = BatchBuilder(transactional=producer is not None)
    if producer is not None:
        builder.set_producer(*producer)
    for value in values:
        builder.append(b"key", value, timestamp=1_700_000_000_000)
    return builder.close()


def end_transaction(broker: BrokerProcess, topic: str, producer_id: int, commit: bool) -> None:
    """WriteTxnMarkers v1 for partition 0, as the transaction coordinator sends it."""
    from kio.schema.write_txn_markers.v1 import request as schema

    response = send(
        broker,
        schema.WriteTxnMarkersRequest(
            markers=(
                schema.WritableTxnMarker(
                    producer_id=producer_id,
                    producer_epoch=0,
                    transaction_result=commit,
                    coordinator_epoch=0,
                    topics=(schema.WritableTxnMarkerTopic(name=topic, partition_indexes=(0,)),),
                ),
            )
        ),
    )
    (result,) = response.markers[0].topics[0].partitions
    assert result.error_code.value == ErrorCode.NONE


def lay_out(broker: BrokerProcess, topic_name: str) -> str:
    """Create ``topic_name`` laid out as the module docstring says, C's transaction open."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    def created() -> bool:
        # A broker just started may not be unfenced yet (INVALID_REPLICATION_FACTOR).
        try:
            admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(30)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return True
            if exc.args[0].code() != KafkaError.INVALID_REPLICATION_FACTOR:
                raise
            return False
        return True

    wait_until(created, f"topic {topic_name} created", 30)
    offsets = [
        produce(broker, topic_name, batch([b"before-0", b"before-1"]), None),
        produce(broker, topic_name, batch([b"aborted-2", b"aborted-3"], (A, 0, 0)), "tx-a"),
        produce(broker, topic_name, batch([b"committed-4", b"committed-5"], (B, 0, 0)), "tx-b"),
    ]
    end_transaction(broker, topic_name, A, commit=False)
    offsets.append(produce(broker, topic_name, batch([b"open-7", b"open-8"], (C, 0, 0)), "tx-c"))
    end_transaction(broker, topic_name, B, commit=True)
    offsets.append(produce(broker, topic_name, batch([b"after-0"]), None))
    assert offsets == [0, 2, 4, 7, 10]
    return topic_name


@pytest.fixture
def topic(broker: BrokerProcess, topic_name: str) -> str:
    return lay_out(broker, topic_name)


COMMITTED_ALL = [*COMMITTED_PREFIX, b"open-7", b"open-8", b"after-0"]
#: The log end once C's COMMIT marker (offset 11) is written.
END_AFTER_COMMIT = HIGH_WATERMARK + 1


# -- consumers ----------------------------------------------------------------------------


def test_confluent_kafka_read_uncommitted_sees_everything(
    broker: BrokerProcess, topic: str
) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "uncommitted",
            "isolation.level": "read_uncommitted",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []

        def read() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
            return len(got) >= len(EVERYTHING)

        wait_until(read, "the read_uncommitted consumer reached the high watermark", 30)
        assert got == EVERYTHING
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert (low, high) == (0, HIGH_WATERMARK)
    finally:
        consumer.close()


def test_confluent_kafka_read_committed_stops_at_the_lso_then_follows_the_commit(
    broker: BrokerProcess, topic: str
) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "committed",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []

        def position() -> int:
            (tp,) = consumer.position([TopicPartition(topic, 0)])
            return int(tp.offset)

        def read_until(done: Any) -> Any:
            def step() -> bool:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    got.append(message.value())
                return bool(done())

            return step

        wait_until(read_until(lambda: position() >= LSO), "the consumer reached the LSO", 30)
        assert position() == LSO  # not one record past the open transaction's first offset
        assert got == COMMITTED_PREFIX
        end_transaction(broker, topic, C, commit=True)
        wait_until(read_until(lambda: len(got) >= len(COMMITTED_ALL)), "read past the commit", 30)
        assert got == COMMITTED_ALL
    finally:
        consumer.close()


def test_kafka_python_read_committed_stops_at_the_lso_then_follows_the_commit(
    broker: BrokerProcess, topic: str
) -> None:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level="read_committed")
    try:
        tp = KafkaTopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[bytes] = []

        def read_until(end: int) -> Any:
            def step() -> bool:
                for records in consumer.poll(timeout_ms=500).values():
                    got.extend(record.value for record in records)
                return consumer.position(tp) >= end

            return step

        wait_until(read_until(LSO), "kafka-python reached the LSO", 30)
        assert consumer.position(tp) == LSO
        assert got == COMMITTED_PREFIX
        end_transaction(broker, topic, C, commit=True)
        wait_until(read_until(END_AFTER_COMMIT), "kafka-python read past the commit", 30)
        assert got == COMMITTED_ALL
        assert consumer.position(tp) == END_AFTER_COMMIT
    finally:
        consumer.close()


def kcat_read_committed(broker: BrokerProcess, topic: str) -> list[bytes]:
    """Every value kcat's read_committed consumer gets before it reports the end."""
    result = subprocess.run(
        [
            KCAT,
            "-b",
            broker.bootstrap,
            "-C",
            "-t",
            topic,
            "-p",
            "0",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%s\n",
            "-X",
            "isolation.level=read_committed",
        ],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_kcat_read_committed_ends_at_the_lso_then_follows_the_commit(
    broker: BrokerProcess, topic: str
) -> None:
    # librdkafka reports the end of a read_committed partition at its LSO.
    assert kcat_read_committed(broker, topic) == COMMITTED_PREFIX
    end_transaction(broker, topic, C, commit=True)
    assert kcat_read_committed(broker, topic) == COMMITTED_ALL


def test_sigkill_keeps_the_open_transaction_and_the_aborted_one(
    tmp_path: Path, topic_name: str
) -> None:
    """A crash (SIGKILL: no shutdown snapshot, no clean-shutdown marker) and a restart:
    recovery rebuilds C's open transaction (the LSO) and A's aborted-transaction entry."""
    process = BrokerProcess(tmp_path, prefix=[sys.executable, str(LAUNCHER)])
    process.start()
    try:
        lay_out(process, topic_name)
        process.restart(hard=True)
        assert kcat_read_committed(process, topic_name) == COMMITTED_PREFIX
        end_transaction(process, topic_name, C, commit=True)
        process.restart(hard=True)
        assert kcat_read_committed(process, topic_name) == COMMITTED_ALL
    finally:
        process.stop()


def test_aiokafka_read_committed_stops_at_the_lso_then_follows_the_commit(
    broker: BrokerProcess, topic: str
) -> None:
    import asyncio
    import time

    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTopicPartition

    async def scenario() -> list[bytes]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            tp = AioTopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got: list[bytes] = []

            async def read_until(end: int, what: str) -> None:
                deadline = time.monotonic() + 30
                while await consumer.position(tp) < end:
                    assert time.monotonic() < deadline, f"aiokafka never {what}"
                    for records in (await consumer.getmany(timeout_ms=500)).values():
                        got.extend(record.value for record in records)

            await read_until(LSO, "reached the LSO")
            assert await consumer.position(tp) == LSO
            assert got == COMMITTED_PREFIX
            await asyncio.to_thread(end_transaction, broker, topic, C, True)
            await read_until(END_AFTER_COMMIT, "read past the commit")
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(scenario()) == COMMITTED_ALL


def test_java_client_read_committed_skips_the_aborted_transaction(
    broker: BrokerProcess, topic: str, java: Any
) -> None:
    """The Java consumer with isolation.level=read_committed: the aborted records are
    dropped, and the open transaction's records come only once it commits."""
    options: dict[str, Any] = {
        "partitions": [0],
        "offsets": {0: 0},
        "configs": {"isolation.level": "read_committed"},
    }
    first = java.consume(topic, max_records=len(COMMITTED_PREFIX), **options)
    assert [got.value for got in first] == COMMITTED_PREFIX
    assert [got.offset for got in first] == [0, 1, 4, 5]
    end_transaction(broker, topic, C, commit=True)
    everything = java.consume(topic, max_records=len(COMMITTED_ALL), **options)
    assert [got.value for got in everything] == COMMITTED_ALL


@pytest.mark.parametrize("level", ["read_committed", "read_uncommitted"])
def test_tidelog_client_drops_the_aborted_transaction_only_when_read_committed(
    broker: BrokerProcess, topic: str, level: str
) -> None:
    """The Tidelog consumer: read_committed stops at the LSO without the aborted records and
    follows the commit; read_uncommitted gets every record up to the high watermark."""
    import time

    from tidelog.client import Consumer as TidelogConsumer
    from tidelog.client import TopicPartition as TidelogTopicPartition

    tp = TidelogTopicPartition(topic, 0)
    consumer = TidelogConsumer({"bootstrap.servers": broker.bootstrap, "isolation.level": level})
    got: list[bytes | None] = []

    def read_until(end: int, what: str) -> None:
        deadline = time.monotonic() + 30
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"the Tidelog consumer never {what}"
            got.extend(record.value for record in consumer.poll(0.5))

    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        if level == "read_uncommitted":
            read_until(HIGH_WATERMARK, "reached the high watermark")
            assert got == EVERYTHING
            return
        read_until(LSO, "reached the LSO")
        assert consumer.position(tp) == LSO
        assert got == COMMITTED_PREFIX
        end_transaction(broker, topic, C, commit=True)
        read_until(END_AFTER_COMMIT, "read past the commit")
        assert got == COMMITTED_ALL
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("level", "expected"),
    [("read_committed", COMMITTED_PREFIX), ("read_uncommitted", EVERYTHING)],
)
def test_tidelog_consume_isolation_level(
    broker: BrokerProcess,
    topic: str,
    level: str,
    expected: list[bytes],
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tidelog.cli.main import main

    status = main(
        ["consume", "--bootstrap-server", broker.bootstrap, "--topic", topic,
         "--from-beginning", "--isolation-level", level, "--max-messages", str(len(expected))]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.splitlines() == [value.decode() for value in expected]
