"""tidelog.protocol: the Kafka wire protocol, sans-io.

Framing (:mod:`.framing`), request/response headers (:mod:`.headers`), the API table and header
versions (:mod:`.apis`), the supported-version table (:mod:`.versions`), reading and writing
messages (:mod:`.codec`, with :mod:`.validate` guarding kio against hostile lengths), ApiVersions
responses (:mod:`.api_versions`), Kafka error codes (:mod:`.error_codes`) and the exceptions
raised for bad input (:mod:`.errors`). Message bodies are kio's classes. No I/O happens here.
"""

from tidelog.protocol.api_versions import api_versions_response, encode_api_versions_fallback
from tidelog.protocol.apis import (
    ApiKey,
    api_name,
    is_flexible,
    request_class,
    request_header_version,
    response_class,
    response_header_version,
)
from tidelog.protocol.codec import (
    decode_response,
    encode_request,
    encode_response,
    encode_response_for,
    parse_request,
    parse_request_header,
    peek_correlation_id,
)
from tidelog.protocol.error_codes import ErrorCode
from tidelog.protocol.errors import (
    BodyError,
    EncodeError,
    FrameError,
    FrameTooLargeError,
    HeaderError,
    IncompleteFrameError,
    MalformedError,
    NegativeFrameSizeError,
    ProtocolError,
    ResponseDecodeError,
    TrailingBytesError,
    TruncatedError,
    UnknownApiKeyError,
    UnsupportedVersionError,
)
from tidelog.protocol.framing import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, frame
from tidelog.protocol.headers import RequestHeader, ResponseHeader
from tidelog.protocol.versions import SUPPORTED_VERSIONS, VersionRange, restrict

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "SUPPORTED_VERSIONS",
    "ApiKey",
    "BodyError",
    "EncodeError",
    "ErrorCode",
    "FrameDecoder",
    "FrameError",
    "FrameTooLargeError",
    "HeaderError",
    "IncompleteFrameError",
    "MalformedError",
    "NegativeFrameSizeError",
    "ProtocolError",
    "RequestHeader",
    "ResponseDecodeError",
    "ResponseHeader",
    "TrailingBytesError",
    "TruncatedError",
    "UnknownApiKeyError",
    "UnsupportedVersionError",
    "VersionRange",
    "api_name",
    "api_versions_response",
    "decode_response",
    "encode_api_versions_fallback",
    "encode_request",
    "encode_response",
    "encode_response_for",
    "frame",
    "is_flexible",
    "parse_request",
    "parse_request_header",
    "peek_correlation_id",
    "request_class",
    "request_header_version",
    "response_class",
    "response_header_version",
    "restrict",
]
