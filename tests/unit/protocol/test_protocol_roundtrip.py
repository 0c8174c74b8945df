"""Property: every accepted version of every supported API round-trips, requests and responses."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.protocol import (
    SUPPORTED_VERSIONS,
    decode_response,
    encode_request,
    encode_response_for,
    parse_request,
    request_class,
    response_class,
)

ACCEPTED = [
    (int(key), version)
    for key, entry in SUPPORTED_VERSIONS.items()
    for version in range(entry.min_accepted, entry.max_version + 1)
]

_FAST = settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize(("api_key", "api_version"), ACCEPTED)
@_FAST
@given(data=st.data())
def test_every_supported_request_and_response_round_trips(
    api_key: int, api_version: int, data: st.DataObject
) -> None:
    request_type = request_class(api_key, api_version)
    response_type = response_class(api_key, api_version)
    assert request_type is not None and response_type is not None
    request = data.draw(st.from_type(request_type))
    header, parsed = parse_request(encode_request(request, correlation_id=1, client_id="c")[4:])
    assert parsed == request
    assert (header.api_key, header.api_version) == (api_key, api_version)
    response = data.draw(st.from_type(response_type))
    framed = encode_response_for(2, response)
    assert decode_response(framed[4:], api_key=api_key, api_version=api_version)[1] == response
