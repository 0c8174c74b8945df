"""One connection to one broker: an asyncio protocol, size-prefixed frames, correlation ids.

Life of a connection:

1. :meth:`Connection.connect` opens the socket (bounded by
   ``socket.connection.setup.timeout.ms``) and negotiates versions:
   it sends ApiVersions at our highest version; a broker that does not know that version answers
   with a v0 response carrying UNSUPPORTED_VERSION and its own ranges (KIP-511), and the request
   is repeated at the highest version both sides know. For every API both sides serve, the
   connection then uses the highest version in the intersection of the broker's range and ours
   (``SUPPORTED_VERSIONS``: from the lowest version kio has schemas for, up to our maximum).
2. :meth:`Connection.call` builds the request for the negotiated version (see
   :mod:`tidelog.client.messages`), waits for a free in-flight slot
   (``max.in.flight.requests.per.connection``), writes it and waits for the response with the
   same correlation id, at most ``request.timeout.ms``.
3. Any failure of the connection itself (reset, unreadable frame, a response nobody waits for,
   a request timeout) closes it and fails every request in flight with
   :class:`~tidelog.client.errors.BrokerConnectionError` (or RequestTimeoutError); the owner
   opens a new one. Kafka's clients also drop the connection on a request timeout, because the
   broker may still answer later.

Responses arrive in request order on a Kafka connection; the reader still matches them by
correlation id, so a broker that answered out of order would be detected, not misread.

Responses are received by :class:`_Wire`, a ``BufferedProtocol``: the event loop receives
straight into the :class:`~tidelog.protocol.FrameDecoder`'s buffer, which is the response's own
buffer once its size is known. A fetch response of megabytes is thus copied once, by the
kernel, in as few receives as the socket allows, with no stream buffer in between.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import Any, cast

from tidelog import __version__
from tidelog.client.errors import (
    BrokerConnectionError,
    ClientError,
    RequestTimeoutError,
    UnsupportedApiError,
)
from tidelog.client.messages import build
from tidelog.protocol import (
    SUPPORTED_VERSIONS,
    ApiKey,
    ErrorCode,
    FrameDecoder,
    ProtocolError,
    api_name,
    decode_response,
    encode_request,
    peek_correlation_id,
    request_class,
)

SOFTWARE_NAME = "tidelog-python"


def our_range(api_key: int) -> tuple[int, int] | None:
    """The versions the client can speak for ``api_key`` (None: not at all)."""
    entry = (
        SUPPORTED_VERSIONS.get(ApiKey(api_key)) if api_key in ApiKey._value2member_map_ else None
    )
    if entry is None:
        return None
    return entry.min_accepted, entry.max_version


def negotiate(broker_ranges: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    """For each API both sides serve, the highest version both speak."""
    chosen: dict[int, int] = {}
    for api_key, (their_min, their_max) in broker_ranges.items():
        ours = our_range(api_key)
        if ours is None:
            continue
        low, high = max(ours[0], their_min), min(ours[1], their_max)
        if low <= high:
            chosen[api_key] = high
    return chosen


class _Pending:
    __slots__ = ("api_key", "api_version", "future")

    def __init__(self, api_key: int, api_version: int, future: asyncio.Future[Any]) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.future = future


class Connection:
    """A connection to ``host:port`` (the broker ``node_id``, or -1 while bootstrapping)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        node_id: int = -1,
        client_id: str = "tidelog",
        request_timeout_ms: int = 30_000,
        connect_timeout_ms: int = 10_000,
        max_in_flight: int = 5,
        max_frame_size: int = 100 * 1024 * 1024,
    ) -> None:
        self.host = host
        self.port = port
        self.node_id = node_id
        self.client_id = client_id
        self.request_timeout = request_timeout_ms / 1000
        self.connect_timeout = connect_timeout_ms / 1000
        self.max_frame_size = max_frame_size
        self.versions: dict[int, int] = {}
        self.broker_ranges: dict[int, tuple[int, int]] = {}
        self._slots = asyncio.Semaphore(max_in_flight)
        self._correlation = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._transport: asyncio.Transport | None = None
        self._wire: _Wire | None = None
        self._failure: ClientError | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<Connection node {self.node_id} {self.host}:{self.port}>"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def usable(self) -> bool:
        return self._transport is not None and not self._closed

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        wire = _Wire(self, FrameDecoder(self.max_frame_size), loop)
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_connection(lambda: wire, self.host, self.port),
                self.connect_timeout,
            )
        except TimeoutError:
            raise BrokerConnectionError(
                f"connecting to {self.address} timed out after {self.connect_timeout:g}s"
            ) from None
        except OSError as exc:
            raise BrokerConnectionError(
                f"cannot connect to {self.address}: {exc.strerror or exc}"
            ) from None
        self._transport, self._wire = transport, wire
        try:
            await self._negotiate()
        except BaseException:
            await self.close()
            raise

    async def _negotiate(self) -> None:
        ours = our_range(ApiKey.API_VERSIONS)
        assert ours is not None
        version = ours[1]
        for _ in range(2):
            response = await self._send(
                ApiKey.API_VERSIONS,
                version,
                {
                    "client_software_name": SOFTWARE_NAME,
                    "client_software_version": __version__,
                },
            )
            ranges = {
                int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys
            }
            code = ErrorCode.from_wire(int(response.error_code))
            if code is ErrorCode.UNSUPPORTED_VERSION and ApiKey.API_VERSIONS in ranges:
                their_max = ranges[ApiKey.API_VERSIONS][1]
                if their_max < version:
                    version = max(ours[0], their_max)
                    continue
            if code is not ErrorCode.NONE:
                raise BrokerConnectionError(
                    f"{self.address} refused ApiVersions: {code.name}", code=code
                )
            self.broker_ranges = ranges
            self.versions = negotiate(ranges)
            return
        raise BrokerConnectionError(f"{self.address}: no common ApiVersions version")

    def version(self, api_key: int) -> int:
        """The negotiated version of ``api_key``."""
        try:
            return self.versions[api_key]
        except KeyError:
            raise UnsupportedApiError(
                f"broker {self.address} does not serve {api_name(api_key)} in a version "
                "this client speaks"
            ) from None

    def supports(self, api_key: int) -> bool:
        return api_key in self.versions

    async def call(
        self,
        api_key: int,
        values: Mapping[str, Any],
        *,
        version: int | None = None,
        expect_response: bool = True,
        timeout_ms: int | None = None,
    ) -> Any:
        """Send ``api_key`` built from ``values``; return kio's response (None if not expected)."""
        if version is None:
            version = self.version(api_key)
        return await self._send(
            api_key, version, values, expect_response=expect_response, timeout_ms=timeout_ms
        )

    async def _send(
        self,
        api_key: int,
        version: int,
        values: Mapping[str, Any],
        *,
        expect_response: bool = True,
        timeout_ms: int | None = None,
    ) -> Any:
        cls = request_class(api_key, version)
        if cls is None:
            raise UnsupportedApiError(f"no schema for {api_name(api_key)} v{version}")
        request = build(cls, values)
        timeout = self.request_timeout if timeout_ms is None else timeout_ms / 1000
        started = asyncio.get_running_loop().time()
        # The wait for an in-flight slot counts toward the request's timeout: behind
        # requests a silent peer never answers, a caller would otherwise wait for all of
        # them to time out before its own even starts.
        try:
            await asyncio.wait_for(self._slots.acquire(), timeout)
        except TimeoutError:
            raise RequestTimeoutError(
                f"{api_name(api_key)} to {self.address} found no free in-flight slot "
                f"in {timeout:g}s"
            ) from None
        try:
            remaining = max(timeout - (asyncio.get_running_loop().time() - started), 0.001)
            return await self._send_holding_slot(
                api_key, version, request, expect_response, remaining
            )
        finally:
            self._slots.release()

    async def _send_holding_slot(
        self, api_key: int, version: int, request: Any, expect_response: bool, timeout: float
    ) -> Any:
        if self._failure is not None:
            raise self._failure
        if self._wire is None or self._closed:
            raise BrokerConnectionError(f"connection to {self.address} is closed")
        correlation_id = next(self._correlation) & 0x7FFFFFFF
        try:
            data = encode_request(request, correlation_id=correlation_id, client_id=self.client_id)
        except ProtocolError as exc:
            raise ClientError(f"cannot encode {api_name(api_key)}: {exc}") from exc
        future: asyncio.Future[Any] | None = None
        if expect_response:
            future = asyncio.get_running_loop().create_future()
            self._pending[correlation_id] = _Pending(api_key, version, future)
        try:
            await self._wire.write(data)
        except (OSError, RuntimeError) as exc:
            self._fail(BrokerConnectionError(f"writing to {self.address} failed: {exc}"))
            raise self._failure or exc from None
        if future is None:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            error = RequestTimeoutError(
                f"{api_name(api_key)} to {self.address} got no response in {timeout:g}s"
            )
            self._fail(error)
            raise error from None
        finally:
            self._pending.pop(correlation_id, None)

    def _dispatch(self, frame: memoryview) -> None:
        correlation_id = peek_correlation_id(frame)
        pending = self._pending.pop(correlation_id, None)
        if pending is None:
            raise BrokerConnectionError(
                f"{self.address} sent a response with unknown correlation id {correlation_id}"
            )
        _, response = decode_response(
            frame,
            api_key=pending.api_key,
            api_version=pending.api_version,
            correlation_id=correlation_id,
        )
        if not pending.future.done():
            pending.future.set_result(response)

    def _fail(self, error: ClientError) -> None:
        if self._failure is None:
            self._failure = error
        pending, self._pending = self._pending, {}
        for item in pending.values():
            if not item.future.done():
                item.future.set_exception(error)
                # Mark retrieved: a request whose caller already gave up must not warn.
                item.future.exception()
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    async def close(self) -> None:
        self._fail(BrokerConnectionError(f"connection to {self.address} is closed"))
        if self._wire is not None:
            await self._wire.closed(self.request_timeout)


class _Wire(asyncio.BufferedProtocol):
    """The connection's socket as the event loop sees it: received bytes go straight into
    the frame decoder's buffer and each whole frame to :meth:`Connection._dispatch`; writes
    wait while the transport's buffer is above its high-water mark."""

    def __init__(
        self, owner: Connection, decoder: FrameDecoder, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._owner = owner
        self._decoder = decoder
        self._transport: asyncio.Transport | None = None
        self._writable: asyncio.Future[None] | None = None  # set while writing is paused
        self._lost: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: uvloop's transports have the methods of
        # asyncio.Transport without deriving from it.
        self._transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.receive_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        owner = self._owner
        try:
            for frame in self._decoder.received(nbytes):
                owner._dispatch(frame)
        except ClientError as exc:
            owner._fail(exc)
        except ProtocolError as exc:
            owner._fail(BrokerConnectionError(f"bad response from {owner.address}: {exc}"))

    def eof_received(self) -> bool:
        self._owner._fail(BrokerConnectionError(f"{self._owner.address} closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        owner = self._owner
        if exc is None:
            owner._fail(BrokerConnectionError(f"{owner.address} closed the connection"))
        else:
            owner._fail(BrokerConnectionError(f"reading from {owner.address} failed: {exc}"))
        if not self._lost.done():
            self._lost.set_result(None)
        self._wake_writers()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self._lost.get_loop().create_future()

    def resume_writing(self) -> None:
        self._wake_writers()

    def _wake_writers(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    async def write(self, data: bytes) -> None:
        """Write ``data``; return once the transport takes more (raises once it is lost)."""
        transport = self._transport
        if transport is None or transport.is_closing() or self._lost.done():
            raise ConnectionResetError("the connection is closed")
        transport.write(data)
        while self._writable is not None:
            await asyncio.shield(self._writable)
            if self._lost.done():
                raise ConnectionResetError("the connection was lost while writing")

    async def closed(self, patience: float) -> None:
        """Wait until the socket is closed: what is still buffered is sent first for at most
        ``patience`` seconds (a broker that reads nothing more must not hold a close)."""
        try:
            await asyncio.wait_for(asyncio.shield(self._lost), patience)
        except TimeoutError:
            if self._transport is not None:
                self._transport.abort()
            await asyncio.shield(self._lost)
