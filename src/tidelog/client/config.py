"""Client configuration: Kafka's property names, Kafka's defaults, checked once up front.

A client takes a dict keyed by Kafka's names (``{"linger.ms": 5}``) and/or keyword arguments
with underscores for dots (``linger_ms=5``). Every key must be known to that kind of client
(common keys plus the producer's, consumer's or admin's own); an unknown key or a value of the
wrong kind raises :class:`~tidelog.client.errors.ConfigError` naming the key, with the closest
known names as a hint. Values may be given as strings (as in a properties file).

Producer keys that take Python objects rather than class names: ``partitioner.class`` (a
callable ``(topic, key_bytes, value_bytes, num_partitions) -> partition``) and
``key.serializer`` / ``value.serializer`` (callables ``(obj) -> bytes | str | None``).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tidelog.client.errors import ConfigError

Parser = Callable[[str, Any], Any]


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ConfigError(f"{name}: expected an integer, got {value!r}")


def _non_negative(name: str, value: Any) -> int:
    number = _int(name, value)
    if number < 0:
        raise ConfigError(f"{name}: must not be negative, got {number}")
    return number


def _positive(name: str, value: Any) -> int:
    number = _int(name, value)
    if number <= 0:
        raise ConfigError(f"{name}: must be positive, got {number}")
    return number


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


def _str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    return value


def _optional_str(name: str, value: Any) -> str | None:
    return None if value is None else _str(name, value)


def _optional_callable(name: str, value: Any) -> Callable[..., Any] | None:
    if value is None:
        return None
    if callable(value):
        function: Callable[..., Any] = value
        return function
    raise ConfigError(f"{name}: expected a callable (or None), got {value!r}")


def _servers(name: str, value: Any) -> tuple[tuple[str, int], ...]:
    """``host:port[,host:port...]`` (or a list of them) -> ((host, port), ...)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ConfigError(f"{name}: expected host:port[,host:port...], got {value!r}")
    servers = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        host, sep, port = text.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{name}: {text!r} is not host:port")
        servers.append((host, int(port)))
    if not servers:
        raise ConfigError(f"{name}: at least one host:port is required")
    return tuple(servers)


def _choice(*choices: str) -> Parser:
    def parse(name: str, value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ConfigError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
        return text

    return parse


def _acks(name: str, value: Any) -> int:
    """``all`` / ``-1`` / ``0`` / ``1`` -> the wire value (-1 for all)."""
    text = str(value).strip().lower()
    mapping = {"all": -1, "-1": -1, "0": 0, "1": 1}
    if text not in mapping:
        raise ConfigError(f"{name}: expected all, -1, 0 or 1, got {value!r}")
    return mapping[text]


@dataclass(frozen=True, slots=True)
class Key:
    name: str
    default: Any
    parse: Parser


def _keys(*keys: Key) -> dict[str, Key]:
    return {k.name: k for k in keys}


COMMON = _keys(
    Key("bootstrap.servers", None, _servers),
    Key("client.id", "tidelog", _str),
    Key("request.timeout.ms", 30_000, _positive),
    Key("socket.connection.setup.timeout.ms", 10_000, _positive),
    Key("metadata.max.age.ms", 300_000, _positive),
    Key("retry.backoff.ms", 100, _non_negative),
    Key("reconnect.backoff.ms", 50, _non_negative),
    Key("max.in.flight.requests.per.connection", 5, _positive),
    # Largest response frame the client reads (librdkafka's name; Java has no such bound).
    Key("receive.message.max.bytes", 100 * 1024 * 1024 + 512, _positive),
)

PRODUCER = _keys(
    Key("acks", -1, _acks),
    Key("linger.ms", 5, _non_negative),
    Key("batch.size", 16_384, _positive),
    Key("compression.type", "none", _choice("none", "gzip", "snappy", "lz4", "zstd")),
    Key("compression.gzip.level", None, lambda n, v: None if v is None else _int(n, v)),
    Key("compression.lz4.level", None, lambda n, v: None if v is None else _int(n, v)),
    Key("compression.zstd.level", None, lambda n, v: None if v is None else _int(n, v)),
    Key("retries", 2_147_483_647, _non_negative),
    Key("delivery.timeout.ms", 120_000, _positive),
    Key("max.request.size", 1_048_576, _positive),
    Key("enable.idempotence", True, _bool),
    Key("partitioner.ignore.keys", False, _bool),
    Key("buffer.memory", 33_554_432, _positive),
    Key("max.block.ms", 60_000, _non_negative),
    Key("partitioner.class", None, _optional_callable),
    Key("key.serializer", None, _optional_callable),
    Key("value.serializer", None, _optional_callable),
    Key("transactional.id", None, _optional_str),
    Key("transaction.timeout.ms", 60_000, _positive),
)

# Assignor names, and the Java class names that configurations written for Kafka's own
# consumer use for them.
ASSIGNOR_NAMES = {
    "range": "range",
    "org.apache.kafka.clients.consumer.rangeassignor": "range",
    "cooperative-sticky": "cooperative-sticky",
    "org.apache.kafka.clients.consumer.cooperativestickyassignor": "cooperative-sticky",
}


def _assignors(name: str, value: Any) -> tuple[str, ...]:
    """``range,cooperative-sticky`` (or a list) -> the assignor names in preference order."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ConfigError(f"{name}: expected a list of assignor names, got {value!r}")
    names: list[str] = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        known = ASSIGNOR_NAMES.get(text.lower())
        if known is None:
            choices = ", ".join(sorted(set(ASSIGNOR_NAMES.values())))
            raise ConfigError(f"{name}: unknown assignor {text!r} (known: {choices})")
        if known not in names:
            names.append(known)
    if not names:
        raise ConfigError(f"{name}: at least one assignor is required")
    return tuple(names)


CONSUMER = _keys(
    Key("group.id", None, _optional_str),
    Key("group.instance.id", None, _optional_str),
    Key("session.timeout.ms", 45_000, _positive),
    Key("heartbeat.interval.ms", 3_000, _positive),
    Key("max.poll.interval.ms", 300_000, _positive),
    Key("auto.commit.interval.ms", 5_000, _non_negative),
    Key("partition.assignment.strategy", ("range", "cooperative-sticky"), _assignors),
    Key("exclude.internal.topics", True, _bool),
    Key("default.api.timeout.ms", 60_000, _positive),
    Key("enable.auto.commit", True, _bool),
    Key("auto.offset.reset", "latest", _choice("earliest", "latest", "none")),
    Key("fetch.min.bytes", 1, _positive),
    Key("fetch.max.bytes", 52_428_800, _positive),
    Key("fetch.max.wait.ms", 500, _non_negative),
    Key("max.partition.fetch.bytes", 1_048_576, _positive),
    Key("max.poll.records", 500, _positive),
    Key("isolation.level", "read_uncommitted", _choice("read_uncommitted", "read_committed")),
    Key("check.crcs", True, _bool),
    Key("client.rack", "", _str),
)

ADMIN = _keys(
    Key("default.api.timeout.ms", 60_000, _positive),
)

KINDS: Mapping[str, Mapping[str, Key]] = {
    "producer": {**COMMON, **PRODUCER},
    "consumer": {**COMMON, **CONSUMER},
    "admin": {**COMMON, **ADMIN},
}


class Config(Mapping[str, Any]):
    """A parsed configuration: every known key of one client kind, with its value or default."""

    def __init__(self, kind: str, values: Mapping[str, Any]) -> None:
        self.kind = kind
        self._values = dict(values)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Any:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Config({self.kind!r}, {self._values!r})"


def parse_config(kind: str, config: Mapping[str, Any] | None = None, **kwargs: Any) -> Config:
    """Check ``config`` plus ``kwargs`` (underscores for dots) against ``kind``'s keys."""
    known = KINDS[kind]
    given: dict[str, Any] = {}
    for key, value in (config or {}).items():
        if not isinstance(key, str):
            raise ConfigError(f"configuration keys are strings, got {key!r}")
        given[key] = value
    for key, value in kwargs.items():
        dotted = key.replace("_", ".")
        if dotted in given:
            raise ConfigError(f"{dotted} is given twice (as {dotted!r} and as {key}=)")
        given[dotted] = value
    values: dict[str, Any] = {}
    for key, value in given.items():
        spec = known.get(key)
        if spec is None:
            hint = difflib.get_close_matches(key, list(known), n=2)
            more = f" (did you mean {' or '.join(hint)}?)" if hint else ""
            raise ConfigError(f"unknown {kind} configuration key {key!r}{more}")
        values[key] = spec.parse(key, value)
    for key, spec in known.items():
        if key not in values:
            if spec.default is None and key == "bootstrap.servers":
                raise ConfigError("bootstrap.servers is required")
            values[key] = spec.default
    return Config(kind, values)
