"""The connection layer over real sockets: ordering, fallback, bad input closes one connection."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest as ApiVersionsV3

from tidelog.broker.broker import Broker
from tidelog.broker.handlers import HANDLERS
from tidelog.broker.reply import Deferred
from tidelog.broker.server import BrokerServer
from tidelog.protocol import (
    SUPPORTED_VERSIONS,
    ApiKey,
    ErrorCode,
    FrameDecoder,
    decode_response,
    encode_request,
    restrict,
)


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro_fn())  # type: ignore[arg-type]


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder()
        self.frames: list[memoryview] = []

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def frame(self, timeout: float = 5.0) -> memoryview:
        while not self.frames:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise ConnectionResetError("closed by broker")
            self.frames.extend(self.decoder.feed(data))
        return self.frames.pop(0)

    async def closed_by_peer(self, timeout: float = 5.0) -> bool:
        try:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
        except ConnectionError:
            return True
        return data == b""

    def close(self) -> None:
        self.writer.close()


async def _serve(broker: Broker) -> AsyncIterator[tuple[BrokerServer, Callable[[], Any]]]:
    accepted = restrict(HANDLERS.keys(), SUPPORTED_VERSIONS)
    server = BrokerServer(
        broker, "127.0.0.1", 0, HANDLERS, accepted, max_frame_size=1 << 20, max_in_flight=8
    )
    await server.start()

    async def connect() -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        return Client(reader, writer)

    try:
        yield server, connect
    finally:
        await server.shutdown()


def api_versions_v3(correlation_id: int) -> bytes:
    request = ApiVersionsV3(client_software_name="tidelog-test", client_software_version="1.0")
    return encode_request(request, correlation_id=correlation_id, client_id="t")


def test_api_versions_lists_exactly_the_registered_handlers(broker: Broker) -> None:
    async def scenario() -> None:
        async for _, connect in _serve(broker):
            client = await connect()
            await client.send(api_versions_v3(7))
            header, response = decode_response(
                await client.frame(), api_key=ApiKey.API_VERSIONS, api_version=3
            )
            assert header.correlation_id == 7
            assert response.error_code == ErrorCode.NONE
            keys = {entry.api_key for entry in response.api_keys}
            assert keys == set(HANDLERS)
            client.close()

    run(scenario)


def test_unknown_api_versions_version_gets_the_v0_fallback(broker: Broker) -> None:
    async def scenario() -> None:
        async for _, connect in _serve(broker):
            client = await connect()
            # ApiVersions v99: header v1 layout (key, version, correlation id, client id), then
            # a body we cannot know.
            body = struct.pack(">hhih", 18, 99, 42, 1) + b"x" + b"\x00\x01\x02"
            await client.send(struct.pack(">i", len(body)) + body)
            header, response = decode_response(
                await client.frame(), api_key=ApiKey.API_VERSIONS, api_version=0
            )
            assert header.correlation_id == 42
            assert response.error_code == ErrorCode.UNSUPPORTED_VERSION
            assert [e.api_key for e in response.api_keys] == [ApiKey.API_VERSIONS]
            # The connection stays usable: the client retries with a version we know.
            await client.send(encode_request(ApiVersionsV0(), correlation_id=43, client_id="t"))
            header, response = decode_response(
                await client.frame(), api_key=ApiKey.API_VERSIONS, api_version=0
            )
            assert header.correlation_id == 43 and response.error_code == ErrorCode.NONE
            client.close()

    run(scenario)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(struct.pack(">i", -5), id="negative-size"),
        pytest.param(struct.pack(">i", (1 << 20) + 1), id="frame-too-large"),
        pytest.param(struct.pack(">i", 10) + struct.pack(">hhih", 9999, 0, 1, 0), id="unknown-api"),
        pytest.param(struct.pack(">i", 6) + b"\xff" * 6, id="garbage-header"),
        pytest.param(
            struct.pack(">i", 14) + struct.pack(">hhih", 18, 3, 5, 0) + b"\x7f\x7f\x7f\x7f",
            id="truncated-body",
        ),
    ],
)
def test_bad_input_closes_only_that_connection(broker: Broker, bad: bytes) -> None:
    async def scenario() -> None:
        async for _, connect in _serve(broker):
            good = await connect()
            victim = await connect()
            await victim.send(bad)
            assert await victim.closed_by_peer()
            await good.send(api_versions_v3(1))
            _, response = decode_response(
                await good.frame(), api_key=ApiKey.API_VERSIONS, api_version=3
            )
            assert response.error_code == ErrorCode.NONE
            good.close()

    run(scenario)


def test_responses_keep_request_order_when_an_earlier_one_is_deferred(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow (deferred) answer holds back later answers on the same connection."""
    from tidelog.broker.handlers import api_versions

    original = api_versions.handle_api_versions
    release = asyncio.Event()
    calls: list[int] = []

    async def slow_first(ctx: Any, request: Any) -> Any:
        calls.append(ctx.header.correlation_id)
        response = await original(ctx, request)
        if ctx.header.correlation_id == 1:

            async def later() -> Any:
                await release.wait()
                return response

            return Deferred(later())
        return response

    monkeypatch.setitem(HANDLERS, ApiKey.API_VERSIONS, slow_first)

    async def scenario() -> None:
        async for _, connect in _serve(broker):
            client = await connect()
            await client.send(api_versions_v3(1) + api_versions_v3(2) + api_versions_v3(3))
            # All three were handled (in order) although the first answer is still pending.
            for _ in range(100):
                if len(calls) == 3:
                    break
                await asyncio.sleep(0.01)
            assert calls == [1, 2, 3]
            with pytest.raises(TimeoutError):
                await client.frame(timeout=0.2)
            release.set()
            order = []
            for _ in range(3):
                header, _ = decode_response(
                    await client.frame(), api_key=ApiKey.API_VERSIONS, api_version=3
                )
                order.append(header.correlation_id)
            assert order == [1, 2, 3]
            client.close()

    run(scenario)


def test_shutdown_sends_answers_already_in_flight(broker: Broker) -> None:
    async def scenario() -> None:
        gen = _serve(broker)
        server, connect = await gen.__anext__()
        client = await connect()
        await client.send(api_versions_v3(5))
        header, _ = decode_response(
            await client.frame(), api_key=ApiKey.API_VERSIONS, api_version=3
        )
        assert header.correlation_id == 5
        await server.shutdown()
        assert await client.closed_by_peer()
        await gen.aclose()

    run(scenario)


def test_a_client_that_hangs_up_does_not_keep_a_pending_answer_alive(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka drops a connection at EOF; a long wait queued on it must not hold it open."""
    from tidelog.broker.handlers import api_versions

    original = api_versions.handle_api_versions
    never = asyncio.Event()

    async def waits_forever(ctx: Any, request: Any) -> Any:
        response = await original(ctx, request)

        async def later() -> Any:
            await never.wait()
            return response

        return Deferred(later())

    monkeypatch.setitem(HANDLERS, ApiKey.API_VERSIONS, waits_forever)

    async def scenario() -> None:
        async for server, connect in _serve(broker):
            client = await connect()
            await client.send(api_versions_v3(1))
            for _ in range(100):
                if server._connections:
                    break
                await asyncio.sleep(0.01)
            assert len(server._connections) == 1
            client.close()
            for _ in range(300):
                if not server._connections:
                    break
                await asyncio.sleep(0.01)
            assert not server._connections

    run(scenario)
