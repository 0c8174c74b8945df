"""Topic-level log configuration, with Kafka's names and defaults.

:class:`LogConfig` is immutable; :meth:`LogConfig.from_mapping` builds one from the
``str -> str | int`` mapping a topic's configs arrive in (CreateTopics, AlterConfigs,
``server.properties`` defaults). Keys this module does not know are ignored, since a
topic's configs also carry keys owned by other layers (``min.insync.replicas`` ...).
A wrong value raises :class:`~tidelog.storage.errors.ConfigError` naming the key
and the value.

"Never" for ``flush.messages``, ``flush.ms`` and ``max.compaction.lag.ms`` is
Kafka's ``Long.MAX_VALUE`` (:data:`LONG_MAX`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tidelog.storage.errors import ConfigError

LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)
INT_MAX = 2**31 - 1
INT_MIN = -(2**31)

CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"
CLEANUP_DELETE = "delete"
CLEANUP_COMPACT = "compact"


def _parse_int(key: str, value: str | int, low: int, high: int) -> int:
    if isinstance(value, bool):
        raise ConfigError(key, value, "expected an integer")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            number = int(text, 10)
        except ValueError:
            raise ConfigError(key, value, "expected an integer") from None
    else:
        raise ConfigError(key, value, "expected an integer")
    if not low <= number <= high:
        raise ConfigError(key, value, f"must be between {low} and {high}")
    return number


def _parse_ratio(key: str, value: str | int) -> float:
    if isinstance(value, bool):
        raise ConfigError(key, value, "expected a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(key, value, "expected a number") from None
    if not 0.0 <= number <= 1.0:
        raise ConfigError(key, value, "must be between 0 and 1")
    return number


def _parse_choice(key: str, value: str | int, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value.strip() not in choices:
        raise ConfigError(key, value, f"must be one of {', '.join(choices)}")
    return value.strip()


def _parse_cleanup_policy(key: str, value: str | int) -> frozenset[str]:
    if not isinstance(value, str):
        raise ConfigError(key, value, "expected a list of delete, compact")
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not parts or any(part not in (CLEANUP_DELETE, CLEANUP_COMPACT) for part in parts):
        raise ConfigError(key, value, "expected a non-empty list of delete, compact")
    return frozenset(parts)


def _int_key(low: int, high: int) -> Callable[[str, str | int], int]:
    return lambda key, value: _parse_int(key, value, low, high)


@dataclass(frozen=True)
class LogConfig:
    """Per-partition log settings; attribute names are the Kafka keys with ``_``."""

    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10485760
    index_interval_bytes: int = 4096
    retention_ms: int = 604800000
    retention_bytes: int = -1
    cleanup_policy: frozenset[str] = frozenset({CLEANUP_DELETE})
    delete_retention_ms: int = 86400000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    max_message_bytes: int = 1048588
    message_timestamp_type: str = CREATE_TIME
    # How far before / after the broker's time a CreateTime timestamp may be. Both follow
    # the topic config defaults of tidelog.metadata.configs (Long.MAX, i.e. unchecked);
    # Kafka 4.0 lowered after.max.ms to one hour (KIP-1030), which needs both changed.
    message_timestamp_before_max_ms: int = LONG_MAX
    # Kafka 4.0's default (KIP-1030): a CreateTime timestamp at most an hour ahead.
    message_timestamp_after_max_ms: int = 3600000
    file_delete_delay_ms: int = 60000

    @property
    def compact(self) -> bool:
        return CLEANUP_COMPACT in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return CLEANUP_DELETE in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == LOG_APPEND_TIME

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, str | int], base: LogConfig | None = None
    ) -> LogConfig:
        """Config from Kafka keys, on top of ``base`` (Kafka's defaults when omitted)."""
        changes: dict[str, object] = {}
        for key, raw in values.items():
            parser = _PARSERS.get(key)
            if parser is None:
                continue
            changes[key.replace(".", "_")] = parser(key, raw)
        config = dataclasses.replace(base or cls(), **changes)  # type: ignore[arg-type]
        return config

    def to_mapping(self) -> dict[str, str]:
        """The Kafka keys and their values as text (DescribeConfigs style)."""
        out: dict[str, str] = {}
        for key in _PARSERS:
            value = getattr(self, key.replace(".", "_"))
            if isinstance(value, frozenset):
                out[key] = ",".join(sorted(value))
            else:
                out[key] = str(value)
        return out


_PARSERS: dict[str, Callable[[str, str | int], object]] = {
    # Kafka's lower bound for segment.bytes is the smallest legacy message.
    "segment.bytes": _int_key(14, INT_MAX),
    "segment.ms": _int_key(1, LONG_MAX),
    "segment.jitter.ms": _int_key(0, LONG_MAX),
    "segment.index.bytes": _int_key(4, INT_MAX),
    "index.interval.bytes": _int_key(0, INT_MAX),
    "retention.ms": _int_key(-1, LONG_MAX),
    "retention.bytes": _int_key(LONG_MIN, LONG_MAX),
    "cleanup.policy": _parse_cleanup_policy,
    "delete.retention.ms": _int_key(0, LONG_MAX),
    "min.cleanable.dirty.ratio": _parse_ratio,
    "min.compaction.lag.ms": _int_key(0, LONG_MAX),
    "max.compaction.lag.ms": _int_key(1, LONG_MAX),
    "flush.messages": _int_key(1, LONG_MAX),
    "flush.ms": _int_key(0, LONG_MAX),
    "max.message.bytes": _int_key(0, INT_MAX),
    "message.timestamp.type": lambda key, value: _parse_choice(
        key, value, (CREATE_TIME, LOG_APPEND_TIME)
    ),
    "message.timestamp.before.max.ms": _int_key(0, LONG_MAX),
    "message.timestamp.after.max.ms": _int_key(0, LONG_MAX),
    "file.delete.delay.ms": _int_key(0, LONG_MAX),
}

CONFIG_KEYS: tuple[str, ...] = tuple(_PARSERS)
