"""Reading and writing whole messages: header plus kio message body, in size-prefixed frames.

Server side::

    header, request = parse_request(frame)          # frame: one frame from FrameDecoder
    ...
    out = encode_response(header, response)          # size-prefixed bytes to send

Client side::

    out = encode_request(request, correlation_id=7, client_id="tidelog")
    correlation_id = peek_correlation_id(frame)      # match the frame to an in-flight request
    header, response = decode_response(frame, api_key=..., api_version=..., correlation_id=7)

Every failure to read raises a :class:`~tidelog.protocol.errors.ProtocolError` subclass (see
that module for what the broker does with each); bodies are checked by
:mod:`tidelog.protocol.validate` before kio reads them, so no length from the wire is trusted.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Mapping
from typing import Final, TypeVar, cast

from kio.serial import entity_reader, entity_writer
from kio.serial.readers import Reader
from kio.static.protocol import Entity, RequestPayload, ResponsePayload

from tidelog.protocol.apis import (
    ApiKey,
    api_name,
    as_api_key,
    is_known_api,
    request_class,
    request_header_version,
    response_class,
    response_header_version,
)
from tidelog.protocol.errors import (
    BodyError,
    EncodeError,
    MalformedError,
    ProtocolError,
    ResponseDecodeError,
    UnknownApiKeyError,
    UnsupportedVersionError,
)
from tidelog.protocol.framing import SIZE_PREFIX, BytesLike
from tidelog.protocol.headers import (
    RequestHeader,
    ResponseHeader,
    decode_request_header,
    decode_response_header,
    encode_request_header,
    encode_response_header,
    read_request_prefix,
)
from tidelog.protocol.validate import check_body
from tidelog.protocol.versions import SUPPORTED_VERSIONS, VersionRange

E = TypeVar("E", bound=Entity)

_SIZE_PLACEHOLDER: Final = b"\x00\x00\x00\x00"
_INT32: Final = struct.Struct(">i")


_readers: dict[type, object] = {}


def _reader(entity_type: type[E]) -> Reader[E]:
    """kio's reader for a class, built once (building one walks the class's fields)."""
    reader = _readers.get(entity_type)
    if reader is None:
        reader = _readers[entity_type] = entity_reader(entity_type)
    return cast("Reader[E]", reader)


def _view(frame: BytesLike) -> memoryview:
    # kio's reader accepts read-only buffers only.
    return memoryview(frame).cast("B").toreadonly()


def _read_body(
    entity_type: type[E], buf: memoryview, offset: int, *, ignore_trailing: bool = False
) -> E:
    """Check, then read, ``buf[offset:]`` as one ``entity_type`` (see :func:`check_body`
    for ``ignore_trailing``).

    :raises BodyError: any way in which the body is not a valid message.
    """
    data, start = check_body(entity_type, buf, offset, ignore_trailing=ignore_trailing)
    try:
        value, size = _reader(entity_type)(data, start)
    except Exception as exc:  # kio's DecodeErrors, and ValueErrors for values out of range
        raise MalformedError(f"{entity_type.__name__}: {exc}") from exc
    if start + size != len(data):
        # The layout check and kio disagree about where the message ends: treat it as bad input.
        raise MalformedError(f"{entity_type.__name__}: message length is inconsistent")
    return value


# -- server side -----------------------------------------------------------------------------


def parse_request_header(
    frame: BytesLike,
) -> tuple[RequestHeader, int]:
    """Read only the header of a request frame; return it and the offset of the body.

    :raises HeaderError: fewer than 8 bytes, or a malformed client id or tagged field section.
    :raises UnknownApiKeyError: an API key Tidelog does not know (the header version, and so
        the rest of the header, cannot be determined).
    """
    buf = _view(frame)
    api_key, api_version, correlation_id = read_request_prefix(buf)
    if not is_known_api(api_key):
        raise UnknownApiKeyError(
            f"unknown API key {api_key} (version {api_version}, correlation id {correlation_id})",
            api_key=api_key,
            api_version=api_version,
            correlation_id=correlation_id,
        )
    return decode_request_header(buf, request_header_version(api_key, api_version))


def parse_request(
    frame: BytesLike,
    supported: Mapping[ApiKey, VersionRange] = SUPPORTED_VERSIONS,
) -> tuple[RequestHeader, RequestPayload]:
    """Read one request frame (without its size prefix) into its header and kio request.

    Only versions in the *accepted* range of ``supported`` are read.

    :raises HeaderError: see :func:`parse_request_header` (``header`` is None).
    :raises UnsupportedVersionError: the API is not in ``supported`` or the version is outside
        its accepted range (``header`` set). For ApiVersions, answer with
        :func:`~tidelog.protocol.api_versions.encode_api_versions_fallback`.
    :raises BodyError: the body is truncated, has trailing bytes or is malformed (``header``
        set).
    """
    buf = _view(frame)
    header, offset = parse_request_header(buf)
    api_key = as_api_key(header.api_key)
    entry = None if api_key is None else supported.get(api_key)
    cls = request_class(header.api_key, header.api_version)
    if entry is None or not entry.accepts(header.api_version) or cls is None:
        raise UnsupportedVersionError(
            f"{api_name(header.api_key)} v{header.api_version} is not supported",
            header=header,
        )
    try:
        return header, _read_body(cls, buf, offset, ignore_trailing=True)
    except BodyError as exc:
        exc.header = header
        exc.args = (f"{api_name(header.api_key)} v{header.api_version} request: {exc}",)
        raise


def _encode(header_bytes: bytes, body: Entity) -> bytes:
    out = io.BytesIO()
    out.write(_SIZE_PLACEHOLDER)
    out.write(header_bytes)
    try:
        entity_writer(type(body))(out, body)
    except Exception as exc:  # kio raises struct.error, TypeError, OutOfBoundValue, ...
        raise EncodeError(f"cannot encode {type(body).__name__}: {exc}") from exc
    view = out.getbuffer()
    _INT32.pack_into(view, 0, len(view) - SIZE_PREFIX.size)
    del view
    return out.getvalue()


def encode_response_for(correlation_id: int, response: ResponsePayload) -> bytes:
    """Frame ``response`` with a response header carrying ``correlation_id``.

    The header version follows from the response's own API key and version. Prefer
    :func:`encode_response`, which also checks that the response answers the request.
    """
    header_version = response_header_version(response.__api_key__, response.__version__)
    header = encode_response_header(ResponseHeader(correlation_id, header_version))
    return _encode(header, response)


def encode_response(header: RequestHeader, response: ResponsePayload) -> bytes:
    """The size-prefixed bytes of ``response`` answering the request with ``header``.

    :raises EncodeError: the response's API key or version differs from the request's, or a
        value does not fit its field.
    """
    if response.__api_key__ != header.api_key or response.__version__ != header.api_version:
        raise EncodeError(
            f"{type(response).__name__} v{response.__version__} (API key "
            f"{response.__api_key__}) does not answer {api_name(header.api_key)} "
            f"v{header.api_version}"
        )
    return encode_response_for(header.correlation_id, response)


# -- client side -----------------------------------------------------------------------------


def encode_request(request: RequestPayload, *, correlation_id: int, client_id: str | None) -> bytes:
    """The size-prefixed bytes of ``request``; API key and version come from its class.

    :raises EncodeError: a value does not fit its field (or the client id is too long).
    """
    api_key = int(request.__api_key__)
    api_version = int(request.__version__)
    header = RequestHeader(
        api_key,
        api_version,
        correlation_id,
        client_id,
        request_header_version(api_key, api_version),
    )
    try:
        header_bytes = encode_request_header(header)
    except (ValueError, struct.error) as exc:
        raise EncodeError(f"cannot encode request header: {exc}") from exc
    return _encode(header_bytes, request)


def peek_correlation_id(frame: BytesLike) -> int:
    """The correlation id of a response frame (the first 4 bytes of every response header).

    :raises ResponseDecodeError: the frame is shorter than 4 bytes.
    """
    buf = _view(frame)
    if len(buf) < 4:
        raise ResponseDecodeError(f"response frame of {len(buf)} bytes has no correlation id")
    return int(_INT32.unpack_from(buf, 0)[0])


def decode_response(
    frame: BytesLike,
    *,
    api_key: int,
    api_version: int,
    correlation_id: int | None = None,
) -> tuple[ResponseHeader, ResponsePayload]:
    """Read a response frame (without its size prefix) to a request of (api_key, api_version).

    An ApiVersions response that does not read as ``api_version`` is read again as v0: a
    broker that does not know the version answers with v0 and UNSUPPORTED_VERSION (KIP-511);
    check the returned response's ``error_code``.

    :raises ValueError: kio has no schema for (api_key, api_version) -- a caller bug.
    :raises ResponseDecodeError: the frame is not a valid response, or its correlation id
        differs from ``correlation_id``.
    """
    cls = response_class(api_key, api_version)
    if cls is None:
        raise ValueError(f"no response schema for {api_name(api_key)} v{api_version}")
    buf = _view(frame)
    try:
        header, offset = decode_response_header(buf, response_header_version(api_key, api_version))
    except ProtocolError as exc:
        raise ResponseDecodeError(f"{api_name(api_key)} response header: {exc}") from exc
    if correlation_id is not None and header.correlation_id != correlation_id:
        raise ResponseDecodeError(
            f"response carries correlation id {header.correlation_id}, expected {correlation_id}"
        )
    try:
        return header, _read_body(cls, buf, offset)
    except BodyError as exc:
        fallback = response_class(api_key, 0) if api_key == ApiKey.API_VERSIONS else None
        if fallback is not None and api_version != 0:
            try:
                return header, _read_body(fallback, buf, offset)
            except BodyError:
                pass
        raise ResponseDecodeError(f"{api_name(api_key)} v{api_version} response: {exc}") from exc
