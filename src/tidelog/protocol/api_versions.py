"""ApiVersions responses built from the supported-version table.

A client's first request on a connection is ApiVersions; the answer lists, per API, the
*advertised* version range (see :mod:`tidelog.protocol.versions`), and the client then uses
the highest version both sides know for each API.

When the request's version is newer than any Tidelog knows, its body cannot be read, but its
header can (its correlation id sits at a fixed place). KIP-511: the broker then answers with a
**v0** response carrying UNSUPPORTED_VERSION and, in ``api_keys``, the range of ApiVersions
itself, so that the client can retry with the highest version the broker knows. A v0 response
uses response header v0 and the pre-flexible encoding, which every client can read.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping

from kio.schema.api_versions.v0 import response as v0
from kio.schema.api_versions.v1 import response as v1
from kio.schema.api_versions.v2 import response as v2
from kio.schema.api_versions.v3 import response as v3
from kio.schema.api_versions.v4 import response as v4
from kio.static.primitive import i16, i32Timedelta

from tidelog.protocol.apis import ApiKey
from tidelog.protocol.codec import encode_response_for
from tidelog.protocol.error_codes import ErrorCode
from tidelog.protocol.headers import RequestHeader
from tidelog.protocol.versions import SUPPORTED_VERSIONS, VersionRange

ApiVersionsResponse = (
    v0.ApiVersionsResponse
    | v1.ApiVersionsResponse
    | v2.ApiVersionsResponse
    | v3.ApiVersionsResponse
    | v4.ApiVersionsResponse
)


def _entries(
    api_keys: Iterable[int] | None, supported: Mapping[ApiKey, VersionRange]
) -> list[tuple[int, int, int]]:
    wanted = None if api_keys is None else set(api_keys)
    return [
        (int(key), entry.min_version, entry.max_version)
        for key, entry in sorted(supported.items())
        if wanted is None or key in wanted
    ]


def api_versions_response(
    version: int,
    *,
    api_keys: Iterable[int] | None = None,
    supported: Mapping[ApiKey, VersionRange] = SUPPORTED_VERSIONS,
    error_code: ErrorCode = ErrorCode.NONE,
    throttle_time_ms: int = 0,
) -> ApiVersionsResponse:
    """An ApiVersions response of ``version`` (0-4) listing the advertised ranges.

    ``api_keys`` limits the list to the APIs the broker has handlers for (default: all of
    ``supported``). Entries are sorted by API key.
    """
    entries = _entries(api_keys, supported)
    code = error_code.to_kio()
    throttle = i32Timedelta.parse(datetime.timedelta(milliseconds=throttle_time_ms))
    if version == 0:
        return v0.ApiVersionsResponse(
            error_code=code,
            api_keys=tuple(
                v0.ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
                for k, lo, hi in entries
            ),
        )
    if version == 1:
        return v1.ApiVersionsResponse(
            error_code=code,
            api_keys=tuple(
                v1.ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
                for k, lo, hi in entries
            ),
            throttle_time=throttle,
        )
    if version == 2:
        return v2.ApiVersionsResponse(
            error_code=code,
            api_keys=tuple(
                v2.ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
                for k, lo, hi in entries
            ),
            throttle_time=throttle,
        )
    if version == 3:
        return v3.ApiVersionsResponse(
            error_code=code,
            api_keys=tuple(
                v3.ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
                for k, lo, hi in entries
            ),
            throttle_time=throttle,
        )
    if version == 4:
        return v4.ApiVersionsResponse(
            error_code=code,
            api_keys=tuple(
                v4.ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
                for k, lo, hi in entries
            ),
            throttle_time=throttle,
        )
    raise ValueError(f"ApiVersions v{version} is not one Tidelog can build")


def encode_api_versions_fallback(
    header: RequestHeader,
    *,
    supported: Mapping[ApiKey, VersionRange] = SUPPORTED_VERSIONS,
) -> bytes:
    """The framed v0 UNSUPPORTED_VERSION answer to an ApiVersions request we cannot read.

    Only ``header.correlation_id`` is used; the response lists the ApiVersions range alone, as
    KIP-511 specifies.
    """
    response = api_versions_response(
        0,
        api_keys=(ApiKey.API_VERSIONS,),
        supported=supported,
        error_code=ErrorCode.UNSUPPORTED_VERSION,
    )
    return encode_response_for(header.correlation_id, response)
