"""RecordBatch v2: batch-level operations, records codec, compression, control records.

Sans-io: everything here takes and returns bytes. ``batch`` works on headers without
decoding records (what storage and the produce path need); ``reader`` decodes records;
``builder`` encodes them; ``compression`` and ``control`` hold the codecs and the
broker's own records. Every decoding failure is a :class:`RecordsError`.
"""

from tidelog.records.batch import (
    BatchHeader,
    compute_crc,
    iter_batches,
    parse_header,
    peek_batch_size,
    set_base_offset,
    set_max_timestamp_log_append_time,
    set_partition_leader_epoch,
    validate_batch,
)
from tidelog.records.builder import BatchBuilder, seal_batch
from tidelog.records.compression import (
    DEFAULT_MAX_DECOMPRESSED_SIZE,
    Compression,
    codec_of,
    compress,
    decompress,
)
from tidelog.records.control import (
    ControlKey,
    ControlRecordType,
    EndTransactionMarker,
    build_end_txn_marker_batch,
    encode_control_key,
    encode_end_txn_marker_value,
    parse_control_key,
    parse_end_txn_marker,
)
from tidelog.records.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    RecordsError,
    TruncatedBatchError,
    UnsupportedCompressionError,
)
from tidelog.records.reader import (
    Record,
    RecordColumns,
    TimestampDeltaBounds,
    check_records,
    decode_columns,
    decode_records,
    decode_rows,
    iter_records,
    records_block,
)

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED_SIZE",
    "BatchBuilder",
    "BatchHeader",
    "BatchTooLargeError",
    "Compression",
    "ControlKey",
    "ControlRecordType",
    "CorruptBatchError",
    "EndTransactionMarker",
    "Record",
    "RecordColumns",
    "RecordsError",
    "TimestampDeltaBounds",
    "TruncatedBatchError",
    "UnsupportedCompressionError",
    "build_end_txn_marker_batch",
    "check_records",
    "codec_of",
    "compress",
    "compute_crc",
    "decode_columns",
    "decode_records",
    "decode_rows",
    "decompress",
    "encode_control_key",
    "encode_end_txn_marker_value",
    "iter_batches",
    "iter_records",
    "parse_control_key",
    "parse_end_txn_marker",
    "parse_header",
    "peek_batch_size",
    "records_block",
    "seal_batch",
    "set_base_offset",
    "set_max_timestamp_log_append_time",
    "set_partition_leader_epoch",
    "validate_batch",
]
