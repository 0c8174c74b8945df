from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.index import api_key_map
from kio.schema.request_header.v1.header import RequestHeader as KioRequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as KioRequestHeaderV2
from kio.serial import entity_writer
from kio.static.primitive import i16, i32

from tidelog.protocol import (
    ApiKey,
    HeaderError,
    RequestHeader,
    ResponseHeader,
    is_flexible,
    request_class,
    request_header_version,
    response_class,
    response_header_version,
)
from tidelog.protocol.apis import kio_versions
from tidelog.protocol.headers import (
    decode_request_header,
    decode_response_header,
    encode_request_header,
    encode_response_header,
)

int16s = st.integers(min_value=-(2**15), max_value=2**15 - 1)
int32s = st.integers(min_value=-(2**31), max_value=2**31 - 1)
client_ids = st.none() | st.text(max_size=40)


def test_request_header_v0_bytes() -> None:
    header = RequestHeader(7, 0, 258, None, header_version=0)
    raw = encode_request_header(header)
    assert raw == b"\x00\x07\x00\x00\x00\x00\x01\x02"
    assert decode_request_header(memoryview(raw), 0) == (header, 8)


def test_request_header_v1_bytes() -> None:
    header = RequestHeader(3, 1, 9, "ab", header_version=1)
    raw = encode_request_header(header)
    assert raw == b"\x00\x03\x00\x01\x00\x00\x00\x09\x00\x02ab"
    assert decode_request_header(memoryview(raw + b"BODY"), 1) == (header, len(raw))


def test_request_header_v2_bytes_keep_the_int16_client_id() -> None:
    header = RequestHeader(18, 3, 1, None, header_version=2)
    raw = encode_request_header(header)
    assert raw == b"\x00\x12\x00\x03\x00\x00\x00\x01\xff\xff\x00"
    assert decode_request_header(memoryview(raw), 2) == (header, len(raw))


def test_request_header_v2_skips_unknown_tagged_fields() -> None:
    raw = b"\x00\x12\x00\x03\x00\x00\x00\x01\x00\x01c" + b"\x02" + b"\x05\x02xy" + b"\x07\x00"
    header, offset = decode_request_header(memoryview(raw + b"rest"), 2)
    assert header == RequestHeader(18, 3, 1, "c", 2)
    assert offset == len(raw)


@given(api_key=int16s, api_version=int16s, correlation_id=int32s, client_id=client_ids)
def test_request_header_round_trip_and_agreement_with_kio(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None
) -> None:
    for version in (0, 1, 2):
        header = RequestHeader(
            api_key,
            api_version,
            correlation_id,
            client_id if version else None,
            header_version=version,
        )
        raw = encode_request_header(header)
        assert decode_request_header(memoryview(raw), version) == (header, len(raw))
    # kio writes headers v1 and v2 from Kafka's spec; ours must be the same bytes.
    kio_v1 = KioRequestHeaderV1(
        request_api_key=i16(api_key),
        request_api_version=i16(api_version),
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )
    kio_v2 = KioRequestHeaderV2(
        request_api_key=i16(api_key),
        request_api_version=i16(api_version),
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )
    for kio_header, version in ((kio_v1, 1), (kio_v2, 2)):
        out = io.BytesIO()
        entity_writer(type(kio_header))(out, kio_header)  # type: ignore[arg-type]
        ours = RequestHeader(api_key, api_version, correlation_id, client_id, version)
        assert encode_request_header(ours) == out.getvalue()


@given(correlation_id=int32s)
def test_response_header_round_trip(correlation_id: int) -> None:
    v0 = encode_response_header(ResponseHeader(correlation_id, 0))
    v1 = encode_response_header(ResponseHeader(correlation_id, 1))
    assert v0 == struct.pack(">i", correlation_id)
    assert v1 == v0 + b"\x00"
    assert decode_response_header(memoryview(v0), 0) == (ResponseHeader(correlation_id, 0), 4)
    assert decode_response_header(memoryview(v1), 1) == (ResponseHeader(correlation_id, 1), 5)


def test_response_header_v1_skips_unknown_tags() -> None:
    raw = b"\x00\x00\x00\x05" + b"\x01" + b"\x09\x01z"
    assert decode_response_header(memoryview(raw), 1) == (ResponseHeader(5, 1), len(raw))


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x00\x03\x00\x01\x00\x00",  # shorter than the fixed prefix
        b"\x00\x03\x00\x01\x00\x00\x00\x01\x00",  # half a client id length
        b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x05ab",  # client id runs past the frame
        b"\x00\x03\x00\x01\x00\x00\x00\x01\xff\xfe",  # length -2
        b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x02\xff\xfe",  # not UTF-8
    ],
)
def test_bad_request_headers_raise_header_error(raw: bytes) -> None:
    with pytest.raises(HeaderError):
        decode_request_header(memoryview(raw), 1)


@pytest.mark.parametrize(
    "tags",
    [b"", b"\x01", b"\x01\x05", b"\x01\x05\x09ab", b"\xff\xff\xff\xff\xff\xff"],
)
def test_bad_v2_tag_sections_raise_header_error(tags: bytes) -> None:
    with pytest.raises(HeaderError):
        decode_request_header(memoryview(b"\x00\x03\x00\x0c\x00\x00\x00\x01\xff\xff" + tags), 2)


def test_header_versions_follow_flexibility() -> None:
    assert request_header_version(ApiKey.METADATA, 8) == 1
    assert request_header_version(ApiKey.METADATA, 9) == 2
    assert response_header_version(ApiKey.METADATA, 8) == 0
    assert response_header_version(ApiKey.METADATA, 9) == 1
    assert request_header_version(ApiKey.PRODUCE, 0) == 1  # below kio's range, not flexible
    # ApiVersions responses always use header v0; its requests follow the rule.
    assert [response_header_version(ApiKey.API_VERSIONS, v) for v in range(6)] == [0] * 6
    assert request_header_version(ApiKey.API_VERSIONS, 2) == 1
    assert request_header_version(ApiKey.API_VERSIONS, 3) == 2
    # A version newer than kio knows of an API whose newest version is flexible: flexible.
    assert request_header_version(ApiKey.API_VERSIONS, 99) == 2
    # ControlledShutdown v0 is the one request with header v0.
    assert request_header_version(7, 0) == 0
    assert request_header_version(7, 1) == 1
    assert request_header_version(7, 3) == 2
    # APIs born flexible are flexible from version 0.
    assert is_flexible(ApiKey.DESCRIBE_CLUSTER, 0)
    with pytest.raises(ValueError):
        request_header_version(999, 0)


def test_header_versions_agree_with_kio_header_schemas_everywhere() -> None:
    checked = 0
    for key in api_key_map:
        span = kio_versions(key)
        assert span is not None
        for version in range(span[0], span[1] + 1):
            request = request_class(key, version)
            response = response_class(key, version)
            assert request is not None and response is not None
            assert request.__flexible__ == is_flexible(key, version)
            assert request.__header_schema__.__version__ == request_header_version(key, version)
            assert response.__header_schema__.__version__ == response_header_version(key, version)
            checked += 1
    assert checked > 200


def test_api_key_enum_matches_kio() -> None:
    assert {int(k): k.name.lower() for k in ApiKey} == dict(api_key_map)
