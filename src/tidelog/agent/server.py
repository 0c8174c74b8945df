"""The daemon's Unix socket server (protocol in :mod:`tidelog.agent.wire`).

One thread per connection, with blocking reads and writes, apart from the agent's event loop
(where the senders deliver to the cluster): an acknowledgement never waits behind delivery
work, and a lone client's SEND costs one read, one group commit on the connection's own
thread (see :mod:`tidelog.agent.queue`) and one write. Every chunk read from a connection is
cut into frames; its SENDs are stored with one call of the agent (one group commit) per
topic and partition, however they alternate (see :class:`_Groups`), and all answers to a
chunk go out in one write, in request order. One client's events for a partition are queued
in the order it sent them, and a QUERY or STATUS is answered after the SENDs before it are
stored. A request the agent fails to answer is answered with the error, and the connection
goes on; only a frame of impossible size closes it.

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
import stat
import struct
import threading
import time
from pathlib import Path

from tidelog.agent.agent import Agent, EventId
from tidelog.agent.errors import (
    AgentClosedError,
    AgentError,
    EventFormatError,
    EventTooLargeError,
    QueueFullError,
)
from tidelog.agent.event import check_body_at
from tidelog.agent.wire import (
    BAD_REQUEST,
    CLOSED,
    ERROR,
    MAX_FRAME,
    OK,
    OP_QUERY,
    OP_SEND,
    OP_STATUS,
    QUERY_ANSWER,
    QUEUE_FULL,
    REQUEST_HEAD,
    STATES,
    TOO_LARGE,
    encode_response,
    encode_send_ok,
    parse_number,
    parse_topic_partition,
)
from tidelog.runtime.filelock import FileLock, LockHeldError

_log = logging.getLogger(__name__)
_SIZE = struct.Struct(">I")


# How long a stopping server lets its connections answer what they had received.
STOP_GRACE_S = 2.0


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
        self._path_lock: FileLock | None = None

    @property
    def lock_path(self) -> Path:
        """``<socket>.lock``, flock'ed while a server owns the socket path."""
        return self.path.with_name(self.path.name + ".lock")

    def start(self) -> None:
        self._lock_path()
        try:
            self._remove_stale_socket()
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                listener.bind(str(self.path))
                listener.listen(128)
            except OSError as exc:
                listener.close()
                reason = exc.strerror or str(exc)
                raise AgentError(f"cannot listen on {str(self.path)!r}: {reason}") from None
        except BaseException:
            self._unlock_path()
            raise
        self._listener = listener
        self._acceptor = threading.Thread(
            target=self._accept_loop, args=(listener,), name="agent-accept", daemon=True
        )
        self._acceptor.start()

    def _lock_path(self) -> None:
        """Own the socket path for as long as this server runs.

        Probing the socket alone leaves a race: two daemons started together both find it
        stale, and the second replaces the first one's socket, leaving that daemon running
        but unreachable. The lock is taken on ``<socket>.lock``; the file is removed at stop,
        so a lock taken on a file that was replaced meanwhile is dropped and taken again.
        """
        while True:
            try:
                lock = FileLock.acquire(self.lock_path, mode=0o600)
            except LockHeldError:
                raise AgentError(f"another agent serves {str(self.path)!r}") from None
            except OSError as exc:
                raise AgentError(f"cannot listen on {str(self.path)!r}: {exc.strerror}") from None
            try:
                same = os.stat(self.lock_path).st_ino == os.fstat(lock.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._path_lock = lock
                return
            lock.release()  # the stopping owner removed the file after this open: retry

    def _unlock_path(self) -> None:
        lock, self._path_lock = self._path_lock, None
        if lock is not None:
            # Removed while still held: whoever opened this file meanwhile sees it replaced.
            with contextlib.suppress(FileNotFoundError):
                self.lock_path.unlink()
            lock.release()

    def _remove_stale_socket(self) -> None:
        """Remove the socket a previous daemon left at the path; never anything else: not a
        file given as the socket path by mistake, not the socket of a daemon still serving."""
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            return
        except OSError as exc:
            raise AgentError(f"cannot listen on {str(self.path)!r}: {exc.strerror}") from None
        if not stat.S_ISSOCK(mode):
            raise AgentError(f"{str(self.path)!r} exists and is not a socket; not replacing it")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.path))
            except OSError:
                pass  # nobody listens: left by a daemon that is gone
            else:
                raise AgentError(f"another agent serves {str(self.path)!r}")
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Stop accepting, close every connection; the agent itself stays open.

        Graceful: each connection stops taking requests (its reading side is shut, so the
        client's next write fails) but answers those it had received, for up to ``grace``
        seconds: an event stored at a stop is answered as stored, rather than failed with
        the connection (and sent again by an application that trusts the failure). A
        connection still busy then (waiting for room in a full queue) is cut.
        """
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
            # A blocked recv() returns what was sent before, then the end of the stream.
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RD)
        if self._acceptor is not None:
            self._acceptor.join(5)
        deadline = time.monotonic() + grace
        for _, thread in connections:
            thread.join(max(0.0, deadline - time.monotonic()))
        for conn, thread in connections:
            if thread.is_alive():
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                # A connection blocked on a full queue is released when the agent closes.
                thread.join(1)
        if listener is not None:  # only the socket this server made
            self._listener = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._unlock_path()

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError as exc:
                with self._lock:
                    if self._stopping:
                        return
                # Out of file descriptors or memory for a moment: the daemon must go on
                # serving once they are back.
                _log.warning("cannot accept a connection: %s", exc)
                time.sleep(0.1)
                continue
            thread = threading.Thread(
                target=self._serve, args=(conn,), name="agent-connection", daemon=True
            )
            with self._lock:
                if self._stopping:
                    conn.close()
                    return
                self._connections[conn] = thread
            try:
                thread.start()
            except RuntimeError as exc:  # no thread to serve it: refuse the connection
                _log.warning("cannot serve a connection: %s", exc)
                with self._lock:
                    self._connections.pop(conn, None)
                conn.close()

    def _serve(self, conn: socket.socket) -> None:
        buffer = bytearray()
        try:
            while True:
                chunk = conn.recv(1 << 18)
                if not chunk:
                    return
                buffer += chunk
                replies: list[bytes] = []
                used = self._handle(buffer, replies)
                if replies:
                    # Before closing for a bad frame too: these events are stored.
                    conn.sendall(b"".join(replies))
                if used is None:
                    return
                if used:
                    # A new buffer for what is left: views of the frames may outlive this
                    # turn. Not while a frame is incomplete: copying it at every read would
                    # make a large frame cost its size times its reads.
                    buffer = buffer[used:]
        except OSError:
            return
        finally:
            with self._lock:
                self._connections.pop(conn, None)
            conn.close()

    def _handle(self, data: bytearray, replies: list[bytes]) -> int | None:
        """Answer the complete frames at the start of ``data``; returns the bytes they took,
        None for a frame of impossible size (the connection is closed).

        One pass over the frames, with no slice per frame but the event body: a SEND whose
        topic and partition bytes are those of the SEND before is not parsed again. The
        SENDs are gathered into groups, each stored with one call of the agent (one group
        commit): all SENDs of one topic to one explicit partition, however they alternate
        with other partitions and topics; SENDs of a topic without a partition keep the
        calls they had one after the other (see :class:`_Groups`). The groups are stored
        before a request of another kind is answered, and at the end of the chunk; the
        answers are put in request order.
        """
        view = memoryview(data)
        available = len(data)
        max_body = self.agent.config["max.request.size"]
        groups = _Groups(self.agent.config["partitioner.ignore.keys"])
        answers: list[bytes] = []  # one per request, in request order; b"" until stored
        send_key: tuple[str, int] = ("", 0)
        prefix = b""  # the raw topic and partition of the last SEND parsed
        pos = 0
        while available - pos >= 4:
            (size,) = _SIZE.unpack_from(data, pos)
            if size < 5 or size > MAX_FRAME:
                _log.warning("closing a connection that sent a frame of %d bytes", size)
                self._store_all(groups, answers)
                replies.extend(answers)
                return None
            end = pos + 4 + size
            if end > available:
                break
            _, op, request_id = REQUEST_HEAD.unpack_from(data, pos)
            at = pos + REQUEST_HEAD.size
            pos = end
            if op == OP_SEND:
                try:
                    if prefix and at + len(prefix) <= end and data.startswith(prefix, at):
                        body_at = at + len(prefix)
                    else:
                        topic, partition, used = parse_topic_partition(view[at:end])
                        prefix = bytes(data[at : at + used])
                        send_key = (topic, partition)
                        body_at = at + used
                    if end - body_at > max_body:
                        raise EventTooLargeError(
                            f"event of {end - body_at} bytes is larger than max.request.size"
                        )
                    key = check_body_at(data, body_at, end)
                except (EventFormatError, EventTooLargeError) as exc:
                    groups.interrupt()
                    status = TOO_LARGE if isinstance(exc, EventTooLargeError) else BAD_REQUEST
                    answers.append(encode_response(request_id, status, str(exc).encode()))
                    continue
                groups.add(send_key, (request_id, len(answers), key, view[body_at:end]))
                answers.append(b"")
                continue
            # Whatever else: answered after the SENDs before it are stored.
            self._store_all(groups, answers)
            answers.append(self._answer(op, request_id, view[at:end]))
        self._store_all(groups, answers)
        replies.extend(answers)
        return pos

    def _answer(self, op: int, request_id: int, payload: memoryview) -> bytes:
        """The answer to a request other than SEND. Whatever the agent raises while answering
        it (a race elsewhere included) fails this request alone, with the reason: the
        connection goes on, and so do the other requests in flight on it."""
        if op == OP_QUERY:
            try:
                topic, partition, used = parse_topic_partition(payload)
                number = parse_number(payload, used)
            except EventFormatError as exc:
                return encode_response(request_id, BAD_REQUEST, str(exc).encode())
            event = EventId(topic, partition, number)
            try:
                state, offset, where = self.agent.delivery(event)
                answer = QUERY_ANSWER.pack(STATES.index(state), offset, where)
            except Exception as exc:
                return _failed(request_id, f"the delivery of {event}", exc)
            return encode_response(request_id, OK, answer)
        if op == OP_STATUS:
            try:
                text = json.dumps({"queues": self.agent.status()})
            except Exception as exc:
                return _failed(request_id, "the status", exc)
            return encode_response(request_id, OK, text.encode())
        return encode_response(request_id, BAD_REQUEST, f"unknown op {op}".encode())

    def _store_all(self, groups: _Groups, answers: list[bytes]) -> None:
        """Store the pending groups in the order they were begun, answering their SENDs."""
        for key, group in groups.take():
            self._store(key, group, answers)

    def _store(self, key: tuple[str, int], group: list[_Send], answers: list[bytes]) -> None:
        topic, partition = key
        try:
            # The bodies are copied into the queue's buffer before store() returns.
            ids = self.agent.store(
                topic, None if partition < 0 else partition, [(k, b) for _, _, k, b in group]
            )
        except Exception as exc:
            status = _status_of(exc)
            if not isinstance(exc, AgentError):
                _log.exception("storing %d event(s) of %s failed", len(group), topic)
            message = str(exc).encode()
            # The group mixes independent requests: those whose events a queue stored
            # before another queue failed are answered as stored.
            stored = getattr(exc, "stored", None) or [None] * len(group)
            for (r, slot, _, _), e in zip(group, stored, strict=True):
                if isinstance(e, EventId):
                    answers[slot] = encode_send_ok(r, e.partition, e.number)
                else:
                    answers[slot] = encode_response(r, status, message)
            return
        for (r, slot, _, _), e in zip(group, ids, strict=True):
            answers[slot] = encode_send_ok(r, e.partition, e.number)


# A SEND waiting to be stored: request id, its answer's index, record key, record body.
_Send = tuple[int, int, bytes | None, memoryview]


class _Groups:
    """The SENDs of one chunk, gathered into the groups the server stores them in.

    The agent stores a list of events of one topic with one group commit per partition
    queue, so a chunk costs a commit per group, not per change of partition between
    consecutive SENDs. What the grouping keeps:

    * Events of one partition are stored in the order they were sent: a group only ever
      takes SENDs of one (topic, partition choice), appended in order, and the groups are
      stored in the order they were begun.
    * A SEND without a partition may land in any partition of its topic, so it is not
      reordered against SENDs of that topic with an explicit one: either kind ends the
      topic's open groups of the other kind, and what comes after goes into new groups.
    * Events without a partition get the partitions they got when each run of them was
      stored by a call of its own: the agent makes one sticky choice per call for the
      events without a key. A SEND joins its topic's group when it follows it directly, or
      when it has a key and so far the group has only events with keys (placed by their
      hash alone: one call for more of them places each the same).
    """

    __slots__ = ("_explicit", "_ignore_keys", "_last", "_order", "_unassigned")

    def __init__(self, ignore_keys: bool) -> None:
        self._ignore_keys = ignore_keys
        self._order: list[tuple[tuple[str, int], list[_Send]]] = []
        # The groups SENDs may still join: per topic, by explicit partition...
        self._explicit: dict[str, dict[int, list[_Send]]] = {}
        # ... and the topic's group without a partition, with whether it is keyed only.
        self._unassigned: dict[str, tuple[list[_Send], bool]] = {}
        self._last: list[_Send] | None = None  # the group of the frame before

    def add(self, key: tuple[str, int], send: _Send) -> None:
        topic, partition = key
        if partition >= 0:
            self._unassigned.pop(topic, None)
            by_partition = self._explicit.setdefault(topic, {})
            group = by_partition.get(partition)
            if group is None:
                group = by_partition[partition] = self._begin(key)
        else:
            keyed = send[2] is not None and not self._ignore_keys
            open_group = self._unassigned.get(topic)
            if open_group is not None and (
                open_group[0] is self._last or (open_group[1] and keyed)
            ):
                group = open_group[0]
                if not keyed and open_group[1]:
                    self._unassigned[topic] = (group, False)
            else:
                self._explicit.pop(topic, None)
                group = self._begin(key)
                self._unassigned[topic] = (group, keyed)
        group.append(send)
        self._last = group

    def interrupt(self) -> None:
        """A frame that is not a stored SEND: a run without a partition ends here."""
        self._last = None

    def take(self) -> list[tuple[tuple[str, int], list[_Send]]]:
        """The groups to store, in order; a new set begins."""
        order = self._order
        self._order = []
        self._explicit.clear()
        self._unassigned.clear()
        self._last = None
        return order

    def _begin(self, key: tuple[str, int]) -> list[_Send]:
        group: list[_Send] = []
        self._order.append((key, group))
        return group


def _failed(request_id: int, what: str, error: Exception) -> bytes:
    """The answer to a QUERY or STATUS the agent failed to answer with ``error``."""
    if not isinstance(error, AgentError):
        _log.exception("answering %s failed", what)
    return encode_response(request_id, _status_of(error), f"cannot tell {what}: {error}".encode())


def _status_of(error: Exception) -> int:
    """The status answering a request the agent failed with ``error``: the client raises
    the same exception type from it."""
    if isinstance(error, QueueFullError):
        return QUEUE_FULL
    if isinstance(error, EventTooLargeError):
        return TOO_LARGE
    if isinstance(error, AgentClosedError):
        return CLOSED
    if isinstance(error, EventFormatError):
        return BAD_REQUEST
    return ERROR
