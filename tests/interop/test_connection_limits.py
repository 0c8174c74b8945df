"""Connection limits against a real `tidelog serve`: ``max.connections.per.ip`` closes the
connection over the limit at once and lets a new one in when one closes; a dynamic change
raised through IncrementalAlterConfigs applies at once and confluent-kafka then produces
and consumes; ``max.connections`` makes the listener stop accepting (back pressure) until a
connection closes; a bad value stops the start with one line."""

from __future__ import annotations

import select
import socket
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from interop_broker import BrokerProcess, broker_kind
from interop_data import wait_until
from interop_metrics import Metrics
from kio.schema.api_versions.v3.request import ApiVersionsRequest

from tidelog.protocol import decode_response, encode_request

pytestmark = pytest.mark.skipif(
    broker_kind() != "tidelog", reason="reads Tidelog's metrics listener and log"
)

TIMEOUT = 30.0
LISTENER = "PLAINTEXT"


def _connection_count(metrics: Metrics) -> float:
    return metrics.scrape().get(
        (
            "kafka_server_socket_server_metrics_connection_count",
            frozenset({("listener", LISTENER)}),
        ),
        0.0,
    )


def _refused(metrics: Metrics) -> float:
    return metrics.scrape().get(
        (
            "kafka_server_socket_server_metrics_connections_refused_total",
            frozenset({("listener", LISTENER)}),
        ),
        0.0,
    )


def _wait_for_connections(metrics: Metrics, count: int) -> None:
    wait_until(
        lambda: _connection_count(metrics) == count,
        f"{count} open connections on {LISTENER}",
        TIMEOUT,
    )


def _send_api_versions(sock: socket.socket, correlation_id: int) -> None:
    request = ApiVersionsRequest(client_software_name="limits", client_software_version="1")
    sock.sendall(encode_request(request, correlation_id=correlation_id, client_id="limits"))


def _read_response(sock: socket.socket) -> bytes | None:
    """The next response frame, or None when the broker closed the connection."""
    data = bytearray()
    size: int | None = None
    while size is None or len(data) < size + 4:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
        if size is None and len(data) >= 4:
            (size,) = struct.unpack(">i", data[:4])
    return bytes(data[4:])


def _api_versions_answered(sock: socket.socket, correlation_id: int) -> bool:
    _send_api_versions(sock, correlation_id)
    body = _read_response(sock)
    if body is None:
        return False
    header, response = decode_response(body, api_key=18, api_version=3)
    return header.correlation_id == correlation_id and response.error_code == 0


def _connect(broker: BrokerProcess) -> socket.socket:
    sock = socket.create_connection((broker.host, broker.port), timeout=TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _closed_by_broker(sock: socket.socket) -> bool:
    """Whether the broker closed ``sock`` without answering a request sent on it."""
    try:
        _send_api_versions(sock, 99)
    except (BrokenPipeError, ConnectionResetError):
        return True
    return _read_response(sock) is None


@pytest.fixture
def per_ip_broker(tmp_path: Path) -> Iterator[Metrics]:
    metrics = Metrics(tmp_path)
    metrics.broker.extra_args += ["--override", "max.connections.per.ip=3"]
    metrics.broker.start()
    try:
        yield metrics
    finally:
        metrics.broker.stop()


def test_per_ip_limit_closes_the_extra_connection(per_ip_broker: Metrics) -> None:
    broker = per_ip_broker.broker
    # The readiness check's clients have gone.
    _wait_for_connections(per_ip_broker, 0)
    first = [_connect(broker) for _ in range(3)]
    try:
        for n, sock in enumerate(first):
            assert _api_versions_answered(sock, n)
        fourth = _connect(broker)
        with fourth:
            assert _closed_by_broker(fourth)
        assert _refused(per_ip_broker) == 1
        # The three are served still.
        for n, sock in enumerate(first):
            assert _api_versions_answered(sock, 10 + n)
        first.pop().close()
        _wait_for_connections(per_ip_broker, 2)
        replacement = _connect(broker)
        first.append(replacement)
        assert _api_versions_answered(replacement, 20)
        assert _refused(per_ip_broker) == 1
    finally:
        for sock in first:
            sock.close()

    # Raised dynamically (Kafka's cluster-wide mode), a real client's connections fit.
    _wait_for_connections(per_ip_broker, 0)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(
        ResourceType.BROKER,
        "1",
        incremental_configs=[
            ConfigEntry("max.connections.per.ip", "50", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    next(iter(admin.incremental_alter_configs([resource]).values())).result(TIMEOUT)
    del admin
    # Applied with the commit the answer waited for: four connections from one address now.
    more = [_connect(broker) for _ in range(4)]
    try:
        for n, sock in enumerate(more):
            assert _api_versions_answered(sock, 30 + n)
    finally:
        for sock in more:
            sock.close()
    topic = f"limits-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for n in range(10):
        producer.produce(topic, value=f"v{n}".encode())
    assert producer.flush(TIMEOUT) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic])
        values: list[bytes] = []

        def read_all() -> bool:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                values.append(message.value())
            return len(values) == 10

        wait_until(read_all, "the 10 records consumed", TIMEOUT)
        assert values == [f"v{n}".encode() for n in range(10)]
    finally:
        consumer.close()
    assert _refused(per_ip_broker) == 1


def _blocked(broker: BrokerProcess) -> bool:
    """Whether the listener has stopped accepting, by the broker's log."""
    log = broker.log_path.read_text()
    stopped = log.count(f"{LISTENER} stops accepting")
    return stopped > log.count(f"{LISTENER} accepts connections again")


def test_max_connections_holds_the_next_client_until_one_closes(tmp_path: Path) -> None:
    metrics = Metrics(tmp_path)
    metrics.broker.extra_args += ["--override", "max.connections=2"]
    broker = metrics.broker
    broker.start()
    try:
        _wait_for_connections(metrics, 0)
        first, second = _connect(broker), _connect(broker)
        with first, second:
            assert _api_versions_answered(first, 1)
            assert _api_versions_answered(second, 2)
            # At the limit the listener stops accepting at once.
            wait_until(lambda: _blocked(broker), "the listener to stop accepting", TIMEOUT)
            # The kernel completes the handshake (backlog); the broker does not accept it.
            third = _connect(broker)
            with third:
                _send_api_versions(third, 3)
                assert _blocked(broker)
                readable, _, _ = select.select([third], [], [], 0)
                assert readable == []
                assert _connection_count(metrics) == 2
                first.close()
                body = _read_response(third)
                assert body is not None
                header, response = decode_response(body, api_key=18, api_version=3)
                assert header.correlation_id == 3 and response.error_code == 0
                assert _api_versions_answered(second, 4)
                assert _connection_count(metrics) == 2
    finally:
        broker.stop()


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("max.connections=-1", "max.connections"),
        ("max.connections.per.ip.overrides=127.0.0.1=5", "max.connections.per.ip.overrides"),
    ],
)
def test_bad_limit_is_refused_in_one_line(tmp_path: Path, override: str, key: str) -> None:
    broker = BrokerProcess(tmp_path, extra_args=["--override", override])
    result = broker.run_to_exit()
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert key in lines[0]


def test_a_client_stalled_halfway_through_a_request_is_closed_when_idle(tmp_path: Path) -> None:
    metrics = Metrics(tmp_path)
    metrics.broker.extra_args += ["--override", "connections.max.idle.ms=1000"]
    broker = metrics.broker
    broker.start()
    try:
        _wait_for_connections(metrics, 0)
        with _connect(broker) as stalled, _connect(broker) as quiet:
            # A size prefix of 100 bytes, then 10 of them, then nothing.
            stalled.sendall(struct.pack(">i", 100) + b"\0" * 10)
            assert _api_versions_answered(quiet, 1)
            # Both are closed by the broker once idle (recv returns at the close).
            assert _read_response(stalled) is None
            assert _read_response(quiet) is None
        _wait_for_connections(metrics, 0)
        assert "idle for connections.max.idle.ms" in broker.log_path.read_text()
        # A new client is served as before.
        with _connect(broker) as fresh:
            assert _api_versions_answered(fresh, 2)
    finally:
        broker.stop()
