"""LogConfig parsing and the checkpoint file format."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.storage import ConfigError, CorruptCheckpointError, LogConfig
from tidelog.storage.checkpoint import parse_checkpoint, read_checkpoint, write_checkpoint
from tidelog.storage.config import LONG_MAX


def test_kafka_defaults() -> None:
    config = LogConfig()
    assert config.segment_bytes == 1073741824
    assert config.segment_ms == 604800000
    assert config.segment_index_bytes == 10485760
    assert config.index_interval_bytes == 4096
    assert config.retention_ms == 604800000
    assert config.retention_bytes == -1
    assert config.cleanup_policy == frozenset({"delete"})
    assert config.delete_retention_ms == 86400000
    assert config.min_cleanable_dirty_ratio == 0.5
    assert config.min_compaction_lag_ms == 0
    assert config.max_compaction_lag_ms == LONG_MAX
    assert config.flush_messages == config.flush_ms == LONG_MAX
    assert config.max_message_bytes == 1048588
    assert config.message_timestamp_type == "CreateTime"
    # As the topic configs declare them (tidelog.metadata.configs.TOPIC_CONFIGS).
    assert config.message_timestamp_before_max_ms == LONG_MAX
    assert config.message_timestamp_after_max_ms == 3600000
    assert config.file_delete_delay_ms == 60000


def test_from_mapping_parses_text_and_ints() -> None:
    config = LogConfig.from_mapping(
        {
            "segment.bytes": "2048",
            "retention.ms": -1,
            "cleanup.policy": "compact, delete",
            "min.cleanable.dirty.ratio": "0.25",
            "message.timestamp.type": "LogAppendTime",
            "message.timestamp.before.max.ms": "0",
            "message.timestamp.after.max.ms": 7200000,
            "min.insync.replicas": "2",  # not a log key: ignored
        }
    )
    assert config.segment_bytes == 2048 and config.retention_ms == -1
    assert config.compact and config.delete and config.log_append_time
    assert config.min_cleanable_dirty_ratio == 0.25
    assert config.message_timestamp_before_max_ms == 0
    assert config.message_timestamp_after_max_ms == 7200000
    layered = LogConfig.from_mapping({"retention.bytes": "10"}, base=config)
    assert layered.segment_bytes == 2048 and layered.retention_bytes == 10
    assert LogConfig.from_mapping(config.to_mapping()) == config


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("segment.bytes", "abc"),
        ("segment.bytes", "10"),
        ("segment.bytes", str(2**31)),
        ("segment.ms", "0"),
        ("retention.ms", "-2"),
        ("cleanup.policy", "shred"),
        ("cleanup.policy", ""),
        ("min.cleanable.dirty.ratio", "1.5"),
        ("message.timestamp.type", "WallTime"),
        ("flush.messages", "0"),
        ("max.message.bytes", "1.5"),
        ("message.timestamp.before.max.ms", "-1"),
        ("message.timestamp.after.max.ms", str(2**63)),
    ],
)
def test_bad_values_name_key_and_value(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        LogConfig.from_mapping({key: value})
    assert info.value.key == key and info.value.value == value
    assert key in str(info.value) and repr(value) in str(info.value)


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    write_checkpoint(path, [("orders", 0, 42), ("orders", 1, 7)])
    assert path.read_text() == "0\n2\norders 0 42\norders 1 7\n"
    assert read_checkpoint(path, 3) == [["orders", "0", "42"], ["orders", "1", "7"]]
    assert not (tmp_path / "recovery-point-offset-checkpoint.tmp").exists()
    assert read_checkpoint(tmp_path / "absent", 3) == []


@pytest.mark.parametrize(
    "text",
    [b"", b"1\n0\n", b"0\n2\nt 0 1\n", b"0\nx\n", b"0\n1\nt 0\n", b"\xff\xfe"],
)
def test_corrupt_checkpoints_raise(text: bytes) -> None:
    with pytest.raises(CorruptCheckpointError):
        parse_checkpoint(text, 3)
