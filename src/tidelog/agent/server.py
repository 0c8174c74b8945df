"""The daemon's Unix socket server (protocol in :mod:`tidelog.agent.wire`).

It runs on the agent's event loop. Every chunk read from a connection is cut into frames;
the SENDs of one chunk are grouped by topic and handed to :meth:`Agent.submit` together, so one
group commit (and one wake-up of this loop) answers all of them. Frames are processed in the
order they arrive, so one client's events for a partition are queued in the order it sent them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import struct
from pathlib import Path
from typing import Any

from tidelog.agent.agent import Agent, EventId
from tidelog.agent.errors import AgentError, EventFormatError, QueueFullError
from tidelog.agent.event import check_body
from tidelog.agent.wire import (
    BAD_REQUEST,
    ERROR,
    MAX_FRAME,
    OK,
    OP_QUERY,
    OP_SEND,
    OP_STATUS,
    QUERY_ANSWER,
    QUEUE_FULL,
    REQUEST_HEAD,
    SEND_ACK,
    STATES,
    encode_response,
    parse_number,
    parse_topic_partition,
)

_log = logging.getLogger(__name__)
_SIZE = struct.Struct(">I")


class AgentServer:
    """Serves one :class:`Agent` on a Unix socket at ``path``."""

    def __init__(self, agent: Agent, path: str | os.PathLike[str]) -> None:
        self.agent = agent
        self.path = Path(path)
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    def start_sync(self) -> None:
        asyncio.run_coroutine_threadsafe(self.start(), self.agent.loop).result()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def stop_sync(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.stop(), self.agent.loop).result(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        loop = asyncio.get_running_loop()
        buffer = bytearray()

        def reply(data: bytes) -> None:
            if not writer.is_closing():
                writer.write(data)

        def reply_threadsafe(data: bytes) -> None:
            loop.call_soon_threadsafe(reply, data)

        try:
            while True:
                chunk = await reader.read(1 << 18)
                if not chunk:
                    return
                buffer += chunk
                frames: list[memoryview] = []
                view = memoryview(buffer)
                pos = 0
                while len(view) - pos >= 4:
                    (size,) = _SIZE.unpack_from(view, pos)
                    if size < 5 or size > MAX_FRAME:
                        _log.warning("closing a connection that sent a frame of %d bytes", size)
                        return
                    if len(view) - pos - 4 < size:
                        break
                    frames.append(view[pos : pos + 4 + size])
                    pos += 4 + size
                await self._handle(frames, reply, reply_threadsafe)
                del frames, view
                del buffer[:pos]
                await writer.drain()
        except (ConnectionError, OSError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _handle(self, frames: list[memoryview], reply: Any, reply_threadsafe: Any) -> None:
        # Consecutive SENDs of one topic and partition choice go to the agent together.
        group: list[tuple[int, bytes | None, memoryview]] = []
        group_key: tuple[str, int] | None = None
        for frame in frames:
            _, op, request_id = REQUEST_HEAD.unpack_from(frame, 0)
            payload = frame[REQUEST_HEAD.size :]
            if op == OP_SEND:
                try:
                    topic, partition, used = parse_topic_partition(payload)
                    body = payload[used:]
                    if len(body) > self.agent.config["max.request.size"]:
                        raise EventFormatError(
                            f"event of {len(body)} bytes is larger than max.request.size"
                        )
                    key = check_body(body)
                except EventFormatError as exc:
                    reply(encode_response(request_id, BAD_REQUEST, str(exc).encode()))
                    continue
                gkey = (topic, partition)
                if group_key is not None and gkey != group_key:
                    await self._send(group_key, group, reply, reply_threadsafe)
                    group = []
                group_key = gkey
                group.append((request_id, key, body))
                continue
            if group_key is not None:
                await self._send(group_key, group, reply, reply_threadsafe)
                group, group_key = [], None
            if op == OP_QUERY:
                try:
                    topic, partition, used = parse_topic_partition(payload)
                    number = parse_number(payload, used)
                except EventFormatError as exc:
                    reply(encode_response(request_id, BAD_REQUEST, str(exc).encode()))
                    continue
                state, offset, where = self.agent.delivery(EventId(topic, partition, number))
                answer = QUERY_ANSWER.pack(STATES.index(state), offset, where)
                reply(encode_response(request_id, OK, answer))
            elif op == OP_STATUS:
                text = json.dumps({"queues": self.agent.status()})
                reply(encode_response(request_id, OK, text.encode()))
            else:
                reply(encode_response(request_id, BAD_REQUEST, f"unknown op {op}".encode()))
        if group_key is not None:
            await self._send(group_key, group, reply, reply_threadsafe)

    async def _send(
        self,
        key: tuple[str, int],
        group: list[tuple[int, bytes | None, memoryview]],
        reply: Any,
        reply_threadsafe: Any,
    ) -> None:
        topic, partition = key
        # The bodies are copied once: the read buffer is reused for the next chunk.
        items = [(k, bytes(body)) for _, k, body in group]
        request_ids = [rid for rid, _, _ in group]

        def done(result: list[EventId] | BaseException) -> None:
            if isinstance(result, BaseException):
                message = str(result).encode()
                data = b"".join(encode_response(r, ERROR, message) for r in request_ids)
            else:
                data = b"".join(
                    encode_response(r, OK, SEND_ACK.pack(e.partition, e.number))
                    for r, e in zip(request_ids, result, strict=True)
                )
            reply_threadsafe(data)

        try:
            await self.agent.submit(topic, None if partition < 0 else partition, items, done)
        except QueueFullError as exc:
            message = str(exc).encode()
            reply(b"".join(encode_response(r, QUEUE_FULL, message) for r in request_ids))
        except AgentError as exc:
            message = str(exc).encode()
            reply(b"".join(encode_response(r, ERROR, message) for r in request_ids))
