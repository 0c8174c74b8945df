"""The daemon's Unix socket server (protocol in :mod:`tidelog.agent.wire`).

One thread per connection, with blocking reads and writes, apart from the agent's event loop
(where the senders deliver to the cluster): an acknowledgement never waits behind delivery
work, and a lone client's SEND costs one read, one group commit on the connection's own
thread (see :mod:`tidelog.agent.queue`) and one write. Every chunk read from a connection is
cut into frames; consecutive SENDs of one topic and partition choice are stored together
with one group commit, and all answers to a chunk go out in one write. Frames are processed
in the order they arrive, so one client's events for a partition are queued in the order it
sent them, and its answers come back in request order.

Applications on the host hold a few long-lived connections, so a thread each is cheap;
while a connection's thread waits for a group commit, the client's further requests wait in
the socket buffer and are answered by the next one together.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import threading
from pathlib import Path

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
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._stopping = False

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.path))
            listener.listen(128)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._acceptor = threading.Thread(
            target=self._accept_loop, args=(listener,), name="agent-accept", daemon=True
        )
        self._acceptor.start()

    def stop(self) -> None:
        """Stop accepting, close every connection; the agent itself stays open."""
        with self._lock:
            self._stopping = True
            connections = list(self._connections.items())
        listener = self._listener
        if listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone does not.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for conn, _ in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._acceptor is not None:
            self._acceptor.join(5)
        for _, thread in connections:
            # A connection blocked on a full queue is released when the agent closes.
            thread.join(1)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            thread = threading.Thread(
                target=self._serve, args=(conn,), name="agent-connection", daemon=True
            )
            with self._lock:
                if self._stopping:
                    conn.close()
                    return
                self._connections[conn] = thread
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        buffer = bytearray()
        try:
            while True:
                chunk = conn.recv(1 << 18)
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
                replies: list[bytes] = []
                self._handle(frames, replies)
                # A new buffer for what is left: the frames' views may outlive this turn.
                buffer = buffer[pos:]
                if replies:
                    conn.sendall(b"".join(replies))
        except OSError:
            return
        finally:
            with self._lock:
                self._connections.pop(conn, None)
            conn.close()

    def _handle(self, frames: list[memoryview], replies: list[bytes]) -> None:
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
                    replies.append(encode_response(request_id, BAD_REQUEST, str(exc).encode()))
                    continue
                gkey = (topic, partition)
                if group_key is not None and gkey != group_key:
                    self._store(group_key, group, replies)
                    group = []
                group_key = gkey
                group.append((request_id, key, body))
                continue
            if group_key is not None:
                self._store(group_key, group, replies)
                group, group_key = [], None
            if op == OP_QUERY:
                try:
                    topic, partition, used = parse_topic_partition(payload)
                    number = parse_number(payload, used)
                except EventFormatError as exc:
                    replies.append(encode_response(request_id, BAD_REQUEST, str(exc).encode()))
                    continue
                state, offset, where = self.agent.delivery(EventId(topic, partition, number))
                answer = QUERY_ANSWER.pack(STATES.index(state), offset, where)
                replies.append(encode_response(request_id, OK, answer))
            elif op == OP_STATUS:
                text = json.dumps({"queues": self.agent.status()})
                replies.append(encode_response(request_id, OK, text.encode()))
            else:
                replies.append(
                    encode_response(request_id, BAD_REQUEST, f"unknown op {op}".encode())
                )
        if group_key is not None:
            self._store(group_key, group, replies)

    def _store(
        self,
        key: tuple[str, int],
        group: list[tuple[int, bytes | None, memoryview]],
        replies: list[bytes],
    ) -> None:
        topic, partition = key
        try:
            # The bodies are copied into the queue's buffer before store() returns.
            ids = self.agent.store(
                topic, None if partition < 0 else partition, [(k, body) for _, k, body in group]
            )
        except QueueFullError as exc:
            message = str(exc).encode()
            replies.extend(encode_response(r, QUEUE_FULL, message) for r, _, _ in group)
            return
        except AgentError as exc:
            message = str(exc).encode()
            replies.extend(encode_response(r, ERROR, message) for r, _, _ in group)
            return
        replies.extend(
            encode_response(r, OK, SEND_ACK.pack(e.partition, e.number))
            for (r, _, _), e in zip(group, ids, strict=True)
        )
