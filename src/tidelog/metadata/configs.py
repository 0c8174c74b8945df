"""Broker and topic configuration: definitions, parsing, layering, describe, validation.

Names, types and defaults are Kafka's. Each definition (:class:`ConfigDef`) knows its
:class:`ConfigType` (the numbers DescribeConfigs v3+ sends), its default (already parsed;
``None`` for "unset"), a check of its range or choices and a documentation string.

Layers. A broker config value comes from the first layer that sets it::

    dynamic per-broker (AlterConfigs on BROKER "<node.id>")   DYNAMIC_BROKER_CONFIG
    dynamic cluster default (AlterConfigs on BROKER "")        DYNAMIC_DEFAULT_BROKER_CONFIG
    static (server.properties, --override, command-line flags) STATIC_BROKER_CONFIG
    the definition's default                                   DEFAULT_CONFIG

A topic config comes from the topic's override (TOPIC_CONFIG) or else from its broker
synonyms, tried in Kafka's order, e.g. ``retention.ms`` from ``log.retention.ms``, then
``log.retention.minutes``, then ``log.retention.hours`` (the first one set in any layer
wins, scaled to milliseconds), and last from the definition's default.

Families. ``*.ms`` wins over ``*.minutes`` over ``*.hours`` whatever layer each comes
from, as in Kafka. ``log.dirs`` wins over ``log.dir``. ``flush.ms`` falls back to
``log.flush.scheduler.interval.ms`` when ``log.flush.interval.ms`` is unset.

Describe. :func:`describe_topic_configs` and :func:`describe_broker_configs` build the
DescribeConfigs entries, with synonyms in Kafka's order: the topic override, then for each
layer (per-broker, cluster default, static, default) every broker synonym set in it.
"""

from __future__ import annotations

import enum
import logging
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from tidelog.metadata import kafka_config_names as kafka_names
from tidelog.metadata.acls import STANDARD_AUTHORIZER, parse_super_users
from tidelog.metadata.errors import ApiError
from tidelog.protocol.error_codes import ErrorCode
from tidelog.runtime.http_endpoints import parse_http_listener
from tidelog.runtime.logs import LOG_FORMATS
from tidelog.storage.config import CONFIG_KEYS as LOG_CONFIG_KEYS
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import ConfigError

if TYPE_CHECKING:
    from tidelog.metadata.raft.config import RaftConfig

__all__ = [
    "BROKER_CONFIGS",
    "TOPIC_CONFIGS",
    "BrokerConfig",
    "ConfigDef",
    "ConfigEntry",
    "ConfigError",
    "ConfigResourceType",
    "ConfigSource",
    "ConfigSynonym",
    "ConfigType",
    "ConfigValue",
    "Endpoint",
    "TopicConfigDef",
    "describe_broker_configs",
    "describe_topic_configs",
    "format_value",
    "no_effect_doc_tables",
    "parse_overrides",
    "parse_per_ip_overrides",
    "parse_properties",
    "read_properties_file",
    "topic_config_value",
    "topic_log_config",
    "validate_broker_config_changes",
    "validate_topic_configs",
]

_log = logging.getLogger(__name__)

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
SHORT_MIN, SHORT_MAX = -(2**15), 2**15 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

ConfigValue = bool | int | float | str | tuple[str, ...]


class ConfigType(enum.IntEnum):
    """The config data type numbers of DescribeConfigs v3+."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class ConfigSource(enum.IntEnum):
    """Where a value comes from (DescribeConfigs ``config_source`` and synonym ``source``)."""

    UNKNOWN = 0
    TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_BROKER_LOGGER_CONFIG = 6


class ConfigResourceType(enum.IntEnum):
    """Resource type numbers of DescribeConfigs / AlterConfigs / IncrementalAlterConfigs."""

    UNKNOWN = 0
    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8


# -- parsing single values ---------------------------------------------------------------

_INTEGER = re.compile(r"[+-]?[0-9]+")
_RANGES = {
    ConfigType.INT: (INT_MIN, INT_MAX),
    ConfigType.SHORT: (SHORT_MIN, SHORT_MAX),
    ConfigType.LONG: (LONG_MIN, LONG_MAX),
}


def _parse_typed(name: str, kind: ConfigType, raw: object) -> ConfigValue:
    """``raw`` (text from a file or a request, or an already typed value) as ``kind``."""
    if kind is ConfigType.BOOLEAN:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        raise ConfigError(name, raw, "expected true or false")
    if kind in _RANGES:
        low, high = _RANGES[kind]
        if isinstance(raw, bool):
            raise ConfigError(name, raw, "expected an integer")
        if isinstance(raw, int):
            number = raw
        elif isinstance(raw, str) and _INTEGER.fullmatch(raw.strip()):
            number = int(raw.strip(), 10)
        else:
            raise ConfigError(name, raw, "expected an integer")
        if not low <= number <= high:
            raise ConfigError(name, raw, f"does not fit the {kind.name} type")
        return number
    if kind is ConfigType.DOUBLE:
        if isinstance(raw, bool):
            raise ConfigError(name, raw, "expected a number")
        try:
            number_f = float(raw.strip()) if isinstance(raw, str) else float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ConfigError(name, raw, "expected a number") from None
        if not math.isfinite(number_f):
            raise ConfigError(name, raw, "expected a finite number")
        return number_f
    if kind is ConfigType.LIST:
        if isinstance(raw, tuple):
            return tuple(str(item).strip() for item in raw)
        if not isinstance(raw, str):
            raise ConfigError(name, raw, "expected a comma-separated list")
        text = raw.strip()
        if not text:
            return ()
        return tuple(item.strip() for item in text.split(","))
    if not isinstance(raw, str):
        raise ConfigError(name, raw, "expected a string")
    return raw.strip()


def format_value(value: ConfigValue | None) -> str | None:
    """A parsed value as the text DescribeConfigs shows (Kafka's spelling)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


Check = Callable[[str, ConfigValue], None]


def at_least(low: int | float) -> Check:
    def check(name: str, value: ConfigValue) -> None:
        if isinstance(value, int | float) and value < low:
            raise ConfigError(name, format_value(value), f"must be at least {low}")

    return check


def between(low: int | float, high: int | float) -> Check:
    def check(name: str, value: ConfigValue) -> None:
        if isinstance(value, int | float) and not low <= value <= high:
            raise ConfigError(name, format_value(value), f"must be between {low} and {high}")

    return check


def one_of(*choices: str, case_sensitive: bool = True) -> Check:
    def check(name: str, value: ConfigValue) -> None:
        text = value if case_sensitive or not isinstance(value, str) else value.lower()
        if text not in choices:
            raise ConfigError(name, format_value(value), f"must be one of {', '.join(choices)}")

    return check


def each_of(*choices: str, non_empty: bool = True) -> Check:
    def check(name: str, value: ConfigValue) -> None:
        items = value if isinstance(value, tuple) else ()
        if non_empty and not items:
            raise ConfigError(name, format_value(value), "must not be empty")
        bad = [item for item in items if item not in choices]
        if bad:
            raise ConfigError(
                name, format_value(value), f"items must be among {', '.join(choices)}"
            )

    return check


def non_empty(name: str, value: ConfigValue) -> None:
    if value in ("", ()):
        raise ConfigError(name, format_value(value), "must not be empty")


# -- listeners ---------------------------------------------------------------------------


class Endpoint(NamedTuple):
    """One listener: ``NAME://host:port``. An empty host means every interface."""

    name: str
    host: str
    port: int
    security_protocol: str

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


_LISTENER = re.compile(r"([A-Za-z0-9_]+)://(\[[0-9A-Fa-f:.]*\]|[^:/\[\]\s]*):([0-9]{1,5})")
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# Addresses that mean "every interface" when bound, and nothing when connected to: Kafka
# refuses to advertise them.
_UNROUTABLE_HOSTS = frozenset({"0.0.0.0", "::"})


def _parse_endpoints(
    name: str, items: Sequence[str], protocols: Mapping[str, str]
) -> list[Endpoint]:
    endpoints: list[Endpoint] = []
    for item in items:
        match = _LISTENER.fullmatch(item)
        if match is None:
            raise ConfigError(name, item, "a listener is NAME://host:port")
        listener, host, port_text = match.groups()
        port = int(port_text)
        if port > 65535:
            raise ConfigError(name, item, "the port must be between 0 and 65535")
        listener = listener.upper()
        protocol = protocols.get(listener)
        if protocol is None:
            raise ConfigError(
                name, item, f"listener {listener} has no entry in listener.security.protocol.map"
            )
        if any(existing.name == listener for existing in endpoints):
            raise ConfigError(name, ",".join(items), f"listener {listener} appears twice")
        endpoints.append(Endpoint(listener, host.strip("[]"), port, protocol))
    return endpoints


def _check_listeners(name: str, value: ConfigValue) -> None:
    items = value if isinstance(value, tuple) else ()
    names = {item.partition("://")[0].upper(): "PLAINTEXT" for item in items}
    _parse_endpoints(name, items, names)


def _parse_protocol_map(name: str, value: ConfigValue) -> dict[str, str]:
    text = value if isinstance(value, str) else ""
    mapping: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        listener, colon, protocol = item.partition(":")
        protocol = protocol.strip().upper()
        if not colon or not listener.strip() or protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(name, text, f"{item.strip()!r} is not LISTENER:PROTOCOL")
        mapping[listener.strip().upper()] = protocol
    return mapping


def _check_protocol_map(name: str, value: ConfigValue) -> None:
    _parse_protocol_map(name, value)


def parse_metrics_listener(name: str, value: ConfigValue | None) -> tuple[str, int] | None:
    """(host, port) of ``http://host:port``; None for the empty value (metrics off)."""
    text = value if isinstance(value, str) else ""
    if not text:
        return None
    try:
        return parse_http_listener(text, name)
    except ValueError:
        raise ConfigError(
            name, text, "expected http://host:port (or empty for no metrics)"
        ) from None


def _check_metrics_listener(name: str, value: ConfigValue) -> None:
    parse_metrics_listener(name, value)


def _check_cluster_id(name: str, value: ConfigValue) -> None:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", value):
        raise ConfigError(name, value, "must be 1-64 characters of [A-Za-z0-9_-]")


# -- definitions -------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigDef:
    """One configuration key: type, default (parsed), check, documentation.

    ``dynamic`` (broker keys only) says whether AlterConfigs may change it at run time;
    ``per_broker`` that it may only on the resource named after a broker (Kafka's
    "per-broker" update mode), not on the cluster-wide default ``""``; ``per_listener``
    that Kafka takes it dynamically only under a ``listener.name.<name>.`` prefix, so the
    bare name is refused. ``no_effect`` is None for a key Tidelog acts on, else why it
    does nothing (accepted and stored for compatibility with Kafka's names).
    """

    name: str
    type: ConfigType
    default: ConfigValue | None
    doc: str
    check: Check | None = None
    dynamic: bool = False
    per_broker: bool = False
    per_listener: bool = False
    no_effect: str | None = None

    @property
    def documentation(self) -> str:
        """The doc DescribeConfigs sends: says when the key has no effect, and why."""
        if self.no_effect is None:
            return self.doc
        return f"{self.doc} No effect in Tidelog: {self.no_effect}."

    @property
    def sensitive(self) -> bool:
        return self.type is ConfigType.PASSWORD

    def parse(self, raw: object) -> ConfigValue:
        """The value of ``raw`` (text or typed), checked; raises ConfigError."""
        value = _parse_typed(self.name, self.type, raw)
        if self.check is not None:
            self.check(self.name, value)
        return value


@dataclass(frozen=True)
class TopicConfigDef(ConfigDef):
    """A topic-level key with the broker keys it falls back to, in Kafka's order."""

    synonyms: tuple[str, ...] = ()


_B = ConfigType.BOOLEAN
_S = ConfigType.STRING
_I = ConfigType.INT
_SH = ConfigType.SHORT
_L = ConfigType.LONG
_D = ConfigType.DOUBLE
_LI = ConfigType.LIST

_COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
_TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
_CLEANUP = ("delete", "compact")
_DEFAULT_PROTOCOL_MAP = (
    "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"
)


def _broker_defs() -> list[ConfigDef]:
    d = ConfigDef
    return [
        # -- identity and network
        d(
            "node.id",
            _I,
            1,
            "Id of this node in the cluster (it is both broker and controller).",
            at_least(0),
        ),
        d(
            "cluster.id",
            _S,
            None,
            "Id of the cluster. When unset it is generated on first start and kept in "
            "meta.properties in every log dir; when set it must match what is there.",
            _check_cluster_id,
        ),
        d(
            "listeners",
            _LI,
            ("PLAINTEXT://127.0.0.1:9092",),
            "Comma-separated NAME://host:port addresses to accept connections on; an empty "
            "host means every interface.",
            _check_listeners,
        ),
        d(
            "advertised.listeners",
            _LI,
            None,
            "Addresses handed to clients in Metadata responses, same format as listeners; "
            "defaults to listeners.",
            _check_listeners,
        ),
        d(
            "listener.security.protocol.map",
            _S,
            _DEFAULT_PROTOCOL_MAP,
            "LISTENER:PROTOCOL pairs giving each listener name its security protocol.",
            _check_protocol_map,
        ),
        d(
            "inter.broker.listener.name",
            _S,
            None,
            "Listener the brokers use between themselves; must be a broker listener "
            "(informational on a single node).",
        ),
        d(
            "controller.listener.names",
            _LI,
            None,
            "Listener names used by controllers: served, but never given to clients in "
            "Metadata. They answer every API the other listeners do, plus what brokers send "
            "the controller (BrokerRegistration, BrokerHeartbeat, UnregisterBroker, "
            "AllocateProducerIds).",
        ),
        d(
            "process.roles",
            _LI,
            ("broker", "controller"),
            "Roles of this process; only combined broker,controller nodes are supported "
            "(broker-only and controller-only nodes are refused at start).",
            each_of("broker", "controller"),
        ),
        d(
            "broker.rack",
            _S,
            None,
            "Rack of this broker: sent in its registration and given to clients in Metadata "
            "and DescribeCluster.",
        ),
        d(
            "broker.heartbeat.interval.ms",
            _I,
            2000,
            "How often a broker heartbeats its controller (a node's own broker too).",
            at_least(1),
        ),
        d(
            "broker.session.timeout.ms",
            _I,
            9000,
            "A broker not heard from for this long is fenced by the active controller: its "
            "leaderships move and clients are no longer given it.",
            at_least(1),
        ),
        d(
            "controller.quorum.voters",
            _LI,
            None,
            "Voters of the metadata quorum, id@host:port of each one's controller listener. "
            "Unset: this node is a quorum of one. Set: the node is a voter of that quorum "
            "(it must be listed) and its controller commits through Raft.",
        ),
        d(
            "controller.quorum.election.timeout.ms",
            _I,
            1000,
            "An election lasts a random time between this and twice this.",
            at_least(1),
        ),
        d(
            "controller.quorum.fetch.timeout.ms",
            _I,
            2000,
            "A voter that has not heard from its leader for this long starts an election; a "
            "leader no majority has fetched from for 1.5 times this long steps down.",
            at_least(1),
        ),
        d(
            "controller.quorum.election.backoff.max.ms",
            _I,
            1000,
            "Cap of the randomised exponential back-off between failed elections.",
            at_least(1),
        ),
        d(
            "controller.quorum.request.timeout.ms",
            _I,
            2000,
            "A quorum request without an answer for this long is given up and sent again.",
            at_least(1),
        ),
        d(
            "controller.quorum.retry.backoff.ms",
            _I,
            20,
            "Pause before a failed quorum request is sent again.",
            at_least(1),
        ),
        d(
            "metadata.log.max.record.bytes.between.snapshots",
            _L,
            20971520,
            "A node of a quorum snapshots its metadata image once this many bytes of records "
            "were committed since its last snapshot, and deletes the log below it (no effect "
            "on a single node).",
            at_least(1),
        ),
        d(
            "metadata.log.max.snapshot.interval.ms",
            _L,
            3600000,
            "A node of a quorum snapshots its metadata image this long after its last "
            "snapshot if anything was committed meanwhile; 0: never by time (no effect on a "
            "single node).",
            at_least(0),
        ),
        d(
            "socket.request.max.bytes",
            _I,
            104857600,
            "Largest request the broker reads; a larger size prefix closes the connection.",
            at_least(1),
        ),
        d(
            "socket.send.buffer.bytes",
            _I,
            102400,
            "SO_SNDBUF of client sockets; -1 keeps the OS default.",
            at_least(-1),
        ),
        d(
            "socket.receive.buffer.bytes",
            _I,
            102400,
            "SO_RCVBUF of client sockets; -1 keeps the OS default.",
            at_least(-1),
        ),
        d(
            "queued.max.requests",
            _I,
            500,
            "Requests read but not yet handled before the broker stops reading sockets.",
            at_least(1),
        ),
        d(
            "metrics.listener",
            _S,
            "",
            "http://host:port of the broker's Prometheus metrics and health endpoints "
            "(/metrics, /health, /ready); empty: off. An empty host means every interface. "
            "Not a Kafka key: Kafka exposes JMX instead.",
            _check_metrics_listener,
        ),
        d(
            "log.format",
            _S,
            "text",
            "How the broker writes its own log on stderr: text (one line per record) or json "
            "(one JSON object per line, extra fields such as a slow request's API and times "
            "as fields). Not a Kafka key: Kafka's log4j configuration does this.",
            one_of(*LOG_FORMATS),
        ),
        d(
            "slow.request.threshold.ms",
            _I,
            1000,
            "Requests that take longer are logged (logger tidelog.request, WARNING) with "
            "their API, client id and time split; -1: off. A Fetch long poll's and a "
            "rebalance's wait are not counted. Not a Kafka key.",
            at_least(-1),
        ),
        d(
            "num.network.threads",
            _I,
            3,
            "Accepted for compatibility; the broker's network work runs on its event loop.",
            at_least(1),
            dynamic=True,
        ),
        d(
            "num.io.threads",
            _I,
            8,
            "Accepted for compatibility; sizes the pool that runs blocking disk work.",
            at_least(1),
            dynamic=True,
        ),
        d(
            "num.recovery.threads.per.data.dir",
            _I,
            1,
            "Accepted for compatibility: threads per log dir for recovery at start.",
            at_least(1),
            dynamic=True,
        ),
        d(
            "message.max.bytes",
            _I,
            1048588,
            "Largest record batch the broker accepts (after compression); default of the "
            "topic config max.message.bytes.",
            at_least(0),
            dynamic=True,
        ),
        d(
            "fetch.max.bytes",
            _I,
            57671680,
            "Most bytes one Fetch response carries, whatever the request asks.",
            at_least(1024),
            dynamic=True,
        ),
        # -- topics
        d(
            "num.partitions",
            _I,
            1,
            "Partitions of a topic created without a partition count (or auto-created).",
            at_least(1),
            dynamic=True,
        ),
        d(
            "default.replication.factor",
            _I,
            1,
            "Replication factor of a topic created without one (or auto-created).",
            at_least(1),
            dynamic=True,
        ),
        d(
            "auto.create.topics.enable",
            _B,
            True,
            "Create a topic when a client asks Metadata for it and allows auto-creation.",
        ),
        d(
            "delete.topic.enable",
            _B,
            True,
            "Allow DeleteTopics; when false every deletion fails with TOPIC_DELETION_DISABLED.",
        ),
        d(
            "min.insync.replicas",
            _I,
            1,
            "Replicas that must acknowledge an acks=all write; default of the topic config "
            "min.insync.replicas.",
            at_least(1),
            dynamic=True,
        ),
        d(
            "unclean.leader.election.enable",
            _B,
            False,
            "Allow a replica outside the ISR to become leader (data loss); default of the "
            "topic config.",
            dynamic=True,
        ),
        d(
            "auto.leader.rebalance.enable",
            _B,
            True,
            "The active controller moves leaderships back to preferred replicas every "
            "leader.imbalance.check.interval.seconds.",
        ),
        d(
            "leader.imbalance.check.interval.seconds",
            _L,
            300,
            "How often the active controller checks for leaderships off their preferred replica.",
            at_least(1),
        ),
        d(
            "leader.imbalance.per.broker.percentage",
            _I,
            10,
            "Share of a broker's preferred leaderships held elsewhere above which the "
            "controller moves them back.",
            between(0, 100),
        ),
        d(
            "compression.type",
            _S,
            "producer",
            "Compression of stored batches; producer keeps what the producer sent. Default "
            "of the topic config.",
            one_of(*_COMPRESSION_TYPES),
            dynamic=True,
        ),
        # -- log dirs and segments
        d(
            "log.dirs",
            _LI,
            None,
            "Comma-separated directories holding the partition logs; wins over log.dir.",
            non_empty,
        ),
        d(
            "log.dir",
            _S,
            "./tidelog-data",
            "The log directory, used when log.dirs is unset.",
            non_empty,
        ),
        d(
            "metadata.log.dir",
            _S,
            None,
            "Directory of the cluster metadata log (__cluster_metadata-0); defaults to the "
            "first log dir.",
        ),
        d(
            "log.segment.bytes",
            _I,
            1073741824,
            "Segment size at which a new segment is started.",
            at_least(14),
            dynamic=True,
        ),
        d(
            "log.roll.ms",
            _L,
            None,
            "Age of a segment (in ms) at which a new one is started; wins over log.roll.hours.",
            at_least(1),
            dynamic=True,
        ),
        d(
            "log.roll.hours",
            _I,
            168,
            "Segment age in hours at which a new one is started.",
            at_least(1),
            dynamic=True,
        ),
        d(
            "log.roll.jitter.ms",
            _L,
            None,
            "Random amount (ms) subtracted from the roll time; wins over log.roll.jitter.hours.",
            at_least(0),
            dynamic=True,
        ),
        d(
            "log.roll.jitter.hours",
            _I,
            0,
            "Random amount (hours) subtracted from the roll time.",
            at_least(0),
            dynamic=True,
        ),
        d(
            "log.index.size.max.bytes",
            _I,
            10485760,
            "Largest offset index of a segment; a full index starts a new segment.",
            at_least(4),
            dynamic=True,
        ),
        d(
            "log.index.interval.bytes",
            _I,
            4096,
            "Bytes of batches between two offset index entries.",
            at_least(0),
            dynamic=True,
        ),
        d(
            "log.preallocate",
            _B,
            False,
            "Preallocate new segment files (accepted; segments grow as written).",
            dynamic=True,
        ),
        d(
            "log.message.timestamp.type",
            _S,
            "CreateTime",
            "CreateTime keeps the producer's timestamps, LogAppendTime stamps the broker's.",
            one_of(*_TIMESTAMP_TYPES),
            dynamic=True,
        ),
        d(
            "log.message.timestamp.before.max.ms",
            _L,
            LONG_MAX,
            "How far in the past a record timestamp may be (CreateTime topics).",
            at_least(0),
            dynamic=True,
        ),
        d(
            "log.message.timestamp.after.max.ms",
            _L,
            # Kafka 4.0's default (KIP-1030): an hour ahead at most.
            3600000,
            "How far in the future a record timestamp may be (CreateTime topics).",
            at_least(0),
            dynamic=True,
        ),
        d(
            "log.segment.delete.delay.ms",
            _L,
            60000,
            "Wait between a segment leaving the log and its files being removed.",
            at_least(0),
            dynamic=True,
        ),
        # -- retention and cleaning
        d(
            "log.retention.ms",
            _L,
            None,
            "Keep data this long (ms, -1 forever); wins over minutes and hours.",
            dynamic=True,
        ),
        d(
            "log.retention.minutes",
            _I,
            None,
            "Keep data this long in minutes; wins over log.retention.hours.",
            dynamic=True,
        ),
        d("log.retention.hours", _I, 168, "Keep data this long in hours.", dynamic=True),
        d(
            "log.retention.bytes",
            _L,
            -1,
            "Largest size of a partition before old segments are deleted (-1: no limit).",
            dynamic=True,
        ),
        d(
            "log.retention.check.interval.ms",
            _L,
            300000,
            "How often the broker looks for segments to delete.",
            at_least(1),
        ),
        d(
            "log.cleanup.policy",
            _LI,
            ("delete",),
            "delete, compact or both: what happens to old segments.",
            each_of(*_CLEANUP),
            dynamic=True,
        ),
        d("log.cleaner.enable", _B, True, "Run the log cleaner (needed for compacted topics)."),
        d(
            "log.cleaner.backoff.ms",
            _L,
            15000,
            "Sleep of the cleaner when there is nothing to clean.",
            at_least(0),
            dynamic=True,
        ),
        d(
            "log.cleaner.delete.retention.ms",
            _L,
            86400000,
            "How long tombstones stay in compacted topics.",
            at_least(0),
            dynamic=True,
        ),
        d(
            "log.cleaner.min.cleanable.ratio",
            _D,
            0.5,
            "Dirty share of a log that makes it eligible for cleaning.",
            between(0, 1),
            dynamic=True,
        ),
        d(
            "log.cleaner.min.compaction.lag.ms",
            _L,
            0,
            "Youngest age at which a record may be compacted.",
            at_least(0),
            dynamic=True,
        ),
        d(
            "log.cleaner.max.compaction.lag.ms",
            _L,
            LONG_MAX,
            "Oldest age a record may reach before it must be compacted.",
            at_least(1),
            dynamic=True,
        ),
        # -- flushing and checkpoints
        d(
            "log.flush.interval.messages",
            _L,
            LONG_MAX,
            "fsync a partition after this many unflushed records.",
            at_least(1),
            dynamic=True,
        ),
        d(
            "log.flush.interval.ms",
            _L,
            None,
            "fsync a partition when its oldest unflushed data is this old; falls back to "
            "log.flush.scheduler.interval.ms.",
            at_least(0),
            dynamic=True,
        ),
        d(
            "log.flush.scheduler.interval.ms",
            _L,
            LONG_MAX,
            "How often the flusher checks whether a partition is due.",
        ),
        d(
            "log.flush.offset.checkpoint.interval.ms",
            _I,
            60000,
            "How often recovery points are written to recovery-point-offset-checkpoint.",
            at_least(0),
        ),
        d(
            "log.flush.start.offset.checkpoint.interval.ms",
            _I,
            60000,
            "How often log start offsets are written to log-start-offset-checkpoint.",
            at_least(0),
        ),
        # -- producers and transactions
        d(
            "producer.id.expiration.ms",
            _I,
            86400000,
            "Idle time after which a producer id's state is dropped from a partition.",
            at_least(1),
            dynamic=True,
        ),
        d(
            "transactional.id.expiration.ms",
            _I,
            604800000,
            "Idle time after which a transactional id expires.",
            at_least(1),
        ),
        d(
            "transaction.max.timeout.ms",
            _I,
            900000,
            "Longest transaction.timeout.ms a producer may ask for (longer ones get "
            "INVALID_TRANSACTION_TIMEOUT).",
            at_least(1),
        ),
        d(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms",
            _I,
            10000,
            "How often transactions open past their timeout are looked for and aborted.",
            at_least(1),
        ),
        d(
            "transaction.remove.expired.transaction.cleanup.interval.ms",
            _I,
            3600000,
            "How often expired transactional ids are looked for and removed.",
            at_least(1),
        ),
        d(
            "transaction.state.log.replication.factor",
            _SH,
            1,
            "Replication factor of __transaction_state.",
            at_least(1),
        ),
        d(
            "transaction.state.log.min.isr",
            _I,
            1,
            "min.insync.replicas of __transaction_state.",
            at_least(1),
        ),
        d(
            "transaction.state.log.num.partitions",
            _I,
            50,
            "Partitions of __transaction_state.",
            at_least(1),
        ),
        d(
            "transaction.state.log.segment.bytes",
            _I,
            104857600,
            "segment.bytes of __transaction_state.",
            at_least(14),
        ),
        # -- groups and offsets
        d("offsets.topic.num.partitions", _I, 50, "Partitions of __consumer_offsets.", at_least(1)),
        d(
            "offsets.topic.segment.bytes",
            _I,
            104857600,
            "segment.bytes of __consumer_offsets.",
            at_least(14),
        ),
        d(
            "offsets.topic.replication.factor",
            _SH,
            1,
            "Replication factor of __consumer_offsets (1 on a single node).",
            at_least(1),
        ),
        d(
            "offsets.retention.minutes",
            _I,
            10080,
            "How long committed offsets of an empty group are kept.",
            at_least(1),
        ),
        d(
            "offsets.retention.check.interval.ms",
            _L,
            600000,
            "How often expired offsets are looked for.",
            at_least(1),
        ),
        d(
            "group.initial.rebalance.delay.ms",
            _I,
            3000,
            "Wait for more members before the first rebalance of an empty group.",
            at_least(0),
        ),
        d(
            "group.min.session.timeout.ms",
            _I,
            6000,
            "Smallest session timeout a member may ask.",
            at_least(0),
        ),
        d(
            "group.max.session.timeout.ms",
            _I,
            1800000,
            "Largest session timeout a member may ask.",
            at_least(0),
        ),
        d("group.max.size", _I, INT_MAX, "Most members in one consumer group.", at_least(1)),
    ]


def _topic_defs() -> list[TopicConfigDef]:
    t = TopicConfigDef
    return [
        t(
            "segment.bytes",
            _I,
            1073741824,
            "Size at which a new segment is started.",
            at_least(14),
            synonyms=("log.segment.bytes",),
        ),
        t(
            "segment.ms",
            _L,
            604800000,
            "Age at which a new segment is started.",
            at_least(1),
            synonyms=("log.roll.ms", "log.roll.hours"),
        ),
        t(
            "segment.jitter.ms",
            _L,
            0,
            "Random amount subtracted from segment.ms per segment.",
            at_least(0),
            synonyms=("log.roll.jitter.ms", "log.roll.jitter.hours"),
        ),
        t(
            "segment.index.bytes",
            _I,
            10485760,
            "Largest offset index of a segment.",
            at_least(4),
            synonyms=("log.index.size.max.bytes",),
        ),
        t(
            "index.interval.bytes",
            _I,
            4096,
            "Bytes of batches between two index entries.",
            at_least(0),
            synonyms=("log.index.interval.bytes",),
        ),
        t(
            "retention.ms",
            _L,
            604800000,
            "Keep data this long before deleting it (-1: forever; delete policy).",
            at_least(-1),
            synonyms=("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
        ),
        t(
            "retention.bytes",
            _L,
            -1,
            "Largest size of a partition before old segments go (-1: no limit).",
            synonyms=("log.retention.bytes",),
        ),
        t(
            "cleanup.policy",
            _LI,
            ("delete",),
            "delete (drop old segments), compact (keep the newest value per key) or both.",
            each_of(*_CLEANUP),
            synonyms=("log.cleanup.policy",),
        ),
        t(
            "delete.retention.ms",
            _L,
            86400000,
            "How long tombstones stay in a compacted topic.",
            at_least(0),
            synonyms=("log.cleaner.delete.retention.ms",),
        ),
        t(
            "min.cleanable.dirty.ratio",
            _D,
            0.5,
            "Dirty share of the log that makes it eligible for compaction.",
            between(0, 1),
            synonyms=("log.cleaner.min.cleanable.ratio",),
        ),
        t(
            "min.compaction.lag.ms",
            _L,
            0,
            "Youngest age at which a record may be compacted.",
            at_least(0),
            synonyms=("log.cleaner.min.compaction.lag.ms",),
        ),
        t(
            "max.compaction.lag.ms",
            _L,
            LONG_MAX,
            "Oldest age a record may reach before it must be compacted.",
            at_least(1),
            synonyms=("log.cleaner.max.compaction.lag.ms",),
        ),
        t(
            "flush.messages",
            _L,
            LONG_MAX,
            "fsync after this many unflushed records.",
            at_least(1),
            synonyms=("log.flush.interval.messages",),
        ),
        t(
            "flush.ms",
            _L,
            LONG_MAX,
            "fsync when unflushed data is this old.",
            at_least(0),
            synonyms=("log.flush.interval.ms",),
        ),
        t(
            "max.message.bytes",
            _I,
            1048588,
            "Largest record batch the topic accepts (after compression).",
            at_least(0),
            synonyms=("message.max.bytes",),
        ),
        t(
            "message.timestamp.type",
            _S,
            "CreateTime",
            "CreateTime keeps producer timestamps, LogAppendTime uses the broker's clock.",
            one_of(*_TIMESTAMP_TYPES),
            synonyms=("log.message.timestamp.type",),
        ),
        t(
            "message.timestamp.before.max.ms",
            _L,
            LONG_MAX,
            "How far in the past a CreateTime timestamp may be.",
            at_least(0),
            synonyms=("log.message.timestamp.before.max.ms",),
        ),
        t(
            "message.timestamp.after.max.ms",
            _L,
            3600000,
            "How far in the future a CreateTime timestamp may be.",
            at_least(0),
            synonyms=("log.message.timestamp.after.max.ms",),
        ),
        t(
            "file.delete.delay.ms",
            _L,
            60000,
            "Wait between a segment leaving the log and its files being removed.",
            at_least(0),
            synonyms=("log.segment.delete.delay.ms",),
        ),
        t(
            "min.insync.replicas",
            _I,
            1,
            "Replicas that must acknowledge an acks=all write.",
            at_least(1),
            synonyms=("min.insync.replicas",),
        ),
        t(
            "compression.type",
            _S,
            "producer",
            "Compression of stored batches; producer keeps the producer's codec.",
            one_of(*_COMPRESSION_TYPES),
            synonyms=("compression.type",),
        ),
        t(
            "unclean.leader.election.enable",
            _B,
            False,
            "Allow a replica outside the ISR to become leader (may lose data).",
            synonyms=("unclean.leader.election.enable",),
        ),
        t("preallocate", _B, False, "Preallocate segment files.", synonyms=("log.preallocate",)),
    ]


# Keys defined above that Tidelog accepts but does not act on (checked against the code:
# nothing reads them, or only to shape something that is never used).
_NO_EFFECT = {
    "inter.broker.listener.name": "a single node has no inter-broker traffic",
    "socket.send.buffer.bytes": "sockets keep the operating system's defaults",
    "socket.receive.buffer.bytes": "sockets keep the operating system's defaults",
    "num.network.threads": "the broker runs on one event loop",
    "num.io.threads": "the broker runs on one event loop with its own worker pool",
    "num.recovery.threads.per.data.dir": "logs are recovered one after another",
    "log.preallocate": "segment files grow as they are written",
    "log.flush.start.offset.checkpoint.interval.ms": (
        "log start offsets are written with every recovery point checkpoint"
    ),
}
_KAFKA_TYPES = {
    "boolean": _B,
    "string": _S,
    "int": _I,
    "short": _SH,
    "long": _L,
    "double": _D,
    "list": _LI,
    "class": ConfigType.CLASS,
    "password": ConfigType.PASSWORD,
}


# Kafka's security keys that tidelog.security acts on, with Kafka's types, defaults and
# update modes. Each is read when its listener starts (also under the listener prefix
# ``listener.name.<name>.``); a dynamic change takes effect at the next start.
_SECURITY_DOCS = {
    "ssl.keystore.type": "Key store format; Tidelog reads PEM only (set PEM).",
    "ssl.keystore.location": "PEM file with the listener's private key and certificate chain.",
    "ssl.keystore.certificate.chain": "The certificate chain in PEM, inline.",
    "ssl.keystore.key": "The private key in PEM (PKCS#8, encrypted or not), inline.",
    "ssl.key.password": "Password of an encrypted private key.",
    "ssl.truststore.type": "Trust store format; Tidelog reads PEM only (set PEM).",
    "ssl.truststore.location": "PEM file of the CA certificates client certificates are checked "
    "against.",
    "ssl.truststore.certificates": "The CA certificates in PEM, inline.",
    "ssl.client.auth": "Client certificates: none, requested (checked when sent) or required.",
    "ssl.enabled.protocols": "TLS versions served (TLSv1.2, TLSv1.3).",
    "ssl.protocol": "TLS, TLSv1.2 or TLSv1.3 (checked; ssl.enabled.protocols decides).",
    "ssl.cipher.suites": "TLS 1.2 cipher suites (IANA or OpenSSL names); empty: OpenSSL's "
    "defaults.",
    "ssl.principal.mapping.rules": "Rules from a client certificate's subject DN to the "
    "principal name: RULE:pattern/replacement/[LU], DEFAULT.",
    "sasl.enabled.mechanisms": "SASL mechanisms of SASL listeners: PLAIN, SCRAM-SHA-256, "
    "SCRAM-SHA-512.",
    "sasl.jaas.config": "JAAS entry; read as listener.name.<listener>.plain.sasl.jaas.config "
    '(PlainLoginModule with user_<name>="<password>" options).',
    "sasl.server.max.receive.size": "Largest request read from a client before it has "
    "authenticated on a SASL listener.",
    "connection.failed.authentication.delay.ms": "How long a connection whose authentication "
    "failed stays open after the broker's answer.",
    "authorizer.class.name": f"{STANDARD_AUTHORIZER} turns ACLs on (CreateAcls, "
    "DescribeAcls, DeleteAcls); empty: no authorization, and the ACL APIs answer "
    "SECURITY_DISABLED.",
    "super.users": "Principals allowed everything, separated by ';' (User:admin;User:ops).",
    "allow.everyone.if.no.acl.found": "Whether a resource no ACL matches is open to everyone "
    "(false: only super users).",
    # Connection limits, read by tidelog.broker.connection_limits (dynamic: applied at once).
    "max.connections": "Connections the broker holds at most (also per listener as "
    "listener.name.<listener>.max.connections); at the limit a listener stops accepting "
    "until one closes. The inter-broker listener is spared when there are others.",
    "max.connections.per.ip": "Connections one client address may hold over every listener; "
    "one more is closed as soon as it is accepted.",
    "max.connections.per.ip.overrides": "Per-address limits instead of max.connections.per.ip: "
    "host:count pairs separated by commas (host names are resolved when read).",
    "max.connection.creation.rate": "New connections accepted per second, broker-wide (also "
    "per listener as listener.name.<listener>.max.connection.creation.rate); over it a "
    "listener waits before its next accept.",
    "connections.max.idle.ms": "A connection with nothing read for this long and no request "
    "waiting for its answer is closed (negative: never).",
    "quota.window.num": "Samples the produce and fetch byte rates of client quotas are "
    "measured over.",
    "quota.window.size.seconds": "Length of one sample of the client quota byte rates.",
}


def parse_per_ip_overrides(key: str, text: str) -> dict[str, int]:
    """``host:count,host:count`` as {host: count}; ConfigError names ``key`` when malformed.

    The count follows the last ``:``, so an IPv6 address keeps its colons."""
    overrides: dict[str, int] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        host, colon, count = item.rpartition(":")
        host, count = host.strip(), count.strip()
        if not colon or not host or not count.lstrip("-").isdigit():
            raise ConfigError(key, text, f"{item!r} is not host:count")
        if int(count) < 0:
            raise ConfigError(key, text, f"the count of {host} must be at least 0")
        overrides[host] = int(count)
    return overrides


def _check_per_ip_overrides(name: str, value: ConfigValue) -> None:
    parse_per_ip_overrides(name, value if isinstance(value, str) else "")


def _check_authorizer(name: str, value: ConfigValue) -> None:
    if value not in ("", STANDARD_AUTHORIZER):
        raise ConfigError(
            name, format_value(value), f"the one authorizer served is {STANDARD_AUTHORIZER}"
        )


def _check_super_users(name: str, value: ConfigValue) -> None:
    try:
        parse_super_users(value if isinstance(value, str) else "")
    except ValueError as exc:
        raise ConfigError(name, format_value(value), str(exc)) from None


# Checks of the Kafka keys above that are read at start, so a wrong value stops it.
_SECURITY_CHECKS: dict[str, Check] = {
    "authorizer.class.name": _check_authorizer,
    "super.users": _check_super_users,
    "max.connections": at_least(0),
    "max.connections.per.ip": at_least(0),
    "max.connections.per.ip.overrides": _check_per_ip_overrides,
    "max.connection.creation.rate": at_least(0),
    "quota.window.num": at_least(2),
    "quota.window.size.seconds": at_least(1),
}


def _kafka_only_defs(known: Collection[str]) -> list[ConfigDef]:
    """Kafka's broker keys Tidelog does not define itself: accepted, without effect
    unless tidelog.security reads them (:data:`_SECURITY_DOCS`)."""
    defs: list[ConfigDef] = []
    for name, kind, default, mode in kafka_names.BROKER_KEYS:
        if name in known:
            continue
        config_type = _KAFKA_TYPES[kind]
        security_doc = _SECURITY_DOCS.get(name)
        defs.append(
            ConfigDef(
                name,
                config_type,
                None if default is None else _parse_typed(name, config_type, default),
                security_doc or "Kafka broker config, accepted and stored.",
                _SECURITY_CHECKS.get(name),
                dynamic=mode != "read-only",
                per_broker=mode == "per-broker",
                per_listener=mode == "per-listener",
                no_effect=None if security_doc else kafka_names.no_effect_reason(name),
            )
        )
    return defs


def _kafka_only_topic_defs(known: Collection[str]) -> list[TopicConfigDef]:
    defs: list[TopicConfigDef] = []
    for name, kind, default in kafka_names.TOPIC_KEYS:
        if name in known:
            continue
        config_type = _KAFKA_TYPES[kind]
        synonym = f"log.{name}" if name.startswith("local.retention.") else name
        defs.append(
            TopicConfigDef(
                name,
                config_type,
                None if default is None else _parse_typed(name, config_type, default),
                "Kafka topic config, accepted and stored.",
                no_effect=kafka_names.no_effect_reason(name),
                synonyms=(synonym,) if synonym in BROKER_CONFIGS else (),
            )
        )
    return defs


def _with_markers(definition: ConfigDef) -> ConfigDef:
    reason = _NO_EFFECT.get(definition.name)
    return definition if reason is None else replace(definition, no_effect=reason)


_OWN_BROKER_DEFS = [_with_markers(d) for d in _broker_defs()]
BROKER_CONFIGS: Mapping[str, ConfigDef] = {
    d.name: d for d in [*_OWN_BROKER_DEFS, *_kafka_only_defs({d.name for d in _OWN_BROKER_DEFS})]
}
_OWN_TOPIC_DEFS = _topic_defs()
TOPIC_CONFIGS: Mapping[str, TopicConfigDef] = {
    d.name: d
    for d in [*_OWN_TOPIC_DEFS, *_kafka_only_topic_defs({d.name for d in _OWN_TOPIC_DEFS})]
}

# Broker keys whose numbers count in a larger unit than the topic key they feed.
_SCALE = {
    "log.roll.hours": 3_600_000,
    "log.roll.jitter.hours": 3_600_000,
    "log.retention.minutes": 60_000,
    "log.retention.hours": 3_600_000,
}
# Kafka reads any negative retention as "keep forever" (-1).
_FOREVER_WHEN_NEGATIVE = frozenset(
    {"log.retention.ms", "log.retention.minutes", "log.retention.hours"}
)
# Broker key families where an earlier name wins over a later one (Kafka's precedence).
_FAMILIES: dict[str, tuple[str, ...]] = {}
for _topic_def in TOPIC_CONFIGS.values():
    for _synonym in _topic_def.synonyms:
        _FAMILIES[_synonym] = _topic_def.synonyms
_FAMILIES["log.dirs"] = _FAMILIES["log.dir"] = ("log.dirs", "log.dir")
# Kafka falls back to the flush scheduler's interval when log.flush.interval.ms is unset.
_FALLBACK = {"flush.ms": "log.flush.scheduler.interval.ms"}


def _broker_family(name: str) -> tuple[str, ...]:
    return _FAMILIES.get(name, (name,))


# -- properties files --------------------------------------------------------------------

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str, source: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 >= len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2 : i + 6]
            if len(digits) != 4 or not re.fullmatch(r"[0-9A-Fa-f]{4}", digits):
                raise ConfigError(source, text, "malformed \\uXXXX escape")
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def _logical_lines(text: str) -> Iterable[str]:
    """Java properties logical lines: comments dropped, backslash continuations joined."""
    pending: str | None = None
    for natural in re.split(r"\r\n|\r|\n", text):
        line = natural.lstrip(" \t\f")
        if pending is None and (not line or line[0] in "#!"):
            continue
        # An odd number of trailing backslashes continues the line.
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending = (pending or "") + line[:-1]
            continue
        yield (pending or "") + line
        pending = None
    if pending is not None:
        yield pending


def parse_properties(text: str, source: str = "properties") -> dict[str, str]:
    """``key=value`` / ``key: value`` / ``key value`` lines in Java properties syntax.

    ``#`` and ``!`` start comment lines, a trailing backslash continues a line (leading
    blanks of the next line are dropped), ``\\t \\n \\uXXXX`` ... are unescaped, and keys and
    values are trimmed. A later line for the same key wins.
    """
    result: dict[str, str] = {}
    for line in _logical_lines(text):
        i = 0
        while i < len(line):
            ch = line[i]
            if ch == "\\":
                i += 2
                continue
            if ch in "=: \t\f":
                break
            i += 1
        key = line[: min(i, len(line))]
        rest = line[i:].lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:]
        key = _unescape(key, source).strip()
        if key:
            result[key] = _unescape(rest.strip(" \t\f"), source).strip()
    return result


def read_properties_file(path: str | Path) -> dict[str, str]:
    """:func:`parse_properties` of a UTF-8 file; unreadable files raise ConfigError."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError("config file", str(path), f"cannot be read: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("config file", str(path), "is not UTF-8 text") from None
    return parse_properties(text, str(path))


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    """``--override k=v`` arguments as a mapping (a later one wins)."""
    result: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError("--override", item, "expected key=value")
        result[key.strip()] = value.strip()
    return result


# -- the broker's configuration ----------------------------------------------------------


_LISTENER_PREFIXED = re.compile(r"listener\.name\.([a-z0-9_]+)\.(.+)")
# A broker's JAAS entry is per listener and per mechanism: <mechanism>.sasl.jaas.config.
_MECHANISM_JAAS = re.compile(r"[a-z0-9-]+\.sasl\.jaas\.config")


def listener_prefixed_definition(key: str) -> ConfigDef | None:
    """The definition of a ``listener.name.<listener>.<key>`` key (Kafka's per-listener
    prefix, listener name in lower case), None when ``key`` is not one."""
    match = _LISTENER_PREFIXED.fullmatch(key)
    if match is None:
        return None
    rest = match.group(2)
    if _MECHANISM_JAAS.fullmatch(rest):
        rest = "sasl.jaas.config"
    definition = BROKER_CONFIGS.get(rest)
    return None if definition is None else replace(definition, name=key)


@dataclass(frozen=True)
class _Layer:
    source: ConfigSource
    raw: Mapping[str, str]
    values: Mapping[str, ConfigValue]


def _parse_layer(
    source: ConfigSource, raw: Mapping[str, str], strict: bool
) -> tuple[_Layer, dict[str, str], list[str]]:
    values: dict[str, ConfigValue] = {}
    kept: dict[str, str] = {}
    unknown: dict[str, str] = {}
    warnings: list[str] = []
    for key, text in raw.items():
        definition = BROKER_CONFIGS.get(key) or listener_prefixed_definition(key)
        if definition is None:
            unknown[key] = text
            warnings.append(f"unknown configuration {key}={text!r} is ignored")
            continue
        try:
            values[key] = definition.parse(text)
        except ConfigError as exc:
            if strict:
                raise
            warnings.append(f"{exc}; ignored")
            continue
        kept[key] = text
    return _Layer(source, kept, values), unknown, warnings


class BrokerConfig:
    """The broker's configuration: static values plus the dynamic layers, typed.

    Build with :meth:`load` (file + overrides + flags) or :meth:`from_mapping`; apply the
    dynamic configs of the metadata image with :meth:`with_dynamic`. Unknown keys are
    kept in :attr:`unknown` and described in :attr:`warnings`; wrong static values raise
    :class:`ConfigError`. Dynamic values that no longer parse are skipped with a warning
    (they were valid when written; the broker must still start).
    """

    def __init__(
        self,
        static: Mapping[str, str] | None = None,
        *,
        dynamic_default: Mapping[str, str] | None = None,
        dynamic_broker: Mapping[str, str] | None = None,
    ) -> None:
        static_layer, unknown, warnings = _parse_layer(
            ConfigSource.STATIC_BROKER_CONFIG, dict(static or {}), strict=True
        )
        default_layer, _, dyn_warnings = _parse_layer(
            ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, dict(dynamic_default or {}), False
        )
        broker_layer, _, broker_warnings = _parse_layer(
            ConfigSource.DYNAMIC_BROKER_CONFIG, dict(dynamic_broker or {}), False
        )
        self._static_raw = dict(static or {})
        self._layers = (broker_layer, default_layer, static_layer)
        self.unknown: Mapping[str, str] = unknown
        self.warnings: tuple[str, ...] = tuple(warnings + dyn_warnings + broker_warnings)
        self._check_consistency()

    def _check_consistency(self) -> None:
        self._check_listener_names()
        self._check_quorum()
        low, high = (
            self.get_int("group.min.session.timeout.ms"),
            self.get_int("group.max.session.timeout.ms"),
        )
        if low > high:
            raise ConfigError(
                "group.min.session.timeout.ms", low, "is above group.max.session.timeout.ms"
            )

    # -- building --------------------------------------------------------------------

    @classmethod
    def from_mapping(cls, values: Mapping[str, str]) -> BrokerConfig:
        return cls(values)

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        overrides: Iterable[str] = (),
        flags: Mapping[str, str | None] | None = None,
    ) -> BrokerConfig:
        """File (optional), then ``--override k=v`` items, then explicit flags (a flag set
        to ``None`` was not given). Each later source wins key by key."""
        values: dict[str, str] = {}
        if path is not None:
            values.update(read_properties_file(path))
        values.update(parse_overrides(overrides))
        for key, value in (flags or {}).items():
            if value is not None:
                values[key] = value
        return cls(values)

    def with_dynamic(
        self, dynamic_default: Mapping[str, str], dynamic_broker: Mapping[str, str]
    ) -> BrokerConfig:
        """The same static config under new dynamic layers (from the metadata image)."""
        return BrokerConfig(
            self._static_raw, dynamic_default=dynamic_default, dynamic_broker=dynamic_broker
        )

    @property
    def static_values(self) -> Mapping[str, str]:
        """The static key/value text as given (unknown keys included)."""
        return dict(self._static_raw)

    # -- lookup ------------------------------------------------------------------------

    def lookup(self, name: str) -> tuple[ConfigValue | None, ConfigSource]:
        """The value of one key and the layer it came from (DEFAULT_CONFIG when unset)."""
        for layer in self._layers:
            if name in layer.values:
                return layer.values[name], layer.source
        definition = BROKER_CONFIGS.get(name)
        return (definition.default if definition else None), ConfigSource.DEFAULT_CONFIG

    def get(self, name: str) -> ConfigValue | None:
        return self.lookup(name)[0]

    def is_set(self, name: str) -> bool:
        return any(name in layer.values for layer in self._layers)

    def get_int(self, name: str) -> int:
        value = self.get(name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise KeyError(f"{name} has no integer value")
        return value

    def get_bool(self, name: str) -> bool:
        value = self.get(name)
        if not isinstance(value, bool):
            raise KeyError(f"{name} has no boolean value")
        return value

    def get_str(self, name: str) -> str | None:
        value = self.get(name)
        return value if isinstance(value, str) else None

    def _list(self, name: str) -> tuple[str, ...]:
        value = self.get(name)
        return value if isinstance(value, tuple) else ()

    def family_value(self, name: str) -> int | str | float | bool | tuple[str, ...] | None:
        """The value of ``name``'s precedence family (ms > minutes > hours), in the unit
        of the family's first key; ``None`` when no key of the family has a value."""
        for key in _broker_family(name):
            value = self.get(key)
            if value is None:
                continue
            if isinstance(value, int) and not isinstance(value, bool):
                if key in _FOREVER_WHEN_NEGATIVE and value < 0:
                    return -1
                return value * _SCALE.get(key, 1)
            return value
        return None

    def _family_int(self, name: str) -> int:
        value = self.family_value(name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise KeyError(f"{name} has no integer value")
        return value

    # -- typed accessors -------------------------------------------------------------

    @property
    def node_id(self) -> int:
        return self.get_int("node.id")

    @property
    def cluster_id(self) -> str | None:
        return self.get_str("cluster.id")

    @property
    def security_protocol_map(self) -> dict[str, str]:
        return _parse_protocol_map(
            "listener.security.protocol.map", self.get("listener.security.protocol.map") or ""
        )

    @property
    def listeners(self) -> list[Endpoint]:
        return _parse_endpoints("listeners", self._list("listeners"), self.security_protocol_map)

    @property
    def controller_listener_names(self) -> tuple[str, ...]:
        return tuple(name.upper() for name in self._list("controller.listener.names"))

    @property
    def process_roles(self) -> tuple[str, ...]:
        return tuple(role.lower() for role in self._list("process.roles"))

    @property
    def quorum_voters(self) -> dict[int, tuple[str, int]]:
        """``controller.quorum.voters`` as {node id: (host, port)}; empty when unset (a
        single node, its own quorum of one)."""
        items = self._list("controller.quorum.voters")
        return parse_quorum_voters(items) if items else {}

    @property
    def quorum_mode(self) -> bool:
        """Whether this node is a voter of a metadata quorum of several nodes (set
        ``controller.quorum.voters``) rather than a single node."""
        return bool(self._list("controller.quorum.voters"))

    @property
    def raft_config(self) -> RaftConfig:
        """The quorum's timers (``controller.quorum.*.ms``)."""
        # Imported here: the Raft package imports the metadata package this module is in.
        from tidelog.metadata.raft.config import RaftConfig

        request_timeout = self.get_int("controller.quorum.request.timeout.ms")
        return RaftConfig(
            election_timeout_ms=self.get_int("controller.quorum.election.timeout.ms"),
            fetch_timeout_ms=self.get_int("controller.quorum.fetch.timeout.ms"),
            election_backoff_max_ms=self.get_int("controller.quorum.election.backoff.max.ms"),
            request_timeout_ms=request_timeout,
            retry_backoff_ms=self.get_int("controller.quorum.retry.backoff.ms"),
            # A held Fetch is answered well before the follower gives up on it.
            fetch_max_wait_ms=min(500, request_timeout // 2),
        )

    def _check_quorum(self) -> None:
        """A quorum configuration that can run, as Kafka checks at start; one line each."""
        roles = self.process_roles
        if set(roles) != {"broker", "controller"}:
            raise ConfigError(
                "process.roles",
                ",".join(roles),
                "broker-only and controller-only nodes are not supported yet; "
                "use broker,controller",
            )
        items = self._list("controller.quorum.voters")
        if not items:
            return
        voters = parse_quorum_voters(items)
        if self.node_id not in voters:
            raise ConfigError(
                "controller.quorum.voters",
                ",".join(items),
                f"node.id {self.node_id} is not among the voters; a controller must be one",
            )
        if not self.controller_listener_names:
            raise ConfigError(
                "controller.listener.names",
                "",
                "a node of a quorum needs a controller listener (in listeners) for the "
                "other voters to reach",
            )

    @property
    def advertised_listeners(self) -> list[Endpoint]:
        """The address clients are given for each listener brokers are reached on, in
        ``listeners`` order (hosts as written).

        A listener named in ``advertised.listeners`` is given as written there; one that
        is not keeps its ``listeners`` address. Controller listeners
        (``controller.listener.names``) are left out: clients are never sent to them, as in
        Kafka, where only broker listeners are registered."""
        advertised = {
            endpoint.name: endpoint
            for endpoint in _parse_endpoints(
                "advertised.listeners",
                self._list("advertised.listeners"),
                self.security_protocol_map,
            )
        }
        controllers = self.controller_listener_names
        return [
            advertised.get(listener.name, listener)
            for listener in self.listeners
            if listener.name not in controllers
        ]

    def _check_listener_names(self) -> None:
        """The listener settings agree with each other, as Kafka checks at start."""
        protocols = self.security_protocol_map
        listeners = _parse_endpoints("listeners", self._list("listeners"), protocols)
        names = [listener.name for listener in listeners]
        if not names:
            raise ConfigError("listeners", "", "at least one listener is needed")
        advertised_items = self._list("advertised.listeners")
        for endpoint in _parse_endpoints("advertised.listeners", advertised_items, protocols):
            if endpoint.name not in names:
                raise ConfigError(
                    "advertised.listeners",
                    str(endpoint),
                    f"listener {endpoint.name} is not in listeners ({', '.join(names)})",
                )
        controllers = self.controller_listener_names
        missing = [name for name in controllers if name not in names]
        if missing:
            raise ConfigError(
                "controller.listener.names",
                ",".join(controllers),
                f"listener {missing[0]} is not in listeners ({', '.join(names)})",
            )
        broker_listeners = [name for name in names if name not in controllers]
        if not broker_listeners:
            raise ConfigError(
                "controller.listener.names",
                ",".join(controllers),
                "names every listener; a broker needs one in listeners for its clients",
            )
        inter_broker = self.get_str("inter.broker.listener.name")
        if inter_broker is not None and inter_broker.upper() not in broker_listeners:
            raise ConfigError(
                "inter.broker.listener.name",
                inter_broker,
                f"must be one of the broker listeners ({', '.join(broker_listeners)})",
            )
        for endpoint in self.advertised_listeners:
            if endpoint.host in _UNROUTABLE_HOSTS:
                source = (
                    "advertised.listeners"
                    if endpoint.name in {e.partition("://")[0].upper() for e in advertised_items}
                    else "listeners"
                )
                raise ConfigError(
                    source,
                    str(endpoint),
                    f"{endpoint.host} cannot be given to clients as an address; set "
                    f"advertised.listeners={endpoint.name}://<host clients reach>:{endpoint.port}",
                )

    @property
    def log_dirs(self) -> list[Path]:
        """``log.dirs`` when set, else ``log.dir``."""
        dirs = self.get("log.dirs")
        if isinstance(dirs, tuple) and dirs:
            return [Path(d) for d in dirs]
        return [Path(self.get_str("log.dir") or "./tidelog-data")]

    @property
    def metadata_log_dir(self) -> Path:
        explicit = self.get_str("metadata.log.dir")
        return Path(explicit) if explicit else self.log_dirs[0]

    @property
    def num_partitions(self) -> int:
        return self.get_int("num.partitions")

    @property
    def default_replication_factor(self) -> int:
        return self.get_int("default.replication.factor")

    @property
    def auto_create_topics_enable(self) -> bool:
        return self.get_bool("auto.create.topics.enable")

    @property
    def delete_topic_enable(self) -> bool:
        return self.get_bool("delete.topic.enable")

    @property
    def message_max_bytes(self) -> int:
        return self.get_int("message.max.bytes")

    @property
    def socket_request_max_bytes(self) -> int:
        return self.get_int("socket.request.max.bytes")

    @property
    def queued_max_requests(self) -> int:
        return self.get_int("queued.max.requests")

    @property
    def metrics_listener(self) -> tuple[str, int] | None:
        """(host, port) of the metrics HTTP listener; None when metrics are off."""
        return parse_metrics_listener("metrics.listener", self.get("metrics.listener"))

    @property
    def fetch_max_bytes(self) -> int:
        return self.get_int("fetch.max.bytes")

    @property
    def min_insync_replicas(self) -> int:
        return self.get_int("min.insync.replicas")

    @property
    def log_roll_ms(self) -> int:
        return self._family_int("log.roll.ms")

    @property
    def log_roll_jitter_ms(self) -> int:
        return self._family_int("log.roll.jitter.ms")

    @property
    def log_retention_ms(self) -> int:
        """Retention in ms from ms / minutes / hours (-1: forever)."""
        return self._family_int("log.retention.ms")

    @property
    def log_retention_check_interval_ms(self) -> int:
        return self.get_int("log.retention.check.interval.ms")

    @property
    def log_cleaner_enable(self) -> bool:
        return self.get_bool("log.cleaner.enable")

    @property
    def log_cleaner_backoff_ms(self) -> int:
        return self.get_int("log.cleaner.backoff.ms")

    @property
    def log_flush_interval_ms(self) -> int:
        value = self.get("log.flush.interval.ms")
        if isinstance(value, int):
            return value
        return self.get_int("log.flush.scheduler.interval.ms")

    @property
    def log_flush_scheduler_interval_ms(self) -> int:
        return self.get_int("log.flush.scheduler.interval.ms")

    @property
    def log_flush_offset_checkpoint_interval_ms(self) -> int:
        return self.get_int("log.flush.offset.checkpoint.interval.ms")

    @property
    def log_flush_start_offset_checkpoint_interval_ms(self) -> int:
        return self.get_int("log.flush.start.offset.checkpoint.interval.ms")

    @property
    def producer_id_expiration_ms(self) -> int:
        return self.get_int("producer.id.expiration.ms")

    @property
    def transactional_id_expiration_ms(self) -> int:
        return self.get_int("transactional.id.expiration.ms")

    @property
    def offsets_topic_num_partitions(self) -> int:
        return self.get_int("offsets.topic.num.partitions")

    @property
    def offsets_topic_replication_factor(self) -> int:
        return self.get_int("offsets.topic.replication.factor")

    @property
    def offsets_retention_ms(self) -> int:
        return self.get_int("offsets.retention.minutes") * 60_000

    @property
    def offsets_retention_check_interval_ms(self) -> int:
        return self.get_int("offsets.retention.check.interval.ms")

    @property
    def group_initial_rebalance_delay_ms(self) -> int:
        return self.get_int("group.initial.rebalance.delay.ms")

    @property
    def group_min_session_timeout_ms(self) -> int:
        return self.get_int("group.min.session.timeout.ms")

    @property
    def group_max_session_timeout_ms(self) -> int:
        return self.get_int("group.max.session.timeout.ms")

    @property
    def group_max_size(self) -> int:
        return self.get_int("group.max.size")

    @property
    def default_log_config(self) -> LogConfig:
        """The LogConfig of a topic without overrides."""
        return topic_log_config(self, {})


# -- topic values ------------------------------------------------------------------------


def _topic_from_broker(broker: BrokerConfig, definition: TopicConfigDef) -> ConfigValue | None:
    if not definition.synonyms:
        return None
    value = broker.family_value(definition.synonyms[0])
    if value is None and definition.name in _FALLBACK:
        value = broker.get(_FALLBACK[definition.name])
    return value


def topic_config_value(
    broker: BrokerConfig, overrides: Mapping[str, str], name: str
) -> tuple[ConfigValue | None, ConfigSource]:
    """A topic config's effective value and source (override, broker layer or default)."""
    definition = TOPIC_CONFIGS[name]
    if name in overrides:
        try:
            return definition.parse(overrides[name]), ConfigSource.TOPIC_CONFIG
        except ConfigError:
            _log.warning("ignoring invalid override %s=%r", name, overrides[name])
    value = _topic_from_broker(broker, definition)
    if value is not None:
        return value, _synonym_source(broker, definition.synonyms)
    return definition.default, ConfigSource.DEFAULT_CONFIG


def _synonym_source(broker: BrokerConfig, names: Sequence[str]) -> ConfigSource:
    synonyms = _broker_synonyms(broker, names, per_broker=True)
    return synonyms[0].source if synonyms else ConfigSource.DEFAULT_CONFIG


def topic_log_config(broker: BrokerConfig, overrides: Mapping[str, str]) -> LogConfig:
    """The storage LogConfig of a topic: its overrides over the broker's settings."""
    values: dict[str, str | int] = {}
    for key in LOG_CONFIG_KEYS:
        if key not in TOPIC_CONFIGS:
            continue
        value, _ = topic_config_value(broker, overrides, key)
        text = format_value(value)
        if text is not None:
            values[key] = text
    try:
        return LogConfig.from_mapping(values)
    except ConfigError as exc:
        # A broker-wide value in a range storage refuses: fall back key by key.
        _log.warning("topic log config falls back to defaults for %s: %s", exc.key, exc)
        values.pop(exc.key, None)
        return topic_log_config_lenient(values)


def topic_log_config_lenient(values: Mapping[str, str | int]) -> LogConfig:
    config = LogConfig()
    for key, value in values.items():
        try:
            config = LogConfig.from_mapping({key: value}, base=config)
        except ConfigError:
            continue
    return config


# -- validation --------------------------------------------------------------------------


def parse_quorum_voters(value: str | Sequence[str]) -> dict[int, tuple[str, int]]:
    """``controller.quorum.voters`` (``id@host:port`` entries) as {node id: (host, port)}.

    :raises ConfigError: an entry that is not ``id@host:port``, or an id given twice.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    voters: dict[int, tuple[str, int]] = {}
    shown = ",".join(items)
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        node, at, address = item.partition("@")
        host, colon, port = address.rpartition(":")
        host = host.strip("[]")
        if not (at and colon and host and node.isdigit() and port.isdigit()):
            raise ConfigError("controller.quorum.voters", shown, f"{item!r} is not id@host:port")
        if int(node) in voters:
            raise ConfigError("controller.quorum.voters", shown, f"voter {node} is listed twice")
        if not 0 < int(port) < 65536:
            raise ConfigError("controller.quorum.voters", shown, f"{item!r} has no valid port")
        voters[int(node)] = (host, int(port))
    if not voters:
        raise ConfigError("controller.quorum.voters", shown, "no voter is listed")
    return voters


def validate_topic_configs(configs: Mapping[str, str | None]) -> ApiError | None:
    """Check topic config overrides (CreateTopics / AlterConfigs); None when all valid.

    Unknown keys, null values and values that do not parse give INVALID_CONFIG with a
    message naming the key and the value.
    """
    for key, value in configs.items():
        definition = TOPIC_CONFIGS.get(key)
        if definition is None:
            return ApiError(ErrorCode.INVALID_CONFIG, f"unknown topic config {key!r}")
        if value is None:
            return ApiError(ErrorCode.INVALID_CONFIG, f"topic config {key} needs a value")
        try:
            definition.parse(value)
            if key in LOG_CONFIG_KEYS:
                LogConfig.from_mapping({key: value})
        except ConfigError as exc:
            return ApiError(ErrorCode.INVALID_CONFIG, str(exc))
    return None


def _kafka_set(names: Iterable[str]) -> str:
    # Kafka prints the offending names as a Scala set; clients show the text as is.
    return f"Set({', '.join(sorted(names))})"


def validate_broker_config_changes(
    configs: Mapping[str, str | None], *, per_broker: bool = True
) -> ApiError | None:
    """Check dynamic broker config changes: known, dynamically updatable, valid values.

    ``per_broker`` is True for the resource named after a broker, False for the
    cluster-wide default ``""``. A ``None`` value deletes the key and needs only to name
    a known dynamic key. Kafka checks in this order and answers INVALID_REQUEST for each
    (its broker-side validation turns every refusal into that code): read-only keys, keys
    dynamic only under a listener prefix, values of the wrong type or range, per-broker
    keys on the default resource. A name Kafka does not know is INVALID_CONFIG here (Kafka
    itself keeps unknown broker names, for plugins; Tidelog has no plugins to read them).
    """
    unknown = [key for key in configs if key not in BROKER_CONFIGS]
    if unknown:
        return ApiError(ErrorCode.INVALID_CONFIG, f"unknown broker config {unknown[0]!r}")
    read_only = [key for key in configs if not BROKER_CONFIGS[key].dynamic]
    if read_only:
        return ApiError(
            ErrorCode.INVALID_REQUEST,
            f"Cannot update these configs dynamically: {_kafka_set(read_only)}",
        )
    per_listener = [key for key in configs if BROKER_CONFIGS[key].per_listener]
    if per_listener:
        return ApiError(
            ErrorCode.INVALID_REQUEST,
            "These security configs can be dynamically updated only per-listener using the "
            f"listener prefix: {_kafka_set(per_listener)}",
        )
    for key, value in configs.items():
        if value is None:
            continue
        try:
            BROKER_CONFIGS[key].parse(value)
        except ConfigError as exc:
            return ApiError(ErrorCode.INVALID_REQUEST, str(exc))
    if not per_broker:
        scoped = [key for key in configs if BROKER_CONFIGS[key].per_broker]
        if scoped:
            return ApiError(
                ErrorCode.INVALID_REQUEST,
                "Cannot update these configs at default cluster level, broker id must be "
                f"specified: {_kafka_set(scoped)}",
            )
    return None


# -- describe ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True)
class ConfigEntry:
    """One DescribeConfigs entry (field names follow the response schema)."""

    name: str
    value: str | None
    read_only: bool
    config_source: ConfigSource
    is_sensitive: bool
    config_type: ConfigType
    documentation: str | None = None
    synonyms: tuple[ConfigSynonym, ...] = field(default=())


def _broker_synonyms(
    broker: BrokerConfig, names: Sequence[str], *, per_broker: bool
) -> list[ConfigSynonym]:
    """Synonyms of broker keys ``names``: every layer in turn, every name set in it."""
    out: list[ConfigSynonym] = []
    for layer in broker._layers:
        if layer.source is ConfigSource.DYNAMIC_BROKER_CONFIG and not per_broker:
            continue
        for name in names:
            if name in layer.raw:
                sensitive = BROKER_CONFIGS[name].sensitive
                value = None if sensitive else format_value(layer.values[name])
                out.append(ConfigSynonym(name, value, layer.source))
    for name in names:
        definition = BROKER_CONFIGS[name]
        if definition.default is not None:
            value = None if definition.sensitive else format_value(definition.default)
            out.append(ConfigSynonym(name, value, ConfigSource.DEFAULT_CONFIG))
    return out


def _selected(names: Iterable[str], keys: Collection[str] | None) -> list[str]:
    if keys is None:
        return sorted(names)
    return [name for name in keys if name in set(names)]


def describe_topic_configs(
    broker: BrokerConfig,
    overrides: Mapping[str, str],
    keys: Collection[str] | None = None,
    *,
    include_synonyms: bool = False,
    include_documentation: bool = False,
) -> list[ConfigEntry]:
    """DescribeConfigs entries of a topic (every topic config, or only ``keys``;
    unknown keys are left out, as Kafka does)."""
    entries: list[ConfigEntry] = []
    for name in _selected(TOPIC_CONFIGS, keys):
        definition = TOPIC_CONFIGS[name]
        value, _ = topic_config_value(broker, overrides, name)
        text = None if definition.sensitive else format_value(value)
        synonyms = _broker_synonyms(broker, definition.synonyms, per_broker=True)
        if name in overrides:
            synonyms.insert(0, ConfigSynonym(name, text, ConfigSource.TOPIC_CONFIG))
        source = synonyms[0].source if synonyms else ConfigSource.DEFAULT_CONFIG
        entries.append(
            ConfigEntry(
                name=name,
                value=text,
                read_only=False,
                config_source=source,
                is_sensitive=definition.sensitive,
                config_type=definition.type,
                documentation=definition.documentation if include_documentation else None,
                synonyms=tuple(synonyms) if include_synonyms else (),
            )
        )
    return entries


def describe_broker_configs(
    broker: BrokerConfig,
    keys: Collection[str] | None = None,
    *,
    per_broker: bool = True,
    include_synonyms: bool = False,
    include_documentation: bool = False,
) -> list[ConfigEntry]:
    """DescribeConfigs entries of the broker resource.

    ``per_broker`` is True for the resource named after this node and False for the
    cluster default resource (named ""), which leaves per-broker values out.
    """
    entries: list[ConfigEntry] = []
    for name in _selected(BROKER_CONFIGS, keys):
        definition = BROKER_CONFIGS[name]
        family = _broker_family(name)
        synonyms = _broker_synonyms(broker, family, per_broker=per_broker)
        # Only this key and the keys it takes precedence over are its synonyms.
        while synonyms and synonyms[0].name != name:
            synonyms.pop(0)
        source = synonyms[0].source if synonyms else ConfigSource.DEFAULT_CONFIG
        value: ConfigValue | None = None
        for layer in broker._layers:
            if layer.source is ConfigSource.DYNAMIC_BROKER_CONFIG and not per_broker:
                continue
            if name in layer.values:
                value = layer.values[name]
                break
        else:
            value = definition.default
        entries.append(
            ConfigEntry(
                name=name,
                value=None if definition.sensitive else format_value(value),
                read_only=not definition.dynamic,
                config_source=source,
                is_sensitive=definition.sensitive,
                config_type=definition.type,
                documentation=definition.documentation if include_documentation else None,
                synonyms=tuple(synonyms) if include_synonyms else (),
            )
        )
    return entries


# -- documentation -----------------------------------------------------------------------


def _doc_default(value: ConfigValue | None) -> str:
    text = format_value(value)
    if text is None:
        return "unset"
    return f"`{text}`" if text else "empty"


def no_effect_doc_tables() -> str:
    """The Markdown tables of docs/configuration.md listing the keys without effect
    (generated from the definitions; a test keeps the file equal to this)."""
    lines = [
        "| Key | Type | Default | Update mode | Why it has no effect |",
        "|---|---|---|---|---|",
    ]
    for name in sorted(BROKER_CONFIGS):
        definition = BROKER_CONFIGS[name]
        if definition.no_effect is None:
            continue
        mode = (
            "read-only"
            if not definition.dynamic
            else "per-listener"
            if definition.per_listener
            else "per-broker"
            if definition.per_broker
            else "cluster-wide"
        )
        lines.append(
            f"| `{name}` | {definition.type.name.lower()} | {_doc_default(definition.default)} "
            f"| {mode} | {definition.no_effect} |"
        )
    lines += ["", "| Topic key | Type | Default | Why it has no effect |", "|---|---|---|---|"]
    for name in sorted(TOPIC_CONFIGS):
        topic_def = TOPIC_CONFIGS[name]
        if topic_def.no_effect is None:
            continue
        lines.append(
            f"| `{name}` | {topic_def.type.name.lower()} | {_doc_default(topic_def.default)} "
            f"| {topic_def.no_effect} |"
        )
    return "\n".join(lines) + "\n"
