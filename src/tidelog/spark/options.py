"""The options of the ``tidelog`` data source, named and checked as Spark's Kafka connector.

Spark hands options over as a case-insensitive map of strings. :func:`parse_source_options`
turns them into a :class:`SourceOptions` once, on the driver, and raises
:class:`TidelogOptionError` (a ``ValueError``) naming the option for any bad value or
combination. Options starting with ``kafka.`` are passed to the client with the prefix
removed (``kafka.bootstrap.servers`` -> ``bootstrap.servers``); only the client's known
properties are kept, the rest are ignored as Kafka's clients ignore unknown ones.

Offsets given as JSON use Spark's layout: ``{"topic": {"0": 23, "1": -2}}`` with -2 meaning
earliest and -1 latest; timestamps likewise ``{"topic": {"0": 1700000000000}}`` (epoch ms).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidelog.client.config import KINDS, parse_config
from tidelog.client.errors import ConfigError

EARLIEST = -2
LATEST = -1

PartitionOffsets = dict[str, dict[int, int]]


class TidelogOptionError(ValueError):
    """An option of the tidelog data source is missing, malformed or not allowed here."""


@dataclass(frozen=True)
class OffsetSpec:
    """Where to start or end: ``kind`` is earliest, latest, offsets (JSON), timestamp (one
    for all partitions) or timestamps (JSON per partition)."""

    kind: str
    offsets: PartitionOffsets = field(default_factory=dict)
    timestamp: int = -1


@dataclass(frozen=True)
class SourceOptions:
    client: dict[str, Any]
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: PartitionOffsets | None = None
    starting: OffsetSpec = OffsetSpec("latest")
    ending: OffsetSpec = OffsetSpec("latest")
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    group_id: str | None = None
    admin_client: dict[str, Any] = field(default_factory=dict)
    timestamp_strategy: str = "error"
    fetch_max_bytes: int = 8 * 1024 * 1024
    poll_timeout_ms: int = 120_000


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def client_config(options: Mapping[str, str], kind: str) -> dict[str, Any]:
    """The ``kafka.*`` options the client of ``kind`` knows, prefix removed."""
    raw = {k[len("kafka.") :]: v for k, v in _lower(options).items() if k.startswith("kafka.")}
    if "bootstrap.servers" not in raw:
        raise TidelogOptionError("option 'kafka.bootstrap.servers' is required")
    known = set(parse_config(kind, {"bootstrap.servers": raw["bootstrap.servers"]}))
    config = {k: v for k, v in raw.items() if k in known}
    try:
        parse_config(kind, config)
    except (ConfigError, ValueError) as exc:
        raise TidelogOptionError(f"kafka.* options: {exc}") from None
    return config


# How long one consumer-group commit may take in all (retries included) unless
# kafka.default.api.timeout.ms says otherwise: the commit runs between micro-batches.
GROUP_COMMIT_TIMEOUT_MS = 15_000


def admin_config(client: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a consumer configuration an admin client takes (connection settings),
    for committing the query's progress as a consumer group."""
    known = KINDS["admin"]
    config = {k: v for k, v in client.items() if k in known}
    config.setdefault("default.api.timeout.ms", GROUP_COMMIT_TIMEOUT_MS)
    return config


def group_name(opts: Mapping[str, str]) -> str | None:
    """The consumer group a stream records its progress in: ``kafka.group.id`` as given,
    else ``groupIdPrefix`` as given; None (no group) when neither is set.

    The name must not change when a query restarts from its checkpoint, and Spark does not
    tell a Python data source its checkpoint location; so, unlike Spark's Kafka connector
    (which appends a random id per run to ``groupIdPrefix``), nothing is appended.
    """
    for key, display in (("kafka.group.id", "kafka.group.id"), ("groupidprefix", "groupIdPrefix")):
        if key in opts:
            name = opts[key].strip()
            if not name:
                raise TidelogOptionError(f"option {display!r} is empty")
            return name
    return None


def _json(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TidelogOptionError(f"option {name!r} is not valid JSON ({exc}): {text!r}") from None


def parse_partition_map(name: str, text: str, *, values: bool = True) -> PartitionOffsets:
    """``{"topic": {"0": 5}}`` (or ``{"topic": [0, 1]}`` when ``values`` is False)."""
    data = _json(name, text)
    if not isinstance(data, dict) or not data:
        raise TidelogOptionError(f"option {name!r} must be a non-empty JSON object: {text!r}")
    out: PartitionOffsets = {}
    for topic, parts in data.items():
        if values:
            if not isinstance(parts, dict):
                raise TidelogOptionError(
                    f"option {name!r}: topic {topic!r} must map partitions to numbers"
                )
            items: Iterable[tuple[Any, Any]] = parts.items()
        else:
            if not isinstance(parts, list):
                raise TidelogOptionError(
                    f"option {name!r}: topic {topic!r} must map to a list of partitions"
                )
            items = ((p, 0) for p in parts)
        out[topic] = {}
        for part, value in items:
            try:
                number = int(part)
            except (TypeError, ValueError):
                raise TidelogOptionError(
                    f"option {name!r}: partition {part!r} of topic {topic!r} is not a number"
                ) from None
            if isinstance(value, bool) or not isinstance(value, int) or number < 0:
                raise TidelogOptionError(
                    f"option {name!r}: {topic}-{part} must be an integer, got {value!r}"
                )
            out[topic][number] = value
    return out


def _bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise TidelogOptionError(f"option {name!r} must be true or false, got {text!r}")
    return lowered == "true"


def _positive(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TidelogOptionError(f"option {name!r} must be an integer, got {text!r}") from None
    if value <= 0:
        raise TidelogOptionError(f"option {name!r} must be positive, got {value}")
    return value


def _offset_spec(opts: Mapping[str, str], which: str, default: str) -> OffsetSpec:
    """startingOffsets / startingTimestamp / startingOffsetsByTimestamp (or ending*)."""
    names = {
        "offsets": f"{which}offsets",
        "timestamp": f"{which}timestamp",
        "by_timestamp": f"{which}offsetsbytimestamp",
    }
    given = [n for n in names.values() if n in opts]
    if len(given) > 1:
        raise TidelogOptionError(
            f"options {', '.join(given)} exclude each other: give only one of them"
        )
    display = which
    if names["timestamp"] in opts:
        try:
            ts = int(opts[names["timestamp"]])
        except ValueError:
            raise TidelogOptionError(
                f"option '{display}Timestamp' must be epoch milliseconds, "
                f"got {opts[names['timestamp']]!r}"
            ) from None
        return OffsetSpec("timestamp", timestamp=ts)
    if names["by_timestamp"] in opts:
        return OffsetSpec(
            "timestamps",
            offsets=parse_partition_map(
                f"{display}OffsetsByTimestamp", opts[names["by_timestamp"]]
            ),
        )
    text = opts.get(names["offsets"], default).strip()
    if text.lower() in ("earliest", "latest"):
        return OffsetSpec(text.lower())
    offsets = parse_partition_map(f"{display}Offsets", text)
    for topic, parts in offsets.items():
        for part, value in parts.items():
            if value < EARLIEST:
                raise TidelogOptionError(
                    f"option '{display}Offsets': {topic}-{part} is {value}; "
                    "use an offset, -2 (earliest) or -1 (latest)"
                )
    return OffsetSpec("offsets", offsets=offsets)


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    opts = _lower(options)
    subscribe = opts.get("subscribe")
    pattern = opts.get("subscribepattern")
    assign = opts.get("assign")
    chosen = [
        n
        for n, v in (("subscribe", subscribe), ("subscribePattern", pattern), ("assign", assign))
        if v is not None
    ]
    if len(chosen) != 1:
        raise TidelogOptionError(
            "exactly one of the options 'subscribe', 'subscribePattern' or 'assign' must be "
            f"given, got {', '.join(chosen) if chosen else 'none'}"
        )
    topics: tuple[str, ...] = ()
    assigned: PartitionOffsets | None = None
    if subscribe is not None:
        topics = tuple(t.strip() for t in subscribe.split(",") if t.strip())
        if not topics:
            raise TidelogOptionError("option 'subscribe' names no topic")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise TidelogOptionError(
                f"option 'subscribePattern' is not a regular expression: {exc}"
            ) from None
    if assign is not None:
        assigned = parse_partition_map("assign", assign, values=False)
    if streaming:
        for name in ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp"):
            if name in opts:
                raise TidelogOptionError(
                    f"option {name!r} is for batch queries only; a stream has no end"
                )
    starting = _offset_spec(opts, "starting", "latest" if streaming else "earliest")
    ending = _offset_spec(opts, "ending", "latest") if not streaming else OffsetSpec("latest")
    if not streaming:
        if starting.kind == "latest":
            raise TidelogOptionError("option 'startingOffsets' cannot be latest in a batch query")
        if ending.kind == "earliest":
            raise TidelogOptionError("option 'endingOffsets' cannot be earliest")
        for parts in starting.offsets.values() if starting.kind == "offsets" else ():
            if LATEST in parts.values():
                raise TidelogOptionError(
                    "option 'startingOffsets' cannot use -1 (latest) in a batch query"
                )
        for parts in ending.offsets.values() if ending.kind == "offsets" else ():
            if EARLIEST in parts.values():
                raise TidelogOptionError("option 'endingOffsets' cannot use -2 (earliest)")
    max_per_trigger = None
    if "maxoffsetspertrigger" in opts:
        if not streaming:
            raise TidelogOptionError("option 'maxOffsetsPerTrigger' is for streaming queries")
        max_per_trigger = _positive("maxOffsetsPerTrigger", opts["maxoffsetspertrigger"])
    min_partitions = None
    if "minpartitions" in opts:
        min_partitions = _positive("minPartitions", opts["minpartitions"])
    max_records = None
    if "maxrecordsperpartition" in opts:
        max_records = _positive("maxRecordsPerPartition", opts["maxrecordsperpartition"])
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise TidelogOptionError(
            f"option 'startingOffsetsByTimestampStrategy' must be error or latest, got {strategy!r}"
        )
    client = client_config(options, "consumer")
    return SourceOptions(
        client=client,
        subscribe=topics,
        pattern=pattern,
        assign=assigned,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=max_per_trigger,
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss", "true")),
        include_headers=_bool("includeHeaders", opts.get("includeheaders", "false")),
        min_partitions=min_partitions,
        max_records_per_partition=max_records,
        group_id=group_name(opts),
        admin_client=admin_config(client),
        timestamp_strategy=strategy,
        fetch_max_bytes=_positive("fetchMaxBytes", opts.get("fetchmaxbytes", str(8 << 20))),
        poll_timeout_ms=_positive(
            "kafkaConsumer.pollTimeoutMs", opts.get("kafkaconsumer.polltimeoutms", "120000")
        ),
    )


@dataclass(frozen=True)
class SinkOptions:
    client: dict[str, Any]
    topic: str | None
    include_headers: bool


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = _lower(options)
    for name in ("subscribe", "subscribepattern", "assign"):
        if name in opts:
            raise TidelogOptionError(f"option {name!r} is for reading; a sink takes 'topic'")
    topic = opts.get("topic")
    if topic is not None and not topic.strip():
        raise TidelogOptionError("option 'topic' is empty")
    return SinkOptions(
        client=client_config(options, "producer"),
        topic=topic.strip() if topic else None,
        include_headers=_bool("includeHeaders", opts.get("includeheaders", "false")),
    )
