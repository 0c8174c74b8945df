"""The error types of :mod:`tidelog.records`.

Every failure to read bytes as record batches raises a :class:`RecordsError`
subclass, never ``struct.error``, ``IndexError`` or a codec's own exception:
callers (the broker, the log's recovery) catch one type and map it to a Kafka
error code or a truncation point.
"""

from __future__ import annotations


class RecordsError(ValueError):
    """Bytes that are not a valid record batch (or sequence of batches)."""


class TruncatedBatchError(RecordsError):
    """The buffer ends before the batch (or a field inside it) does."""


class CorruptBatchError(RecordsError):
    """The batch is complete but its contents are inconsistent (CRC, magic, lengths)."""


class BatchTooLargeError(RecordsError):
    """The batch declares a size above the caller's limit; nothing was allocated for it."""


class UnsupportedCompressionError(RecordsError):
    """The attributes name a compression codec that does not exist."""
