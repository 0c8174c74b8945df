"""Codec framing, compatibility with other writers, and bounded decompression."""

from __future__ import annotations

import gzip
import io
import os
import struct
import zlib

import cramjam
import lz4.block
import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.records import compression as c
from tidelog.records.compression import Compression, codec_of, compress, decompress
from tidelog.records.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    RecordsError,
    TruncatedBatchError,
    UnsupportedCompressionError,
)

SAMPLES = [
    b"",
    b"a",
    b"hello kafka " * 50,
    os.urandom(70_000) + b"z" * 100_000,  # several lz4 / snappy-java blocks
]
CODECS = list(Compression)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("data", SAMPLES, ids=lambda d: f"{len(d)}B")
def test_round_trip(codec: Compression, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data
    assert decompress(codec, compress(codec, bytearray(data))) == data


@pytest.mark.parametrize("codec", CODECS)
def test_limit_is_enforced(codec: Compression) -> None:
    data = b"x" * 100_000
    packed = compress(codec, data)
    assert decompress(codec, packed, max_size=len(data)) == data
    with pytest.raises(BatchTooLargeError):
        decompress(codec, packed, max_size=len(data) - 1)


@pytest.mark.parametrize("codec", CODECS[1:])
def test_a_bomb_fails_before_it_expands(codec: Compression) -> None:
    # 64 MiB of zeros compresses to a few KiB; a 1 MiB limit must stop it.
    bomb = compress(codec, bytes(64 << 20))
    with pytest.raises(BatchTooLargeError):
        decompress(codec, bomb, max_size=1 << 20)


def test_default_limit_is_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    packed = compress(Compression.GZIP, b"y" * 1000)
    monkeypatch.setattr(c, "DEFAULT_MAX_DECOMPRESSED_SIZE", 999)
    with pytest.raises(BatchTooLargeError):
        decompress(Compression.GZIP, packed)


def test_codec_ids() -> None:
    assert [int(x) for x in Compression] == [0, 1, 2, 3, 4]
    assert codec_of(0x0B) is Compression.LZ4  # other attribute bits are ignored
    for bad in (5, 6, 7):
        with pytest.raises(UnsupportedCompressionError):
            codec_of(bad)
        with pytest.raises(UnsupportedCompressionError):
            decompress(bad, b"")


def test_gzip_framing_and_other_writers() -> None:
    packed = compress(Compression.GZIP, b"data")
    assert packed[:4] == b"\x1f\x8b\x08\x00"  # gzip member, deflate, no optional fields
    assert packed[4:8] == b"\x00\x00\x00\x00"  # mtime 0: deterministic output
    # A member with a file name and mtime, as gzip tools write.
    named = io.BytesIO()
    with gzip.GzipFile(filename="records.bin", mode="wb", fileobj=named, mtime=1234) as f:
        f.write(b"first")
    assert decompress(Compression.GZIP, named.getvalue()) == b"first"
    # Several members are one stream; trailing bytes that are not a member are ignored.
    two = gzip.compress(b"ab") + gzip.compress(b"cd")
    assert decompress(Compression.GZIP, two) == b"abcd"
    assert decompress(Compression.GZIP, two + b"\x00\x00\x00") == b"abcd"
    with pytest.raises(TruncatedBatchError):
        decompress(Compression.GZIP, two[:-3])
    with pytest.raises(CorruptBatchError):
        decompress(Compression.GZIP, b"\x1f\x8b\x08\x00garbage-garbage")
    with pytest.raises(RecordsError):
        decompress(Compression.GZIP, zlib.compress(b"zlib, not gzip"))


def test_snappy_java_framing_is_written() -> None:
    data = b"s" * 40_000 + os.urandom(40_000)
    packed = compress(Compression.SNAPPY, data)
    assert packed[:8] == b"\x82SNAPPY\x00"
    assert struct.unpack(">ii", packed[8:16]) == (1, 1)
    # Blocks of at most 32 KiB of input: 80 000 bytes make three.
    pos, blocks = 16, []
    while pos < len(packed):
        (length,) = struct.unpack(">i", packed[pos : pos + 4])
        blocks.append(bytes(cramjam.snappy.decompress_raw(packed[pos + 4 : pos + 4 + length])))
        pos += 4 + length
    assert [len(b) for b in blocks] == [32768, 32768, 80_000 - 65536]
    assert b"".join(blocks) == data


def test_snappy_reads_raw_blocks_as_librdkafka_writes_them() -> None:
    data = b"librdkafka " * 300
    raw = bytes(cramjam.snappy.compress_raw(data))
    assert decompress(Compression.SNAPPY, raw) == data
    with pytest.raises(BatchTooLargeError):
        decompress(Compression.SNAPPY, raw, max_size=len(data) - 1)


def test_snappy_forged_lengths_fail_without_allocating() -> None:
    # A raw block claiming 4 GiB of output (varint ff ff ff ff 0f), and nothing after it.
    with pytest.raises(BatchTooLargeError):
        decompress(Compression.SNAPPY, b"\xff\xff\xff\xff\x0f\x00")
    header = c.SNAPPY_JAVA_HEADER
    with pytest.raises(CorruptBatchError):
        decompress(Compression.SNAPPY, header + struct.pack(">i", 2**30) + b"abc")
    with pytest.raises(CorruptBatchError):
        decompress(Compression.SNAPPY, header + struct.pack(">i", -4) + b"abcd")
    with pytest.raises(TruncatedBatchError):
        decompress(Compression.SNAPPY, header + b"\x00\x00")
    with pytest.raises(TruncatedBatchError):
        decompress(Compression.SNAPPY, header[:12])
    assert decompress(Compression.SNAPPY, header) == b""


def test_lz4_frame_flags_are_the_ones_the_java_client_reads() -> None:
    packed = compress(Compression.LZ4, b"x" * 1000)
    assert packed[:4] == b"\x04\x22\x4d\x18"
    flg, bd = packed[4], packed[5]
    assert flg >> 6 == 0b01  # version 1
    assert flg & 0x20  # independent blocks (the Java reader refuses dependent ones)
    assert not flg & 0x10  # no block checksum
    assert not flg & 0x08  # no content size
    assert not flg & 0x04  # no content checksum
    assert not flg & 0x01  # no dictionary id
    assert bd == 0x40  # 64 KiB maximum block size
    assert lz4.frame.get_frame_info(packed)["block_linked"] is False


def test_lz4_reads_frames_with_other_flags() -> None:
    data = os.urandom(1000) * 200
    for kwargs in (
        {"store_size": True, "content_checksum": True, "block_checksum": True},
        {"block_linked": True, "block_size": lz4.frame.BLOCKSIZE_MAX4MB},
    ):
        packed = lz4.frame.compress(data, **kwargs)
        assert decompress(Compression.LZ4, packed) == data
    two = lz4.frame.compress(b"ab") + lz4.frame.compress(b"cd")
    assert decompress(Compression.LZ4, two) == b"abcd"
    with pytest.raises(RecordsError):
        decompress(Compression.LZ4, lz4.block.compress(data))  # a bare block is not a frame
    with pytest.raises(TruncatedBatchError):
        decompress(Compression.LZ4, b"")


def test_zstd_reads_streamed_frames_without_content_size() -> None:
    data = os.urandom(1000) * 500
    out = io.BytesIO()
    writer = zstandard.ZstdCompressor(level=3).stream_writer(out, closefd=False)
    writer.write(data)
    writer.close()
    streamed = out.getvalue()
    params = zstandard.get_frame_parameters(streamed)
    assert params.content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert decompress(Compression.ZSTD, streamed) == data
    assert decompress(Compression.ZSTD, streamed + streamed) == data + data
    with pytest.raises(BatchTooLargeError):
        decompress(Compression.ZSTD, streamed, max_size=len(data) - 1)
    with pytest.raises(RecordsError):
        decompress(Compression.ZSTD, streamed[:-5])
    with pytest.raises(RecordsError):
        decompress(Compression.ZSTD, streamed + b"trailing")


def test_zstd_written_with_content_size() -> None:
    packed = compress(Compression.ZSTD, b"z" * 5000)
    assert zstandard.get_frame_parameters(packed).content_size == 5000


def test_zstd_huge_window_is_refused_as_too_large() -> None:
    # A frame header declaring a 2 GiB window (window descriptor 0x88: exponent 31-10).
    frame = b"\x28\xb5\x2f\xfd" + b"\x00" + b"\xa8" + b"\x01\x00\x00"
    with pytest.raises(BatchTooLargeError):
        decompress(Compression.ZSTD, frame, max_size=1 << 20)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(CODECS), st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_records_errors(codec: Compression, data: bytes) -> None:
    try:
        out = decompress(codec, data, max_size=4096)
    except RecordsError:
        return
    assert len(out) <= 4096


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(CODECS[1:]),
    st.binary(min_size=1, max_size=400),
    st.integers(0, 10_000),
    st.integers(0, 255),
)
def test_corrupted_compressed_blocks_raise_only_records_errors(
    codec: Compression, data: bytes, where: int, xor: int
) -> None:
    packed = bytearray(compress(codec, data))
    packed[where % len(packed)] ^= xor or 0xFF
    try:
        out = decompress(codec, packed, max_size=4096)
    except RecordsError:
        return
    assert len(out) <= 4096
