"""The error types of :mod:`tidelog.protocol`.

Every failure to read bytes from the wire raises a :class:`ProtocolError` subclass, never
``struct.error``, ``IndexError``, ``UnicodeDecodeError`` or one of kio's exceptions. The broker
catches one type and decides from it what to do with the connection:

- ``header is None``: not even a request header could be read (bad frame size, a frame shorter
  than a header, an unknown API key). Nothing can be answered; close the connection.
- ``header`` is set: the header parsed, so the broker knows the correlation id, API key and
  version and *could* answer. ``error_code`` is the Kafka code such an answer would carry.
  ``close_connection`` says what Kafka itself does: it closes the connection for every request it
  cannot parse, except an ApiVersions request of an unknown version, which it answers (KIP-511,
  see :func:`tidelog.protocol.api_versions.encode_api_versions_fallback`).

The client side gets :class:`ResponseDecodeError` for a response it cannot read; its connection
is no longer trustworthy either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidelog.protocol.error_codes import ErrorCode

if TYPE_CHECKING:
    from tidelog.protocol.headers import RequestHeader


class ProtocolError(Exception):
    """Bytes that are not a valid Kafka protocol frame, header or message."""

    error_code: ErrorCode = ErrorCode.INVALID_REQUEST

    def __init__(self, message: str, *, header: RequestHeader | None = None) -> None:
        super().__init__(message)
        self.header = header

    @property
    def correlation_id(self) -> int | None:
        return None if self.header is None else self.header.correlation_id

    @property
    def api_key(self) -> int | None:
        return None if self.header is None else self.header.api_key

    @property
    def api_version(self) -> int | None:
        return None if self.header is None else self.header.api_version

    @property
    def close_connection(self) -> bool:
        """Whether Kafka closes the connection here instead of answering."""
        return True


# -- framing ---------------------------------------------------------------------------------


class FrameError(ProtocolError):
    """The 4-byte size prefix is unacceptable; the stream cannot be resynchronised."""


class NegativeFrameSizeError(FrameError):
    """The size prefix is negative."""


class FrameTooLargeError(FrameError):
    """The size prefix exceeds the limit (``socket.request.max.bytes``); nothing was allocated."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class IncompleteFrameError(FrameError):
    """The input ended inside a frame (only raised when the caller says the stream ended)."""


# -- requests (server side) ------------------------------------------------------------------


class HeaderError(ProtocolError):
    """The request header could not be read."""


class UnknownApiKeyError(HeaderError):
    """The API key is not one Tidelog knows; the rest of the header cannot be interpreted."""

    def __init__(self, message: str, *, api_key: int, api_version: int, correlation_id: int):
        super().__init__(message)
        # The first 8 bytes of every request header are fixed, so these are known even though the
        # header as a whole is not; kept for logging only.
        self.raw_api_key = api_key
        self.raw_api_version = api_version
        self.raw_correlation_id = correlation_id


class UnsupportedVersionError(ProtocolError):
    """The header parsed, but Tidelog does not serve this version of the API."""

    error_code = ErrorCode.UNSUPPORTED_VERSION

    def __init__(self, message: str, *, header: RequestHeader) -> None:
        super().__init__(message, header=header)

    @property
    def close_connection(self) -> bool:
        from tidelog.protocol.apis import ApiKey

        return self.api_key != ApiKey.API_VERSIONS


class BodyError(ProtocolError):
    """The header parsed but the body did not (truncated, trailing bytes, bad lengths, ...).

    ``header`` is set on the server side; on the client side the error is raised as
    :class:`ResponseDecodeError` instead.
    """


class TruncatedError(BodyError):
    """A field or length runs past the end of the frame."""


class TrailingBytesError(BodyError):
    """The message ended before the frame did."""


class MalformedError(BodyError):
    """A value is impossible: negative length, overlong varint, invalid UTF-8, bad marker."""


# -- responses (client side) -----------------------------------------------------------------


class ResponseDecodeError(ProtocolError):
    """A response frame could not be read (or does not belong to the request it answers)."""

    error_code = ErrorCode.NETWORK_EXCEPTION


# -- encoding (either side) ------------------------------------------------------------------


class EncodeError(ProtocolError):
    """A message object cannot be written (a value out of range, a header/message mismatch).

    This is a bug in the caller, not bad input from the peer.
    """

    error_code = ErrorCode.UNKNOWN_SERVER_ERROR
