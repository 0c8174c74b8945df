"""Batch-level operations on RecordBatch v2 that never decode records.

Layout of one batch (all integers big-endian; ``docs/formats.md`` has the full picture)::

    offset  size  field
         0     8  base_offset             \\  the "log overhead": outside the length
         8     4  batch_length            /  and outside the CRC
        12     4  partition_leader_epoch     outside the CRC (set by the broker)
        16     1  magic (= 2)
        17     4  crc (CRC-32C, unsigned, of bytes 21..end)
        21     2  attributes
        23     4  last_offset_delta
        27     8  base_timestamp (first timestamp)
        35     8  max_timestamp
        43     8  producer_id
        51     2  producer_epoch
        53     4  base_sequence
        57     4  record_count
        61     -  records (compressed as one block when attributes say so)

``batch_length`` counts the bytes after itself, so a batch occupies
``batch_length + 12`` bytes. The broker may rewrite ``base_offset`` and
``partition_leader_epoch`` in place because the CRC does not cover them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

from crc32c import crc32c

from tidelog.records.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    TruncatedBatchError,
)

MAGIC_V2 = 2
LOG_OVERHEAD = 12  # base_offset + batch_length: the bytes batch_length does not count
HEADER_SIZE = 61  # bytes before the first record
CRC_START = 21  # the CRC covers attributes .. end of batch
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
PARTITION_LEADER_EPOCH_OFFSET = 12
MAX_TIMESTAMP_OFFSET = 35
# The smallest legal batch_length: a header with zero records.
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD

# attributes bits
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08  # 0 = CreateTime, 1 = LogAppendTime
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40  # base_timestamp holds the delete horizon (compaction, KIP-534)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")
assert _HEADER.size == HEADER_SIZE


class BatchHeader(NamedTuple):
    """Every fixed field of a RecordBatch v2 header, read without touching the records."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies, log overhead included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_MASK)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        """Sequence of the batch's last record (wrapping at 2**31 like Kafka), or -1."""
        if self.base_sequence < 0:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Read the fixed header of the batch starting at ``pos``.

    Checks that the header is complete, the magic is 2 and the declared length is at
    least a bare header. It does not check that the whole batch is present nor its CRC:
    use :func:`validate_batch` for that.
    """
    if pos < 0 or len(buf) - pos < HEADER_SIZE:
        raise TruncatedBatchError(
            f"record batch header needs {HEADER_SIZE} bytes, {max(len(buf) - pos, 0)} remain "
            f"at position {pos}"
        )
    header = BatchHeader._make(_HEADER.unpack_from(buf, pos))
    if header.magic != MAGIC_V2:
        raise CorruptBatchError(
            f"record batch at position {pos} has magic {header.magic}; only magic 2 is supported"
        )
    if header.batch_length < MIN_BATCH_LENGTH:
        raise CorruptBatchError(
            f"record batch at position {pos} declares length {header.batch_length}, "
            f"below the header's own {MIN_BATCH_LENGTH}"
        )
    if header.last_offset_delta < 0 or header.record_count < 0:
        raise CorruptBatchError(
            f"record batch at position {pos} has negative last offset delta "
            f"({header.last_offset_delta}) or record count ({header.record_count})"
        )
    return header


def peek_batch_size(buf: bytes | bytearray | memoryview, pos: int = 0) -> int:
    """Total size in bytes of the batch at ``pos`` as its length field declares it.

    Needs only the first 12 bytes; raises :class:`TruncatedBatchError` when fewer remain
    and :class:`CorruptBatchError` for a length below a bare header.
    """
    if pos < 0 or len(buf) - pos < LOG_OVERHEAD:
        raise TruncatedBatchError(
            f"record batch needs {LOG_OVERHEAD} bytes for offset and length, "
            f"{max(len(buf) - pos, 0)} remain at position {pos}"
        )
    (length,) = _INT32.unpack_from(buf, pos + 8)
    if length < MIN_BATCH_LENGTH:
        raise CorruptBatchError(
            f"record batch at position {pos} declares length {length}, "
            f"below the header's own {MIN_BATCH_LENGTH}"
        )
    return int(length) + LOG_OVERHEAD


def compute_crc(buf: bytes | bytearray | memoryview, pos: int, size: int) -> int:
    """CRC-32C of the CRC-covered range of the batch of ``size`` bytes at ``pos``."""
    return int(crc32c(memoryview(buf)[pos + CRC_START : pos + size]))


def validate_batch(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    *,
    max_size: int | None = None,
    verify_crc: bool = True,
) -> BatchHeader:
    """Check the batch at ``pos``: complete, within ``max_size``, magic 2, CRC right.

    Returns its header. Never allocates from the declared length: the size is checked
    against ``max_size`` and against the buffer before any slice is taken.
    """
    size = peek_batch_size(buf, pos)
    if max_size is not None and size > max_size:
        raise BatchTooLargeError(
            f"record batch at position {pos} is {size} bytes, above the limit of {max_size}"
        )
    if len(buf) - pos < size:
        raise TruncatedBatchError(
            f"record batch at position {pos} declares {size} bytes, only {len(buf) - pos} remain"
        )
    header = parse_header(buf, pos)
    if verify_crc:
        actual = compute_crc(buf, pos, size)
        if actual != header.crc:
            raise CorruptBatchError(
                f"record batch at position {pos} (base offset {header.base_offset}) has "
                f"CRC {header.crc:#010x}, computed {actual:#010x}"
            )
    return header


def iter_batches(
    buf: bytes | bytearray | memoryview,
    start: int = 0,
    end: int | None = None,
    *,
    max_size: int | None = None,
    verify_crc: bool = True,
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each complete, valid batch in ``buf[start:end]``.

    Raises the :class:`RecordsError` of the first bad batch after yielding every good
    one before it, so a caller can keep the valid prefix (log recovery) or refuse the
    whole request (produce validation).
    """
    stop = len(buf) if end is None else end
    view = memoryview(buf)[:stop] if stop != len(buf) else buf
    pos = start
    while pos < stop:
        header = validate_batch(view, pos, max_size=max_size, verify_crc=verify_crc)
        yield pos, header
        pos += header.size


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Overwrite the base offset in place (outside the CRC, so the batch stays valid)."""
    _INT64.pack_into(buf, pos, base_offset)


def set_partition_leader_epoch(buf: bytearray | memoryview, pos: int, epoch: int) -> None:
    """Overwrite the partition leader epoch in place (outside the CRC)."""
    _INT32.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def set_max_timestamp_log_append_time(
    buf: bytearray | memoryview, pos: int, size: int, timestamp: int
) -> None:
    """Mark the batch LogAppendTime with ``timestamp`` as its max timestamp, fixing the CRC.

    This is the broker's rewrite for ``message.timestamp.type=LogAppendTime``: Kafka
    sets the timestamp-type bit and the max timestamp, and readers then report the max
    timestamp for every record of the batch. Both fields lie inside the CRC, so it is
    recomputed — once per batch, never per record.
    """
    (attributes,) = _INT16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)
    _INT16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_MASK)
    _INT64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, timestamp)
    _UINT32.pack_into(buf, pos + CRC_OFFSET, compute_crc(buf, pos, size))
