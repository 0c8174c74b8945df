"""The connection limiter's decisions: counts, per-address overrides, release on close,
back pressure at max.connections, the spared inter-broker listener, the creation rate, and
the config errors a broker refuses to start with."""

from __future__ import annotations

import pytest

from tidelog.broker.connection_limits import (
    UNLIMITED,
    ConnectionLimiter,
    ConnectionLimits,
)
from tidelog.metadata.configs import BrokerConfig, ConfigError, validate_broker_config_changes
from tidelog.protocol.error_codes import ErrorCode


def limits_of(values: dict[str, str]) -> ConnectionLimits:
    # Host names of overrides resolve to themselves plus a fixed address, not via DNS.
    return ConnectionLimits.from_config(
        BrokerConfig.from_mapping(values),
        resolve=lambda host: ["10.0.0.9"] if host == "build-box" else [host],
    )


def test_defaults_are_unlimited() -> None:
    limits = limits_of({})
    assert limits.max_connections == UNLIMITED
    assert limits.per_ip == UNLIMITED
    assert limits.creation_rate == UNLIMITED
    limiter = ConnectionLimiter(limits)
    for _ in range(1000):
        assert limiter.wait_time("PLAINTEXT", 0.0) == 0
        assert limiter.admit("PLAINTEXT", "127.0.0.1", 0.0)
    assert limiter.connections("PLAINTEXT") == 1000


def test_per_ip_limit_refuses_and_release_lets_one_in() -> None:
    limiter = ConnectionLimiter(limits_of({"max.connections.per.ip": "3"}))
    assert [limiter.admit("PLAINTEXT", "127.0.0.1", 0.0) for _ in range(4)] == [
        True,
        True,
        True,
        False,
    ]
    # Another address has its own count; a refusal counts nothing but the refusal.
    assert limiter.admit("PLAINTEXT", "127.0.0.2", 0.0)
    assert limiter.connections_from("127.0.0.1") == 3
    assert limiter.connections("PLAINTEXT") == 4
    assert limiter.total == 4
    assert limiter.refused_per_ip == {"PLAINTEXT": 1}
    limiter.release("PLAINTEXT", "127.0.0.1")
    assert limiter.connections_from("127.0.0.1") == 2
    assert limiter.admit("PLAINTEXT", "127.0.0.1", 0.0)
    assert not limiter.admit("PLAINTEXT", "127.0.0.1", 0.0)


def test_per_ip_counts_over_every_listener() -> None:
    limits = limits_of(
        {
            "listeners": "PLAINTEXT://127.0.0.1:0,OTHER://127.0.0.1:0",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,OTHER:PLAINTEXT",
            "max.connections.per.ip": "2",
        }
    )
    limiter = ConnectionLimiter(limits)
    assert limiter.admit("PLAINTEXT", "10.1.1.1", 0.0)
    assert limiter.admit("OTHER", "10.1.1.1", 0.0)
    assert not limiter.admit("OTHER", "10.1.1.1", 0.0)
    assert limiter.refused_per_ip == {"OTHER": 1}


def test_overrides_raise_and_lower_single_addresses() -> None:
    limits = limits_of(
        {
            "max.connections.per.ip": "2",
            "max.connections.per.ip.overrides": " 127.0.0.1:5 , build-box:0,::1:1",
        }
    )
    assert limits.per_ip_overrides == {"127.0.0.1": 5, "10.0.0.9": 0, "::1": 1}
    assert limits.limit_of("127.0.0.1") == 5
    assert limits.limit_of("10.0.0.9") == 0
    assert limits.limit_of("::1") == 1
    assert limits.limit_of("192.168.1.1") == 2
    limiter = ConnectionLimiter(limits)
    assert sum(limiter.admit("PLAINTEXT", "127.0.0.1", 0.0) for _ in range(7)) == 5
    assert not limiter.admit("PLAINTEXT", "10.0.0.9", 0.0)
    assert limiter.admit("PLAINTEXT", "::1", 0.0)
    assert not limiter.admit("PLAINTEXT", "::1", 0.0)


def test_max_connections_blocks_accepting_until_a_close() -> None:
    limiter = ConnectionLimiter(limits_of({"max.connections": "2"}))
    woken: list[str] = []
    for address in ("127.0.0.1", "127.0.0.2"):
        assert limiter.wait_time("PLAINTEXT", 0.0) == 0
        assert limiter.admit("PLAINTEXT", address, 0.0)
    assert limiter.wait_time("PLAINTEXT", 0.0) is None
    limiter.when_room(lambda: woken.append("room"))
    limiter.release("PLAINTEXT", "127.0.0.2")
    assert woken == ["room"]
    assert limiter.wait_time("PLAINTEXT", 0.0) == 0
    # A callback is called once.
    limiter.release("PLAINTEXT", "127.0.0.1")
    assert woken == ["room"]


def test_listener_limit_falls_back_to_max_connections() -> None:
    limits = limits_of(
        {
            "listeners": "PLAINTEXT://127.0.0.1:0,OTHER://127.0.0.1:0",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,OTHER:PLAINTEXT",
            "max.connections": "10",
            "listener.name.other.max.connections": "1",
        }
    )
    assert limits.listener_max_connections == {"PLAINTEXT": 10, "OTHER": 1}
    limiter = ConnectionLimiter(limits)
    assert limiter.admit("OTHER", "127.0.0.1", 0.0)
    assert limiter.wait_time("OTHER", 0.0) is None
    assert limiter.wait_time("PLAINTEXT", 0.0) == 0


def test_inter_broker_listener_is_spared_by_the_broker_wide_limit() -> None:
    limits = limits_of(
        {
            "listeners": "CLIENTS://127.0.0.1:0,REPLICATION://127.0.0.1:0",
            "listener.security.protocol.map": "CLIENTS:PLAINTEXT,REPLICATION:PLAINTEXT",
            "inter.broker.listener.name": "REPLICATION",
            "max.connections": "1",
            "listener.name.replication.max.connections": "5",
        }
    )
    assert limits.protected_listener == "REPLICATION"
    limiter = ConnectionLimiter(limits)
    assert limiter.admit("CLIENTS", "10.0.0.1", 0.0)
    assert limiter.wait_time("CLIENTS", 0.0) is None
    # Over the broker-wide limit, replication connections still come in (and count).
    assert limiter.wait_time("REPLICATION", 0.0) == 0
    assert limiter.admit("REPLICATION", "10.0.0.2", 0.0)
    assert limiter.total == 2
    limiter.release("CLIENTS", "10.0.0.1")
    # The replication connection still holds the broker's one slot.
    assert limiter.wait_time("CLIENTS", 0.0) is None


def test_a_lone_listener_is_not_spared() -> None:
    limits = limits_of({"max.connections": "1"})
    assert limits.protected_listener is None
    limiter = ConnectionLimiter(limits)
    assert limiter.admit("PLAINTEXT", "10.0.0.1", 0.0)
    assert limiter.wait_time("PLAINTEXT", 0.0) is None


def test_a_controller_listener_does_not_make_the_broker_listener_spared() -> None:
    limits = limits_of(
        {
            "listeners": "PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "max.connections": "1",
        }
    )
    assert limits.protected_listener is None
    limiter = ConnectionLimiter(limits)
    assert limiter.admit("PLAINTEXT", "10.0.0.1", 0.0)
    assert limiter.wait_time("PLAINTEXT", 0.0) is None


def test_controller_listener_is_outside_the_broker_wide_total() -> None:
    limits = limits_of(
        {
            "listeners": "PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "max.connections": "1",
            "listener.name.controller.max.connections": "3",
        }
    )
    limiter = ConnectionLimiter(limits)
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        assert limiter.wait_time("CONTROLLER", 0.0) == 0
        assert limiter.admit("CONTROLLER", address, 0.0)
    assert limiter.wait_time("CONTROLLER", 0.0) is None
    assert limiter.total == 0
    assert limiter.wait_time("PLAINTEXT", 0.0) == 0


def test_creation_rate_delays_the_next_accept() -> None:
    limiter = ConnectionLimiter(limits_of({"max.connection.creation.rate": "2"}))
    for _ in range(2):
        assert limiter.wait_time("PLAINTEXT", 10.0) == 0
        assert limiter.admit("PLAINTEXT", "10.0.0.1", 10.0)
    assert limiter.wait_time("PLAINTEXT", 10.0) == pytest.approx(0.5)
    assert limiter.wait_time("PLAINTEXT", 10.25) == pytest.approx(0.25)
    assert limiter.wait_time("PLAINTEXT", 10.5) == 0


def test_listener_creation_rate() -> None:
    limits = limits_of({"listener.name.plaintext.max.connection.creation.rate": "1"})
    assert limits.listener_creation_rate == {"PLAINTEXT": 1}
    limiter = ConnectionLimiter(limits)
    assert limiter.wait_time("PLAINTEXT", 0.0) == 0
    assert limiter.admit("PLAINTEXT", "10.0.0.1", 0.0)
    assert limiter.wait_time("PLAINTEXT", 0.0) == pytest.approx(1.0)


def test_raising_the_limit_wakes_the_waiting_listener_and_keeps_counts() -> None:
    limiter = ConnectionLimiter(limits_of({"max.connections": "1"}))
    assert limiter.admit("PLAINTEXT", "10.0.0.1", 0.0)
    woken: list[bool] = []
    limiter.when_room(lambda: woken.append(True))
    limiter.reconfigure(limits_of({"max.connections": "2"}))
    assert woken == [True]
    assert limiter.connections("PLAINTEXT") == 1
    assert limiter.wait_time("PLAINTEXT", 0.0) == 0


@pytest.mark.parametrize(
    ("values", "key", "reason"),
    [
        ({"max.connections": "-1"}, "max.connections", "at least 0"),
        ({"max.connections.per.ip": "-5"}, "max.connections.per.ip", "at least 0"),
        ({"max.connection.creation.rate": "-1"}, "max.connection.creation.rate", "at least 0"),
        (
            {"listener.name.plaintext.max.connections": "-2"},
            "listener.name.plaintext.max.connections",
            "at least 0",
        ),
        (
            {"max.connections.per.ip.overrides": "127.0.0.1=4"},
            "max.connections.per.ip.overrides",
            "is not host:count",
        ),
        (
            {"max.connections.per.ip.overrides": "127.0.0.1:many"},
            "max.connections.per.ip.overrides",
            "is not host:count",
        ),
        (
            {"max.connections.per.ip.overrides": "127.0.0.1:-1"},
            "max.connections.per.ip.overrides",
            "at least 0",
        ),
        ({"max.connections.per.ip": "0"}, "max.connections.per.ip", "refuses every client"),
    ],
)
def test_invalid_values_are_one_line_config_errors(
    values: dict[str, str], key: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        limits_of(values)
    message = str(raised.value)
    assert key in message and reason in message
    assert "\n" not in message


def test_unresolvable_override_host_is_a_config_error() -> None:
    config = BrokerConfig.from_mapping(
        {"max.connections.per.ip.overrides": "no-such-host.invalid:3"}
    )
    with pytest.raises(
        ConfigError, match=r"max\.connections\.per\.ip\.overrides.*cannot be resolved"
    ):
        ConnectionLimits.from_config(config)


def test_dynamic_changes_are_validated_like_static_ones() -> None:
    assert validate_broker_config_changes({"max.connections.per.ip": "3"}, per_broker=False) is None
    refused = validate_broker_config_changes(
        {"max.connections.per.ip.overrides": "localhost"}, per_broker=False
    )
    assert refused is not None and refused.code == ErrorCode.INVALID_REQUEST
    assert "is not host:count" in (refused.message or "")


def test_metrics_report_connections_and_refusals_per_listener() -> None:
    from tidelog.broker.metrics import BrokerMetrics

    from .test_metrics import parse, value

    limiter = ConnectionLimiter(limits_of({"max.connections.per.ip": "1"}))
    metrics = BrokerMetrics()
    metrics.connection_limiter = limiter
    assert limiter.admit("PLAINTEXT", "10.0.0.1", 0.0)
    assert limiter.admit("PLAINTEXT", "10.0.0.2", 0.0)
    assert not limiter.admit("PLAINTEXT", "10.0.0.1", 0.0)
    limiter.release("PLAINTEXT", "10.0.0.2")
    sample = parse(metrics.render(metrics.gather_requests()))
    count = "kafka_server_socket_server_metrics_connection_count"
    refused = "kafka_server_socket_server_metrics_connections_refused_total"
    assert value(sample, count, listener="PLAINTEXT") == 1
    assert value(sample, refused, listener="PLAINTEXT") == 1
