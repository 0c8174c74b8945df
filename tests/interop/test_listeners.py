"""Every listener in `listeners` is served, each with its own advertised address; a listener
without the TLS or SASL settings its protocol needs stops the start with one line.

The two-listener broker advertises its first listener (PLAINTEXT) at 127.0.0.1:1, where
nothing listens, and its second (EXTERNAL) at its real address. A client that bootstraps on
EXTERNAL can only produce and consume if the broker answers its Metadata, FindCoordinator
and Fetch with the addresses of the listener it came in on, as Kafka does.
"""

from __future__ import annotations

import gc
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_aiokafka as aio
import test_confluent_kafka as ck
import test_kafka_python as kp
import test_kcat as kc
from interop_broker import BrokerProcess, free_port, venv_bin
from interop_data import Got, assert_read_back, base_timestamp, make_records
from java_harness import JavaClient, consume_step, step, to_gots

COUNT = 8
UNREACHABLE = "127.0.0.1:1"


class TwoListenerBroker(BrokerProcess):
    """`tidelog serve` with PLAINTEXT (advertised where nothing listens) and EXTERNAL;
    `port`, and so `bootstrap`, is the EXTERNAL listener's."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, kind="tidelog")
        self.plaintext_port = free_port()

    def command(self) -> list[str]:
        return [
            str(venv_bin() / "tidelog"),
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--override",
            f"listeners=PLAINTEXT://127.0.0.1:{self.plaintext_port},"
            f"EXTERNAL://127.0.0.1:{self.port}",
            "--override",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT",
            "--override",
            f"advertised.listeners=PLAINTEXT://{UNREACHABLE}",
        ]


@pytest.fixture(scope="module")
def two_listeners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoListenerBroker]:
    process = TwoListenerBroker(tmp_path_factory.mktemp("listeners"))
    process.start()
    try:
        yield process
    finally:
        gc.collect()
        process.stop()


def _advertised_on(port: int) -> set[tuple[str, int]]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})
    metadata = admin.list_topics(timeout=10.0)
    return {(b.host, b.port) for b in metadata.brokers.values()}


def test_each_listener_answers_with_its_own_address(two_listeners: TwoListenerBroker) -> None:
    assert _advertised_on(two_listeners.port) == {("127.0.0.1", two_listeners.port)}
    assert _advertised_on(two_listeners.plaintext_port) == {("127.0.0.1", 1)}


def test_confluent_kafka_on_the_second_listener(
    two_listeners: TwoListenerBroker, topic_name: str
) -> None:
    ck.create_topic(two_listeners, topic_name, 2)
    records = make_records(COUNT, seed=91, partitions=2, base_timestamp=base_timestamp())
    ck.produce(two_listeners, topic_name, records)
    assert_read_back(records, ck.read(two_listeners, topic_name, 2, COUNT))


def test_group_coordinator_on_the_second_listener(
    two_listeners: TwoListenerBroker, topic_name: str
) -> None:
    """FindCoordinator gives the address of the listener asked on: a group commits."""
    from confluent_kafka import TopicPartition

    ck.create_topic(two_listeners, topic_name, 1)
    records = make_records(COUNT, seed=92, partitions=1, base_timestamp=base_timestamp())
    ck.produce(two_listeners, topic_name, records)
    consumer = ck.consumer_for(two_listeners, **{"group.id": f"g-{topic_name}"})
    try:
        consumer.subscribe([topic_name])
        assert_read_back(records, ck.poll_n(consumer, COUNT))
        consumer.commit(asynchronous=False)
        (committed,) = consumer.committed([TopicPartition(topic_name, 0)], timeout=10)
        assert committed.offset == COUNT
    finally:
        consumer.close()


def test_kafka_python_on_the_second_listener(
    two_listeners: TwoListenerBroker, topic_name: str
) -> None:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(
        bootstrap_servers=two_listeners.bootstrap, request_timeout_ms=kp.TIMEOUT_MS
    )
    try:
        kp.create_topic(admin, topic_name, 2)
    finally:
        admin.close()
    records = make_records(COUNT, seed=93, partitions=2, base_timestamp=base_timestamp())
    kp.produce(two_listeners, topic_name, records)
    assert_read_back(records, kp.read(two_listeners, topic_name, 2, COUNT))


def test_aiokafka_on_the_second_listener(two_listeners: TwoListenerBroker, topic_name: str) -> None:
    ck.create_topic(two_listeners, topic_name, 2)
    records = make_records(COUNT, seed=94, partitions=2, base_timestamp=base_timestamp())

    async def write() -> list[tuple[int, int]]:
        return await aio.produce(two_listeners, topic_name, records)

    async def read() -> list[Got]:
        return await aio.read(two_listeners, topic_name, 2, COUNT)

    aio.run(write)
    assert_read_back(records, aio.run(read))


def test_kcat_on_the_second_listener(two_listeners: TwoListenerBroker, topic_name: str) -> None:
    records = make_records(COUNT, seed=95, headers=False)
    ck.create_topic(two_listeners, topic_name, 1)
    kc.produce(two_listeners, topic_name, records)
    # kcat's producer stamps records itself.
    assert_read_back(
        records, kc.consume(two_listeners, topic_name, 0, COUNT), check_timestamps=False
    )


def test_java_client_on_the_second_listener(
    two_listeners: TwoListenerBroker, java_client: JavaClient, topic_name: str
) -> None:
    java = java_client.bound(two_listeners.bootstrap)
    records = make_records(COUNT, seed=96, partitions=2, base_timestamp=base_timestamp())
    java.batch(step("create-topic", topic=topic_name, partitions=2))
    java.produce(topic_name, records, compression="lz4", idempotence=True)
    (consumed,) = java.batch(consume_step(topic_name, max_records=COUNT))
    assert_read_back(records, to_gots(consumed))


@pytest.mark.parametrize(
    ("listener", "protocol_map", "key"),
    [
        ("SSL://127.0.0.1:{port}", None, "ssl.keystore.location"),
        ("SASL_SSL://127.0.0.1:{port}", None, "ssl.keystore.location"),
        ("SASL_PLAINTEXT://127.0.0.1:{port}", None, "sasl.enabled.mechanisms"),
        ("CLIENTS://127.0.0.1:{port}", "CLIENTS:SSL", "ssl.keystore.location"),
    ],
)
def test_a_listener_without_its_security_settings_stops_the_start(
    tmp_path: Path, listener: str, protocol_map: str | None, key: str
) -> None:
    """SSL needs a key store; SASL needs mechanisms Tidelog serves (Kafka's default, GSSAPI,
    is not). One line names the key, before anything is written (docs/security.md)."""
    port = free_port()
    command = [
        str(venv_bin() / "tidelog"),
        "serve",
        "--data-dir",
        str(tmp_path / "data"),
        "--override",
        listener.format(port=port),
    ]
    command[-1] = f"listeners={command[-1]}"
    if protocol_map is not None:
        command += ["--override", f"listener.security.protocol.map={protocol_map}"]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0
    assert len(lines) == 1, result.stderr
    assert f"configuration {key}" in lines[0]
    # Nothing was written: the refusal comes before the data directory is touched.
    assert not (tmp_path / "data").exists()
