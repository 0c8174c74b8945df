"""Clients of the agent daemon over its Unix socket (protocol in :mod:`tidelog.agent.wire`).

:class:`AgentClient` is synchronous and thread-safe: :meth:`AgentClient.send` returns once
the daemon has the event on disk; :meth:`AgentClient.submit` returns a future at once so that
many sends can be in flight (pipelining); a reader thread matches answers to requests.
:class:`AsyncAgentClient` is the asyncio form (``await client.send(...)``; concurrent sends
pipeline by themselves).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import socket
import struct
import threading
import time
from concurrent.futures import Future
from typing import Any

from tidelog.agent.agent import Delivery, EventId
from tidelog.agent.errors import AgentClosedError, AgentError, QueueFullError
from tidelog.agent.event import Headers, encode_body
from tidelog.agent.wire import (
    BAD_REQUEST,
    MAX_FRAME,
    OK,
    OP_QUERY,
    OP_SEND,
    OP_STATUS,
    QUERY_ANSWER,
    QUEUE_FULL,
    RESPONSE_HEAD,
    SEND_ACK,
    STATES,
    encode_number,
    encode_request,
    encode_topic_partition,
)

_SIZE = struct.Struct(">I")


def _send_payload(
    topic: str,
    value: bytes | None,
    key: bytes | None,
    headers: Headers | None,
    partition: int | None,
    timestamp: int | None,
) -> bytes:
    ts = int(time.time() * 1000) if timestamp is None else timestamp
    return encode_topic_partition(topic, -1 if partition is None else partition) + encode_body(
        key, value, headers, ts
    )


def _error(status: int, payload: bytes) -> AgentError:
    message = payload.decode("utf-8", "replace")
    if status == QUEUE_FULL:
        return QueueFullError(message)
    if status == BAD_REQUEST:
        return AgentError(f"the agent refused the request: {message}")
    return AgentError(message)


def _decode(kind: int, topic: str, status: int, payload: bytes) -> Any:
    if status != OK:
        raise _error(status, payload)
    if kind == OP_SEND:
        partition, number = SEND_ACK.unpack(payload)
        return EventId(topic, partition, number)
    if kind == OP_QUERY:
        state, offset, partition = QUERY_ANSWER.unpack(payload)
        return Delivery(STATES[state], offset, partition)
    return json.loads(payload)


class _Many:
    """The answers to one :meth:`AgentClient.submit_many`: one future for all of them."""

    __slots__ = ("failed", "future", "remaining", "results", "topic")

    def __init__(self, count: int, topic: str) -> None:
        self.topic = topic
        self.future: Future[list[EventId]] = Future()
        self.results: list[Any] = [None] * count
        self.remaining = count
        self.failed = False

    def set(self, index: int, value: Any) -> None:
        self.results[index] = value
        self.remaining -= 1
        if self.remaining == 0 and not self.failed:
            self.future.set_result(self.results)

    def fail(self, error: BaseException) -> None:
        if not self.failed:
            self.failed = True
            self.future.set_exception(error)


class AgentClient:
    """A synchronous, thread-safe connection to the agent daemon at ``path``."""

    def __init__(self, path: str | os.PathLike[str], *, timeout: float | None = 30.0) -> None:
        self.path = os.fspath(path)
        self.timeout = timeout
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(self.path)
        except OSError as exc:
            self._sock.close()
            raise AgentClosedError(f"cannot connect to the agent at {self.path}: {exc}") from None
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[Future[Any], int, str]] = {}
        self._many: dict[int, tuple[_Many, int]] = {}
        self._write_lock = threading.Lock()
        self._failure: AgentError | None = None
        self._reader = threading.Thread(target=self._read_loop, name="agent-client", daemon=True)
        self._reader.start()

    def _request(self, op: int, payload: bytes, topic: str = "") -> Future[Any]:
        future: Future[Any] = Future()
        with self._write_lock:
            if self._failure is not None:
                raise self._failure
            request_id = next(self._ids) & 0xFFFFFFFF
            self._pending[request_id] = (future, op, topic)
            try:
                self._sock.sendall(encode_request(op, request_id, payload))
            except OSError as exc:
                self._pending.pop(request_id, None)
                raise AgentClosedError(f"the connection to the agent failed: {exc}") from None
        return future

    def submit(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        *,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> Future[EventId]:
        """Send without waiting; the future resolves once the event is durable at the agent."""
        return self._request(
            OP_SEND, _send_payload(topic, value, key, headers, partition, timestamp), topic
        )

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        *,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> EventId:
        """Send one event; returns once it is durable at the agent."""
        result: EventId = self.submit(
            topic, value, key, headers, partition=partition, timestamp=timestamp
        ).result(self.timeout)
        return result

    def submit_many(
        self, topic: str, events: list[tuple[bytes | None, bytes | None]]
    ) -> Future[list[EventId]]:
        """Send (key, value) events in one write, without waiting; the future resolves to
        their ids once all are durable (or fails with the first error)."""
        now = int(time.time() * 1000)
        prefix = encode_topic_partition(topic, -1)
        waiter = _Many(len(events), topic)
        if not events:
            waiter.future.set_result([])
            return waiter.future
        frames = []
        with self._write_lock:
            if self._failure is not None:
                raise self._failure
            for index, (key, value) in enumerate(events):
                request_id = next(self._ids) & 0xFFFFFFFF
                self._many[request_id] = (waiter, index)
                frames.append(
                    encode_request(OP_SEND, request_id, prefix + encode_body(key, value, None, now))
                )
            try:
                self._sock.sendall(b"".join(frames))
            except OSError as exc:
                raise AgentClosedError(f"the connection to the agent failed: {exc}") from None
        return waiter.future

    def send_many(
        self, topic: str, events: list[tuple[bytes | None, bytes | None]]
    ) -> list[EventId]:
        """Pipelined (key, value) sends; returns when all are durable."""
        result: list[EventId] = self.submit_many(topic, events).result(self.timeout)
        return result

    def delivery(self, event: EventId) -> Delivery:
        """Whether the event reached the cluster, and its offset when known."""
        payload = encode_topic_partition(event.topic, event.partition) + encode_number(event.number)
        result: Delivery = self._request(OP_QUERY, payload).result(self.timeout)
        return result

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self._request(OP_STATUS, b"").result(self.timeout)
        return result

    def _read_loop(self) -> None:
        buffer = bytearray()
        error: AgentError = AgentClosedError("the agent closed the connection")
        try:
            while True:
                chunk = self._sock.recv(1 << 18)
                if not chunk:
                    break
                buffer += chunk
                pos = 0
                while len(buffer) - pos >= 4:
                    (size,) = _SIZE.unpack_from(buffer, pos)
                    if size < 5 or size > MAX_FRAME:
                        raise AgentError(f"the agent sent a frame of {size} bytes")
                    if len(buffer) - pos - 4 < size:
                        break
                    _, request_id, status = RESPONSE_HEAD.unpack_from(buffer, pos)
                    payload = bytes(buffer[pos + RESPONSE_HEAD.size : pos + 4 + size])
                    pos += 4 + size
                    many = self._many.pop(request_id, None)
                    if many is not None:
                        waiter, index = many
                        if status == OK:
                            partition, number = SEND_ACK.unpack(payload)
                            waiter.set(index, EventId(waiter.topic, partition, number))
                        else:
                            waiter.fail(_error(status, payload))
                        continue
                    entry = self._pending.pop(request_id, None)
                    if entry is None:
                        continue
                    future, op, topic = entry
                    try:
                        future.set_result(_decode(op, topic, status, payload))
                    except AgentError as exc:
                        future.set_exception(exc)
                del buffer[:pos]
        except OSError as exc:
            error = AgentClosedError(f"the connection to the agent failed: {exc}")
        except AgentError as exc:
            error = exc
        with self._write_lock:
            self._failure = error
            pending, self._pending = self._pending, {}
            waiting, self._many = self._many, {}
        for future, _, _ in pending.values():
            if not future.done():
                future.set_exception(error)
        for waiter, _ in waiting.values():
            waiter.fail(error)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._reader.join(timeout=5)

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncAgentClient:
    """The asyncio client: ``client = await AsyncAgentClient.connect(path)``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[Any], int, str]] = {}
        self._failure: AgentError | None = None
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def connect(cls, path: str | os.PathLike[str]) -> AsyncAgentClient:
        try:
            reader, writer = await asyncio.open_unix_connection(os.fspath(path))
        except OSError as exc:
            raise AgentClosedError(f"cannot connect to the agent at {path}: {exc}") from None
        return cls(reader, writer)

    def _request(self, op: int, payload: bytes, topic: str = "") -> asyncio.Future[Any]:
        if self._failure is not None:
            raise self._failure
        request_id = next(self._ids) & 0xFFFFFFFF
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (future, op, topic)
        self._writer.write(encode_request(op, request_id, payload))
        return future

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        *,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> EventId:
        future = self._request(
            OP_SEND, _send_payload(topic, value, key, headers, partition, timestamp), topic
        )
        await self._writer.drain()
        result: EventId = await future
        return result

    async def delivery(self, event: EventId) -> Delivery:
        payload = encode_topic_partition(event.topic, event.partition) + encode_number(event.number)
        future = self._request(OP_QUERY, payload)
        await self._writer.drain()
        result: Delivery = await future
        return result

    async def status(self) -> dict[str, Any]:
        future = self._request(OP_STATUS, b"")
        await self._writer.drain()
        result: dict[str, Any] = await future
        return result

    async def _read_loop(self) -> None:
        error: AgentError = AgentClosedError("the agent closed the connection")
        try:
            while True:
                head = await self._reader.readexactly(4)
                (size,) = _SIZE.unpack(head)
                if size < 5 or size > MAX_FRAME:
                    raise AgentError(f"the agent sent a frame of {size} bytes")
                frame = await self._reader.readexactly(size)
                request_id, status = struct.unpack_from(">IB", frame, 0)
                entry = self._pending.pop(request_id, None)
                if entry is None:
                    continue
                future, op, topic = entry
                if future.done():
                    continue
                try:
                    future.set_result(_decode(op, topic, status, frame[5:]))
                except AgentError as exc:
                    future.set_exception(exc)
        except (OSError, asyncio.IncompleteReadError) as exc:
            error = AgentClosedError(f"the connection to the agent ended: {exc}")
        except AgentError as exc:
            error = exc
        self._failure = error
        pending, self._pending = self._pending, {}
        for future, _, _ in pending.values():
            if not future.done():
                future.set_exception(error)

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
