"""What an API handler gives back to the connection that will send it.

A handler returns one of:

* a kio response object — the connection encodes it with the request's header version;
* :class:`EncodedResponse` — the body already laid out as parts, some of which are
  :class:`~tidelog.storage.FileSlice` regions of segment files that the connection sends
  with ``os.sendfile`` (Fetch's zero-copy path);
* :class:`Deferred` — the answer is not ready yet (acks=all waiting for fsync, a Fetch
  long poll). The connection goes on reading and handling the next requests, and sends
  every response in request order once each one is ready (Kafka's per-connection ordering);
* :data:`NO_RESPONSE` — Produce with acks=0, which Kafka never answers.

Handlers do their state changes (appends, commits) before returning, in the order the
requests arrived; only waiting happens inside a Deferred. That keeps the effects of
pipelined requests on one connection in order, which idempotent producers rely on.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from tidelog.storage import FileSlice

_SIZE = struct.Struct(">i")


@dataclass
class EncodedResponse:
    """A response body as ordered parts; the response header is added by the connection.

    ``parts`` are bytes or file regions; the connection writes the size prefix, the
    response header, then each part in order. File regions are closed after sending
    (or when the connection drops).
    """

    parts: list[bytes | FileSlice] = field(default_factory=list)
    #: The non-zero error codes the body carries (top level and per partition), which the
    #: broker's metrics count without decoding the body again.
    error_codes: list[int] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(len(p) if isinstance(p, bytes) else p.length for p in self.parts)

    def close(self) -> None:
        for part in self.parts:
            if isinstance(part, FileSlice):
                part.close()


class _NoResponse:
    """Marker: the request gets no response at all (Produce with acks=0)."""

    def __repr__(self) -> str:
        return "NO_RESPONSE"


NO_RESPONSE: Final = _NoResponse()

#: What a handler may produce once it is ready: a kio response, pre-encoded parts, or nothing.
Ready = Any


class Deferred:
    """A response that becomes ready later; ``waiter`` resolves to a :data:`Ready` value."""

    __slots__ = ("waiter",)

    def __init__(self, waiter: Awaitable[Ready]) -> None:
        self.waiter = waiter


def size_prefix(size: int) -> bytes:
    return _SIZE.pack(size)


def join_parts(parts: Sequence[bytes | FileSlice]) -> bytes:
    """All parts as bytes (for TLS connections and tests, where sendfile does not apply)."""
    out = bytearray()
    for part in parts:
        out += part if isinstance(part, bytes) else part.read()
    return bytes(out)


#: A handler: (request context, parsed kio request) -> reply, possibly after awaiting.
Handler = Callable[[Any, Any], Awaitable[Any]]
