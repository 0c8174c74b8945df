"""The log manager: dirs, checkpoints, the clean-shutdown marker, create/delete."""

from __future__ import annotations

from pathlib import Path

import pytest
from storage_helpers import FakeClock, make_batch, read_all

from tidelog.storage import InvalidPartitionDirError, LogConfig, LogManager
from tidelog.storage.manager import parse_partition_dir_name


def _manager(dirs: list[Path], clock: FakeClock, **kwargs: object) -> LogManager:
    manager = LogManager(dirs, clock=clock, **kwargs)  # type: ignore[arg-type]
    manager.open()
    return manager


def test_create_append_close_reopen(tmp_path: Path, clock: FakeClock) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = _manager(dirs, clock)
    logs = [
        manager.get_or_create_log("orders", p, topic_id="AAAAAAAAAAAAAAAAAAAAAA") for p in range(4)
    ]
    assert {log.directory.parent for log in logs} == set(dirs)  # spread over both dirs
    for index, log in enumerate(logs):
        log.append(make_batch([b"%d" % index] * (index + 1)))
    assert manager.get_or_create_log("orders", 0) is logs[0]
    manager.close()
    for directory in dirs:
        assert (directory / ".clean-shutdown").exists()
        lines = (directory / "recovery-point-offset-checkpoint").read_text().splitlines()
        assert lines[0] == "0" and int(lines[1]) == len(lines) - 2 == 2
    reopened = _manager(dirs, clock)
    assert all(reopened.clean_shutdown.values())
    assert not any((d / ".clean-shutdown").exists() for d in dirs)  # removed on open
    for index in range(4):
        log = reopened.get_log("orders", index)
        assert log is not None
        assert log.recovery_report.recovered_segments == []
        assert read_all(log) == [(o, b"%d" % index) for o in range(index + 1)]
        assert log.topic_id == "AAAAAAAAAAAAAAAAAAAAAA"
    reopened.close()


def test_unclean_open_recovers_from_checkpointed_recovery_point(
    tmp_path: Path, clock: FakeClock
) -> None:
    manager = _manager([tmp_path], clock)
    log = manager.get_or_create_log("t", 0)
    log.append(make_batch([b"a"]))
    log.roll()
    log.append(make_batch([b"b"]))
    log.flush()
    manager.checkpoint()
    log.append(make_batch([b"c"]))
    # Crash: no close, no marker.
    for segment in log.segments:
        manager.handle_cache.retire(segment)
    reopened = _manager([tmp_path], clock)
    recovered = reopened.get_log("t", 0)
    assert recovered is not None
    assert not reopened.clean_shutdown[tmp_path]
    assert recovered.recovery_report.recovered_segments == [1]
    assert read_all(recovered) == [(0, b"a"), (1, b"b"), (2, b"c")]
    reopened.close()


def test_log_start_offset_is_checkpointed_on_delete_records(
    tmp_path: Path, clock: FakeClock
) -> None:
    manager = _manager([tmp_path], clock)
    log = manager.get_or_create_log("t", 0)
    for value in (b"a", b"b", b"c"):
        log.append(make_batch([value]))
    log.delete_records(2)
    assert (tmp_path / "log-start-offset-checkpoint").read_text() == "0\n1\nt 0 2\n"
    for segment in log.segments:
        manager.handle_cache.retire(segment)  # crash
    reopened = _manager([tmp_path], clock)
    recovered = reopened.get_log("t", 0)
    assert recovered is not None and recovered.log_start_offset == 2
    assert read_all(recovered) == [(2, b"c")]
    reopened.close()


def test_junk_dirs_are_reported_and_delete_dirs_removed(tmp_path: Path, clock: FakeClock) -> None:
    (tmp_path / "not a partition").mkdir()
    (tmp_path / "topic-x").mkdir()
    (tmp_path / "t-0.abc-delete").mkdir()
    (tmp_path / "stray-file").write_text("x")
    manager = _manager([tmp_path], clock)
    assert sorted(p.name for p in manager.junk) == ["not a partition", "topic-x"]
    assert not (tmp_path / "t-0.abc-delete").exists()
    assert manager.logs == {}
    manager.close()


def test_delete_log(tmp_path: Path, clock: FakeClock) -> None:
    manager = _manager([tmp_path], clock)
    log = manager.get_or_create_log("t", 3)
    log.append(make_batch([b"a"]))
    manager.checkpoint()
    assert manager.delete_log("t", 3)
    assert not manager.delete_log("t", 3)
    assert not (tmp_path / "t-3").exists()
    assert manager.get_log("t", 3) is None
    assert (tmp_path / "recovery-point-offset-checkpoint").read_text() == "0\n0\n"
    again = manager.get_or_create_log("t", 3)
    assert again.log_end_offset == 0
    manager.close()


def test_cleanup_and_flush_due(tmp_path: Path, clock: FakeClock) -> None:
    config = LogConfig.from_mapping({"retention.ms": 100, "flush.ms": 50})
    manager = _manager([tmp_path], clock, default_config=config)
    log = manager.get_or_create_log("t", 0)
    log.append(make_batch([b"a"], timestamp=clock.now))
    log.roll()
    log.append(make_batch([b"b"], timestamp=clock.now + 1000))
    assert manager.flush_due(clock.now + 60) == 1
    assert log.recovery_point == 2
    assert manager.cleanup(clock.now + 500) == 1
    assert log.log_start_offset == 1
    assert (tmp_path / "log-start-offset-checkpoint").read_text() == "0\n1\nt 0 1\n"
    manager.close()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("orders-0", ("orders", 0)),
        ("a-b-12", ("a-b", 12)),
        ("__consumer_offsets-49", ("__consumer_offsets", 49)),
    ],
)
def test_partition_dir_names(name: str, expected: tuple[str, int]) -> None:
    assert parse_partition_dir_name(name) == expected


@pytest.mark.parametrize(
    "name", ["orders", "orders-", "-1", "orders-01", "or ders-1", "x-99999999999"]
)
def test_bad_partition_dir_names(name: str) -> None:
    with pytest.raises(InvalidPartitionDirError):
        parse_partition_dir_name(name)
