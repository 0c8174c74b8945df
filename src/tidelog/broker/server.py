"""The listener: accept connections, serve each in its own task, shut down cleanly.

Shutdown (SIGTERM/SIGINT, or :meth:`BrokerServer.shutdown`) happens in Kafka's order:
stop accepting, stop reading new requests, let the requests already taken finish and
their responses go out (bounded by a grace period), then close the connections and
hand over to the broker to flush and close its logs with the clean-shutdown marker.

Connection limits (:mod:`tidelog.broker.connection_limits`): before each accept the
listener waits for room under ``max.connections`` and its creation rate; a connection
accepted from an address at its ``max.connections.per.ip`` is closed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tidelog.broker.connection import Connection
from tidelog.broker.connection_limits import ConnectionLimiter
from tidelog.broker.reply import Handler
from tidelog.protocol import ApiKey, VersionRange

if TYPE_CHECKING:
    from tidelog.broker.broker import Broker
    from tidelog.security import ListenerSecurity

_log = logging.getLogger(__name__)


class BrokerServer:
    """Listens on one address (one listener) and runs a :class:`Connection` per client."""

    def __init__(
        self,
        broker: Broker,
        host: str,
        port: int,
        handlers: Mapping[int, Handler],
        accepted: Mapping[ApiKey, VersionRange],
        *,
        max_frame_size: int,
        max_in_flight: int,
        shutdown_grace_s: float = 10.0,
        listener: str = "PLAINTEXT",
        security: ListenerSecurity | None = None,
        limiter: ConnectionLimiter | None = None,
        max_idle_ms: int | None = None,
    ) -> None:
        self.listener = listener
        #: The broker's connection counts and limits, shared by its listeners.
        self.limiter = limiter if limiter is not None else ConnectionLimiter()
        #: TLS and SASL of this listener (None: plain text, everyone ANONYMOUS)
        self.security = security
        self._broker = broker
        self._host = host
        self._port = port
        self._handlers = handlers
        self._accepted = accepted
        self._max_frame_size = max_frame_size
        self._max_in_flight = max_in_flight
        self._grace = shutdown_grace_s
        self._max_idle_ms = max_idle_ms
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._connections: dict[Connection, asyncio.Task[None]] = {}

    @property
    def host(self) -> str:
        """The address it listens on."""
        return self._host

    @property
    def port(self) -> int:
        """The bound port (useful when asked for port 0)."""
        assert self._listener is not None
        return int(self._listener.getsockname()[1])

    async def start(self) -> None:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        listener = socket.create_server(
            (self._host, self._port), family=family, backlog=1024, reuse_port=False
        )
        listener.setblocking(False)
        self._listener = listener
        self._accepting = asyncio.create_task(self._accept_loop(), name="accept")

    async def _accept_loop(self) -> None:
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        limiter = self.limiter
        while True:
            await self._room_to_accept()
            try:
                sock, address = await loop.sock_accept(self._listener)
            except OSError as exc:
                # EMFILE and friends: log, back off a little, keep serving the others.
                _log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            host = str(address[0]) if isinstance(address, tuple) else str(address)
            if not limiter.admit(self.listener, host, time.monotonic()):
                # Kafka's TooManyConnectionsException: closed before a byte is read.
                _log.info(
                    "closing a connection from %s on %s: max.connections.per.ip (%d) reached",
                    host,
                    self.listener,
                    limiter.limits.limit_of(host),
                )
                with contextlib.suppress(OSError):
                    sock.close()
                continue
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                # Reset by the client already: its slot is free again at once.
                limiter.release(self.listener, host)
                sock.close()
                continue
            connection = Connection(
                sock,
                self._broker,
                self._handlers,
                self._accepted,
                max_frame_size=self._max_frame_size,
                max_in_flight=self._max_in_flight,
                listener=self.listener,
                security=self.security,
                max_idle_ms=self._max_idle_ms,
            )
            task = asyncio.create_task(connection.run(), name=f"connection {connection.peer}")
            self._connections[connection] = task
            task.add_done_callback(self._forget(connection, host))

    async def _room_to_accept(self) -> None:
        """Wait until this listener may accept one more connection (back pressure: the
        clients wait in the kernel's backlog meanwhile)."""
        loop = asyncio.get_running_loop()
        blocked = False
        while True:
            delay = self.limiter.wait_time(self.listener, time.monotonic())
            if delay == 0:
                if blocked:
                    _log.info("%s accepts connections again", self.listener)
                return
            if delay is not None:
                await asyncio.sleep(delay)
                continue
            if not blocked:
                blocked = True
                _log.info("%s stops accepting: its connection limit is reached", self.listener)
            room: asyncio.Future[None] = loop.create_future()
            self.limiter.when_room(functools.partial(_wake, room))
            await room

    def _forget(self, connection: Connection, host: str) -> Callable[[asyncio.Task[None]], None]:
        def forget(_: asyncio.Task[None]) -> None:
            self._connections.pop(connection, None)
            self.limiter.release(self.listener, host)

        return forget

    async def shutdown(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self._listener is not None:
            self._listener.close()
        for connection in list(self._connections):
            connection.stop_reading()
        tasks = list(self._connections.values())
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self._grace)
            for connection, task in list(self._connections.items()):
                if task in pending:
                    connection.abort()
                    task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
