"""The error types of :mod:`tidelog.storage`.

Every failure of the partition log that a caller may want to map to a Kafka error
code is a :class:`StorageError` subclass. Corrupt bytes found on disk during
recovery are not raised: recovery truncates them and reports what it dropped.
"""

from __future__ import annotations

import errno


class StorageError(Exception):
    """Base of every error the storage layer raises on purpose."""


class ConfigError(StorageError, ValueError):
    """A log config key has a value of the wrong type or outside its range."""

    def __init__(self, key: str, value: object, reason: str) -> None:
        super().__init__(f"invalid value {value!r} for configuration {key}: {reason}")
        self.key = key
        self.value = value


class OffsetOutOfRangeError(StorageError):
    """The requested offset is below the log start offset or above the log end offset."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(f"offset {offset} is out of range [{log_start_offset}, {log_end_offset}]")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class InvalidAppendError(StorageError):
    """The batches of an append cannot be written as given (bad header, offsets)."""


class UnexpectedAppendOffsetError(InvalidAppendError):
    """A follower append whose offsets go backwards or start below the log end offset."""


class RecordTooLargeError(InvalidAppendError):
    """A batch is larger than ``max.message.bytes`` or than a segment can hold."""


class CorruptCheckpointError(StorageError):
    """A checkpoint file whose text does not follow the checkpoint format."""


class LogClosedError(StorageError):
    """An operation on a log (or log manager) that was closed or deleted."""


class InvalidPartitionDirError(StorageError):
    """A directory name that is not ``<topic>-<partition>``."""


class CorruptSegmentError(StorageError):
    """Bytes inside the recovered (trusted) part of a segment do not parse as batches."""


class SegmentDeletedError(StorageError):
    """A segment was deleted (retention, truncation, replacement) while being used."""


class InvalidRecordError(InvalidAppendError):
    """A record the log's config does not accept (a record without a key on a
    compacted topic); nothing of the append is written."""


#: Errors that say the process ran out of file descriptors or memory, not that the disk
#: failed: they fail the operation but leave the log dir in use. (Kafka takes the dir offline
#: on these too; here a client opening connections until the descriptors run out must not be
#: able to take a disk out of service.)
_NOT_THE_DISK = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def is_disk_failure(exc: OSError) -> bool:
    """Whether an I/O error on a log dir means its disk cannot be trusted any more."""
    return exc.errno not in _NOT_THE_DISK


class LogDirOfflineError(StorageError):
    """An I/O error hit a log directory, which is now offline: nothing on it is read or
    written again until the process restarts (Kafka's ``KafkaStorageException``).

    ``directory`` is the log dir (a ``log.dirs`` entry), ``cause`` the first I/O error
    that took it offline.
    """

    def __init__(self, directory: object, cause: BaseException) -> None:
        super().__init__(f"log dir {directory} is offline after an I/O error: {cause}")
        self.directory = directory
        self.cause = cause
