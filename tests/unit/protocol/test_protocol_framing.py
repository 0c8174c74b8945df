from __future__ import annotations

import itertools
import struct
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    FrameDecoder,
    FrameTooLargeError,
    IncompleteFrameError,
    NegativeFrameSizeError,
    ProtocolError,
    frame,
)


def _prefix(size: int) -> bytes:
    return struct.pack(">i", size)


def test_default_limit_is_kafkas_socket_request_max_bytes() -> None:
    assert DEFAULT_MAX_FRAME_SIZE == 104857600
    assert FrameDecoder().max_frame_size == 104857600


def test_one_frame_in_one_feed() -> None:
    frames = FrameDecoder().feed(_prefix(3) + b"abc")
    assert [bytes(f) for f in frames] == [b"abc"]


def test_frames_are_read_only_and_survive_later_feeds() -> None:
    decoder = FrameDecoder()
    first = decoder.feed(_prefix(2) + b"xy")[0]
    decoder.feed(_prefix(2) + b"zw")
    assert first.readonly
    assert bytes(first) == b"xy"


def test_split_at_every_byte() -> None:
    data = _prefix(5) + b"hello" + _prefix(0) + _prefix(2) + b"ok"
    decoder = FrameDecoder()
    out: list[bytes] = []
    for i in range(len(data)):
        out.extend(bytes(f) for f in decoder.feed(data[i : i + 1]))
        if i < len(data) - 1:
            assert decoder.buffered > 0 or out
    assert out == [b"hello", b"", b"ok"]
    assert decoder.buffered == 0
    decoder.close()


def test_several_frames_and_a_partial_one_in_one_feed() -> None:
    decoder = FrameDecoder()
    frames = decoder.feed(_prefix(1) + b"a" + _prefix(2) + b"bc" + _prefix(4) + b"de")
    assert [bytes(f) for f in frames] == [b"a", b"bc"]
    assert decoder.buffered == 6
    assert [bytes(f) for f in decoder.feed(b"fg")] == [b"defg"]


def test_partial_prefix_is_kept() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(b"\x00\x00") == []
    assert decoder.feed(b"\x00") == []
    assert decoder.buffered == 3
    assert [bytes(f) for f in decoder.feed(b"\x01z")] == [b"z"]


def test_close_inside_a_frame_raises() -> None:
    decoder = FrameDecoder()
    decoder.feed(_prefix(4) + b"ab")
    with pytest.raises(IncompleteFrameError):
        decoder.close()
    decoder2 = FrameDecoder()
    decoder2.feed(b"\x00")
    with pytest.raises(IncompleteFrameError):
        decoder2.close()


def test_negative_size_is_refused_and_the_decoder_stays_failed() -> None:
    decoder = FrameDecoder()
    with pytest.raises(NegativeFrameSizeError):
        decoder.feed(_prefix(-1))
    with pytest.raises(NegativeFrameSizeError):
        decoder.feed(_prefix(1) + b"a")


def test_oversize_is_refused_before_allocating() -> None:
    decoder = FrameDecoder(max_frame_size=1000)
    decoder.feed(_prefix(1000) + b"x" * 1000)  # exactly the limit is fine
    with pytest.raises(FrameTooLargeError) as info:
        decoder.feed(_prefix(1001))
    assert info.value.size == 1001
    assert info.value.limit == 1000
    assert isinstance(info.value, ProtocolError)


def test_oversize_at_the_default_limit_allocates_nothing_large() -> None:
    decoder = FrameDecoder()
    tracemalloc.start()
    try:
        with pytest.raises(FrameTooLargeError):
            decoder.feed(_prefix(2**31 - 1) + b"\x00" * 16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


def test_frame_helper_prefixes_the_size() -> None:
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert frame(memoryview(b"")) == b"\x00\x00\x00\x00"


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=12),
)
def test_any_chunking_yields_the_same_frames(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(p) for p in payloads)
    points = sorted({c for c in cuts if c < len(stream)} | {0, len(stream)})
    decoder = FrameDecoder(max_frame_size=300)
    out: list[bytes] = []
    for start, end in itertools.pairwise(points):
        out.extend(bytes(f) for f in decoder.feed(stream[start:end]))
    assert out == payloads
    decoder.close()


def _receive(decoder: FrameDecoder, data: bytes, step: int) -> list[bytes]:
    """``data`` received through receive_buffer/received, at most ``step`` bytes a time."""
    frames: list[bytes] = []
    pos = 0
    while pos < len(data):
        target = decoder.receive_buffer()
        n = min(step, len(target), len(data) - pos)
        target[:n] = data[pos : pos + n]
        pos += n
        frames.extend(bytes(f) for f in decoder.received(n))
    return frames


@given(
    st.lists(st.binary(max_size=300), max_size=8),
    st.integers(1, 700),
)
def test_received_in_place_gives_what_feed_gives(payloads: list[bytes], step: int) -> None:
    stream = b"".join(frame(p) for p in payloads)
    assert _receive(FrameDecoder(), stream, step) == payloads


def test_a_large_frame_is_received_into_its_own_buffer() -> None:
    """Once the size is known, the buffer handed out is the frame's: the bytes received
    there are the frame handed back, not a copy of them."""
    payload = bytes(range(256)) * 4096  # 1 MiB
    decoder = FrameDecoder()
    scratch = decoder.receive_buffer()
    first = frame(payload)[:1000]
    scratch[: len(first)] = first
    assert decoder.received(len(first)) == []
    target = decoder.receive_buffer()
    assert len(target) == len(payload) - (1000 - 4)
    target[:] = payload[996:]
    (done,) = decoder.received(len(target))
    assert done.obj is target.obj  # the same bytearray
    assert done == payload
    assert decoder.buffered == 0


def test_received_checks_sizes_and_reports_bad_prefixes() -> None:
    decoder = FrameDecoder(max_frame_size=100)
    target = decoder.receive_buffer()
    target[:4] = _prefix(50)
    assert decoder.received(4) == []
    assert len(decoder.receive_buffer()) == 50
    with pytest.raises(ValueError, match="cannot have been written"):
        decoder.received(51)
    bad = FrameDecoder(max_frame_size=100)
    bad.receive_buffer()[:4] = _prefix(101)
    with pytest.raises(FrameTooLargeError):
        bad.received(4)
    with pytest.raises(FrameTooLargeError):
        bad.receive_buffer()
