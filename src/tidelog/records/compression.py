"""Compression of the records block of a batch, one codec per batch.

The low three bits of a batch's attributes name the codec; the records that follow
the 61-byte header are then one compressed block. Framing per codec, as the Apache
Kafka Java client and librdkafka write and read it:

- ``gzip`` (1): one or more gzip members (RFC 1952). Written as one member with
  ``mtime = 0``. When reading, bytes after the last member that do not start
  another member are ignored, as ``java.util.zip.GZIPInputStream`` does.
- ``snappy`` (2): written in the snappy-java ("xerial") stream framing the Java
  client uses: the 8 bytes ``82 'SNAPPY' 00``, int32 version (1) and int32
  compatible version (1), then repeated ``[int32 big-endian length][raw snappy
  block]``, each block holding at most 32 KiB of input. librdkafka reads that framing
  and writes plain raw snappy (one block, no framing), which the Java client's reader
  also accepts; so reading takes both, and writing uses the framing every client reads.
- ``lz4`` (3): the LZ4 frame format (magic ``04 22 4D 18``) with the header checksum
  right (KIP-57). The Java client's reader refuses dependent blocks, so frames are
  written with independent blocks, 64 KiB maximum block size, no content size, no
  block or content checksum — the same flags the Java client writes. Reading accepts
  any valid frame (and concatenated frames).
- ``zstd`` (4): one or more zstd frames, with or without the content size (streaming
  writers such as the Java client's leave it out). Written with the content size.

Decompression is bounded: it never produces (nor allocates for) more than
``max_size`` bytes (default :data:`DEFAULT_MAX_DECOMPRESSED_SIZE`, read at call
time so it can be changed for the process), raising :class:`BatchTooLargeError`
beyond it. Every codec failure is raised as a :class:`RecordsError` subclass.
"""

from __future__ import annotations

import zlib
from enum import IntEnum

import cramjam
import lz4.frame
import zstandard

from tidelog.records.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    RecordsError,
    TruncatedBatchError,
    UnsupportedCompressionError,
)

# Ceiling on what one batch may decompress to unless the caller gives its own. Kafka
# puts no bound here; 64 MiB is well above max.message.bytes (1 MiB) times any ratio a
# real producer reaches, and far below what would hurt a broker.
DEFAULT_MAX_DECOMPRESSED_SIZE = 64 * 1024 * 1024

GZIP_DEFAULT_LEVEL = 6  # zlib's and the Java client's default (Deflater.DEFAULT_COMPRESSION)
ZSTD_DEFAULT_LEVEL = 3  # zstd's default, also Kafka's compression.zstd.level default
LZ4_DEFAULT_LEVEL = 0  # lz4's fast mode; readers do not care which level wrote a frame

SNAPPY_JAVA_MAGIC = b"\x82SNAPPY\x00"
SNAPPY_JAVA_HEADER = SNAPPY_JAVA_MAGIC + b"\x00\x00\x00\x01\x00\x00\x00\x01"
SNAPPY_JAVA_BLOCK_SIZE = 32 * 1024  # snappy-java's default block size
_GZIP_MAGIC = b"\x1f\x8b"
# zstd refuses frames whose window is above the decoder's limit. The limit follows the
# caller's size limit but is never below 8 MiB, the window streaming writers declare up
# to level 19 when they do not know the size, and never above zstd's own maximum.
_ZSTD_MIN_WINDOW = 1 << 23
_ZSTD_MAX_WINDOW = 1 << 31
_ZSTD_CONTENTSIZE_UNKNOWN = 2**64 - 1
# First output buffer of the streaming decoders, grown by doubling up to the limit.
_FIRST_READ = 256 * 1024


class Compression(IntEnum):
    """Codec ids of the attributes' low three bits."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


def codec_of(attributes: int) -> Compression:
    """The codec named by a batch's attributes; :class:`UnsupportedCompressionError` for 5-7."""
    value = attributes & 0x07
    try:
        return Compression(value)
    except ValueError:
        raise UnsupportedCompressionError(f"compression codec id {value} does not exist") from None


def compress(
    codec: Compression | int,
    data: bytes | bytearray | memoryview,
    level: int | None = None,
) -> bytes:
    """Compress a records block with ``codec`` in the framing described above."""
    codec = Compression(codec)
    if codec is Compression.NONE:
        return bytes(data)
    if codec is Compression.GZIP:
        return _gzip_compress(data, GZIP_DEFAULT_LEVEL if level is None else level)
    if codec is Compression.SNAPPY:
        return _snappy_java_compress(data)
    if codec is Compression.LZ4:
        return bytes(
            lz4.frame.compress(
                data,
                compression_level=LZ4_DEFAULT_LEVEL if level is None else level,
                block_size=lz4.frame.BLOCKSIZE_MAX64KB,
                block_linked=False,
                content_checksum=False,
                block_checksum=False,
                store_size=False,
            )
        )
    compressor = zstandard.ZstdCompressor(level=ZSTD_DEFAULT_LEVEL if level is None else level)
    return compressor.compress(data)


def decompress(
    codec: Compression | int,
    data: bytes | bytearray | memoryview,
    max_size: int | None = None,
) -> bytes:
    """Inverse of :func:`compress`, never yielding more than ``max_size`` bytes."""
    limit = DEFAULT_MAX_DECOMPRESSED_SIZE if max_size is None else max_size
    if limit < 0:
        raise ValueError(f"max_size must not be negative, got {limit}")
    if not 0 <= codec <= 7:
        raise UnsupportedCompressionError(f"compression codec id {codec} does not exist")
    codec = codec_of(codec)
    try:
        if codec is Compression.NONE:
            if len(data) > limit:
                raise BatchTooLargeError(
                    f"records block of {len(data)} bytes is above the limit of {limit}"
                )
            return bytes(data)
        if codec is Compression.GZIP:
            return _gzip_decompress(data, limit)
        if codec is Compression.SNAPPY:
            return _snappy_decompress(data, limit)
        if codec is Compression.LZ4:
            return _lz4_decompress(data, limit)
        return _zstd_decompress(data, limit)
    except RecordsError:
        raise
    except MemoryError:
        raise BatchTooLargeError(
            f"{codec.name.lower()} records block could not be decompressed: out of memory"
        ) from None
    except Exception as exc:
        # Codec libraries raise their own types (zlib.error, cramjam.DecompressionError,
        # RuntimeError, zstandard.ZstdError, ...): one type for callers.
        raise CorruptBatchError(
            f"{codec.name.lower()} records block does not decompress: {exc}"
        ) from exc


def _too_large(codec: str, limit: int) -> BatchTooLargeError:
    return BatchTooLargeError(f"{codec} records block decompresses to more than {limit} bytes")


def _gzip_compress(data: bytes | bytearray | memoryview, level: int) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


def _gzip_decompress(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    rest = bytes(data)
    while True:
        decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
        # max_length 0 would mean "unbounded"; limit + 1 - total >= 1 here.
        chunk = decompressor.decompress(rest, limit + 1 - total)
        total += len(chunk)
        if total > limit:
            raise _too_large("gzip", limit)
        parts.append(chunk)
        if not decompressor.eof:
            raise TruncatedBatchError("gzip records block ends inside a gzip member")
        rest = decompressor.unused_data
        if not rest.startswith(_GZIP_MAGIC):
            # Trailing bytes that are not another member are ignored, as Java's reader does.
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _snappy_java_compress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    parts = [SNAPPY_JAVA_HEADER]
    for start in range(0, len(view), SNAPPY_JAVA_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + SNAPPY_JAVA_BLOCK_SIZE]))
        parts.append(len(block).to_bytes(4, "big"))
        parts.append(block)
    return b"".join(parts)


def _snappy_raw_block(block: bytes | memoryview, room: int, limit: int) -> bytes:
    # The raw block starts with its uncompressed length: check it before allocating.
    size = int(cramjam.snappy.decompress_raw_len(block))
    if size > room:
        raise _too_large("snappy", limit)
    out = bytes(cramjam.snappy.decompress_raw(block))
    if len(out) != size:
        raise CorruptBatchError(
            f"snappy block declares {size} bytes but decompresses to {len(out)}"
        )
    return out


def _snappy_decompress(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    view = memoryview(data)
    if bytes(view[:8]) != SNAPPY_JAVA_MAGIC:
        return _snappy_raw_block(view, limit, limit)
    if len(view) < len(SNAPPY_JAVA_HEADER):
        raise TruncatedBatchError("snappy-java stream ends inside its 16-byte header")
    pos = len(SNAPPY_JAVA_HEADER)
    end = len(view)
    parts: list[bytes] = []
    total = 0
    while pos < end:
        if end - pos < 4:
            raise TruncatedBatchError(f"snappy-java stream ends inside a block length at {pos}")
        length = int.from_bytes(view[pos : pos + 4], "big", signed=True)
        pos += 4
        if length < 0 or length > end - pos:
            raise CorruptBatchError(
                f"snappy-java block at {pos - 4} declares {length} bytes, {end - pos} remain"
            )
        block = _snappy_raw_block(view[pos : pos + length], limit - total, limit)
        total += len(block)
        parts.append(block)
        pos += length
    return b"".join(parts)


def _lz4_decompress(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    # The decompressor allocates max_length up front, so ask for output in growing
    # chunks: a small block never pays for a buffer of the whole limit.
    parts: list[bytes] = []
    total = 0
    rest = bytes(data)
    if not rest:
        raise TruncatedBatchError("lz4 records block is empty")
    want = min(limit + 1, max(_FIRST_READ, 4 * len(rest)))
    while rest:
        decompressor = lz4.frame.LZ4FrameDecompressor()
        chunk = decompressor.decompress(rest, max_length=want)
        while True:
            total += len(chunk)
            if total > limit:
                raise _too_large("lz4", limit)
            parts.append(chunk)
            if decompressor.eof:
                break
            if decompressor.needs_input:
                raise TruncatedBatchError("lz4 records block ends inside an lz4 frame")
            want = min(limit + 1 - total, 2 * want)
            chunk = decompressor.decompress(b"", max_length=want)
        rest = decompressor.unused_data
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _zstd_window_limit(limit: int) -> int:
    window = _ZSTD_MIN_WINDOW
    while window < limit and window < _ZSTD_MAX_WINDOW:
        window <<= 1
    return window


_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE_MASK = 0xFFFFFFF0
_ZSTD_SKIPPABLE_MAGIC = 0x184D2A50
_ZSTD_FCS_FIELD_SIZE = (0, 2, 4, 8)
_ZSTD_DICT_ID_SIZE = (0, 1, 2, 4)


def _zstd_check_frames(source: bytes) -> None:
    """Walk the frame and block headers so a cut-off stream is refused.

    The streaming decoder returns what it could decode from a truncated frame without
    complaint; the block headers tell where each frame ends, so check that every frame
    is whole and that nothing else follows, before decoding.
    """
    end = len(source)
    pos = 0
    if end == 0:
        raise TruncatedBatchError("zstd records block is empty")
    while pos < end:
        if end - pos < 8:
            raise TruncatedBatchError(f"zstd stream ends inside a frame header at {pos}")
        magic = int.from_bytes(source[pos : pos + 4], "little")
        if magic & _ZSTD_SKIPPABLE_MASK == _ZSTD_SKIPPABLE_MAGIC:
            pos += 8 + int.from_bytes(source[pos + 4 : pos + 8], "little")
            continue
        if magic != _ZSTD_MAGIC:
            raise CorruptBatchError(f"no zstd frame at {pos} (magic {magic:#010x})")
        descriptor = source[pos + 4]
        single_segment = (descriptor >> 5) & 1
        fcs_flag = descriptor >> 6
        fcs_size = _ZSTD_FCS_FIELD_SIZE[fcs_flag] or single_segment
        pos += 5 + (1 - single_segment) + _ZSTD_DICT_ID_SIZE[descriptor & 3] + fcs_size
        while True:
            if end - pos < 3:
                raise TruncatedBatchError(f"zstd stream ends inside a block header at {pos}")
            block = int.from_bytes(source[pos : pos + 3], "little")
            block_type = (block >> 1) & 3
            if block_type == 3:
                raise CorruptBatchError(f"zstd block at {pos} has the reserved type")
            pos += 3 + (1 if block_type == 1 else block >> 3)
            if block & 1:
                break
        if descriptor & 0x04:
            pos += 4  # content checksum
    if pos != end:
        raise TruncatedBatchError(f"zstd stream ends {pos - end} bytes before its last frame")


def _zstd_decompress(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    source = bytes(data)
    _zstd_check_frames(source)
    params = zstandard.get_frame_parameters(source)
    max_window = _zstd_window_limit(limit)
    if params.window_size > max_window:
        raise BatchTooLargeError(
            f"zstd frame needs a {params.window_size}-byte window, above the {max_window} "
            f"allowed for a limit of {limit} bytes"
        )
    decompressor = zstandard.ZstdDecompressor(max_window_size=max_window)
    if params.content_size != _ZSTD_CONTENTSIZE_UNKNOWN:
        if params.content_size > limit:
            raise _too_large("zstd", limit)
        try:
            # One frame that declares its size: a single exact allocation.
            return decompressor.decompress(source, allow_extra_data=False)
        except zstandard.ZstdError:
            pass  # more than one frame, or a lie: the streaming path below decides
    # No declared size: read in growing chunks so a small block never costs a big buffer.
    reader = decompressor.stream_reader(source, read_across_frames=True)
    parts: list[bytes] = []
    total = 0
    want = min(limit + 1, max(_FIRST_READ, 4 * len(source)))
    while True:
        chunk = reader.read(want)
        if not chunk:
            break
        total += len(chunk)
        if total > limit:
            raise _too_large("zstd", limit)
        parts.append(chunk)
        want = min(limit + 1 - total, 2 * want)
    return b"".join(parts)
