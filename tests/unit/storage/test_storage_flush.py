"""Flush policy, the recovery point and group commit of durable appends."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from storage_helpers import FakeClock, LogFactory, make_batch, read_all

from tidelog.storage import InvalidAppendError, Log, LogConfig, RecordTooLargeError


class CountingFsync:
    """An fsync that counts calls per kind of file and can hold the first data fsync."""

    def __init__(self) -> None:
        self.log_files = 0
        self.total = 0
        self.hold_until: threading.Event | None = None
        self._lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        is_log = target.endswith(".log")
        with self._lock:
            self.total += 1
            if is_log:
                self.log_files += 1
            first = is_log and self.log_files == 1
        if first and self.hold_until is not None:
            assert self.hold_until.wait(10), "writers never finished"
        os.fsync(fd)


def test_group_commit_shares_fsyncs(tmp_path: Path, clock: FakeClock) -> None:
    fsync = CountingFsync()
    log = Log.open(tmp_path / "t-0", topic="t", partition=0, clock=clock, fsync=fsync)
    callers = 8
    all_written = threading.Event()
    fsync.hold_until = all_written
    fsync.log_files = 0
    infos = []
    errors: list[BaseException] = []

    def produce(index: int) -> None:
        try:
            infos.append(log.append(make_batch([b"%d" % index]), durable=True))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while log.log_end_offset < callers and time.monotonic() < deadline:
        time.sleep(0.001)
    all_written.set()
    for thread in threads:
        thread.join(10)
    assert not errors
    assert len(infos) == callers
    # The first fsync was held until every caller had written: at most one more fsync
    # round covers everyone who wrote after the first round took its target.
    assert fsync.log_files <= 2 < callers
    assert log.recovery_point == log.log_end_offset == callers
    log.close()


def test_sync_covered_caller_does_not_fsync(open_log: LogFactory) -> None:
    log = open_log()
    log.append(make_batch([b"a"]))
    assert log.sync(1)
    assert not log.sync(1)  # already covered
    assert log.recovery_point == 1


def test_flush_messages(tmp_path: Path, clock: FakeClock) -> None:
    fsync = CountingFsync()
    config = LogConfig.from_mapping({"flush.messages": 3})
    log = Log.open(tmp_path / "t-0", config, topic="t", partition=0, clock=clock, fsync=fsync)
    log.append(make_batch([b"a", b"b"]))
    assert log.recovery_point == 0
    log.append(make_batch([b"c"]))
    assert log.recovery_point == 3
    assert fsync.log_files == 1
    log.close()


def test_flush_ms_and_default_never(open_log: LogFactory, clock: FakeClock) -> None:
    log = open_log({"flush.ms": 1000})
    log.append(make_batch([b"a"]))
    assert not log.maybe_flush(clock.now + 999)
    assert log.maybe_flush(clock.now + 1000)
    assert log.recovery_point == 1
    assert not log.maybe_flush(clock.now + 5000)  # nothing new to flush
    never = Log.open(log.directory.parent / "other-0", topic="other", partition=0, clock=clock)
    never.append(make_batch([b"a"] * 100))
    assert not never.maybe_flush(clock.now + 10**12)
    assert never.recovery_point == 0
    never.close()


def test_recovery_point_covers_sealed_segments(open_log: LogFactory) -> None:
    log = open_log()
    log.append(make_batch([b"a"]))
    log.roll()
    log.append(make_batch([b"b"]))
    log.flush()
    assert log.recovery_point == 2


def test_concurrent_appends_and_reads_keep_every_record_once(
    tmp_path: Path, clock: FakeClock
) -> None:
    config = LogConfig.from_mapping({"segment.bytes": 2000, "index.interval.bytes": 100})
    log = Log.open(tmp_path / "t-0", config, topic="t", partition=0, clock=clock)
    writers, per_writer = 4, 50
    errors: list[BaseException] = []

    def write(writer: int) -> None:
        try:
            for index in range(per_writer):
                log.append(make_batch([b"%d-%d" % (writer, index)]), durable=index % 10 == 0)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def read() -> None:
        try:
            for _ in range(20):
                offset = log.log_start_offset
                while offset < log.log_end_offset:
                    piece = log.read(offset, 4096, whole_batches=True)
                    assert piece is not None
                    with piece:
                        offset = piece.first_offset + 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    threads += [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    values = [v for _, v in read_all(log)]
    assert sorted(values) == sorted(
        b"%d-%d" % (w, i) for w in range(writers) for i in range(per_writer)
    )
    for writer in range(writers):  # each writer's records in its own order
        mine = [v for v in values if v is not None and v.startswith(b"%d-" % writer)]
        assert mine == [b"%d-%d" % (writer, i) for i in range(per_writer)]
    log.close()


def test_roll_makes_the_sealed_segment_durable_first(tmp_path: Path, clock: FakeClock) -> None:
    fsync = CountingFsync()
    log = Log.open(tmp_path / "t-0", topic="t", partition=0, clock=clock, fsync=fsync)
    log.append(make_batch([b"a", b"b"]))
    assert log.recovery_point == 0
    before = fsync.log_files
    log.roll()
    assert fsync.log_files == before + 1
    assert log.recovery_point == 2
    log.append(make_batch([b"c"]))
    assert log.recovery_point == 2
    log.close()


class RecordingSync:
    """Records the names of the files it syncs (directories as ``<dir>/``)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __call__(self, fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        is_dir = os.path.isdir(target)
        self.names.append(os.path.basename(target) + ("/" if is_dir else ""))
        os.fsync(fd)

    def take(self) -> list[str]:
        names, self.names = self.names, []
        return sorted(names)


def test_segment_files_use_datasync_and_directories_fsync(tmp_path: Path, clock: FakeClock) -> None:
    fsync, datasync = RecordingSync(), RecordingSync()
    log = Log.open(
        tmp_path / "t-0", topic="t", partition=0, clock=clock, fsync=fsync, datasync=datasync
    )
    fsync.take()
    first = "00000000000000000000"
    log.append(make_batch([b"a"]), durable=True)
    assert datasync.take() == [f"{first}.log"]  # not the active segment's indexes
    assert fsync.take() == []  # opening made the directory durable
    log.append(make_batch([b"b"]), durable=True)
    assert (datasync.take(), fsync.take()) == ([f"{first}.log"], [])
    log.roll()
    assert datasync.take() == [f"{first}.index", f"{first}.log", f"{first}.timeindex"]
    assert fsync.take() == []  # the new segment's entry waits for the next sync
    second = "00000000000000000002"
    log.append(make_batch([b"c"]), durable=True)
    # The sealed segment is below the recovery point: not synced again.
    assert datasync.take() == [f"{second}.log"]
    assert fsync.take() == ["t-0/"]  # now the new segment's directory entry
    log.flush()
    assert datasync.take() == [f"{second}.index", f"{second}.log", f"{second}.timeindex"]
    log.close()


def test_default_syncs_segment_data_with_fdatasync(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    datasync = RecordingSync()
    monkeypatch.setattr(os, "fdatasync", datasync)
    log = Log.open(tmp_path / "t-0", topic="t", partition=0, clock=clock)
    log.append(make_batch([b"a"]), durable=True)
    assert datasync.take() == ["00000000000000000000.log"]
    log.close()


def test_every_durable_append_returns_after_an_fsync_started_after_its_write(
    tmp_path: Path, clock: FakeClock
) -> None:
    log: Log | None = None
    starts: list[int] = []  # the LEO when each data sync started
    lock = threading.Lock()

    def datasync(fd: int) -> None:
        assert log is not None
        with lock:
            starts.append(log.log_end_offset)
        os.fsync(fd)

    log = Log.open(tmp_path / "t-0", topic="t", partition=0, clock=clock, datasync=datasync)
    errors: list[BaseException] = []

    def produce(writer: int) -> None:
        try:
            for index in range(30):
                info = log.append(make_batch([b"%d-%d" % (writer, index)]), durable=True)
                with lock:
                    covered = any(start > info.last_offset for start in starts)
                assert covered, f"offset {info.last_offset} returned before an fsync covered it"
                assert log.recovery_point > info.last_offset
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    assert log.recovery_point == log.log_end_offset == 180
    # Group commit shared fsyncs (the exact count depends on scheduling).
    assert len(starts) < 180
    log.close()


def test_failed_durable_append_does_not_hold_back_group_commit(open_log: LogFactory) -> None:
    log = open_log({"max.message.bytes": 200})
    with pytest.raises(RecordTooLargeError):
        log.append(make_batch([b"x" * 300]), durable=True)
    with pytest.raises(InvalidAppendError):
        log.append(b"not a batch", durable=True)
    for index in range(3):
        log.append(make_batch([b"%d" % index]), durable=True)
        assert log.recovery_point == index + 1
