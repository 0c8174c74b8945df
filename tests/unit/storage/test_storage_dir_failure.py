"""A failing log dir goes offline: its logs stop, nothing more is written there, the other
dirs keep working, and a restart brings it back with everything that was durable."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
from storage_helpers import FakeClock, make_batch, read_all

from tidelog.runtime.failing_disk import FailingDirs, is_inside, path_of_fd
from tidelog.storage import Log, LogConfig, LogDirOfflineError, LogManager
from tidelog.storage import segment as segment_module
from tidelog.storage.manager import (
    CLEAN_SHUTDOWN_MARKER,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
)


class Disk:
    """Two log dirs on a disk whose fsyncs fail, on demand, inside the dirs in ``failing``."""

    def __init__(self, tmp_path: Path, clock: FakeClock) -> None:
        self.dirs = [tmp_path / "a", tmp_path / "b"]
        self.failing: set[str] = set()
        self.fsync = FailingDirs(os.fsync, lambda: self.failing)
        self.clock = clock
        self.offline_calls: list[tuple[Path, OSError]] = []

    def manager(self, config: LogConfig | None = None) -> LogManager:
        manager = LogManager(
            self.dirs, clock=self.clock, fsync=self.fsync, default_config=config or LogConfig()
        )
        manager.on_dir_offline.append(lambda d, cause: self.offline_calls.append((d, cause)))
        manager.open()
        return manager

    def fail(self, directory: Path) -> None:
        self.failing.add(str(directory))


@pytest.fixture
def disk(tmp_path: Path, clock: FakeClock) -> Disk:
    return Disk(tmp_path, clock)


def _spread(manager: LogManager, disk: Disk) -> tuple[Log, Log]:
    """t-0 in dir a and t-1 in dir b (a new log goes to the dir with fewest logs)."""
    in_a = manager.get_or_create_log("t", 0)
    in_b = manager.get_or_create_log("t", 1)
    assert in_a.directory.parent == disk.dirs[0] and in_b.directory.parent == disk.dirs[1]
    return in_a, in_b


def test_failed_fsync_takes_the_dir_offline_and_the_other_keeps_working(disk: Disk) -> None:
    manager = disk.manager()
    in_a, in_b = _spread(manager, disk)
    in_b.append(make_batch([b"durable"]), durable=True)
    in_b.append(make_batch([b"not synced"]))
    disk.fail(disk.dirs[1])
    with pytest.raises(LogDirOfflineError) as raised:
        in_b.sync()
    assert raised.value.directory == disk.dirs[1]
    assert isinstance(raised.value.cause, OSError) and raised.value.cause.errno == errno.EIO
    assert manager.offline_dirs.keys() == {disk.dirs[1]}
    assert [d for d, _ in disk.offline_calls] == [disk.dirs[1]]  # told once
    assert manager.online_dirs == [disk.dirs[0]]
    # Nothing on the offline dir is read or written again.
    with pytest.raises(LogDirOfflineError):
        in_b.append(make_batch([b"after"]))
    with pytest.raises(LogDirOfflineError):
        in_b.read(0, 1 << 20)
    with pytest.raises(LogDirOfflineError):
        in_b.sync()  # not "already durable": the fsync never happened
    assert manager.get_log("t", 1) is None
    assert manager.offline_error("t", 1) is not None
    # Its partition is not recreated, empty, in the dir that still works.
    with pytest.raises(LogDirOfflineError):
        manager.get_or_create_log("t", 1)
    assert not (disk.dirs[0] / "t-1").exists()
    # The other dir: appends, syncs, new partitions.
    in_a.append(make_batch([b"a"]), durable=True)
    assert read_all(in_a) == [(0, b"a")]
    assert manager.get_or_create_log("t", 2).directory.parent == disk.dirs[0]
    assert disk.fsync.failures == 1


def test_offline_dir_gets_no_checkpoint_and_no_clean_marker(disk: Disk) -> None:
    manager = disk.manager()
    in_a, in_b = _spread(manager, disk)
    in_b.append(make_batch([b"x"]), durable=True)
    manager.checkpoint()
    before = {
        name: (disk.dirs[1] / name).read_bytes()
        for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT)
    }
    disk.fail(disk.dirs[1])
    with pytest.raises(LogDirOfflineError):
        in_b.append(make_batch([b"y"]), durable=True)
    failures = disk.fsync.failures
    in_a.append(make_batch([b"a"]))
    manager.checkpoint()
    manager.flush_due(disk.clock() + 10**9)
    manager.cleanup(disk.clock())
    manager.close()
    assert disk.fsync.failures == failures  # nothing tried to write there again
    assert not (disk.dirs[1] / CLEAN_SHUTDOWN_MARKER).exists()
    assert (disk.dirs[0] / CLEAN_SHUTDOWN_MARKER).exists()
    for name, content in before.items():
        assert (disk.dirs[1] / name).read_bytes() == content


def test_restart_brings_the_dir_back_with_what_was_durable(disk: Disk) -> None:
    manager = disk.manager()
    _, in_b = _spread(manager, disk)
    for value in (b"one", b"two"):
        in_b.append(make_batch([value]), durable=True)
    disk.fail(disk.dirs[1])
    with pytest.raises(LogDirOfflineError):
        in_b.append(make_batch([b"three"]), durable=True)
    manager.close()
    disk.failing.clear()
    reopened = disk.manager()
    log = reopened.get_log("t", 1)
    assert log is not None and log.directory.parent == disk.dirs[1]
    assert not reopened.clean_shutdown[disk.dirs[1]]  # recovered, not trusted
    records = read_all(log)
    # Everything acknowledged as durable is there; what follows is at most the write
    # whose fsync failed (it reached the page cache), never anything else.
    assert records[:2] == [(0, b"one"), (1, b"two")]
    assert records[2:] in ([], [(2, b"three")])
    log.append(make_batch([b"four"]), durable=True)
    reopened.close()


def test_failed_write_takes_the_dir_offline(disk: Disk, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = disk.manager()
    in_a, in_b = _spread(manager, disk)
    real = segment_module._pwrite_all

    def pwrite_all(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
        if is_inside(path_of_fd(fd), disk.failing):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data, position)

    monkeypatch.setattr(segment_module, "_pwrite_all", pwrite_all)
    disk.failing.add(str(disk.dirs[1]))
    with pytest.raises(LogDirOfflineError) as raised:
        in_b.append(make_batch([b"x"]))
    assert raised.value.cause.errno == errno.ENOSPC  # type: ignore[attr-defined]
    assert manager.offline_dirs.keys() == {disk.dirs[1]}
    in_a.append(make_batch([b"a"]))
    assert read_all(in_a) == [(0, b"a")]


def test_failed_roll_takes_the_dir_offline(disk: Disk) -> None:
    manager = disk.manager(LogConfig.from_mapping({"segment.bytes": 200}))
    _, in_b = _spread(manager, disk)
    in_b.append(make_batch([b"x" * 100]))
    disk.fail(disk.dirs[1])
    # The next append rolls, and a roll makes the sealed segment durable first.
    with pytest.raises(LogDirOfflineError):
        in_b.append(make_batch([b"y" * 100]))
    assert manager.offline_dirs.keys() == {disk.dirs[1]}


def test_failed_truncation_takes_the_dir_offline(disk: Disk) -> None:
    manager = disk.manager()
    _, in_b = _spread(manager, disk)
    in_b.append(make_batch([b"x"]))
    in_b.append(make_batch([b"y"]))
    disk.fail(disk.dirs[1])
    with pytest.raises(LogDirOfflineError):
        in_b.truncate_to(1)
    assert manager.offline_dirs.keys() == {disk.dirs[1]}


def test_failed_checkpoint_takes_the_dir_offline(disk: Disk) -> None:
    manager = disk.manager()
    _, in_b = _spread(manager, disk)
    disk.fail(disk.dirs[1])
    with pytest.raises(LogDirOfflineError):
        manager.checkpoint()
    assert manager.offline_dirs.keys() == {disk.dirs[1]}
    # The other dir got its checkpoints all the same.
    assert "t 0 0" in (disk.dirs[0] / RECOVERY_POINT_CHECKPOINT).read_text()
    with pytest.raises(LogDirOfflineError):
        in_b.append(make_batch([b"x"]))


def test_callers_waiting_on_a_failed_group_commit_are_not_acknowledged(disk: Disk) -> None:
    manager = disk.manager()
    _, in_b = _spread(manager, disk)
    disk.fail(disk.dirs[1])
    outcomes: list[BaseException | None] = []

    def durable_append() -> None:
        try:
            in_b.append(make_batch([b"v"]), durable=True)
        except LogDirOfflineError as exc:
            outcomes.append(exc)
        else:
            outcomes.append(None)

    threads = [threading.Thread(target=durable_append) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(outcomes) == 4
    assert all(isinstance(outcome, LogDirOfflineError) for outcome in outcomes)


def test_every_dir_offline_refuses_new_logs(disk: Disk) -> None:
    manager = disk.manager()
    in_a, in_b = _spread(manager, disk)
    disk.fail(disk.dirs[0])
    disk.fail(disk.dirs[1])
    for log in (in_a, in_b):
        with pytest.raises(LogDirOfflineError):
            log.append(make_batch([b"x"]), durable=True)
    assert manager.online_dirs == []
    with pytest.raises(LogDirOfflineError):
        manager.get_or_create_log("u", 0)
    manager.close()


def test_running_out_of_descriptors_is_not_a_failed_disk(
    disk: Disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Many client connections can exhaust the descriptors; that must not take a disk out.
    manager = disk.manager()
    _, in_b = _spread(manager, disk)
    real = segment_module._pwrite_all
    exhausted = True

    def pwrite_all(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
        if exhausted:
            raise OSError(errno.EMFILE, "Too many open files")
        real(fd, data, position)

    monkeypatch.setattr(segment_module, "_pwrite_all", pwrite_all)
    with pytest.raises(OSError) as raised:
        in_b.append(make_batch([b"x"]))
    assert raised.value.errno == errno.EMFILE
    assert manager.offline_dirs == {}
    exhausted = False
    in_b.append(make_batch([b"y"]), durable=True)
    assert [v for _, v in read_all(in_b)] == [b"y"]
