from __future__ import annotations

import datetime
import struct
import tracemalloc
import uuid

import pytest
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.fetch.v4 import request as fetch_v4
from kio.schema.fetch.v12 import response as fetch_v12_response
from kio.schema.fetch.v15 import request as fetch_v15
from kio.schema.join_group.v5 import request as join_v5
from kio.schema.metadata.v1 import request as metadata_v1
from kio.schema.metadata.v12 import request as metadata_v12
from kio.schema.metadata.v12 import response as metadata_v12_response
from kio.schema.produce.v3 import request as produce_v3
from kio.schema.produce.v9 import request as produce_v9
from kio.schema.produce.v10 import response as produce_v10_response
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from tidelog.protocol import (
    ApiKey,
    EncodeError,
    HeaderError,
    MalformedError,
    ProtocolError,
    RequestHeader,
    ResponseDecodeError,
    TruncatedError,
    UnknownApiKeyError,
    UnsupportedVersionError,
    decode_response,
    encode_request,
    encode_response,
    encode_response_for,
    parse_request,
    peek_correlation_id,
)
from tidelog.protocol.error_codes import ErrorCode
from tidelog.protocol.validate import encode_uvarint
from tidelog.protocol.versions import SUPPORTED_VERSIONS, restrict


def _ms(value: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


def _body(framed: bytes) -> bytes:
    assert struct.unpack(">i", framed[:4])[0] == len(framed) - 4
    return framed[4:]


def _requests() -> list[object]:
    return [
        metadata_v1.MetadataRequest(topics=(metadata_v1.MetadataRequestTopic(name="t"),)),
        metadata_v1.MetadataRequest(topics=None),
        metadata_v12.MetadataRequest(
            topics=(metadata_v12.MetadataRequestTopic(topic_id=uuid.uuid4(), name=None),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=True,
        ),
        produce_v3.ProduceRequest(
            transactional_id=None,
            acks=i16(-1),
            timeout=_ms(1500),
            topic_data=(
                produce_v3.TopicProduceData(
                    name="orders",
                    partition_data=(
                        produce_v3.PartitionProduceData(index=i32(0), records=b"\x01" * 70),
                        produce_v3.PartitionProduceData(index=i32(1), records=None),
                    ),
                ),
            ),
        ),
        produce_v9.ProduceRequest(
            transactional_id="tx",
            acks=i16(1),
            timeout=_ms(30000),
            topic_data=(
                produce_v9.TopicProduceData(
                    name="t",
                    partition_data=(produce_v9.PartitionProduceData(index=i32(3), records=b"r"),),
                ),
            ),
        ),
        fetch_v4.FetchRequest(
            replica_id=i32(-1),
            max_wait=_ms(500),
            min_bytes=i32(1),
            max_bytes=i32(52428800),
            isolation_level=i8(0),
            topics=(
                fetch_v4.FetchTopic(
                    topic="t",
                    partitions=(
                        fetch_v4.FetchPartition(
                            partition=i32(0), fetch_offset=i64(42), partition_max_bytes=i32(1 << 20)
                        ),
                    ),
                ),
            ),
        ),
        join_v5.JoinGroupRequest(
            group_id="g",
            session_timeout=_ms(10000),
            rebalance_timeout=_ms(300000),
            member_id="",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=(join_v5.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01"),),
        ),
    ]


@pytest.mark.parametrize("request_", _requests(), ids=lambda r: type(r).__module__)
def test_request_round_trip(request_: object) -> None:
    framed = encode_request(request_, correlation_id=123, client_id="cli")  # type: ignore[arg-type]
    header, parsed = parse_request(_body(framed))
    assert parsed == request_
    assert header.correlation_id == 123
    assert header.client_id == "cli"
    assert header.api_key == request_.__api_key__  # type: ignore[attr-defined]
    assert header.api_version == request_.__version__  # type: ignore[attr-defined]


def test_parse_accepts_bytes_bytearray_and_memoryview() -> None:
    request = metadata_v1.MetadataRequest(topics=None)
    body = _body(encode_request(request, correlation_id=1, client_id=None))
    for frame in (body, bytearray(body), memoryview(body)):
        assert parse_request(frame)[1] == request


def _metadata_v12_response() -> metadata_v12_response.MetadataResponse:
    return metadata_v12_response.MetadataResponse(
        throttle_time=_ms(0),
        brokers=(
            metadata_v12_response.MetadataResponseBroker(
                node_id=i32(1), host="localhost", port=i32(9092), rack=None
            ),
        ),
        cluster_id="c",
        controller_id=i32(1),
        topics=(
            metadata_v12_response.MetadataResponseTopic(
                error_code=KioErrorCode.none,
                name="t",
                topic_id=uuid.UUID(int=5),
                is_internal=False,
                partitions=(
                    metadata_v12_response.MetadataResponsePartition(
                        error_code=KioErrorCode.none,
                        partition_index=i32(0),
                        leader_id=i32(1),
                        leader_epoch=i32(0),
                        replica_nodes=(i32(1),),
                        isr_nodes=(i32(1),),
                        offline_replicas=(),
                    ),
                ),
                topic_authorized_operations=i32(-2147483648),
            ),
        ),
    )


def _produce_v10_response(error: KioErrorCode) -> produce_v10_response.ProduceResponse:
    return produce_v10_response.ProduceResponse(
        responses=(
            produce_v10_response.TopicProduceResponse(
                name="t",
                partition_responses=(
                    produce_v10_response.PartitionProduceResponse(
                        index=i32(0),
                        error_code=error,
                        base_offset=i64(10),
                        log_append_time=None,
                        log_start_offset=i64(0),
                        record_errors=(),
                        error_message=None,
                        current_leader=produce_v10_response.LeaderIdAndEpoch(
                            leader_id=i32(2), leader_epoch=i32(7)
                        ),
                    ),
                ),
            ),
        ),
        throttle_time=_ms(0),
    )


def test_response_round_trip_flexible_with_tagged_struct() -> None:
    response = _produce_v10_response(KioErrorCode.not_leader_or_follower)
    header = RequestHeader(ApiKey.PRODUCE, 10, 77, "c", 2)
    framed = encode_response(header, response)
    assert framed[4:9] == b"\x00\x00\x00\x4d\x00"  # correlation id, then header v1's empty tags
    got_header, got = decode_response(_body(framed), api_key=0, api_version=10, correlation_id=77)
    assert got == response
    assert got_header.header_version == 1


def test_response_round_trip_metadata_and_fetch() -> None:
    response = _metadata_v12_response()
    framed = encode_response(RequestHeader(ApiKey.METADATA, 12, 5, None, 2), response)
    assert decode_response(_body(framed), api_key=3, api_version=12)[1] == response

    fetch = fetch_v12_response.FetchResponse(
        throttle_time=_ms(0),
        error_code=KioErrorCode.none,
        session_id=i32(0),
        responses=(
            fetch_v12_response.FetchableTopicResponse(
                topic="t",
                partitions=(
                    fetch_v12_response.PartitionData(
                        partition_index=i32(0),
                        error_code=KioErrorCode.none,
                        high_watermark=i64(100),
                        last_stable_offset=i64(100),
                        log_start_offset=i64(0),
                        aborted_transactions=None,
                        preferred_read_replica=i32(-1),
                        records=b"\x00" * 61,
                    ),
                ),
            ),
        ),
    )
    framed = encode_response(RequestHeader(ApiKey.FETCH, 12, 6, None, 2), fetch)
    assert decode_response(_body(framed), api_key=1, api_version=12)[1] == fetch


def test_peek_correlation_id() -> None:
    framed = encode_response_for(-5, _metadata_v12_response())
    assert peek_correlation_id(_body(framed)) == -5
    with pytest.raises(ResponseDecodeError):
        peek_correlation_id(b"\x00\x01")


# -- errors ----------------------------------------------------------------------------------


def test_unknown_api_key_closes_without_a_header() -> None:
    raw = struct.pack(">hhih", 999, 0, 17, -1)
    with pytest.raises(UnknownApiKeyError) as info:
        parse_request(raw)
    assert info.value.header is None
    assert info.value.close_connection
    assert info.value.raw_correlation_id == 17


def test_frame_too_short_for_a_header() -> None:
    with pytest.raises(HeaderError) as info:
        parse_request(b"\x00\x03\x00")
    assert info.value.header is None


@pytest.mark.parametrize(
    ("api_key", "api_version"),
    [(ApiKey.PRODUCE, 2), (ApiKey.PRODUCE, 0), (ApiKey.FETCH, 3), (ApiKey.METADATA, 14)],
)
def test_unsupported_versions_carry_the_header(api_key: int, api_version: int) -> None:
    raw = struct.pack(">hhih", api_key, api_version, 31, 1) + b"x" + b"\x00" * 8
    with pytest.raises(UnsupportedVersionError) as info:
        parse_request(raw)
    err = info.value
    assert (err.api_key, err.api_version, err.correlation_id) == (api_key, api_version, 31)
    assert err.header is not None and err.header.client_id == "x"
    assert err.error_code is ErrorCode.UNSUPPORTED_VERSION
    assert err.close_connection  # what Kafka does for every API but ApiVersions


def test_unknown_api_versions_version_is_answerable() -> None:
    # A v9 ApiVersions request: flexible, so header v2, and a body we cannot read.
    raw = struct.pack(">hhih", 18, 9, 44, 3) + b"abc" + b"\x00" + b"whatever"
    with pytest.raises(UnsupportedVersionError) as info:
        parse_request(raw)
    assert not info.value.close_connection
    assert info.value.header == RequestHeader(18, 9, 44, "abc", 2)


def test_api_outside_the_passed_table_is_unsupported() -> None:
    body = _body(
        encode_request(metadata_v1.MetadataRequest(topics=None), correlation_id=1, client_id=None)
    )
    with pytest.raises(UnsupportedVersionError):
        parse_request(body, restrict([ApiKey.API_VERSIONS]))
    assert parse_request(body, SUPPORTED_VERSIONS)[0].api_key == ApiKey.METADATA


def test_truncated_body_carries_the_header() -> None:
    framed = encode_request(_requests()[3], correlation_id=8, client_id="p")  # type: ignore[arg-type]
    body = _body(framed)
    for cut in range(len(body) - 1, 10, -7):
        with pytest.raises(TruncatedError) as info:
            parse_request(body[:cut])
        err = info.value
        assert (err.api_key, err.api_version, err.correlation_id) == (0, 3, 8)
        assert err.error_code is ErrorCode.INVALID_REQUEST


def test_bytes_after_a_request_are_ignored_as_kafka_does() -> None:
    """librdkafka sends three stray bytes after an all-topics Metadata v12/v13 request."""
    from kio.schema.metadata.v13.request import MetadataRequest

    captured = bytes.fromhex("0003000d00000003000772646b61666b610000000000010000")
    header, request = parse_request(captured)
    assert (header.api_key, header.api_version, header.client_id) == (3, 13, "rdkafka")
    assert isinstance(request, MetadataRequest)
    assert request.topics is None
    body = _body(encode_request(_requests()[0], correlation_id=2, client_id=None))  # type: ignore[arg-type]
    assert parse_request(body + b"\x00\x01") == parse_request(body)


def test_bytes_after_a_response_are_refused() -> None:
    from kio.schema.api_versions.v0.response import ApiVersionsResponse

    response = ApiVersionsResponse(error_code=ErrorCode.NONE.to_kio(), api_keys=())
    framed = encode_response_for(5, response)
    with pytest.raises(ResponseDecodeError):
        decode_response(
            framed[4:] + b"\x00", api_key=ApiKey.API_VERSIONS, api_version=0, correlation_id=5
        )


def _metadata_v1_prefix() -> bytes:
    return struct.pack(">hhih", 3, 1, 99, -1)


def _metadata_v12_prefix() -> bytes:
    return struct.pack(">hhih", 3, 12, 99, -1) + b"\x00"


@pytest.mark.parametrize(
    "raw",
    [
        _metadata_v1_prefix() + struct.pack(">i", 2**31 - 1),
        _metadata_v1_prefix() + struct.pack(">i", 2**31 - 1) + b"\x00\x01a" * 100,
        _metadata_v12_prefix() + encode_uvarint(2**32 - 1),
        # 2^32 + 5: kio's native reader would try to reserve 32 GiB for this and abort.
        _metadata_v12_prefix() + encode_uvarint(2**32 + 5),
        _metadata_v12_prefix() + encode_uvarint(2**34),
    ],
)
def test_huge_counts_fail_fast_without_allocating(raw: bytes) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(TruncatedError) as info:
            parse_request(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200_000
    assert info.value.correlation_id == 99


def test_huge_counts_do_not_reserve_native_memory() -> None:
    # tracemalloc sees only Python's allocator; the native reader allocates through malloc.
    # VmPeak (peak virtual size) would jump by gigabytes had anything reserved the space.
    def vm_peak_kib() -> int:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmPeak:"):
                    return int(line.split()[1])
        raise AssertionError("no VmPeak")

    before = vm_peak_kib()
    for count in (2**31 - 1, 2**30, 2**28):
        with pytest.raises(TruncatedError):
            parse_request(_metadata_v1_prefix() + struct.pack(">i", count))
        with pytest.raises(TruncatedError):
            parse_request(_metadata_v12_prefix() + encode_uvarint(count))
    assert vm_peak_kib() - before < 256 * 1024


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (_metadata_v1_prefix() + struct.pack(">i", -2), MalformedError),
        (_metadata_v1_prefix() + struct.pack(">ih", 1, -3), MalformedError),
        (_metadata_v1_prefix() + struct.pack(">ih", 1, 2) + b"\xff\xfe", MalformedError),
        (_metadata_v12_prefix() + b"\xff" * 6, MalformedError),  # varint too long
        (_metadata_v12_prefix() + b"\x01\x02\x00\x00", MalformedError),  # bool 2
        (_metadata_v12_prefix() + b"\x01", TruncatedError),
    ],
)
def test_malformed_values(raw: bytes, error: type[ProtocolError]) -> None:
    with pytest.raises(error) as info:
        parse_request(raw)
    assert info.value.header is not None


def test_unknown_tagged_fields_are_skipped_at_every_level() -> None:
    request = metadata_v12.MetadataRequest(
        topics=(metadata_v12.MetadataRequestTopic(topic_id=uuid.UUID(int=1), name="a"),),
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    framed = encode_request(request, correlation_id=3, client_id=None)
    body = bytearray(_body(framed))
    # Layout after the header (11 bytes): topics count(1) | topic: uuid(16) name(2) tags(1)
    # | two bools | top-level tags(1). Put an unknown tag in the topic and at the top level.
    topic_tags = 11 + 1 + 16 + 2
    assert body[topic_tags] == 0 and body[-1] == 0
    body[-1:] = b"\x02" + b"\x00\x01Z" + b"\x1f\x03xyz"
    body[topic_tags : topic_tags + 1] = b"\x01" + b"\x63\x02ab"
    header, parsed = parse_request(bytes(body))
    assert parsed == request
    assert header.correlation_id == 3


def test_unknown_tag_inside_a_known_tagged_struct_is_dropped() -> None:
    request = fetch_v15.FetchRequest(
        max_wait=_ms(100),
        min_bytes=i32(1),
        max_bytes=i32(1000),
        isolation_level=i8(1),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(),
        forgotten_topics_data=(),
        rack_id="",
        replica_state=fetch_v15.ReplicaState(replica_id=i32(4), replica_epoch=i64(9)),
    )
    body = _body(encode_request(request, correlation_id=1, client_id=None))
    # The request ends with its tag section: count 1, tag 1, size 13, the struct (4+8 bytes and
    # its own empty tag section). Give the struct an unknown tag, growing it by 4 bytes.
    tail = b"\x01\x01\x0d" + struct.pack(">iq", 4, 9) + b"\x00"
    assert body.endswith(tail)
    grown = b"\x01\x01\x11" + struct.pack(">iq", 4, 9) + b"\x01\x08\x02ok"
    _, parsed = parse_request(body[: -len(tail)] + grown)
    assert parsed == request
    # A declared size that disagrees with the value is malformed.
    with pytest.raises(MalformedError):
        parse_request(body[: -len(tail)] + b"\x01\x01\x0e" + struct.pack(">iq", 4, 9) + b"\x00\x00")


def test_unknown_error_codes_read_as_unknown_server_error() -> None:
    framed = encode_response_for(1, _produce_v10_response(KioErrorCode.none))
    body = bytearray(_body(framed))
    # The partition's error code follows: header(5) count(1) name(2) partitions count(1) index(4)
    position = 5 + 1 + 2 + 1 + 4
    assert body[position : position + 2] == b"\x00\x00"
    body[position : position + 2] = struct.pack(">h", 4242)
    _, response = decode_response(bytes(body), api_key=0, api_version=10)
    code = response.responses[0].partition_responses[0].error_code  # type: ignore[attr-defined]
    assert code == KioErrorCode.unknown_server_error


def test_response_correlation_mismatch_and_garbage() -> None:
    framed = encode_response_for(1, _metadata_v12_response())
    with pytest.raises(ResponseDecodeError):
        decode_response(_body(framed), api_key=3, api_version=12, correlation_id=2)
    with pytest.raises(ResponseDecodeError):
        decode_response(_body(framed)[:-3], api_key=3, api_version=12)
    with pytest.raises(ResponseDecodeError):
        decode_response(b"\x00\x00", api_key=3, api_version=12)
    with pytest.raises(ValueError):
        decode_response(_body(framed), api_key=3, api_version=99)


def test_encode_response_checks_it_answers_the_request() -> None:
    with pytest.raises(EncodeError):
        encode_response(RequestHeader(ApiKey.METADATA, 11, 1, None, 2), _metadata_v12_response())
    with pytest.raises(EncodeError):
        encode_response(RequestHeader(ApiKey.FETCH, 12, 1, None, 2), _metadata_v12_response())


def test_encode_errors_are_protocol_errors() -> None:
    bad = metadata_v1.MetadataRequest(topics=(metadata_v1.MetadataRequestTopic(name="x" * 40000),))
    with pytest.raises(EncodeError):
        encode_request(bad, correlation_id=1, client_id=None)
    with pytest.raises(EncodeError):
        encode_request(
            metadata_v1.MetadataRequest(topics=None), correlation_id=1, client_id="c" * 40000
        )


@pytest.mark.parametrize(
    "frame_hex",
    [
        pytest.param("000200010000004d00046e756c6cffffffffffffffff", id="list-offsets-topics"),
        pytest.param("000000030000004d00046e756c6cffff0001000003e8ffffffff", id="produce-topics"),
        pytest.param("003d00000000004d00046e756c6c000000", id="describe-producers-topics"),
    ],
)
def test_null_for_a_non_nullable_field_is_malformed(frame_hex: str) -> None:
    """Kafka refuses these; passing None on would crash handlers that expect a list."""
    with pytest.raises(MalformedError, match="non-nullable"):
        parse_request(bytes.fromhex(frame_hex))


def test_null_where_the_schema_allows_it_is_kept() -> None:
    # Metadata v1 with topics = null: "all topics".
    header, request = parse_request(struct.pack(">hhih", 3, 1, 9, -1) + struct.pack(">i", -1))
    assert header.api_version == 1
    assert request.topics is None  # type: ignore[union-attr]


def test_a_null_spelled_as_a_two_byte_varint_is_still_null() -> None:
    """Compact length 0 written as 80 00: the same null, and still refused."""
    header = struct.pack(">hhih", 0, 9, 1, 1) + b"x" + b"\x00"  # Produce v9, header v2
    body = b"\x00" + struct.pack(">hi", 1, 1000) + b"\x80\x00" + b"\x00"
    with pytest.raises(MalformedError, match="non-nullable"):
        parse_request(header + body)
