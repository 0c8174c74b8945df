"""The producer against a real broker: what confluent-kafka reads back, where keys land, and
an idempotent stream across a broker killed with SIGKILL and restarted."""

from __future__ import annotations

import importlib.util
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tidelog.client import Admin, NewTopic, Producer, RecordMetadata
from tidelog.client.partitioner import partition_for_key

pytestmark = pytest.mark.slow

confluent_kafka = pytest.importorskip("confluent_kafka")


def _load_interop_broker() -> Any:
    """tests/interop/interop_broker.py (start, SIGKILL, restart a broker process)."""
    path = Path(__file__).parent.parent / "interop" / "interop_broker.py"
    spec = importlib.util.spec_from_file_location("interop_broker_for_producer_tests", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, partitions, 1)])


def _read_with_confluent(bootstrap: str, topic: str, partitions: int, count: int) -> list[Any]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{topic}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        messages: list[Any] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                messages.append(message)
            if len(messages) == count:
                # Everything expected is here; a little longer to see any record too many.
                deadline = min(deadline, time.monotonic() + 1.0)
        return messages
    finally:
        consumer.close()


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_reads_our_records_byte_exactly(
    broker: Any, topic_name: str, codec: str
) -> None:
    _create(broker.bootstrap, topic_name, 3)
    rng = random.Random(codec)
    sent: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]] = []
    for i in range(600):
        key = None if i % 4 == 0 else rng.randbytes(rng.randint(0, 40))
        value = None if i % 9 == 0 else rng.randbytes(rng.choice((0, 1, 100, 3000)))
        headers = [(f"h{j}", None if j == 1 else rng.randbytes(j * 3)) for j in range(i % 3)]
        sent.append((key, value, headers, 1_700_000_000_000 + i))
    with Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec}) as producer:
        assert producer.idempotent
        futures = [
            producer.send(topic_name, v, key=k, headers=h, timestamp=ts) for k, v, h, ts in sent
        ]
        producer.flush()
        metadata: list[RecordMetadata] = [f.result() for f in futures]
    messages = _read_with_confluent(broker.bootstrap, topic_name, 3, len(sent))
    assert len(messages) == len(sent)
    by_position = {(m.partition(), m.offset()): m for m in messages}
    for (key, value, headers, ts), md in zip(sent, metadata, strict=True):
        message = by_position[(md.partition, md.offset)]
        assert message.key() == key
        assert message.value() == value
        assert message.timestamp() == (confluent_kafka.TIMESTAMP_CREATE_TIME, ts)
        assert (message.headers() or []) == headers
        if key is not None:
            assert md.partition == partition_for_key(key, 3)


def test_keys_land_where_the_java_partitioner_puts_them(broker: Any, topic_name: str) -> None:
    """librdkafka's murmur2_random partitioner is the Java client's default; for 10,000 random
    keys it and ours choose the same partition."""
    partitions = 7
    _create(broker.bootstrap, topic_name, partitions)
    rng = random.Random(2024)
    keys = [rng.randbytes(rng.randint(1, 64)) for _ in range(10_000)]
    chosen: dict[bytes, int] = {}

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        chosen[message.key()] = message.partition()

    reference = confluent_kafka.Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
        }
    )
    for key in keys:
        reference.produce(topic_name, b"", key=key, on_delivery=delivered)
        reference.poll(0)
    assert reference.flush(30) == 0
    assert len(chosen) == len(set(keys))
    mismatches = [k for k in set(keys) if partition_for_key(k, partitions) != chosen[k]]
    assert mismatches == []
    with Producer({"bootstrap.servers": broker.bootstrap}) as producer:
        futures = [(k, producer.send(topic_name, b"", key=k)) for k in keys[:500]]
        producer.flush()
        assert all(f.result().partition == chosen[k] for k, f in futures)


def test_idempotent_stream_across_a_broker_killed_and_restarted(
    tmp_path: Path, topic_name: str
) -> None:
    """Records sent while the broker is SIGKILLed and restarted arrive once each, in order
    per partition; every future succeeds with the offset the record really has."""
    interop = _load_interop_broker()
    process = interop.BrokerProcess(tmp_path, kind="tidelog")
    process.start()
    try:
        partitions = 3
        _create(process.bootstrap, topic_name, partitions)
        total = 6000
        futures = []
        failures: list[BaseException] = []
        config = {
            "bootstrap.servers": process.bootstrap,
            "linger.ms": 2,
            "batch.size": 4096,
            "request.timeout.ms": 5000,
            "retry.backoff.ms": 50,
            "delivery.timeout.ms": 90_000,
        }
        with Producer(config) as producer:

            def kill_and_restart() -> None:
                try:
                    time.sleep(0.3)
                    process.kill()
                    time.sleep(0.3)
                    process.start()
                except BaseException as exc:  # reported by the main thread
                    failures.append(exc)

            chaos = threading.Thread(target=kill_and_restart)
            for i in range(total):
                if i == 1500:
                    chaos.start()
                futures.append(producer.send(topic_name, b"%06d" % i, key=b"key-%d" % (i % 50)))
                if i % 100 == 0:
                    time.sleep(0.01)  # spread the stream over the kill
            chaos.join()
            assert failures == []
            assert producer.flush(90) == 0
            metadata = [f.result() for f in futures]
        messages = _read_with_confluent(process.bootstrap, topic_name, partitions, total)
        assert len(messages) == total
        per_partition: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        for m in sorted(messages, key=lambda m: (m.partition(), m.offset())):
            per_partition[m.partition()].append(m.value())
        expected: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        for i in range(total):
            expected[partition_for_key(b"key-%d" % (i % 50), partitions)].append(b"%06d" % i)
        assert per_partition == expected
        positions = {(m.partition(), m.offset()): m.value() for m in messages}
        for i, md in enumerate(metadata):
            assert positions[(md.partition, md.offset)] == b"%06d" % i
    finally:
        process.stop()


def _perf_produce(bootstrap: str, topic: str, *flags: str) -> int:
    from tidelog.cli.main import main

    return main(["perf", "produce", "--bootstrap-server", bootstrap, "--topic", topic, *flags])


def test_perf_produce_reports_progress_and_a_summary(
    broker: Any, topic_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _create(broker.bootstrap, topic_name, 2)
    status = _perf_produce(
        broker.bootstrap,
        topic_name,
        *("--num-records", "3000", "--record-size", "50", "--throughput", "20000"),
        *("--reporting-interval", "50", "--producer-property", "linger.ms=1"),
    )
    assert status == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) >= 2  # at least one progress line, then the summary
    assert all("records/sec" in line and "ms max latency" in line for line in lines)
    assert lines[-1].startswith("3000 records sent,") and "99.9th" in lines[-1]
    messages = _read_with_confluent(broker.bootstrap, topic_name, 2, 3000)
    assert len(messages) == 3000
    assert all(len(m.value()) == 50 for m in messages)


def test_perf_produce_progress_lines_count_acknowledged_records(
    broker: Any, topic_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """As in Kafka's tool, acknowledgements drive the progress lines: a run of many
    intervals (600 records held to 2000/s, a line every 1 ms, no record acknowledged
    within 5 ms of its send with linger.ms=5) prints lines that each count records
    acknowledged in their window, the first one too, and together every record once."""
    _create(broker.bootstrap, topic_name, 1)
    status = _perf_produce(
        broker.bootstrap,
        topic_name,
        *("--num-records", "600", "--record-size", "20", "--throughput", "2000"),
        *("--reporting-interval", "1", "--producer-property", "linger.ms=5"),
    )
    assert status == 0
    *progress, summary = capsys.readouterr().out.strip().splitlines()
    assert summary.startswith("600 records sent,") and "99.9th" in summary
    counts = [int(line.split(" records sent,")[0]) for line in progress]
    assert len(counts) >= 2 and counts[0] > 0
    assert all(count > 0 for count in counts)
    assert sum(counts) == 600
