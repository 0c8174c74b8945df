"""Property: no input makes the codec raise anything but ProtocolError (or crash the process by
allocating from a hostile length)."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.protocol import (
    SUPPORTED_VERSIONS,
    ProtocolError,
    decode_response,
    encode_request,
    encode_response_for,
    parse_request,
    request_class,
    response_class,
)
from tidelog.protocol.validate import encode_uvarint


def _mutations() -> st.SearchStrategy[tuple[str, int, bytes]]:
    hostile = st.sampled_from(
        [
            b"\xff",
            b"\x00",
            b"\x7f\xff\xff\xff",
            b"\xff\xff\xff\xfe",
            b"\x80\x00\x00\x00",
            encode_uvarint(2**32 + 5),
            encode_uvarint(2**31),
            b"\xff\xff\xff\xff\xff\xff",
        ]
    )
    return st.tuples(
        st.sampled_from(["overwrite", "insert", "truncate", "delete"]),
        st.integers(min_value=0, max_value=10_000),
        hostile | st.binary(min_size=1, max_size=8),
    )


def _mutate(raw: bytes, mutations: list[tuple[str, int, bytes]]) -> bytes:
    out = bytearray(raw)
    for kind, where, blob in mutations:
        position = where % (len(out) + 1)
        if kind == "overwrite":
            out[position : position + len(blob)] = blob
        elif kind == "insert":
            out[position:position] = blob
        elif kind == "truncate":
            del out[position:]
        else:
            del out[position : position + len(blob)]
    return bytes(out)


# Flexible and non-flexible versions of the busiest APIs, and nested or tagged layouts.
_MUTATION_TARGETS = [
    (0, 3), (0, 12), (1, 4), (1, 15), (3, 1), (3, 12), (8, 8), (11, 5), (18, 3), (32, 4),
]  # fmt: skip


@pytest.mark.parametrize(("api_key", "api_version"), _MUTATION_TARGETS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), mutations=st.lists(_mutations(), min_size=1, max_size=4))
def test_mutated_frames_raise_only_protocol_errors(
    api_key: int, api_version: int, data: st.DataObject, mutations: list[tuple[str, int, bytes]]
) -> None:
    request_type = request_class(api_key, api_version)
    response_type = response_class(api_key, api_version)
    assert request_type is not None and response_type is not None
    request = data.draw(st.from_type(request_type))
    raw = _mutate(encode_request(request, correlation_id=1, client_id="c")[4:], mutations)
    with contextlib.suppress(ProtocolError):
        parse_request(raw)
    response = data.draw(st.from_type(response_type))
    raw = _mutate(encode_response_for(3, response)[4:], mutations)
    with contextlib.suppress(ProtocolError):
        decode_response(raw, api_key=api_key, api_version=api_version)


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=200), api_key=st.sampled_from(sorted(SUPPORTED_VERSIONS)))
def test_garbage_after_a_valid_prefix_raises_only_protocol_errors(
    body: bytes, api_key: int
) -> None:
    entry = SUPPORTED_VERSIONS[api_key]  # type: ignore[index]
    for version in (entry.min_accepted, entry.max_version):
        try:
            parse_request(struct.pack(">hhi", api_key, version, 5) + body)
        except ProtocolError as exc:
            if exc.header is not None:
                assert exc.correlation_id == 5
        with contextlib.suppress(ProtocolError):
            decode_response(body, api_key=api_key, api_version=version)


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=300))
def test_random_bytes_raise_only_protocol_errors(raw: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        parse_request(raw)
