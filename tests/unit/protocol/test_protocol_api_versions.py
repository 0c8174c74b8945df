from __future__ import annotations

import struct

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest

from tidelog.protocol import (
    SUPPORTED_VERSIONS,
    ApiKey,
    ErrorCode,
    RequestHeader,
    UnsupportedVersionError,
    api_versions_response,
    decode_response,
    encode_api_versions_fallback,
    encode_request,
    encode_response,
    parse_request,
    request_class,
    response_class,
)
from tidelog.protocol.versions import VersionRange, restrict

# The APIs the broker's first releases serve (the brief's list).
FIRST_RELEASE_APIS = {
    ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS,
    ApiKey.OFFSET_FOR_LEADER_EPOCH, ApiKey.DELETE_RECORDS, ApiKey.CREATE_TOPICS,
    ApiKey.DELETE_TOPICS, ApiKey.CREATE_PARTITIONS, ApiKey.DESCRIBE_CONFIGS, ApiKey.ALTER_CONFIGS,
    ApiKey.INCREMENTAL_ALTER_CONFIGS, ApiKey.DESCRIBE_LOG_DIRS, ApiKey.DESCRIBE_PRODUCERS,
    ApiKey.INIT_PRODUCER_ID, ApiKey.DESCRIBE_CLUSTER, ApiKey.FIND_COORDINATOR, ApiKey.JOIN_GROUP,
    ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP, ApiKey.OFFSET_COMMIT,
    ApiKey.OFFSET_FETCH, ApiKey.LIST_GROUPS, ApiKey.DESCRIBE_GROUPS, ApiKey.DELETE_GROUPS,
    ApiKey.OFFSET_DELETE,
}  # fmt: skip
# Authentication (KIP-43, KIP-152), SCRAM credentials (KIP-554), ACLs (KIP-140) and client
# quotas (KIP-546).
SECURITY_APIS = {
    ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS, ApiKey.DESCRIBE_ACLS, ApiKey.CREATE_ACLS,
    ApiKey.DELETE_ACLS, ApiKey.DESCRIBE_CLIENT_QUOTAS, ApiKey.ALTER_CLIENT_QUOTAS,
}  # fmt: skip
# Transactions (KIP-98, KIP-664) with the transaction coordinator and the partition leaders.
TRANSACTION_APIS = {
    ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN,
    ApiKey.TXN_OFFSET_COMMIT, ApiKey.WRITE_TXN_MARKERS, ApiKey.DESCRIBE_TRANSACTIONS,
    ApiKey.LIST_TRANSACTIONS,
}  # fmt: skip
# Leader elections and partition reassignment (KIP-460, KIP-455), decided by the controller.
REPLICATION_APIS = {
    ApiKey.ELECT_LEADERS, ApiKey.ALTER_PARTITION_REASSIGNMENTS,
    ApiKey.LIST_PARTITION_REASSIGNMENTS,
}  # fmt: skip
# kio's newest version of these is transactions v2 (KIP-890 part 2), which is not served:
# a client that sees it advertised would rely on the server adding partitions implicitly.
SERVED_BELOW_KIO = {
    ApiKey.ADD_PARTITIONS_TO_TXN: 4,
    ApiKey.END_TXN: 4,
    ApiKey.TXN_OFFSET_COMMIT: 4,
}


def test_table_lists_exactly_the_first_release_apis() -> None:
    assert (
        set(SUPPORTED_VERSIONS)
        == FIRST_RELEASE_APIS | TRANSACTION_APIS | SECURITY_APIS | REPLICATION_APIS
    )


def test_every_accepted_version_has_kio_schemas() -> None:
    for key, entry in SUPPORTED_VERSIONS.items():
        for version in range(entry.min_accepted, entry.max_version + 1):
            assert request_class(key, version) is not None, (key, version)
            assert response_class(key, version) is not None, (key, version)
        # The widest range kio has: nothing above, nothing below (except advertised Produce),
        # except the transactions v2 versions.
        if key in SERVED_BELOW_KIO:
            assert entry.max_version == SERVED_BELOW_KIO[key]
            continue
        assert request_class(key, entry.max_version + 1) is None
        assert request_class(key, entry.min_accepted - 1) is None


def test_produce_is_advertised_from_zero_but_accepted_from_three() -> None:
    produce = SUPPORTED_VERSIONS[ApiKey.PRODUCE]
    assert (produce.min_version, produce.min_accepted) == (0, 3)
    assert not produce.accepts(2) and produce.accepts(3)
    others = [e for k, e in SUPPORTED_VERSIONS.items() if k != ApiKey.PRODUCE]
    assert all(e.min_version == e.min_accepted for e in others)
    assert SUPPORTED_VERSIONS[ApiKey.FETCH].min_accepted == 4


def test_version_range_rejects_inconsistent_bounds() -> None:
    with pytest.raises(ValueError):
        VersionRange(ApiKey.FETCH, 5, 4, 5)
    with pytest.raises(ValueError):
        VersionRange(ApiKey.FETCH, 4, 10, 3)


def test_v0_response_bytes_by_hand() -> None:
    response = api_versions_response(0, api_keys=[ApiKey.PRODUCE, ApiKey.API_VERSIONS])
    framed = encode_response(RequestHeader(ApiKey.API_VERSIONS, 0, 0x01020304, "c", 1), response)
    expected_body = (
        b"\x00\x00"  # error_code NONE
        b"\x00\x00\x00\x02"  # api_keys: int32 count 2
        b"\x00\x00" b"\x00\x00" b"\x00\x0d"  # Produce 0..13 (advertised from 0)
        b"\x00\x12" b"\x00\x00" b"\x00\x04"  # ApiVersions 0..4
    )  # fmt: skip
    header = b"\x01\x02\x03\x04"  # response header v0: correlation id only
    assert framed == struct.pack(">i", len(header + expected_body)) + header + expected_body


def test_v3_response_bytes_by_hand() -> None:
    response = api_versions_response(
        3, api_keys=[ApiKey.METADATA, ApiKey.FETCH], throttle_time_ms=7
    )
    framed = encode_response(RequestHeader(ApiKey.API_VERSIONS, 3, 9, None, 2), response)
    expected = (
        b"\x00\x00\x00\x09"  # response header v0 even though v3 is flexible: no tag section
        b"\x00\x00"  # error_code
        b"\x03"  # compact array: 2 entries + 1
        b"\x00\x01" b"\x00\x04" b"\x00\x12" b"\x00"  # Fetch 4..18, empty tags
        b"\x00\x03" b"\x00\x00" b"\x00\x0d" b"\x00"  # Metadata 0..13, empty tags
        b"\x00\x00\x00\x07"  # throttle_time_ms
        b"\x00"  # no tagged fields (features left at their defaults)
    )  # fmt: skip
    assert framed == struct.pack(">i", len(expected)) + expected


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_every_version_round_trips_through_a_client_decode(version: int) -> None:
    response = api_versions_response(version)
    framed = encode_response(
        RequestHeader(18, version, 5, None, 2 if version >= 3 else 1), response
    )
    _, decoded = decode_response(framed[4:], api_key=18, api_version=version, correlation_id=5)
    assert decoded == response
    listed = {(e.api_key, e.min_version, e.max_version) for e in decoded.api_keys}  # type: ignore[attr-defined]
    assert listed == {(k, e.min_version, e.max_version) for k, e in SUPPORTED_VERSIONS.items()}


def test_broker_can_advertise_a_subset() -> None:
    response = api_versions_response(2, api_keys=[ApiKey.METADATA, 9999])
    assert [e.api_key for e in response.api_keys] == [ApiKey.METADATA]
    table = restrict([ApiKey.API_VERSIONS])
    assert [e.api_key for e in api_versions_response(1, supported=table).api_keys] == [18]
    with pytest.raises(ValueError):
        api_versions_response(5)


def test_fallback_for_an_unknown_version_bytes_by_hand() -> None:
    raw = struct.pack(">hhih", 18, 127, 0x0A0B0C0D, 1) + b"x" + b"\x00" + b"\x99" * 5
    with pytest.raises(UnsupportedVersionError) as info:
        parse_request(raw)
    assert info.value.header is not None
    framed = encode_api_versions_fallback(info.value.header)
    expected = (
        b"\x0a\x0b\x0c\x0d"  # correlation id, response header v0
        b"\x00\x23"  # UNSUPPORTED_VERSION (35)
        b"\x00\x00\x00\x01"  # one entry ...
        b"\x00\x12\x00\x00\x00\x04"  # ... ApiVersions 0..4, so the client can retry with v4
    )
    assert framed == struct.pack(">i", len(expected)) + expected


def test_client_reads_the_v0_fallback_to_a_newer_request() -> None:
    framed = encode_api_versions_fallback(RequestHeader(18, 3, 12, None, 2))
    _, response = decode_response(framed[4:], api_key=18, api_version=3, correlation_id=12)
    assert response.error_code == ErrorCode.UNSUPPORTED_VERSION  # type: ignore[attr-defined]
    assert response.__version__ == 0


def test_full_exchange_v3() -> None:
    request = ApiVersionsRequest(client_software_name="tidelog", client_software_version="0.1")
    header, parsed = parse_request(encode_request(request, correlation_id=4, client_id="t")[4:])
    assert parsed == request
    framed = encode_response(header, api_versions_response(header.api_version))
    _, decoded = decode_response(framed[4:], api_key=18, api_version=3, correlation_id=4)
    assert decoded.error_code == ErrorCode.NONE  # type: ignore[attr-defined]
