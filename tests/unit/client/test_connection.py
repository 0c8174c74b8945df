"""Connection against an in-process fake broker: negotiation, correlation ids, timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tidelog.client.connection import Connection, negotiate
from tidelog.client.errors import BrokerConnectionError, RequestTimeoutError
from tidelog.client.messages import build
from tidelog.protocol import (
    ApiKey,
    FrameDecoder,
    RequestHeader,
    VersionRange,
    api_versions_response,
    encode_api_versions_fallback,
    encode_response_for,
    parse_request_header,
    response_class,
)

Handler = Callable[[RequestHeader, asyncio.StreamWriter], Any]


class FakeBroker:
    """Answers ApiVersions up to ``api_versions_max`` (KIP-511 fallback above it) and hands
    every other request to ``on_request``."""

    def __init__(self, api_versions_max: int = 4, metadata_max: int = 12) -> None:
        self.table = {
            ApiKey.API_VERSIONS: VersionRange(ApiKey.API_VERSIONS, 0, api_versions_max, 0),
            ApiKey.METADATA: VersionRange(ApiKey.METADATA, 0, metadata_max, 0),
        }
        self.api_versions_seen: list[int] = []
        self.on_request: Handler | None = None
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        while chunk := await reader.read(65536):
            for frame in decoder.feed(chunk):
                header, _ = parse_request_header(frame)
                if header.api_key == ApiKey.API_VERSIONS:
                    self.api_versions_seen.append(header.api_version)
                    if header.api_version > self.table[ApiKey.API_VERSIONS].max_version:
                        writer.write(encode_api_versions_fallback(header, supported=self.table))
                    else:
                        response = api_versions_response(header.api_version, supported=self.table)
                        writer.write(encode_response_for(header.correlation_id, response))
                elif self.on_request is not None:
                    await self.on_request(header, writer)
        writer.close()


def metadata_response(version: int, correlation_id: int, cluster_id: str) -> bytes:
    cls = response_class(ApiKey.METADATA, version)
    assert cls is not None
    response = build(cls, {"brokers": [], "topics": [], "cluster_id": cluster_id})
    return encode_response_for(correlation_id, response)


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    fake = FakeBroker()
    await fake.start()
    yield fake
    assert fake.server is not None
    fake.server.close()


async def wait_for_state(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Until ``condition`` holds (the event loop keeps running meanwhile)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the state never came"
        await asyncio.sleep(0.01)


def test_negotiate_takes_highest_common_version() -> None:
    chosen = negotiate({ApiKey.METADATA: (0, 9), ApiKey.PRODUCE: (0, 20), ApiKey.FETCH: (0, 2)})
    assert chosen[ApiKey.METADATA] == 9
    assert chosen[ApiKey.PRODUCE] == 13  # our maximum
    assert ApiKey.FETCH not in chosen  # we speak Fetch v4+ only
    assert negotiate({9999: (0, 1)}) == {}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_negotiation_and_out_of_order_responses() -> None:
    async def scenario() -> None:
        fake = FakeBroker(metadata_max=9)
        await fake.start()
        held: list[RequestHeader] = []

        async def answer_in_reverse(header: RequestHeader, writer: asyncio.StreamWriter) -> None:
            held.append(header)
            if len(held) == 2:
                for h in reversed(held):
                    writer.write(
                        metadata_response(h.api_version, h.correlation_id, f"c{h.correlation_id}")
                    )

        fake.on_request = answer_in_reverse
        conn = Connection("127.0.0.1", fake.port)
        await conn.connect()
        assert conn.version(ApiKey.METADATA) == 9
        first, second = await asyncio.gather(
            conn.call(ApiKey.METADATA, {"topics": None}),
            conn.call(ApiKey.METADATA, {"topics": None}),
        )
        assert first.cluster_id == f"c{held[0].correlation_id}"
        assert second.cluster_id == f"c{held[1].correlation_id}"
        assert held[0].correlation_id != held[1].correlation_id
        await conn.close()
        assert fake.server is not None
        fake.server.close()

    run(scenario())


def test_kip511_fallback_retries_at_brokers_version() -> None:
    async def scenario() -> None:
        fake = FakeBroker(api_versions_max=2)
        await fake.start()
        conn = Connection("127.0.0.1", fake.port)
        await conn.connect()
        assert fake.api_versions_seen == [4, 2]
        assert conn.version(ApiKey.API_VERSIONS) == 2
        await conn.close()
        assert fake.server is not None
        fake.server.close()

    run(scenario())


def test_request_timeout_closes_the_connection() -> None:
    async def scenario() -> None:
        fake = FakeBroker()
        await fake.start()

        async def never(header: RequestHeader, writer: asyncio.StreamWriter) -> None:
            return None

        fake.on_request = never
        conn = Connection("127.0.0.1", fake.port, request_timeout_ms=100)
        await conn.connect()
        with pytest.raises(RequestTimeoutError) as info:
            await conn.call(ApiKey.METADATA, {"topics": None})
        assert info.value.code is not None and info.value.code.name == "REQUEST_TIMED_OUT"
        assert not conn.usable
        with pytest.raises(RequestTimeoutError):
            await conn.call(ApiKey.METADATA, {"topics": None})
        await conn.close()
        assert fake.server is not None
        fake.server.close()

    run(scenario())


def test_waiting_for_an_in_flight_slot_counts_toward_the_timeout() -> None:
    """Behind a request a silent broker never answers, a call with a short timeout times
    out by itself (without sending anything), not after the request ahead of it."""

    async def scenario() -> None:
        fake = FakeBroker()
        await fake.start()
        seen: list[int] = []

        async def never(header: RequestHeader, writer: asyncio.StreamWriter) -> None:
            seen.append(header.correlation_id)

        fake.on_request = never
        conn = Connection("127.0.0.1", fake.port, request_timeout_ms=600_000, max_in_flight=1)
        await conn.connect()
        ahead = asyncio.create_task(conn.call(ApiKey.METADATA, {"topics": None}))
        await wait_for_state(lambda: len(seen) == 1)
        with pytest.raises(RequestTimeoutError, match="no free in-flight slot"):
            # The outer bound only turns a hang into a failure; the call's own timeout
            # must end it first.
            await asyncio.wait_for(conn.call(ApiKey.METADATA, {"topics": None}, timeout_ms=100), 60)
        # Nothing was sent for it, so the connection is still good for the one ahead.
        assert len(seen) == 1 and conn.usable and not ahead.done()
        ahead.cancel()
        await conn.close()
        assert fake.server is not None
        fake.server.close()

    run(scenario())


def test_unknown_correlation_id_fails_the_connection() -> None:
    async def scenario() -> None:
        fake = FakeBroker()
        await fake.start()

        async def wrong_id(header: RequestHeader, writer: asyncio.StreamWriter) -> None:
            writer.write(metadata_response(header.api_version, header.correlation_id + 100, "x"))

        fake.on_request = wrong_id
        conn = Connection("127.0.0.1", fake.port)
        await conn.connect()
        with pytest.raises(BrokerConnectionError, match="unknown correlation id") as info:
            await conn.call(ApiKey.METADATA, {"topics": None})
        assert info.value.code is not None and info.value.code.name == "NETWORK_EXCEPTION"
        await conn.close()
        assert fake.server is not None
        fake.server.close()

    run(scenario())


def test_connection_refused_is_a_client_error() -> None:
    async def scenario() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        conn = Connection("127.0.0.1", port)
        with pytest.raises(BrokerConnectionError, match=f"cannot connect to 127.0.0.1:{port}"):
            await conn.connect()

    run(scenario())


def test_a_large_response_arriving_in_small_pieces() -> None:
    """A response of megabytes trickling in, 7,001 bytes a write: received into its frame
    piece by piece and decoded whole; the connection serves the next call as usual."""

    async def scenario() -> None:
        fake = FakeBroker(metadata_max=9)
        await fake.start()
        big_id = "".join(chr(0x41 + i % 26) for i in range(3 << 20))

        async def trickle(header: RequestHeader, writer: asyncio.StreamWriter) -> None:
            data = metadata_response(header.api_version, header.correlation_id, big_id)
            for at in range(0, len(data), 7001):
                writer.write(data[at : at + 7001])
                await writer.drain()

        fake.on_request = trickle
        conn = Connection("127.0.0.1", fake.port)
        await conn.connect()
        first = await conn.call(ApiKey.METADATA, {"topics": None})
        assert first.cluster_id == big_id
        second = await conn.call(ApiKey.METADATA, {"topics": None})
        assert second.cluster_id == big_id
        await conn.close()
        assert fake.server is not None
        fake.server.close()

    run(scenario())


def test_a_call_waits_while_the_socket_cannot_take_more() -> None:
    """While the transport has paused writing (its buffer is above the high-water mark) a
    call waits after writing; it goes on when writing resumes, and fails when the connection
    is lost meanwhile."""

    async def scenario() -> None:
        fake = FakeBroker(metadata_max=9)
        await fake.start()

        async def answer(header: RequestHeader, writer: asyncio.StreamWriter) -> None:
            writer.write(metadata_response(header.api_version, header.correlation_id, "ok"))

        fake.on_request = answer
        conn = Connection("127.0.0.1", fake.port)
        await conn.connect()
        wire = conn._wire
        assert wire is not None
        wire.pause_writing()
        call = asyncio.ensure_future(conn.call(ApiKey.METADATA, {"topics": None}))
        await asyncio.sleep(0.2)
        assert not call.done()
        wire.resume_writing()
        assert (await call).cluster_id == "ok"

        wire.pause_writing()
        stuck = asyncio.ensure_future(conn.call(ApiKey.METADATA, {"topics": None}))
        await asyncio.sleep(0.05)
        assert not stuck.done()
        assert conn._transport is not None
        conn._transport.abort()
        with pytest.raises(BrokerConnectionError):
            await stuck
        await conn.close()
        assert fake.server is not None
        fake.server.close()

    run(scenario())
