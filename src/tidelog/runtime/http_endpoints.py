"""A minimal HTTP/1.1 server for a process's observability endpoints (``/metrics``,
``/health``, ``/ready``), shared by the broker and the event agent.

It runs in the caller's event loop: one small handler per connection, no thread per
request. One request per connection (``Connection: close``): Prometheus scrapes every few
seconds, a keep-alive would save nothing worth the code. Only ``GET`` is served; a path not
in the table is 404, a request head over 8 KiB is 400, and a client that sends half a head
is dropped after 10 s, so a stray connection costs nothing lasting.

A handler returns ``(status, content type, body)``; an exception from it becomes a 500
with a one-line body and a log entry, never the end of the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping

__all__ = [
    "Answer",
    "EndpointServer",
    "Handler",
    "health",
    "parse_http_listener",
    "readiness_answer",
]

_log = logging.getLogger(__name__)

Answer = tuple[int, str, bytes]
Handler = Callable[[], Awaitable[Answer]]

_MAX_HEAD = 8192
_READ_TIMEOUT_S = 10.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def parse_http_listener(value: str, key: str) -> tuple[str, int]:
    """``http://host:port`` → (host, port); a ValueError naming ``key`` otherwise.

    Port 0 asks the kernel for a free port (tests read it back from the server)."""
    scheme, sep, address = value.partition("://")
    host, colon, port_text = address.rpartition(":")
    if (
        scheme.lower() != "http"
        or not sep
        or not colon
        or not port_text.isdigit()
        or int(port_text) > 65535
        or "/" in address
    ):
        raise ValueError(f"{key}: expected http://host:port, not {value!r}")
    return host.strip("[]"), int(port_text)


async def health() -> Answer:
    """``/health``: 200 while the process is up (it answers, so it is)."""
    return 200, "text/plain", b"up\n"


def readiness_answer(reason: str | None) -> Answer:
    """``/ready``: 200 ``ready``, or 503 with the one-line reason the process is not."""
    if reason is None:
        return 200, "text/plain", b"ready\n"
    return 503, "text/plain", f"not ready: {reason}\n".encode()


class EndpointServer:
    """Serves ``GET`` on a fixed table of paths."""

    def __init__(self, host: str, port: int, routes: Mapping[str, Handler]) -> None:
        self._host = host
        self._port = port
        self._routes = dict(routes)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The bound port (the kernel's choice when 0 was asked)."""
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self._host or None, self._port, reuse_address=True
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._handlers):
                task.cancel()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            status, content_type, body = await self._answer(reader)
            head = (
                f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                f"Content-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
            writer.write(head + body)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            if task is not None:
                self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> Answer:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            return 400, "text/plain", b"request head too large\n"
        if len(head) > _MAX_HEAD:
            return 400, "text/plain", b"request head too large\n"
        method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
        path = rest.split(" ", 1)[0].split("?", 1)[0]
        handler = self._routes.get(path)
        if handler is None:
            return 404, "text/plain", f"no such path: {path} (try /metrics)\n".encode()
        if method != "GET":
            return 405, "text/plain", b"only GET\n"
        try:
            return await handler()
        except Exception:
            # A bug behind one endpoint must cost the process nothing but this answer.
            _log.exception("GET %s failed", path)
            return 500, "text/plain", f"{path} failed; see the log\n".encode()
