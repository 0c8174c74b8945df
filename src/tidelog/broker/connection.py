"""One client connection: read frames, dispatch requests in order, send responses in order.

Two tasks per connection:

* the *reader* receives bytes into a reusable buffer, cuts frames (bounded by
  ``socket.request.max.bytes`` before anything is allocated), parses each request and runs
  its handler. Handlers run one at a time, in arrival order, so their effects (appends,
  commits) happen in request order; a handler that must wait returns a
  :class:`~tidelog.broker.reply.Deferred` instead of blocking the connection;
* the *writer* takes replies from a bounded queue in request order, waits for each one
  that is deferred, and sends it. The queue bound (``queued.max.requests`` per
  connection, Kafka's name) is the in-flight limit: when it is full the reader stops
  reading, and TCP pushes back on the client.

Sockets are raw non-blocking sockets driven by the loop's ``sock_*`` calls rather than
transports, because only a socket we own lets us hand file regions to ``os.sendfile``
(zero copy from segment files to the network). On a TLS listener a
:class:`~tidelog.broker.tls_channel.TlsChannel` sits between the socket and the frames.

Every connection has a principal (:class:`~tidelog.security.KafkaPrincipal`, on each
request's context for the authorizer): ``User:ANONYMOUS``, the mapped subject of an SSL
client's certificate, or the user a SASL exchange authenticated. On a SASL listener only
ApiVersions, SaslHandshake and SaslAuthenticate are taken before authentication, and
requests are bounded by ``sasl.server.max.receive.size`` until then; any other request
closes the connection (Kafka's IllegalSaslStateException). After a SaslHandshake v0 the
exchange comes as raw size-prefixed tokens, answered the same way.

A request that cannot be parsed closes this connection only, after one log line; the
ApiVersions request of a version we do not know gets Kafka's v0 fallback answer instead.

A connection with nothing read for ``connections.max.idle.ms`` and no request waiting for
its answer is closed (Kafka's idle expiry; negative: never): a client that sends part of a
request and stalls, or stalls in the TLS handshake, does not hold its slot under the
connection limits for ever. One timer per connection, moved on only when it fires.

A client over its byte-rate quota is answered at once with the throttle time, then the
connection is *muted* for that time (KIP-219): nothing more is read from it, so TCP pushes
back on a client that does not wait by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import ssl
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tidelog.broker.metrics import error_codes as response_error_codes
from tidelog.broker.reply import NO_RESPONSE, Deferred, EncodedResponse, Handler, size_prefix
from tidelog.protocol import (
    ApiKey,
    FrameDecoder,
    ProtocolError,
    RequestHeader,
    ResponseHeader,
    UnsupportedVersionError,
    VersionRange,
    encode_api_versions_fallback,
    encode_response,
    parse_request,
    response_header_version,
)
from tidelog.protocol.headers import encode_response_header
from tidelog.security import (
    ANONYMOUS,
    KafkaPrincipal,
    PrincipalMappingError,
    SaslFailure,
    SaslServer,
    SaslState,
    ScramCredential,
    ScramMechanism,
    rfc2253_subject,
)
from tidelog.storage import FileSlice

if TYPE_CHECKING:
    from tidelog.broker.broker import Broker
    from tidelog.broker.tls_channel import TlsChannel
    from tidelog.security import ListenerSecurity

_log = logging.getLogger(__name__)

_RECV_SIZE = 256 * 1024

#: What a connection may take before a SASL client has authenticated (Kafka's list).
_BEFORE_SASL = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})

#: What the reader hands the writer: header, reply, when the bytes that completed the frame
#: were read, when its handler started and when it returned (``time.perf_counter``); the
#: times feed the request metrics.
_Queued = tuple[RequestHeader | None, Any, float, float, float]


class RequestContext:
    """What a handler knows about the request besides its body."""

    __slots__ = ("broker", "connection", "header")

    def __init__(self, broker: Broker, connection: Connection, header: RequestHeader) -> None:
        self.broker = broker
        self.connection = connection
        self.header = header

    @property
    def api_version(self) -> int:
        return self.header.api_version

    @property
    def client_id(self) -> str:
        # Kafka treats a null client id as the empty string.
        return self.header.client_id or ""

    @property
    def peer(self) -> str:
        return self.connection.peer

    @property
    def listener(self) -> str:
        """The name of the listener the request came in on (``PLAINTEXT``, ...)."""
        return self.connection.listener

    @property
    def principal(self) -> KafkaPrincipal:
        """Who sent the request (``User:ANONYMOUS`` when nobody authenticated)."""
        return self.connection.principal

    def throttle(self, throttle_ms: int) -> None:
        """Read nothing more from this connection for ``throttle_ms`` (a quota violation)."""
        if throttle_ms > 0:
            self.connection.mute_for(throttle_ms)


class _Closed(Exception):
    """The connection is going away; stop quietly."""


class CloseConnection(Exception):
    """Raised by a handler to close the connection without answering the request.

    Responses to earlier requests are still sent, then the connection closes. Produce with
    acks=0 uses it when a partition failed: the client gets no answer, so Kafka closes the
    connection to make it refresh its metadata.
    """


class Connection:
    """A client connection; :meth:`run` serves it until the client or the broker ends it."""

    def __init__(
        self,
        sock: socket.socket,
        broker: Broker,
        handlers: Mapping[int, Handler],
        accepted: Mapping[ApiKey, VersionRange],
        *,
        max_frame_size: int,
        max_in_flight: int,
        listener: str = "PLAINTEXT",
        security: ListenerSecurity | None = None,
        max_idle_ms: int | None = None,
    ) -> None:
        """``max_idle_ms``: ``connections.max.idle.ms`` (None or negative: never idle)."""
        self._sock = sock
        #: The listener this connection was accepted on: Metadata, FindCoordinator and
        #: Fetch answer with the addresses of that listener, as Kafka does.
        self.listener = listener
        self._fd = sock.fileno()
        self._broker = broker
        self._handlers = handlers
        self._accepted = accepted
        self._security = security
        self._max_frame_size = max_frame_size
        self.principal: KafkaPrincipal = ANONYMOUS
        #: The SASL exchange of a SASL listener's connection (None: no SASL here)
        self.sasl: SaslServer | None = None
        self._tls: TlsChannel | None = None
        self._close_after_reply = False
        if security is not None and security.sasl is not None:
            self.sasl = SaslServer(security.sasl, self._scram_credential)
            # Bounded tighter until the client has authenticated, as Kafka bounds it.
            max_frame_size = min(max_frame_size, security.sasl_max_receive_size)
        self._decoder = FrameDecoder(max_frame_size)
        self._queue: asyncio.Queue[_Queued] = asyncio.Queue(max(1, max_in_flight))
        #: Requests of this connection taken and not yet answered, and the listener's
        #: total of them that the metrics report (None: metrics are off).
        self._unanswered = 0
        metrics = broker.metrics
        self._queue_size = metrics.request_queue(listener) if metrics is not None else None
        #: When the last read returned: a frame waits from then until its handler starts.
        self._received = 0.0
        self._loop = asyncio.get_running_loop()
        self._reading: asyncio.Task[None] | None = None
        self._closing = False
        self._peer_closed = False
        #: When bytes last came in or went out (``time.monotonic``), for the idle expiry.
        self._active = time.monotonic()
        self._idle_s = max_idle_ms / 1000 if max_idle_ms is not None and max_idle_ms >= 0 else None
        self._idle_timer: asyncio.TimerHandle | None = None
        #: Until when (the loop's clock) no request is read: a quota's throttle time.
        self.muted_until = 0.0
        try:
            host, port = sock.getpeername()[:2]
            self.peer = f"{host}:{port}"
        except OSError:
            self.peer = "?"

    # -- authentication ----------------------------------------------------------------

    def _scram_credential(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        controller = self._broker.controller
        if controller is None:
            return None
        found = controller.image.scram_credential(user, mechanism.type)
        if found is None:
            return None
        return ScramCredential(found.salt, found.stored_key, found.server_key, found.iterations)

    def authenticated(self) -> None:
        """The SASL exchange succeeded: requests now carry its user, and are bounded by
        ``socket.request.max.bytes`` again."""
        assert self.sasl is not None and self.sasl.principal is not None
        self.principal = self.sasl.principal
        _log.info("%s authenticated as %s with %s", self.peer, self.principal, self.sasl.mechanism)
        if self._decoder.buffered == 0:
            self._decoder = FrameDecoder(self._max_frame_size)

    def close_after_reply(self) -> None:
        """Close the connection once the reply of the request being handled is sent, after
        ``connection.failed.authentication.delay.ms`` (a failed authentication, closed as
        Kafka closes it)."""
        self._close_after_reply = True

    async def _start_tls(self) -> bool:
        """TLS handshake and, for SSL, the principal from the client's certificate; False
        when the client is refused (logged once with its address)."""
        from tidelog.broker.tls_channel import TlsChannel

        assert self._security is not None and self._security.ssl_context is not None
        channel = TlsChannel(self._sock, self._security.ssl_context)
        try:
            await channel.handshake()
        except ssl.SSLError as exc:
            _log.warning("TLS handshake with %s failed: %s", self.peer, exc.reason or exc)
            return False
        except (ConnectionError, OSError) as exc:
            _log.info("TLS handshake with %s ended: %s", self.peer, exc)
            return False
        self._tls = channel
        cert = channel.peer_certificate()
        if self.sasl is None and cert is not None:
            subject = rfc2253_subject(cert.get("subject", ()))
            try:
                self.principal = self._security.principal_mapper.principal(subject)
            except PrincipalMappingError as exc:
                _log.warning("refusing the SSL client %s: %s", self.peer, exc)
                return False
            _log.debug("%s is %s (certificate subject %s)", self.peer, self.principal, subject)
        return True

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self) -> None:
        if self._idle_s is not None:
            self._idle_timer = self._loop.call_later(self._idle_s, self._expire_if_idle)
        try:
            await self._serve()
        finally:
            if self._idle_timer is not None:
                self._idle_timer.cancel()

    def _expire_if_idle(self) -> None:
        assert self._idle_s is not None
        idle_for = time.monotonic() - self._active
        if idle_for >= self._idle_s and self._unanswered == 0:
            _log.info(
                "closing connection from %s: idle for connections.max.idle.ms (%d ms)",
                self.peer,
                int(self._idle_s * 1000),
            )
            self.abort()
            return
        # Busy meanwhile, or a request is in progress: look again one idle period after
        # the last activity (or later, while the request is unanswered).
        self._idle_timer = self._loop.call_later(
            max(self._idle_s - idle_for, 0.0) or self._idle_s, self._expire_if_idle
        )

    async def _serve(self) -> None:
        if self._security is not None and self._security.uses_tls:
            try:
                if not await self._start_tls():
                    return
            finally:
                if self._tls is None:
                    with contextlib.suppress(OSError):
                        self._sock.close()
        writer = asyncio.create_task(self._write_loop(), name=f"write {self.peer}")
        reading = asyncio.create_task(self._read_loop(), name=f"read {self.peer}")
        self._reading = reading
        # A writer that ends (client gone, send failed) must not leave the reader blocked
        # on a full queue.
        writer.add_done_callback(lambda _: reading.cancel())
        try:
            # The reader ends at EOF, a protocol error, or stop_reading(). After a protocol
            # error or at shutdown the writer first sends what is still queued, as Kafka
            # has answered every earlier request before it reads the next one; a client
            # that hung up gets nothing more, not even a pending long poll.
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            if not writer.done() and not self._peer_closed:
                await self._queue.put((None, None, 0.0, 0.0, 0.0))
                await writer
        except (ConnectionError, OSError, _Closed):
            pass
        finally:
            writer.cancel()
            with contextlib.suppress(BaseException):
                await writer
            if self._close_after_reply and self._security is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(self._security.failed_authentication_delay_ms / 1000)
            self._drain_unsent()
            if self._queue_size is not None:
                # Requests that will never be answered leave the listener's queue.
                self._queue_size.value -= self._unanswered
            self._unanswered = 0
            with contextlib.suppress(OSError):
                self._sock.close()

    def stop_reading(self) -> None:
        """Take no new requests; responses already in flight are still sent (shutdown)."""
        self._closing = True
        if self._reading is not None:
            self._reading.cancel()

    def abort(self) -> None:
        """Drop the connection now."""
        self._closing = True
        if self._reading is not None:
            self._reading.cancel()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def mute_for(self, throttle_ms: int) -> None:
        """Read no request for ``throttle_ms`` from now (the longest mute wins)."""
        self.muted_until = max(self.muted_until, self._loop.time() + throttle_ms / 1000)

    async def _unmuted(self) -> None:
        while (wait := self.muted_until - self._loop.time()) > 0:
            await asyncio.sleep(wait)

    # -- reading -----------------------------------------------------------------------

    async def _read_loop(self) -> None:
        buf = bytearray(_RECV_SIZE)
        view = memoryview(buf)
        loop = self._loop
        try:
            tls = self._tls
            while not self._closing:
                await self._unmuted()
                if tls is not None:
                    n = await tls.recv_into(buf)
                else:
                    n = await loop.sock_recv_into(self._sock, buf)
                if n == 0:
                    self._peer_closed = True
                    return
                self._received = time.perf_counter()
                self._active = time.monotonic()
                for frame in self._decoder.feed(view[:n]):
                    # Frames read together with a throttled request wait out its mute.
                    await self._unmuted()
                    await self._handle_frame(frame)
                    if self._closing:
                        return
        except ProtocolError as exc:
            _log.warning("closing connection from %s: %s", self.peer, exc)
        except ssl.SSLError as exc:
            _log.warning("closing TLS connection from %s: %s", self.peer, exc.reason or exc)
            self._peer_closed = True
        except (ConnectionError, OSError):
            self._peer_closed = True

    async def _raw_sasl_token(self, frame: memoryview) -> None:
        """A token of the unframed exchange after SaslHandshake v0: answered with a
        size-prefixed token; a failure just closes the connection (v0 cannot say why)."""
        assert self.sasl is not None
        taken = time.perf_counter()
        try:
            token = self.sasl.authenticate(bytes(frame))
        except SaslFailure as failure:
            _log.warning(
                "SASL authentication from %s with %s failed: %s",
                self.peer,
                self.sasl.mechanism,
                failure.message,
            )
            self._closing = True
            return
        if self.sasl.complete:
            self.authenticated()
        token = size_prefix(len(token)) + token
        await self._queue.put((None, token, taken, taken, time.perf_counter()))

    async def _handle_frame(self, frame: memoryview) -> None:
        sasl = self.sasl
        if sasl is not None and sasl.raw_tokens and sasl.state is SaslState.AUTHENTICATE:
            await self._raw_sasl_token(frame)
            return
        taken = time.perf_counter()
        # Frames read together wait for the handlers of the ones before them.
        received = min(self._received, taken)
        self._took()
        try:
            header, request = parse_request(frame, self._accepted)
        except UnsupportedVersionError as exc:
            assert exc.header is not None
            if exc.header.api_key == ApiKey.API_VERSIONS:
                fallback = encode_api_versions_fallback(exc.header)
                await self._queue.put((exc.header, fallback, received, taken, time.perf_counter()))
                return
            self._answered()
            _log.warning("closing connection from %s: %s", self.peer, exc)
            self._closing = True
            return
        except ProtocolError as exc:
            _log.warning("closing connection from %s: %s", self.peer, exc)
            self._answered()
            self._closing = True
            return
        if sasl is not None and not sasl.complete and header.api_key not in _BEFORE_SASL:
            _log.warning(
                "closing connection from %s: %s before SASL authentication",
                self.peer,
                ApiKey(header.api_key).name,
            )
            self._answered()
            self._closing = True
            return
        handler = self._handlers[header.api_key]
        ctx = RequestContext(self._broker, self, header)
        try:
            reply = await handler(ctx, request)
        except CloseConnection as exc:
            _log.info("closing connection from %s: %s", self.peer, exc)
            self._answered()
            self._closing = True
            return
        except Exception:
            # A handler bug must not take the broker down; Kafka closes the connection of a
            # request it failed to handle in an unexpected way, and so do we.
            _log.exception(
                "%s v%d from %s failed; closing the connection",
                ApiKey(header.api_key).name,
                header.api_version,
                self.peer,
            )
            self._answered()
            self._closing = True
            return
        await self._queue.put((header, reply, received, taken, time.perf_counter()))
        if self._close_after_reply:
            self._closing = True

    # -- writing -----------------------------------------------------------------------

    async def _write_loop(self) -> None:
        metrics = self._broker.metrics
        slow_log = self._broker.slow_request_log
        while True:
            header, reply, received, taken, handled = await self._queue.get()
            if header is None and reply is None:
                return
            ready = handled
            if isinstance(reply, Deferred):
                reply = await reply.waiter
                ready = time.perf_counter()
            if reply is NO_RESPONSE:
                if header is not None:
                    self._answered()
                if metrics is not None and header is not None:
                    metrics.request_done(
                        header.api_key,
                        (),
                        ready - received,
                        handled - taken,
                        ready - handled,
                        queue=taken - received,
                    )
                if slow_log is not None and header is not None:
                    slow_log.observe(
                        header, self.peer, tuple, ready - taken, handled - taken, ready - handled
                    )
                continue
            error_codes = metrics.error_codes_of(reply) if metrics is not None else ()
            if isinstance(reply, bytes):
                await self._send(reply)
            elif isinstance(reply, EncodedResponse):
                assert header is not None
                try:
                    await self._send_encoded(header, reply)
                finally:
                    reply.close()
            else:
                assert header is not None
                await self._send(encode_response(header, reply))
            if header is None:
                continue
            sent = time.perf_counter()
            self._active = time.monotonic()
            self._answered()
            if metrics is not None:
                metrics.request_done(
                    header.api_key,
                    error_codes,
                    sent - received,
                    handled - taken,
                    ready - handled,
                    queue=taken - received,
                    send=sent - ready,
                )
            if slow_log is not None:
                slow_log.observe(
                    header,
                    self.peer,
                    # Walked only for a slow request, unless the metrics already did.
                    functools.partial(list, error_codes)
                    if metrics is not None
                    else functools.partial(response_error_codes, reply),
                    sent - taken,
                    handled - taken,
                    ready - handled,
                )

    async def _send_encoded(self, header: RequestHeader, reply: EncodedResponse) -> None:
        response_header = encode_response_header(
            ResponseHeader(
                header.correlation_id,
                response_header_version(header.api_key, header.api_version),
            )
        )
        pending = bytearray(size_prefix(len(response_header) + reply.size))
        pending += response_header
        for part in reply.parts:
            if isinstance(part, bytes):
                pending += part
                continue
            if pending:
                await self._send(pending)
                pending = bytearray()
            await self._sendfile(part)
        if pending:
            await self._send(pending)

    async def _send(self, data: bytes | bytearray) -> None:
        if self._tls is not None:
            await self._tls.sendall(data)
        else:
            await self._loop.sock_sendall(self._sock, data)

    async def _sendfile(self, part: FileSlice) -> None:
        if self._tls is not None:
            if await self._tls.sendfile(part) < part.length:
                raise _Closed(f"segment shrank while sending to {self.peer}")
            return
        offset, remaining = part.position, part.length
        while remaining > 0:
            try:
                sent = os.sendfile(self._fd, part.fd, offset, remaining)
            except BlockingIOError:
                await self._writable()
                continue
            if sent == 0:
                # The segment was truncated under us: the response can no longer be
                # completed, and a short response would desynchronise the client.
                raise _Closed(f"segment shrank while sending to {self.peer}")
            offset += sent
            remaining -= sent

    async def _writable(self) -> None:
        waiter: asyncio.Future[None] = self._loop.create_future()

        def ready() -> None:
            if not waiter.done():
                waiter.set_result(None)

        self._loop.add_writer(self._fd, ready)
        try:
            await waiter
        finally:
            self._loop.remove_writer(self._fd)

    def _took(self) -> None:
        self._unanswered += 1
        if self._queue_size is not None:
            self._queue_size.value += 1

    def _answered(self) -> None:
        self._unanswered -= 1
        if self._queue_size is not None:
            self._queue_size.value -= 1

    def _drain_unsent(self) -> None:
        while not self._queue.empty():
            _, reply, _, _, _ = self._queue.get_nowait()
            if isinstance(reply, EncodedResponse):
                reply.close()
            elif isinstance(reply, Deferred):
                waiter = reply.waiter
                if isinstance(waiter, asyncio.Future | asyncio.Task):
                    waiter.cancel()
                elif asyncio.iscoroutine(waiter):
                    waiter.close()
