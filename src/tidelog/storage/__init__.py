"""tidelog.storage: the Kafka-format partition log on disk.

See ``docs/storage.md`` for the layout and the rules. Entry points: :class:`Log`
(one partition), :class:`LogManager` (every partition of one or more log dirs),
:class:`LogConfig` (topic-level settings), :class:`Cleaner` (compaction).
"""

from tidelog.storage.cleaner import (
    CLEANER_OFFSET_CHECKPOINT,
    CleanableRange,
    Cleaner,
    CleanResult,
    OffsetMap,
)
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import (
    ConfigError,
    CorruptCheckpointError,
    CorruptSegmentError,
    InvalidAppendError,
    InvalidPartitionDirError,
    InvalidRecordError,
    LogClosedError,
    LogDirOfflineError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    SegmentDeletedError,
    StorageError,
    UnexpectedAppendOffsetError,
)
from tidelog.storage.log import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    AppendInfo,
    InvalidTimestampError,
    Log,
    RecoveryReport,
    TimestampOffset,
)
from tidelog.storage.manager import LOG_DIR_LOCK, LogManager, lock_log_dirs
from tidelog.storage.segment import FileSlice, HandleCache, RecoveryProblem, Segment

__all__ = [
    "CLEANER_OFFSET_CHECKPOINT",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "LOG_DIR_LOCK",
    "MAX_TIMESTAMP",
    "AppendInfo",
    "CleanResult",
    "CleanableRange",
    "Cleaner",
    "ConfigError",
    "CorruptCheckpointError",
    "CorruptSegmentError",
    "FileSlice",
    "HandleCache",
    "InvalidAppendError",
    "InvalidPartitionDirError",
    "InvalidRecordError",
    "InvalidTimestampError",
    "Log",
    "LogClosedError",
    "LogConfig",
    "LogDirOfflineError",
    "LogManager",
    "OffsetMap",
    "OffsetOutOfRangeError",
    "RecordTooLargeError",
    "RecoveryProblem",
    "RecoveryReport",
    "Segment",
    "SegmentDeletedError",
    "StorageError",
    "TimestampOffset",
    "UnexpectedAppendOffsetError",
    "lock_log_dirs",
]
