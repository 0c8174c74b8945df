from __future__ import annotations

import pytest

from tidelog.client.config import parse_config
from tidelog.client.errors import ConfigError


def test_defaults_are_kafkas() -> None:
    c = parse_config("producer", {"bootstrap.servers": "h:9092"})
    assert c["bootstrap.servers"] == (("h", 9092),)
    assert c["acks"] == -1
    assert c["batch.size"] == 16384
    assert c["linger.ms"] == 5
    assert c["compression.type"] == "none"
    assert c["enable.idempotence"] is True  # as the Java client and librdkafka
    assert c["request.timeout.ms"] == 30000


def test_keyword_arguments_use_underscores() -> None:
    c = parse_config("producer", bootstrap_servers="a:1,b:2", linger_ms="7", acks="1")
    assert c["bootstrap.servers"] == (("a", 1), ("b", 2))
    assert c["linger.ms"] == 7
    assert c["acks"] == 1


def test_unknown_key_names_itself_and_suggests() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown producer configuration key 'linger\.m'.*linger\.ms"
    ):
        parse_config("producer", {"bootstrap.servers": "h:1", "linger.m": 1})


def test_key_of_another_client_kind_is_unknown() -> None:
    with pytest.raises(ConfigError, match="unknown consumer configuration key 'acks'"):
        parse_config("consumer", {"bootstrap.servers": "h:1", "acks": "all"})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("linger.ms", "soon", "expected an integer"),
        ("linger.ms", -1, "must not be negative"),
        ("batch.size", 0, "must be positive"),
        ("acks", "2", "expected all, -1, 0 or 1"),
        ("compression.type", "brotli", "expected one of none, gzip"),
        ("enable.idempotence", "yes", "expected true or false"),
        ("bootstrap.servers", "nohostport", "is not host:port"),
        ("bootstrap.servers", "h:99999", "is not host:port"),
    ],
)
def test_bad_values(key: str, value: object, message: str) -> None:
    config = {"bootstrap.servers": "h:1", key: value}
    with pytest.raises(ConfigError, match=message):
        parse_config("producer", config)


def test_bootstrap_servers_is_required() -> None:
    with pytest.raises(ConfigError, match=r"bootstrap\.servers is required"):
        parse_config("admin", {})


def test_same_key_twice_is_an_error() -> None:
    with pytest.raises(ConfigError, match="given twice"):
        parse_config("admin", {"bootstrap.servers": "h:1"}, bootstrap_servers="h:2")


def test_consumer_choices_and_bools() -> None:
    c = parse_config(
        "consumer",
        {"bootstrap.servers": "[::1]:9092", "auto.offset.reset": "EARLIEST", "check.crcs": "false"},
    )
    assert c["bootstrap.servers"] == (("::1", 9092),)
    assert c["auto.offset.reset"] == "earliest"
    assert c["check.crcs"] is False


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_config("admin", {"bootstrap.servers": "h:1", "nope": 1})
