"""TLS over a connection's raw socket, through :class:`ssl.SSLObject` and memory BIOs.

The connection keeps its non-blocking socket and the loop's ``sock_*`` calls; this class
puts OpenSSL between them: received bytes go into the incoming BIO and come out of
:meth:`recv_into` decrypted; what is sent is encrypted into the outgoing BIO and drained to
the socket. Only one task drains at a time and the drain takes whatever the BIO holds at
that moment, so TLS records leave in the order OpenSSL wrote them even when the reader
(which may produce records: session tickets, key updates, alerts) and the writer both
send.

There is no zero copy with TLS (OpenSSL must see every byte): file regions are read into
one reusable buffer with ``preadv`` and encrypted from it, in chunks of many TLS records,
which is the fewest copies the ``ssl`` module allows (kernel TLS needs Python 3.12's
``OP_ENABLE_KTLS``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from typing import Any

from tidelog.storage import FileSlice

__all__ = ["TlsChannel"]

_CHUNK = 256 * 1024


class TlsChannel:
    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._raw = bytearray(_CHUNK)
        self._file_buffer: bytearray | None = None
        self._draining = asyncio.Lock()

    async def handshake(self) -> None:
        """Run the TLS handshake; ssl.SSLError or ConnectionError when it fails."""
        while True:
            try:
                self._ssl.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._drain()
                if not await self._receive():
                    raise ConnectionError(
                        "the client closed the connection during the TLS handshake"
                    ) from None
            except ssl.SSLError:
                # Send the alert that explains the refusal before closing.
                await self._drain()
                raise
        await self._drain()

    def peer_certificate(self) -> dict[str, Any] | None:
        """The client's verified certificate, None when it sent none."""
        cert = self._ssl.getpeercert()
        return cert or None

    async def _receive(self) -> bool:
        n = await self._loop.sock_recv_into(self._sock, self._raw)
        if n == 0:
            self._incoming.write_eof()
            return False
        self._incoming.write(memoryview(self._raw)[:n])
        return True

    async def _drain(self) -> None:
        async with self._draining:
            data = self._outgoing.read()
            if data:
                await self._loop.sock_sendall(self._sock, data)

    async def recv_into(self, buffer: bytearray) -> int:
        """Decrypted bytes into ``buffer``; 0 at the end of the stream."""
        while True:
            try:
                # With a buffer, read() fills it and returns the count (typeshed says bytes).
                n: int = self._ssl.read(len(buffer), buffer)  # type: ignore[assignment]
            except ssl.SSLWantReadError:
                if self._outgoing.pending:
                    await self._drain()
                if not await self._receive():
                    return 0
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return 0
            if self._outgoing.pending:
                await self._drain()
            return n

    async def sendall(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        for start in range(0, len(view), _CHUNK):
            self._ssl.write(view[start : start + _CHUNK])
            await self._drain()

    async def sendfile(self, part: FileSlice) -> int:
        """Send a file region; the bytes sent (short only if the file shrank)."""
        if self._file_buffer is None:
            self._file_buffer = bytearray(_CHUNK)
        buffer = self._file_buffer
        offset, remaining, sent = part.position, part.length, 0
        while remaining > 0:
            n = os.preadv(part.fd, [memoryview(buffer)[: min(remaining, _CHUNK)]], offset)
            assert isinstance(n, int)
            if n == 0:
                return sent
            self._ssl.write(memoryview(buffer)[:n])
            await self._drain()
            offset += n
            remaining -= n
            sent += n
        return sent
