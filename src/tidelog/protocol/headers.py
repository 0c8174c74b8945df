"""Request and response headers.

Layouts (big-endian; ``string`` is an int16 length then UTF-8, -1 meaning null):

- request header v0: api_key int16, api_version int16, correlation_id int32
- request header v1: v0 + client_id nullable string
- request header v2: v1 + tagged fields (unsigned varint count, then tag/size/value entries)
- response header v0: correlation_id int32
- response header v1: v0 + tagged fields

The client id keeps its int16-length encoding even in v2: Kafka pins it so that a broker can
read the client id of any request, flexible or not. Neither header defines a tagged field, so
any tag present is skipped.

Which version a message uses follows from its API key and version; see
:func:`tidelog.protocol.apis.request_header_version` and ``response_header_version``. The
headers are written by hand here rather than through kio because kio has no request header v0
and because a header is read before the body's schema is even known.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from tidelog.protocol.errors import HeaderError, MalformedError, TruncatedError
from tidelog.protocol.validate import read_uvarint

_PREFIX: Final = struct.Struct(">hhi")
_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")
_NO_TAGS: Final = b"\x00"

REQUEST_HEADER_PREFIX_SIZE: Final = _PREFIX.size
"""api_key, api_version and correlation_id: the 8 bytes every request header starts with."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None
    header_version: int = 1
    """How the header was (or will be) encoded: 0, 1 or 2."""


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    correlation_id: int
    header_version: int = 0


def read_request_prefix(buf: memoryview) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) from the first 8 bytes of a request frame."""
    if len(buf) < _PREFIX.size:
        raise HeaderError(
            f"a request header needs at least {_PREFIX.size} bytes, the frame has {len(buf)}"
        )
    api_key, api_version, correlation_id = _PREFIX.unpack_from(buf, 0)
    return int(api_key), int(api_version), int(correlation_id)


def _skip_tagged_fields(buf: memoryview, pos: int, end: int) -> int:
    count, pos = read_uvarint(buf, pos, end)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos, end)
        size, pos = read_uvarint(buf, pos, end)
        if size > end - pos:
            raise TruncatedError(f"header tagged field of {size} bytes runs past the frame")
        pos += size
    return pos


def decode_request_header(buf: memoryview, header_version: int) -> tuple[RequestHeader, int]:
    """Read a request header of the given version; return it and the offset of the body.

    :raises HeaderError: the header is truncated or malformed.
    """
    api_key, api_version, correlation_id = read_request_prefix(buf)
    pos = _PREFIX.size
    end = len(buf)
    client_id: str | None = None
    try:
        if header_version >= 1:
            if pos + 2 > end:
                raise TruncatedError("client id length runs past the frame")
            length = _INT16.unpack_from(buf, pos)[0]
            pos += 2
            if length >= 0:
                if length > end - pos:
                    raise TruncatedError("client id runs past the frame")
                client_id = bytes(buf[pos : pos + length]).decode("utf-8")
                pos += length
            elif length != -1:
                raise MalformedError(f"negative client id length {length}")
        if header_version >= 2:
            pos = _skip_tagged_fields(buf, pos, end)
    except UnicodeDecodeError as exc:
        raise HeaderError(f"client id is not valid UTF-8: {exc}") from None
    except (TruncatedError, MalformedError) as exc:
        raise HeaderError(f"request header v{header_version}: {exc}") from None
    header = RequestHeader(api_key, api_version, correlation_id, client_id, header_version)
    return header, pos


def encode_request_header(header: RequestHeader) -> bytes:
    """The bytes of ``header`` in its ``header_version``."""
    out = _PREFIX.pack(header.api_key, header.api_version, header.correlation_id)
    if header.header_version >= 1:
        if header.client_id is None:
            out += _INT16.pack(-1)
        else:
            raw = header.client_id.encode("utf-8")
            if len(raw) > 0x7FFF:
                raise ValueError("client id longer than 32767 bytes")
            out += _INT16.pack(len(raw)) + raw
    if header.header_version >= 2:
        out += _NO_TAGS
    return out


def decode_response_header(buf: memoryview, header_version: int) -> tuple[ResponseHeader, int]:
    """Read a response header; return it and the offset of the body.

    :raises TruncatedError, MalformedError: the header is truncated or malformed.
    """
    if len(buf) < 4:
        raise TruncatedError(f"a response header needs 4 bytes, the frame has {len(buf)}")
    correlation_id = int(_INT32.unpack_from(buf, 0)[0])
    pos = 4
    if header_version >= 1:
        pos = _skip_tagged_fields(buf, pos, len(buf))
    return ResponseHeader(correlation_id, header_version), pos


def encode_response_header(header: ResponseHeader) -> bytes:
    out = _INT32.pack(header.correlation_id)
    if header.header_version >= 1:
        out += _NO_TAGS
    return out


__all__ = [
    "REQUEST_HEADER_PREFIX_SIZE",
    "RequestHeader",
    "ResponseHeader",
    "decode_request_header",
    "decode_response_header",
    "encode_request_header",
    "encode_response_header",
    "read_request_prefix",
]
