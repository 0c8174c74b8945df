"""Checks on the records of one partition of a Produce request, before anything is written.

The rules and their order are Kafka's (``ProduceRequest.validateRecords``, the size and CRC
checks of ``UnifiedLog.analyzeAndValidateRecords``, ``LogValidator.validateBatch`` and
``validateRecord``); each refusal carries the Kafka error code the client expects:

1. no bytes (null or empty records): INVALID_RECORD ("must have at least one record batch");
2. a first batch whose magic is not 2: INVALID_RECORD (Kafka's code for v3+ requests);
3. zstd before Produce v7: UNSUPPORTED_COMPRESSION_TYPE; an unknown codec: INVALID_RECORD;
4. a batch larger than the topic's ``max.message.bytes``: MESSAGE_TOO_LARGE;
5. a truncated batch, a bad length, a CRC mismatch: CORRUPT_MESSAGE;
6. bytes after the first batch: INVALID_RECORD (v3+ allows exactly one batch per partition;
   Kafka silently drops a trailing partial batch, Tidelog refuses it);
7. ``last_offset_delta + 1 != record_count`` or no records, a control batch, a
   transactional batch without a producer id, a producer id with a negative base sequence:
   INVALID_RECORD;
8. (a transactional batch is checked later, against the partition's transaction state
   and the :class:`TransactionVerifier`, see below);
9. a batch marked LogAppendTime by the producer: INVALID_TIMESTAMP;
10. records that do not parse (lengths, count, offset deltas, headers — what a consumer
    would choke on): CORRUPT_MESSAGE; compacted topics: a record without a key:
    INVALID_RECORD, with one record error per keyless record;
11. timestamps (CreateTime topics): any record's timestamp outside ``[now -
    message.timestamp.before.max.ms, now + message.timestamp.after.max.ms]``, or a header
    max timestamp past the upper bound: INVALID_TIMESTAMP, with one record error per
    record out of range. On a compacted topic a keyless record is named for its key only,
    and a batch with both kinds of errors is refused INVALID_TIMESTAMP naming all of them
    (Kafka checks a record's key before its timestamp, and any timestamp error decides the
    top-level code).

Every record is checked, as Kafka does: a batch whose CRC is right but whose records do not
parse would otherwise be stored and stop every consumer at its offset. The check walks the
records without building them (:func:`~tidelog.records.check_records`), except on
compacted topics, where the records are decoded once to see every key; the handler tells
``Log.append`` so with ``keys_checked=True``, so no record is decoded twice.

Every record's timestamp is checked, as Kafka does, without decoding every record: the walk
of step 10 returns bounds on the records' timestamp deltas (exact for deltas of three bytes
or more, +-8192 ms for the one- and two-byte deltas it skips). Only when the batch's base
timestamp plus those bounds, or its ``max_timestamp``, reaches past the topic's window are
the records decoded and compared one by one, which also names the offending ones in
``record_errors``. So a batch is decoded twice only when it comes within about 8 s of a
bound (a topic whose window is narrower than that pays it on every batch).

Kafka does not require a producer batch's base offset to be 0 (it overwrites it), and
neither does this module.

Transactional batches (KIP-890 part 1, the server-side defence). A transactional batch that
would start a transaction on a partition (its producer has none ongoing there at that
epoch) is first put to the broker's :class:`TransactionVerifier`, which the transaction
coordinator provides: a partition not added to the producer's ongoing transaction is
refused with the code it answers (INVALID_TXN_STATE), so a late request of a transaction
that already ended cannot start one. The partition's producer state then refuses an old
epoch, a sequence that does not follow, and a first transactional batch not at sequence
0 from a producer it has no state for. Until a coordinator is plugged in,
:class:`RefuseTransactions` refuses every such batch with INVALID_TXN_STATE.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tidelog.protocol import ErrorCode
from tidelog.records import BatchHeader, RecordsError, check_records, iter_records
from tidelog.records.batch import (
    COMPRESSION_MASK,
    MAGIC_OFFSET,
    MAGIC_V2,
    NO_TIMESTAMP,
    peek_batch_size,
    validate_batch,
)
from tidelog.records.compression import DEFAULT_MAX_DECOMPRESSED_SIZE, Compression
from tidelog.storage import LogConfig

LONG_MAX = 2**63 - 1

_ZSTD = int(Compression.ZSTD)
_MAX_CODEC = max(int(codec) for codec in Compression)


class TransactionVerifier(Protocol):
    """Answers whether a transactional produce may start a transaction on a partition."""

    def verify(
        self,
        transactional_id: str | None,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> ErrorCode:
        """NONE when ``topic``-``partition`` is in the producer's ongoing transaction (at
        that epoch), else the code to refuse the batch with."""
        ...


class RefuseTransactions:
    """The verifier of a broker without a transaction coordinator: refuses every
    transactional batch."""

    def verify(
        self,
        transactional_id: str | None,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> ErrorCode:
        return ErrorCode.INVALID_TXN_STATE


@dataclass(slots=True)
class Refusal:
    """Why a partition's records are refused."""

    error: ErrorCode
    message: str | None = None
    #: (index of the record in its batch, message), Kafka's ``record_errors``.
    record_errors: list[tuple[int, str | None]] = field(default_factory=list)


def validate_partition_records(
    records: bytes | bytearray | memoryview | None,
    *,
    api_version: int,
    config: LogConfig,
    now_ms: int,
    topic_partition: str,
) -> BatchHeader | Refusal:
    """The header of the single valid batch in ``records``, or why it is refused."""
    if not records:
        return Refusal(
            ErrorCode.INVALID_RECORD,
            f"Produce requests with version {api_version} must have at least one record "
            "batch per partition",
        )
    size_or_refusal = _first_batch_size(records, api_version, config)
    if isinstance(size_or_refusal, Refusal):
        return size_or_refusal
    try:
        header = validate_batch(records, 0)
    except RecordsError as exc:
        return Refusal(ErrorCode.CORRUPT_MESSAGE, f"{exc} in {topic_partition}")
    if header.size != len(records):
        return Refusal(
            ErrorCode.INVALID_RECORD,
            f"Produce requests with version {api_version} are only allowed to contain exactly "
            "one record batch per partition",
        )
    refusal = _check_batch(header, topic_partition)
    if refusal is not None:
        return refusal
    if header.is_log_append_time:
        return Refusal(
            ErrorCode.INVALID_TIMESTAMP,
            "One or more records have been rejected due to invalid timestamp",
            [(0, "Producer should not set timestamp type to LogAppendTime.")],
        )
    keyless: list[tuple[int, str | None]] = []
    if config.compact:
        keys = _check_keys(records, header, topic_partition)
        if isinstance(keys, Refusal):
            return keys
        span, keyless = keys
    else:
        walked = _check_records(records, header, topic_partition)
        if isinstance(walked, Refusal):
            return walked
        span = walked
    refusal = _check_timestamps(
        records, header, config, span, now_ms, frozenset(index for index, _ in keyless)
    )
    if refusal is not None:
        # As Kafka: a keyless record is named for its key only, and any timestamp error
        # makes the whole refusal INVALID_TIMESTAMP.
        refusal.record_errors = sorted(keyless + refusal.record_errors, key=lambda e: e[0])
        return refusal
    if keyless:
        return Refusal(
            ErrorCode.INVALID_RECORD,
            f"One or more records have been rejected due to {len(keyless)} record errors in "
            f"total: records without a key cannot be written to compacted topic partition "
            f"{topic_partition}",
            keyless,
        )
    return header


def _check_records(
    records: bytes | bytearray | memoryview, header: BatchHeader, topic_partition: str
) -> tuple[int, int] | Refusal:
    """Walks every record; returns bounds on their timestamps (oldest, newest)."""
    try:
        deltas = check_records(
            records, 0, header=header, max_decompressed_size=DEFAULT_MAX_DECOMPRESSED_SIZE
        )
    except RecordsError as exc:
        return Refusal(ErrorCode.CORRUPT_MESSAGE, f"{exc} in {topic_partition}")
    first = header.base_timestamp
    return first + deltas.lowest, first + deltas.highest


def _first_batch_size(
    records: bytes | bytearray | memoryview, api_version: int, config: LogConfig
) -> int | Refusal:
    if len(records) > MAGIC_OFFSET and records[MAGIC_OFFSET] != MAGIC_V2:
        return Refusal(
            ErrorCode.INVALID_RECORD,
            f"Produce requests with version {api_version} are only allowed to contain record "
            "batches with magic version 2",
        )
    if len(records) >= 23:
        codec = ((records[21] << 8) | records[22]) & COMPRESSION_MASK
        if codec > _MAX_CODEC:
            return Refusal(ErrorCode.INVALID_RECORD, f"unknown compression codec {codec}")
        if codec == _ZSTD and api_version < 7:
            return Refusal(
                ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
                f"Produce requests with version {api_version} are not allowed to use ZStandard "
                "compression",
            )
    try:
        size = peek_batch_size(records, 0)
    except RecordsError as exc:
        return Refusal(ErrorCode.CORRUPT_MESSAGE, str(exc))
    limit = config.max_message_bytes
    if size > limit:
        return Refusal(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"The record batch of {size} bytes is larger than max.message.bytes ({limit})",
        )
    return size


def _check_batch(header: BatchHeader, topic_partition: str) -> Refusal | None:
    count = header.record_count
    if count <= 0:
        return Refusal(
            ErrorCode.INVALID_RECORD,
            f"Invalid reported count for record batch: {count} in {topic_partition}",
        )
    if header.last_offset_delta + 1 != count:
        return Refusal(
            ErrorCode.INVALID_RECORD,
            f"Inconsistent batch offset range [{header.base_offset}, {header.last_offset}] and "
            f"count of records {count} in {topic_partition}",
        )
    if header.is_control:
        return Refusal(
            ErrorCode.INVALID_RECORD,
            f"Clients are not allowed to write control records in {topic_partition}",
        )
    if header.is_transactional and header.producer_id < 0:
        return Refusal(
            ErrorCode.INVALID_RECORD,
            f"Transactional record batch without a producer id in {topic_partition}",
        )
    if header.producer_id >= 0 and header.base_sequence < 0:
        return Refusal(
            ErrorCode.INVALID_RECORD,
            f"Invalid sequence number {header.base_sequence} in record batch with producerId "
            f"{header.producer_id} in {topic_partition}",
        )
    return None


def _check_timestamps(
    records: bytes | bytearray | memoryview,
    header: BatchHeader,
    config: LogConfig,
    span: tuple[int, int],
    now_ms: int,
    keyless: frozenset[int] = frozenset(),
) -> Refusal | None:
    """Kafka's per-record check of CreateTime timestamps, decoding the records only when
    ``span`` (bounds on their timestamps from the walk) or the header's max timestamp
    reaches past the topic's window. The records at ``keyless`` (refused for their missing
    key on a compacted topic) are not checked."""
    if config.log_append_time:
        return None
    before = config.message_timestamp_before_max_ms
    after = config.message_timestamp_after_max_ms
    low = now_ms - before if before < LONG_MAX else None
    high = now_ms + after if after < LONG_MAX else None
    oldest, newest = span
    largest = header.max_timestamp
    header_too_new = high is not None and largest != NO_TIMESTAMP and largest > high
    if (low is None or oldest >= low) and (high is None or newest <= high) and not header_too_new:
        return None
    lower = now_ms - before
    upper = now_ms + after
    errors: list[tuple[int, str | None]] = []
    try:
        for index, record in enumerate(iter_records(records, 0, header=header)):
            ts = record.timestamp
            if (
                ts != NO_TIMESTAMP
                and ((low is not None and ts < low) or (high is not None and ts > high))
                and index not in keyless
            ):
                errors.append(
                    (
                        index,
                        f"Timestamp {ts} of message with offset {record.offset} is out of "
                        f"range. The timestamp should be within [{lower}, {upper}]",
                    )
                )
    except RecordsError:
        errors = []
    if not errors and header_too_new and not keyless:
        # Every record is in range but the header claims a newer one: stored as is, that
        # max timestamp would hold the segment past retention.
        errors = [(0, f"The batch's max timestamp {largest} is after {upper}")]
    if not errors:
        return None
    return Refusal(
        ErrorCode.INVALID_TIMESTAMP,
        # Kafka's text, word for word (the partition is in the response already).
        "One or more records have been rejected due to invalid timestamp",
        errors,
    )


def _check_keys(
    records: bytes | bytearray | memoryview, header: BatchHeader, topic_partition: str
) -> tuple[tuple[int, int], list[tuple[int, str | None]]] | Refusal:
    """Decodes every record: (oldest, newest) timestamp and a record error per keyless
    record; a Refusal if the records do not parse."""
    errors: list[tuple[int, str | None]] = []
    oldest = newest = header.base_timestamp
    try:
        for index, record in enumerate(
            iter_records(
                records, 0, header=header, max_decompressed_size=DEFAULT_MAX_DECOMPRESSED_SIZE
            )
        ):
            ts = record.timestamp
            if ts < oldest:
                oldest = ts
            elif ts > newest:
                newest = ts
            if record.key is None:
                errors.append(
                    (
                        index,
                        "Compacted topic cannot accept message without key in topic partition "
                        f"{topic_partition}",
                    )
                )
    except RecordsError as exc:
        return Refusal(ErrorCode.CORRUPT_MESSAGE, f"{exc} in {topic_partition}")
    return (oldest, newest), errors
