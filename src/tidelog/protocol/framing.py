"""Size-prefixed framing, sans-io.

On the wire every request and response is ``size:int32`` (big-endian) followed by ``size``
bytes. :class:`FrameDecoder` turns a byte stream, fed in chunks of any size, into whole frames.

Invariants:

- the size prefix is checked (negative, or above ``max_frame_size``) before any memory is
  reserved for the frame; the check raises a :class:`~tidelog.protocol.errors.FrameError` and
  the decoder stays failed (the stream cannot be resynchronised; the connection must close);
- each frame is copied exactly once, from the fed chunks into a buffer of exactly its size, and
  handed out as a read-only ``memoryview`` the decoder never touches again, so callers may
  keep it;
- a frame of size 0 is a valid frame (an empty one); what it means is the reader's concern.

Two ways to give it bytes: :meth:`FrameDecoder.feed` takes chunks someone else received;
:meth:`FrameDecoder.receive_buffer` and :meth:`FrameDecoder.received` let the reader receive
straight into the decoder (``recv_into``, asyncio's ``BufferedProtocol``). While a frame is in
progress that buffer is the unfilled rest of the frame itself, so a large frame (a fetch
response of megabytes) is written once, by the kernel, and never copied in Python; between
frames it is a small scratch buffer whose bytes go through :meth:`feed`.
"""

from __future__ import annotations

import struct
from typing import Final, TypeAlias

from tidelog.protocol.errors import (
    FrameError,
    FrameTooLargeError,
    IncompleteFrameError,
    NegativeFrameSizeError,
)

BytesLike: TypeAlias = bytes | bytearray | memoryview

DEFAULT_MAX_FRAME_SIZE: Final = 104_857_600
"""Kafka's ``socket.request.max.bytes`` default (100 MiB)."""

SIZE_PREFIX: Final = struct.Struct(">i")

SCRATCH_SIZE: Final = 64 * 1024
"""Bytes of :meth:`FrameDecoder.receive_buffer` between frames: room for many small frames
(and the size prefix of a large one) per receive."""


class FrameDecoder:
    """Feed bytes in, get complete frames out."""

    __slots__ = (
        "_failure",
        "_filled",
        "_frame",
        "_into_frame",
        "_max_frame_size",
        "_prefix",
        "_scratch",
    )

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 0:
            raise ValueError("max_frame_size must not be negative")
        self._max_frame_size = max_frame_size
        self._prefix = bytearray()
        self._frame: bytearray | None = None
        self._filled = 0
        self._failure: FrameError | None = None
        self._scratch: memoryview | None = None
        self._into_frame = False

    @property
    def max_frame_size(self) -> int:
        return self._max_frame_size

    @property
    def buffered(self) -> int:
        """Bytes received (size prefix included) of the frame not yet complete."""
        if self._frame is None:
            return len(self._prefix)
        return SIZE_PREFIX.size + self._filled

    def feed(self, data: BytesLike) -> list[memoryview]:
        """Consume ``data``; return the frames it completed, oldest first (often none).

        :raises FrameError: a size prefix is negative or too large. Every later call raises it
            again.
        """
        if self._failure is not None:
            raise self._failure
        view = memoryview(data).cast("B")
        frames: list[memoryview] = []
        pos = 0
        end = len(view)
        while pos < end:
            frame = self._frame
            if frame is None:
                need = SIZE_PREFIX.size - len(self._prefix)
                if not self._prefix and end - pos >= SIZE_PREFIX.size:
                    size = SIZE_PREFIX.unpack_from(view, pos)[0]
                    pos += SIZE_PREFIX.size
                else:
                    take = min(need, end - pos)
                    self._prefix += view[pos : pos + take]
                    pos += take
                    if len(self._prefix) < SIZE_PREFIX.size:
                        break
                    size = SIZE_PREFIX.unpack_from(self._prefix, 0)[0]
                    self._prefix.clear()
                self._check_size(size)
                frame = self._frame = bytearray(size)
                self._filled = 0
            take = min(len(frame) - self._filled, end - pos)
            frame[self._filled : self._filled + take] = view[pos : pos + take]
            self._filled += take
            pos += take
            if self._filled == len(frame):
                frames.append(memoryview(frame).toreadonly())
                self._frame = None
                self._filled = 0
        return frames

    def receive_buffer(self) -> memoryview:
        """A writable buffer for the next bytes received; report how many were written with
        :meth:`received` before asking again.

        Inside a frame it is the rest of that frame (at least one byte); between frames it
        is a scratch buffer of :data:`SCRATCH_SIZE` bytes.
        """
        if self._failure is not None:
            raise self._failure
        frame = self._frame
        if frame is not None:
            self._into_frame = True
            return memoryview(frame)[self._filled :]
        self._into_frame = False
        if self._scratch is None:
            self._scratch = memoryview(bytearray(SCRATCH_SIZE))
        return self._scratch

    def received(self, nbytes: int) -> list[memoryview]:
        """``nbytes`` were written to the start of the last :meth:`receive_buffer`; return
        the frames they completed, oldest first.

        :raises FrameError: as :meth:`feed`.
        """
        if self._failure is not None:
            raise self._failure
        frame = self._frame
        if not self._into_frame:
            assert self._scratch is not None
            return self.feed(self._scratch[:nbytes])
        assert frame is not None
        if not 0 <= nbytes <= len(frame) - self._filled:
            raise ValueError(f"{nbytes} bytes cannot have been written to the frame's buffer")
        self._filled += nbytes
        if self._filled < len(frame):
            return []
        self._frame = None
        self._filled = 0
        self._into_frame = False
        return [memoryview(frame).toreadonly()]

    def close(self) -> None:
        """Declare the end of the stream.

        :raises IncompleteFrameError: the stream ended inside a frame.
        """
        if self.buffered:
            raise IncompleteFrameError(
                f"stream ended inside a frame ({self.buffered} bytes of it received)"
            )

    def _check_size(self, size: int) -> None:
        failure: FrameError | None = None
        if size < 0:
            failure = NegativeFrameSizeError(f"negative frame size {size}")
        elif size > self._max_frame_size:
            failure = FrameTooLargeError(size, self._max_frame_size)
        if failure is not None:
            self._failure = failure
            raise failure


def frame(payload: BytesLike) -> bytes:
    """``payload`` with its size prefix."""
    view = memoryview(payload)
    return SIZE_PREFIX.pack(view.nbytes) + view.tobytes()
