"""The hand-made zero-copy Fetch response encoding against kio, byte for byte."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.broker.broker import Broker
from tidelog.broker.fetch_response import (
    NodeEndpoint,
    PartitionResult,
    TopicResult,
    encode_fetch_response,
)
from tidelog.broker.reply import join_parts
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.storage import FileSlice

from .test_fetch_helpers import (
    Want,
    add_partitions,
    append,
    batch,
    decode_body,
    fetch_request,
    kio_encode,
    partitions_of,
    resolve,
)
from .test_fetch_helpers import call as call_handler

VERSIONS = range(4, 19)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("isolation_level", [0, 1])
def test_handler_response_decodes_as_kio_and_sends_records_as_file_regions(
    broker: Broker, version: int, isolation_level: int
) -> None:
    add_partitions(broker, "orders", 3)
    add_partitions(broker, "audit", 1)
    p0 = broker.partitions.get("orders", 0)
    p2 = broker.partitions.get("orders", 2)
    audit = broker.partitions.get("audit", 0)
    assert p0 is not None and p2 is not None and audit is not None
    append(p0, batch([b"a" * 10, b"b" * 20]), batch([b"c"]), batch([b"d" * 300]))
    append(p2, batch([b"x"]))
    append(audit, batch([b"y" * 50, b"z"]))
    request = fetch_request(
        broker,
        version,
        [
            Want("orders", 0, offset=2),
            Want("orders", 1),
            Want("orders", 2),
            Want("orders", 7),  # no such partition
            Want("audit", 0),
        ],
        isolation_level=isolation_level,
    )
    encoded = resolve(call_handler(broker, ApiKey.FETCH, request))
    regions = [part for part in encoded.parts if isinstance(part, FileSlice)]
    try:
        body = join_parts(encoded.parts)
    finally:
        encoded.close()
    assert len(regions) == 3  # orders-0, orders-2, audit-0: the records are never copied
    assert all(region.fd == -1 for region in regions)  # closed with the response

    response = decode_body(ApiKey.FETCH, version, body)
    assert kio_encode(response) == body
    got = partitions_of(response)
    orders = broker.topic_id_of("orders") if version >= 13 else "orders"
    audit_key = broker.topic_id_of("audit") if version >= 13 else "audit"
    assert [t.partitions[0].partition_index for t in response.responses] == [0, 0]
    assert len(response.responses) == 2  # consecutive partitions of a topic grouped

    first = got[(orders, 0)]
    assert first.error_code == ErrorCode.NONE
    assert first.records == p0.log.read_bytes(2, 1 << 20, whole_batches=True)
    assert first.high_watermark == first.last_stable_offset == 4
    assert got[(orders, 1)].records == b""
    assert got[(orders, 1)].high_watermark == 0
    assert got[(orders, 2)].records == p2.log.read_bytes(0, 1 << 20)
    assert got[(audit_key, 0)].records == audit.log.read_bytes(0, 1 << 20)
    missing = got[(orders, 7)]
    assert missing.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert (missing.high_watermark, missing.last_stable_offset) == (-1, -1)
    assert missing.records == b""
    assert missing.aborted_transactions is None
    expected_aborted = () if isolation_level == 1 else None
    assert first.aborted_transactions == expected_aborted
    if version >= 5:
        assert first.log_start_offset == 0
    if version >= 7:
        assert response.error_code == ErrorCode.NONE
        assert response.session_id == 0
    if version >= 11:
        assert first.preferred_read_replica == -1


def _slice_of(path: Path, data: bytes) -> FileSlice:
    path.write_bytes(b"junk" + data + b"tail")
    fd = os.open(path, os.O_RDONLY)
    return FileSlice(fd, 4, len(data), 0)


_INT32 = st.integers(-(2**31), 2**31 - 1)
_INT64 = st.integers(-(2**63), 2**63 - 1)
_pair32_64 = st.tuples(_INT32, _INT64)


@st.composite
def _partitions(draw: Any, version: int) -> tuple[PartitionResult, bytes]:
    data = draw(st.binary(max_size=300))
    result = PartitionResult(
        partition_index=draw(_INT32),
        error_code=draw(st.sampled_from([0, 1, 3, 6, 74, 100])),
        high_watermark=draw(_INT64),
        last_stable_offset=draw(_INT64),
        log_start_offset=draw(_INT64) if version >= 5 else -1,
        aborted_transactions=draw(st.none() | st.lists(st.tuples(_INT64, _INT64), max_size=3)),
        preferred_read_replica=draw(_INT32) if version >= 11 else -1,
        diverging_epoch=draw(st.none() | _pair32_64) if version >= 12 else None,
        current_leader=draw(st.none() | st.tuples(_INT32, _INT32)) if version >= 12 else None,
    )
    return result, data


@st.composite
def _responses(draw: Any) -> tuple[int, list[tuple[str, uuid.UUID | None, list[Any]]], Any]:
    version = draw(st.sampled_from(list(VERSIONS)))
    topics = draw(
        st.lists(
            st.tuples(
                st.text(max_size=20),
                st.uuids() | st.none(),
                st.lists(_partitions(version), max_size=3),
            ),
            max_size=3,
        )
    )
    endpoints = (
        draw(
            st.lists(
                st.builds(
                    NodeEndpoint, _INT32, st.text(max_size=10), _INT32, st.none() | st.text()
                ),
                max_size=2,
            )
        )
        if version >= 16
        else []
    )
    return version, topics, endpoints


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_responses(), _INT32, st.sampled_from([0, 70, 71]))
def test_encoder_matches_kio_for_any_field_values(
    tmp_path: Path, case: Any, session_id: int, error: int
) -> None:
    version, topics, endpoints = case
    results = []
    expected_records = []
    for index, (name, topic_id, partitions) in enumerate(topics):
        parts = []
        for number, (result, data) in enumerate(partitions):
            if data:
                result.records = _slice_of(tmp_path / f"{index}-{number}", data)
            parts.append(result)
            expected_records.append(data)
        results.append(TopicResult(name, topic_id, parts))
    encoded = encode_fetch_response(
        version, results, error_code=error, session_id=session_id, node_endpoints=endpoints
    )
    try:
        body = join_parts(encoded.parts)
    finally:
        encoded.close()
    response = decode_body(ApiKey.FETCH, version, body)
    assert kio_encode(response) == body
    decoded = [p for t in response.responses for p in t.partitions]
    assert [p.records for p in decoded] == expected_records
    flat = [p for t in results for p in t.partitions]
    for got, want in zip(decoded, flat, strict=True):
        assert got.partition_index == want.partition_index
        assert got.error_code == want.error_code
        assert got.high_watermark == want.high_watermark
        assert got.last_stable_offset == want.last_stable_offset
        aborted = got.aborted_transactions
        if want.aborted_transactions is None:
            assert aborted is None
        else:
            assert [(a.producer_id, a.first_offset) for a in aborted] == list(
                want.aborted_transactions
            )
        if version >= 5:
            assert got.log_start_offset == want.log_start_offset
        if version >= 12:
            diverging = want.diverging_epoch or (-1, -1)
            assert (got.diverging_epoch.epoch, got.diverging_epoch.end_offset) == diverging
            leader = want.current_leader or (-1, -1)
            assert (got.current_leader.leader_id, got.current_leader.leader_epoch) == leader
    if version >= 13:
        assert [t.topic_id for t in response.responses] == [t.topic_id for t in results]
    else:
        assert [t.topic for t in response.responses] == [t.name for t in results]
    if version >= 7:
        assert (response.error_code, response.session_id) == (error, session_id)
    if version >= 16:
        assert [(n.node_id, n.host, n.port, n.rack) for n in response.node_endpoints] == [
            (n.node_id, n.host, n.port, n.rack) for n in endpoints
        ]


def test_empty_records_are_not_sent_as_regions(tmp_path: Path) -> None:
    empty = _slice_of(tmp_path / "e", b"")
    encoded = encode_fetch_response(
        12, [TopicResult("t", None, [PartitionResult(0, records=empty)])]
    )
    assert all(isinstance(part, bytes) for part in encoded.parts)
    encoded.close()
    assert empty.fd == -1
