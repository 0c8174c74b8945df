"""Building one RecordBatch v2, as a producer (or the broker, for control batches) does.

Records are encoded as they are appended into one growing buffer (layout in
:mod:`tidelog.records.reader`); :meth:`BatchBuilder.close` compresses that buffer once,
writes the 61-byte header (layout in :mod:`tidelog.records.batch`), computes the
CRC-32C once over attributes .. end, and returns the batch as one ``bytes`` object.

Header fields follow the Java client: ``base_offset`` 0 (the broker assigns real
offsets by rewriting it), ``base_timestamp`` the first record's timestamp,
``max_timestamp`` the largest record timestamp (or the LogAppendTime when that flag is
set), ``last_offset_delta`` the last record's offset delta, and producer id / epoch /
base sequence -1 unless set (idempotent and transactional producers set them).
"""

from __future__ import annotations

from collections.abc import Iterable

from crc32c import crc32c

from tidelog.records.batch import (
    _HEADER,
    COMPRESSION_MASK,
    CONTROL_MASK,
    CRC_START,
    DELETE_HORIZON_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
)
from tidelog.records.compression import Compression, compress
from tidelog.records.varint import INT32_MAX, INT64_MAX, INT64_MIN

_ONE_BYTE: tuple[bytes, ...] = tuple(bytes((i,)) for i in range(128))
_NULL = b"\x01"  # zigzag varint of -1: a null key, value or header value
_NO_HEADERS = b"\x00"


def _varint(value: int) -> bytes:
    """Zigzag varint/varlong of a value already known to be in range."""
    zz = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    if zz < 0x80:
        return _ONE_BYTE[zz]
    out = bytearray()
    while zz >= 0x80:
        out.append((zz & 0x7F) | 0x80)
        zz >>= 7
    out.append(zz)
    return bytes(out)


class BatchBuilder:
    """Accumulates records and closes them into one RecordBatch v2.

    ``compression`` is a :class:`~tidelog.records.compression.Compression` codec and
    ``compression_level`` an optional codec level. ``log_append_time`` marks the batch
    LogAppendTime with that max timestamp (readers then report it for every record).
    ``transactional`` and ``control`` set the matching attribute bits.
    ``last_offset_delta`` (default: the last record's offset delta) and
    ``delete_horizon_ms`` are for the log cleaner; see the module docstring.
    """

    __slots__ = (
        "_base_timestamp",
        "_closed",
        "_count",
        "_last_delta",
        "_max_timestamp",
        "_records",
        "base_offset",
        "base_sequence",
        "compression",
        "compression_level",
        "control",
        "delete_horizon_ms",
        "last_offset_delta",
        "log_append_time",
        "partition_leader_epoch",
        "producer_epoch",
        "producer_id",
        "transactional",
    )

    def __init__(
        self,
        *,
        compression: Compression | int = Compression.NONE,
        compression_level: int | None = None,
        base_offset: int = 0,
        partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
        transactional: bool = False,
        control: bool = False,
        log_append_time: int | None = None,
        last_offset_delta: int | None = None,
        delete_horizon_ms: int | None = None,
    ) -> None:
        if last_offset_delta is not None and not 0 <= last_offset_delta <= INT32_MAX:
            raise ValueError(f"last offset delta {last_offset_delta} is outside 0 .. 2**31 - 1")
        if delete_horizon_ms is not None and not INT64_MIN <= delete_horizon_ms <= INT64_MAX:
            raise ValueError(f"delete horizon {delete_horizon_ms} is outside the int64 range")
        self.compression = Compression(compression)
        self.compression_level = compression_level
        self.base_offset = base_offset
        self.partition_leader_epoch = partition_leader_epoch
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.transactional = transactional
        self.control = control
        self.log_append_time = log_append_time
        self.last_offset_delta = last_offset_delta
        self.delete_horizon_ms = delete_horizon_ms
        self._records = bytearray()
        self._count = 0
        self._last_delta = -1
        self._base_timestamp = -1 if delete_horizon_ms is None else delete_horizon_ms
        self._max_timestamp = -1
        self._closed = False

    def set_producer(self, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        """Set the idempotence fields (they may be set until :meth:`close`)."""
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence

    @property
    def record_count(self) -> int:
        return self._count

    @property
    def uncompressed_size(self) -> int:
        """Bytes the batch would take uncompressed: header plus records so far."""
        return HEADER_SIZE + len(self._records)

    def append(
        self,
        key: bytes | bytearray | memoryview | None,
        value: bytes | bytearray | memoryview | None,
        headers: Iterable[tuple[str, bytes | bytearray | memoryview | None]] = (),
        *,
        timestamp: int,
        offset_delta: int | None = None,
    ) -> int:
        """Add one record; returns its offset delta.

        The delta is the next one (previous + 1) unless ``offset_delta`` is given, which
        must be above the previous record's (the cleaner keeps original deltas).
        """
        if self._closed:
            raise ValueError("the batch is already closed")
        if not INT64_MIN <= timestamp <= INT64_MAX:
            raise ValueError(f"timestamp {timestamp} is outside the int64 range")
        if self._count > INT32_MAX - 1:
            raise ValueError("a batch holds at most 2**31 - 1 records")
        delta = self._last_delta + 1 if offset_delta is None else offset_delta
        if delta <= self._last_delta or delta > INT32_MAX:
            raise ValueError(
                f"offset delta {delta} must be above the previous one ({self._last_delta}) "
                "and at most 2**31 - 1"
            )
        if self.last_offset_delta is not None and delta > self.last_offset_delta:
            raise ValueError(
                f"offset delta {delta} is above the last offset delta {self.last_offset_delta}"
            )
        if self._count == 0:
            if self.delete_horizon_ms is None:
                self._base_timestamp = timestamp
            self._max_timestamp = timestamp
        elif timestamp > self._max_timestamp:
            self._max_timestamp = timestamp
        timestamp_delta = timestamp - self._base_timestamp
        if not INT64_MIN <= timestamp_delta <= INT64_MAX:
            raise ValueError(f"timestamp {timestamp} is too far from the batch's first one")
        body = bytearray(b"\x00")  # attributes: unused, always 0
        body += _varint(timestamp_delta)
        body += _varint(delta)
        if key is None:
            body += _NULL
        else:
            if len(key) > INT32_MAX:
                raise ValueError("a key is at most 2**31 - 1 bytes")
            body += _varint(len(key))
            body += key
        if value is None:
            body += _NULL
        else:
            if len(value) > INT32_MAX:
                raise ValueError("a value is at most 2**31 - 1 bytes")
            body += _varint(len(value))
            body += value
        if not headers:
            body += _NO_HEADERS
        else:
            self._encode_headers(body, headers)
        records = self._records
        records += _varint(len(body))
        records += body
        self._count += 1
        self._last_delta = delta
        return delta

    @staticmethod
    def _encode_headers(
        body: bytearray,
        headers: Iterable[tuple[str, bytes | bytearray | memoryview | None]],
    ) -> None:
        items = list(headers)
        body += _varint(len(items))
        for name, hvalue in items:
            if not isinstance(name, str):
                raise TypeError(f"header keys are str, got {type(name).__name__}")
            encoded = name.encode("utf-8")
            body += _varint(len(encoded))
            body += encoded
            if hvalue is None:
                body += _NULL
            else:
                body += _varint(len(hvalue))
                body += hvalue

    def close(self) -> bytes:
        """The finished batch; the builder accepts no more records afterwards."""
        if self._count == 0:
            raise ValueError("a record batch needs at least one record")
        self._closed = True
        attributes = int(self.compression)
        if self.log_append_time is not None:
            attributes |= TIMESTAMP_TYPE_MASK
            max_timestamp = self.log_append_time
        else:
            max_timestamp = self._max_timestamp
        if self.transactional:
            attributes |= TRANSACTIONAL_MASK
        if self.control:
            attributes |= CONTROL_MASK
        if self.delete_horizon_ms is not None:
            attributes |= DELETE_HORIZON_MASK
        return seal_batch(
            self._records,
            record_count=self._count,
            last_offset_delta=(
                self._last_delta if self.last_offset_delta is None else self.last_offset_delta
            ),
            base_timestamp=self._base_timestamp,
            max_timestamp=max_timestamp,
            attributes=attributes,
            compression=self.compression,
            compression_level=self.compression_level,
            base_offset=self.base_offset,
            partition_leader_epoch=self.partition_leader_epoch,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            base_sequence=self.base_sequence,
        )


def seal_batch(
    records: bytes | bytearray | memoryview,
    *,
    record_count: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    attributes: int = 0,
    compression: Compression = Compression.NONE,
    compression_level: int | None = None,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    precompressed: bool = False,
) -> bytes:
    """A whole batch around an already encoded records block: compress it once, write the
    header, compute the CRC once. With ``precompressed`` the block is already compressed
    with ``compression`` (a producer keeps the compressed payload to re-send it). :class:`BatchBuilder` ends here, and so do the encoders
    on hot paths (the client's producer, the agent's sender) that lay out records
    themselves with :data:`~tidelog.records.varint.SMALL_VARINTS`.

    ``attributes`` holds the flag bits; the codec bits come from ``compression``.
    """
    if precompressed or compression is Compression.NONE:
        payload: bytes | bytearray | memoryview = records
    else:
        payload = compress(compression, records, compression_level)
    header = bytearray(
        _HEADER.pack(
            base_offset,
            HEADER_SIZE - LOG_OVERHEAD + len(payload),
            partition_leader_epoch,
            MAGIC_V2,
            0,
            (attributes & ~COMPRESSION_MASK) | int(compression),
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            record_count,
        )
    )
    crc = crc32c(payload, crc32c(memoryview(header)[CRC_START:]))
    header[CRC_START - 4 : CRC_START] = crc.to_bytes(4, "big")
    return b"".join((header, payload))


def build_empty_batch(
    *,
    base_offset: int,
    last_offset_delta: int,
    timestamp: int,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    attributes: int = 0,
) -> bytes:
    """A batch header with no records: what compaction leaves of a batch whose records
    were all removed but which must stay (a producer's last batch, or the last batch
    of a cleaned segment). ``attributes`` keeps the timestamp type, transactional and
    control bits; compression and the delete horizon bit are cleared (there is nothing
    to compress). ``timestamp`` goes in both base and max timestamp."""
    if not 0 <= last_offset_delta <= INT32_MAX:
        raise ValueError(f"last offset delta {last_offset_delta} is outside 0 .. 2**31 - 1")
    attributes &= TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK | CONTROL_MASK
    header = bytearray(
        _HEADER.pack(
            base_offset,
            HEADER_SIZE - LOG_OVERHEAD,
            partition_leader_epoch,
            MAGIC_V2,
            0,
            attributes,
            last_offset_delta,
            timestamp,
            timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            0,
        )
    )
    crc = crc32c(memoryview(header)[CRC_START:])
    header[CRC_START - 4 : CRC_START] = crc.to_bytes(4, "big")
    return bytes(header)
