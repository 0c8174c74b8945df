"""Every partition log of one or more log directories.

Layout of each log dir::

    <dir>/<topic>-<partition>/               one Log (see tidelog.storage.log)
    <dir>/recovery-point-offset-checkpoint   "topic partition offset" lines
    <dir>/log-start-offset-checkpoint        "topic partition offset" lines
    <dir>/.clean-shutdown                    present only between a clean close and
                                             the next open
    <dir>/.lock                              flock'ed by the process that owns the dir
                                             (:func:`lock_log_dirs`)

Opening a dir reads (and removes) the clean-shutdown marker, reads both checkpoints
and opens every ``<topic>-<partition>`` directory with them: a log whose dir had the
marker skips the recovery scan. Directory names that are not ``<topic>-<partition>``
are reported in :attr:`LogManager.junk` and left alone; ``*-delete`` directories
(a deletion a crash interrupted) are removed.

Checkpoints are written by :meth:`LogManager.checkpoint` (call it on a schedule, as
Kafka does every ``log.flush.offset.checkpoint.interval.ms``), right after any
truncation or DeleteRecords (a log calls back), and on close. Missing or stale
checkpoints are safe: a recovery point that is too low only costs a longer scan,
and the log start offset never drops below the first segment's base offset.

A failing disk (Kafka's log dir failure handling). An I/O error on a log dir -- a
write, fsync, roll, truncation, index, checkpoint or producer-state write, a read -- takes
that dir offline (:meth:`LogManager.mark_offline`): after a failed write or fsync the page
cache may already have dropped data, so nothing on it can be trusted until the process
restarts. Its logs are abandoned (:meth:`~tidelog.storage.log.Log.abandon`: closed without
writing anything more, no flush, no checkpoint, no clean-shutdown marker); every later
call on them raises :class:`~tidelog.storage.errors.LogDirOfflineError`; their partitions
are never created again in another dir. The other dirs keep working, and the listeners
of :attr:`LogManager.on_dir_offline` are told (the broker answers KAFKA_STORAGE_ERROR for
those partitions, and stops when no dir is left). The next start opens the dir again and
recovers its logs from what reached the disk.

Compaction: :attr:`LogManager.cleaner` (a :class:`~tidelog.storage.cleaner.Cleaner`)
is attached to every log, so truncations lower the ``cleaner-offset-checkpoint``;
:meth:`LogManager.clean_dirtiest` runs one pass on the compacted log most in need
(the broker calls it on a schedule, from any thread but one call at a time).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

from tidelog.runtime.filelock import FileLock, lock_directory
from tidelog.storage.checkpoint import (
    FsyncFn,
    fsync_dir,
    parse_int_field,
    read_checkpoint,
    write_checkpoint,
    write_durably,
)
from tidelog.storage.cleaner import Cleaner, CleanResult
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import (
    CorruptCheckpointError,
    InvalidPartitionDirError,
    LogClosedError,
    LogDirOfflineError,
    is_disk_failure,
)
from tidelog.storage.log import Clock, Log, RecoveryReport
from tidelog.storage.segment import HandleCache

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEAN_SHUTDOWN_MARKER = ".clean-shutdown"
DELETE_DIR_SUFFIX = "-delete"
#: Kafka's name for the file a process locks to own a log dir.
LOG_DIR_LOCK = ".lock"

_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def lock_log_dirs(dirs: Iterable[str | Path]) -> list[FileLock]:
    """Own every dir of ``dirs`` (created if missing) by locking its ``.lock``: all or none.

    Two processes writing one log dir assign the same offsets twice and damage the logs,
    so this comes before anything in the dir is read or written, and the locks are held
    until the process stops using the dirs. A dir another process holds raises
    :class:`~tidelog.runtime.filelock.LockHeldError` (whose ``path`` is the lock file),
    leaving every dir as it was; other failures raise their OSError.
    """
    locks: list[FileLock] = []
    try:
        for directory in dict.fromkeys(Path(d) for d in dirs):
            locks.append(lock_directory(directory, LOG_DIR_LOCK))
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks


def parse_partition_dir_name(name: str) -> TopicPartition:
    """``(topic, partition)`` from ``<topic>-<partition>``; raises on anything else."""
    topic, dash, number = name.rpartition("-")
    if (
        not dash
        or not number.isdigit()
        or number != str(int(number))
        or not _TOPIC.fullmatch(topic)
        or topic in (".", "..")
    ):
        raise InvalidPartitionDirError(f"{name!r} is not <topic>-<partition>")
    partition = int(number)
    if partition > 2**31 - 1:
        raise InvalidPartitionDirError(f"{name!r} has a partition number out of range")
    return topic, partition


def partition_dir_name(topic: str, partition: int) -> str:
    if not _TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise InvalidPartitionDirError(f"invalid topic name {topic!r}")
    if not 0 <= partition <= 2**31 - 1:
        raise InvalidPartitionDirError(f"invalid partition {partition}")
    return f"{topic}-{partition}"


class LogManager:
    """Creates, opens, deletes and checkpoints the logs of a set of log dirs.

    ``config_for(topic)`` gives a topic's :class:`LogConfig` (default: ``default_config``
    for every topic). ``max_idle_open_segments`` caps the sealed segments kept open
    across all logs (see :class:`~tidelog.storage.segment.HandleCache`).
    """

    def __init__(
        self,
        log_dirs: Sequence[str | Path],
        *,
        clock: Clock,
        default_config: LogConfig | None = None,
        config_for: Callable[[str], LogConfig] | None = None,
        fsync: FsyncFn = os.fsync,
        max_idle_open_segments: int = 128,
        reserved_dirs: Collection[str] = (),
        on_sync: Callable[[float], None] | None = None,
    ) -> None:
        """``reserved_dirs`` names partition directories that another owner opens (the
        metadata log's ``__cluster_metadata-0``); they are neither opened nor reported.
        ``on_sync`` is given to every log (:attr:`Log.on_sync`): the seconds of each fsync
        round."""
        if not log_dirs:
            raise ValueError("at least one log dir is needed")
        self.log_dirs = [Path(d) for d in log_dirs]
        self._reserved = frozenset(reserved_dirs)
        self._clock = clock
        self.default_config = default_config or LogConfig()
        self._config_for = config_for
        self._fsync = fsync
        self._on_sync = on_sync
        self.handle_cache = HandleCache(max_idle_open_segments)
        self.cleaner = Cleaner(fsync=fsync)
        self._lock = threading.RLock()
        self._logs: dict[TopicPartition, Log] = {}
        self._dir_of: dict[TopicPartition, Path] = {}
        #: Offline log dirs and the I/O error that took each one offline.
        self.offline_dirs: dict[Path, OSError] = {}
        #: The partitions whose log was in a dir when it went offline, and that dir.
        self.offline_logs: dict[TopicPartition, Path] = {}
        #: Called with (dir, cause) once when a dir goes offline, from the thread that
        #: hit the error and after the dir's logs are abandoned.
        self.on_dir_offline: list[Callable[[Path, OSError], object]] = []
        self.junk: list[Path] = []
        self.recovery_reports: dict[TopicPartition, RecoveryReport] = {}
        self.clean_shutdown: dict[Path, bool] = {}
        self._closed = False
        self._opened = False

    # -- opening -----------------------------------------------------------------------

    def open(self) -> None:
        """Open every log of every dir (recovering those not shut down cleanly)."""
        with self._lock:
            if self._opened:
                return
            self._opened = True
            for directory in self.log_dirs:
                self._open_dir(directory)

    def _open_dir(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        marker = directory / CLEAN_SHUTDOWN_MARKER
        clean = marker.exists()
        if clean:
            # Removed before any write: a crash from here on must trigger recovery.
            marker.unlink()
            fsync_dir(directory, self._fsync)
        self.clean_shutdown[directory] = clean
        recovery_points = self._read_offsets(directory / RECOVERY_POINT_CHECKPOINT)
        start_offsets = self._read_offsets(directory / LOG_START_OFFSET_CHECKPOINT)
        for entry in sorted(os.listdir(directory)):
            path = directory / entry
            if not path.is_dir() or entry in self._reserved:
                continue
            if entry.endswith(DELETE_DIR_SUFFIX):
                _log.info("removing %s, a log deletion left unfinished", path)
                shutil.rmtree(path, ignore_errors=True)
                continue
            try:
                key = parse_partition_dir_name(entry)
            except InvalidPartitionDirError as exc:
                _log.warning("ignoring %s in log dir: %s", path, exc)
                self.junk.append(path)
                continue
            if key in self._logs:
                _log.error("ignoring %s: %s-%s already lives in %s", path, *key, self._dir_of[key])
                self.junk.append(path)
                continue
            log = Log.open(
                path,
                self._config(key[0]),
                topic=key[0],
                partition=key[1],
                clock=self._clock,
                recovery_point=recovery_points.get(key, 0),
                log_start_offset=start_offsets.get(key, 0),
                clean_shutdown=clean,
                fsync=self._fsync,
                handle_cache=self.handle_cache,
                on_checkpoint=self._checkpoint_callback(directory),
            )
            self._adopt(key, log, directory)
            self.recovery_reports[key] = log.recovery_report

    def _read_offsets(self, path: Path) -> dict[TopicPartition, int]:
        try:
            rows = read_checkpoint(path, 3)
            return {
                (topic, parse_int_field(part, str(path), 0, 2**31 - 1)): parse_int_field(
                    offset, str(path), 0
                )
                for topic, part, offset in rows
            }
        except CorruptCheckpointError as exc:
            # Falling back to 0 / the first segment is always safe, only slower.
            _log.warning("ignoring corrupt checkpoint: %s", exc)
            return {}

    def _config(self, topic: str) -> LogConfig:
        return self._config_for(topic) if self._config_for is not None else self.default_config

    def _checkpoint_callback(self, directory: Path) -> Callable[[], None]:
        return lambda: self.checkpoint_dir(directory)

    def _adopt(self, key: TopicPartition, log: Log, directory: Path) -> None:
        log.on_sync = self._on_sync
        log.on_io_error = lambda exc: self.mark_offline(directory, exc)
        self._logs[key] = log
        self._dir_of[key] = directory
        self.cleaner.attach(log)

    # -- offline dirs ------------------------------------------------------------------

    def mark_offline(self, directory: Path, cause: OSError) -> bool:
        """Take ``directory`` offline after the I/O error ``cause``: abandon its logs
        and tell :attr:`on_dir_offline`. False when it was offline already."""
        with self._lock:
            if directory in self.offline_dirs or directory not in self.log_dirs:
                return False
            self.offline_dirs[directory] = cause
            for key in [k for k, d in self._dir_of.items() if d == directory]:
                log = self._logs.pop(key)
                del self._dir_of[key]
                self.offline_logs[key] = directory
                self.cleaner.forget(log)
                log.abandon(cause)
        _log.error(
            "log dir %s is offline after an I/O error (%s); its %d partitions stop until "
            "the broker restarts",
            directory,
            cause,
            sum(1 for d in self.offline_logs.values() if d == directory),
        )
        for listener in list(self.on_dir_offline):
            try:
                listener(directory, cause)
            except Exception:
                # The dir is offline whatever a listener does; the caller gets its error.
                _log.exception("a listener of log dir %s going offline failed", directory)
        return True

    @property
    def online_dirs(self) -> list[Path]:
        with self._lock:
            return [d for d in self.log_dirs if d not in self.offline_dirs]

    def offline_error(self, topic: str, partition: int) -> LogDirOfflineError | None:
        """Why the partition's log is unusable, when it lived in a dir now offline."""
        directory = self.offline_logs.get((topic, partition))
        if directory is None:
            return None
        return LogDirOfflineError(directory, self.offline_dirs[directory])

    def _fail_dir_on(self, directory: Path, exc: OSError) -> None:
        """After ``exc`` on ``directory``: take the dir offline and raise
        :class:`LogDirOfflineError` when the disk failed; return (the caller re-raises
        ``exc``) when the error is not the disk's."""
        if is_disk_failure(exc):
            self.mark_offline(directory, exc)
            raise LogDirOfflineError(directory, exc) from exc

    # -- logs --------------------------------------------------------------------------

    def get_log(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    @property
    def logs(self) -> dict[TopicPartition, Log]:
        with self._lock:
            return dict(self._logs)

    def get_or_create_log(
        self,
        topic: str,
        partition: int,
        config: LogConfig | None = None,
        *,
        topic_id: str | None = None,
    ) -> Log:
        """The partition's log, created empty (in the dir with fewest logs) when absent."""
        with self._lock:
            self._check_open()
            key = (topic, partition)
            existing = self._logs.get(key)
            if existing is not None:
                return existing
            offline = self.offline_error(topic, partition)
            if offline is not None:
                # Its data is on the failed disk: a new empty log elsewhere would lose it.
                raise offline
            name = partition_dir_name(topic, partition)
            online = self.online_dirs
            if not online:
                raise LogDirOfflineError(self.log_dirs[0], self.offline_dirs[self.log_dirs[0]])
            counts = {d: 0 for d in online}
            for d in self._dir_of.values():
                counts[d] += 1
            directory = min(online, key=lambda d: counts[d])
            try:
                log = Log.open(
                    directory / name,
                    config or self._config(topic),
                    topic=topic,
                    partition=partition,
                    clock=self._clock,
                    clean_shutdown=True,
                    fsync=self._fsync,
                    handle_cache=self.handle_cache,
                    topic_id=topic_id,
                    on_checkpoint=self._checkpoint_callback(directory),
                )
            except OSError as exc:
                self._fail_dir_on(directory, exc)
                raise
            self._adopt(key, log, directory)
            return log

    def delete_log(self, topic: str, partition: int) -> bool:
        """Remove the partition's log and its directory; False when there is none.

        The directory is first renamed ``<name>.<random>-delete`` (atomic), so a crash
        midway leaves a directory the next open removes.
        """
        with self._lock:
            key = (topic, partition)
            if self.offline_logs.pop(key, None) is not None:
                # Forgotten here; its files stay on the failed disk (Kafka deletes them
                # once the dir is back).
                self.recovery_reports.pop(key, None)
                return True
            log = self._logs.pop(key, None)
            if log is None:
                return False
            directory = self._dir_of.pop(key)
            self.cleaner.forget(log)
            try:
                log.delete()
                doomed = directory / f"{log.directory.name}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
                os.replace(log.directory, doomed)
                fsync_dir(directory, self._fsync)
            except OSError as exc:
                self._fail_dir_on(directory, exc)
                raise
            shutil.rmtree(doomed, ignore_errors=True)
            self.recovery_reports.pop(key, None)
        self.checkpoint_dir(directory)
        return True

    # -- periodic work -----------------------------------------------------------------

    def checkpoint(self) -> None:
        """Write both checkpoint files of every online log dir."""
        failed: Exception | None = None
        for directory in self.log_dirs:
            try:
                self.checkpoint_dir(directory)
            except (LogDirOfflineError, OSError) as exc:
                failed = failed or exc  # the other dirs still get theirs
        if failed is not None:
            raise failed

    def checkpoint_dir(self, directory: Path) -> None:
        """Both checkpoint files of ``directory``; nothing for an offline dir (its logs'
        state may not match what reached the disk)."""
        with self._lock:
            if directory in self.offline_dirs:
                return
            logs = [(key, log) for key, log in self._logs.items() if self._dir_of[key] == directory]
            try:
                write_checkpoint(
                    directory / RECOVERY_POINT_CHECKPOINT,
                    [(t, p, log.recovery_point) for (t, p), log in sorted(logs)],
                    self._fsync,
                )
                write_checkpoint(
                    directory / LOG_START_OFFSET_CHECKPOINT,
                    [(t, p, log.log_start_offset) for (t, p), log in sorted(logs)],
                    self._fsync,
                )
            except OSError as exc:
                self._fail_dir_on(directory, exc)
                raise

    def cleanup(self, now_ms: int | None = None) -> int:
        """Retention on every log; returns the number of segments deleted."""
        deleted = 0
        for log in self._snapshot():
            # A log whose dir went offline (now or meanwhile) is skipped, not the others.
            with contextlib.suppress(LogDirOfflineError, LogClosedError):
                deleted += log.delete_old_segments(now_ms)
        if deleted:
            self.checkpoint()
        return deleted

    def clean_dirtiest(self, now_ms: int) -> CleanResult | None:
        """Compact the compacted log whose pass is most due: the highest dirty ratio
        among those above their ``min.cleanable.dirty.ratio`` (or due by
        ``max.compaction.lag.ms`` or an expired tombstone horizon). None when no log
        needs cleaning."""
        best: Log | None = None
        best_ratio = -1.0
        for log in self._snapshot():
            if log.closed or not log.config.compact:
                continue
            try:
                due, ranges = self.cleaner.needs_cleaning(log, now_ms)
            except (LogClosedError, LogDirOfflineError):
                continue
            except OSError as exc:
                if is_disk_failure(exc):
                    self.mark_offline(log.directory.parent, exc)
                continue
            if due and ranges.dirty_ratio > best_ratio:
                best, best_ratio = log, ranges.dirty_ratio
        if best is None:
            return None
        try:
            return self.cleaner.clean_log(best, now_ms)
        except OSError as exc:
            # The cleaner writes the cleaned segment and its checkpoint itself.
            self._fail_dir_on(best.directory.parent, exc)
            raise

    def flush_due(self, now_ms: int) -> int:
        """``maybe_flush`` on every log; returns how many logs fsynced."""
        flushed = 0
        for log in self._snapshot():
            with contextlib.suppress(LogDirOfflineError, LogClosedError):
                flushed += log.maybe_flush(now_ms)
        return flushed

    def _snapshot(self) -> Iterable[Log]:
        with self._lock:
            return list(self._logs.values())

    def update_configs(self, configs: Mapping[str, LogConfig]) -> None:
        """New configs for the named topics' logs."""
        for (topic, _), log in self.logs.items():
            if topic in configs:
                log.update_config(configs[topic])

    # -- closing -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError("the log manager is closed")

    def close(self) -> None:
        """Flush and close every log, write the checkpoints, then the clean marker, in
        every online dir. A dir that fails meanwhile goes offline without its marker (its
        next open recovers it); the first such failure is raised once the others are
        closed."""
        with self._lock:
            if self._closed:
                return
            failed: Exception | None = None
            for log in list(self._logs.values()):
                try:
                    log.close()
                except (LogDirOfflineError, OSError) as exc:
                    failed = failed or exc
            try:
                self.checkpoint()
            except (LogDirOfflineError, OSError) as exc:
                failed = failed or exc
            for directory in self.online_dirs:
                try:
                    write_durably(directory / CLEAN_SHUTDOWN_MARKER, b"", self._fsync)
                except OSError as exc:
                    if is_disk_failure(exc):
                        self.mark_offline(directory, exc)
                    failed = failed or exc
            self._closed = True
            if failed is not None:
                raise failed
