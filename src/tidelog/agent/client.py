"""Clients of the agent daemon over its Unix socket (protocol in :mod:`tidelog.agent.wire`).

:class:`AgentClient` is synchronous and thread-safe: :meth:`AgentClient.send` returns once
the daemon has the event on disk; :meth:`AgentClient.submit` returns a future at once so that
many sends can be in flight (pipelining). Answers are matched to requests by id, read by the
thread waiting for one when it can (see :class:`AgentClient`).
:class:`AsyncAgentClient` is the asyncio form (``await client.send(...)``; concurrent sends
pipeline by themselves).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import itertools
import json
import os
import select
import socket
import stat
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future, InvalidStateError
from typing import Any

from tidelog.agent.agent import Delivery, EventId
from tidelog.agent.errors import AgentClosedError, AgentError, EventTooLargeError, QueueFullError
from tidelog.agent.event import Headers, encode_bodies, encode_body, event_timestamp
from tidelog.agent.wire import (
    BAD_REQUEST,
    CLOSED,
    MAX_FRAME,
    OK,
    OP_QUERY,
    OP_SEND,
    OP_STATUS,
    QUERY_ANSWER,
    QUEUE_FULL,
    REQUEST_HEAD,
    RESPONSE_HEAD,
    SEND_ACK,
    STATES,
    TOO_LARGE,
    check_partition,
    encode_number,
    encode_request,
    encode_topic_partition,
)

_SIZE = struct.Struct(">I")


def _answer_at(buffer: bytearray, pos: int) -> tuple[int, int, int, bytes] | None:
    """The answer frame at ``pos`` if it is whole: (position after it, request id, status,
    payload); None when it is not all there yet."""
    if len(buffer) - pos < 4:
        return None
    (size,) = _SIZE.unpack_from(buffer, pos)
    if size < 5 or size > MAX_FRAME:
        raise AgentError(f"the agent sent a frame of {size} bytes")
    end = pos + 4 + size
    if len(buffer) < end:
        return None
    _, request_id, status = RESPONSE_HEAD.unpack_from(buffer, pos)
    return end, request_id, status, bytes(buffer[pos + RESPONSE_HEAD.size : end])


# What a client waits on per request id: a request's future, with its op and topic...
_Pending = tuple["Future[Any] | asyncio.Future[Any]", int, str]
# ... or one event of a send_many call: its _Many and its index in the call.
_ManyEntry = tuple["_Many", int]


def _dispatch_answers(
    buffer: bytearray, pending: dict[int, _Pending], many: dict[int, _ManyEntry]
) -> int:
    """Answer the requests of the whole answer frames in ``buffer``; how many frames there
    were. The frames dispatched leave the buffer even if dispatching stops half-way (an
    exception from a future's callback, a frame of impossible size)."""
    pos = 0
    count = 0
    try:
        while (answer := _answer_at(buffer, pos)) is not None:
            pos, request_id, status, payload = answer
            count += 1
            event = many.pop(request_id, None)
            if event is not None:
                event[0].answer(event[1], status, payload)
                continue
            entry = pending.pop(request_id, None)
            if entry is None:
                continue  # given up on (a timeout, a cancellation)
            future, op, topic = entry
            try:
                _settle(future, _decode(op, topic, status, payload))
            except AgentError as exc:
                _settle(future, error=exc)
    finally:
        del buffer[:pos]
    return count


def _discard(future: asyncio.Future[Any]) -> None:
    """An answer given up on: cancelled if still to come, its error read if it came (so
    that asyncio never reports it as "never retrieved")."""
    if not future.done():
        future.cancel()
    elif not future.cancelled():
        future.exception()


def _many_frames(
    topic: str,
    events: list[tuple[bytes | None, bytes | None]],
    partition: int | None,
) -> tuple[bytes, list[bytes]]:
    """The raw topic and partition of a ``send_many`` and the body of each of its events,
    checked against the frame limit."""
    prefix = encode_topic_partition(topic, check_partition(partition))
    bodies = encode_bodies(events, int(time.time() * 1000))
    _check_frame(len(prefix) + max((len(body) for body in bodies), default=0))
    return prefix, bodies


def _join_frames(prefix: bytes, bodies: list[bytes], ids: list[int]) -> bytes:
    """One SEND frame per body, with its request id, all in one buffer (one write)."""
    pack_head = REQUEST_HEAD.pack
    fixed = REQUEST_HEAD.size - 4 + len(prefix)
    parts: list[bytes] = []
    for request_id, body in zip(ids, bodies, strict=True):
        parts += (pack_head(fixed + len(body), OP_SEND, request_id), prefix, body)
    return b"".join(parts)


def _send_payload(
    topic: str,
    value: bytes | None,
    key: bytes | None,
    headers: Headers | None,
    partition: int | None,
    timestamp: int | None,
) -> bytes:
    return encode_topic_partition(topic, check_partition(partition)) + encode_body(
        key, value, headers, event_timestamp(timestamp)
    )


def _query_payload(event: object) -> bytes:
    event = EventId.of(event)
    return encode_topic_partition(event.topic, event.partition) + encode_number(event.number)


def _check_frame(payload_bytes: int) -> None:
    """Refuse a request the agent would close the connection for, before it is written."""
    if REQUEST_HEAD.size - 4 + payload_bytes > MAX_FRAME:
        raise EventTooLargeError(
            f"a request of {payload_bytes} bytes is larger than the agent's frame limit "
            f"({MAX_FRAME} bytes)"
        )


def _connect_error(path: str, exc: OSError) -> AgentClosedError:
    """Why connecting failed, in the words of what the user finds at ``path``."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOENT:
        reason = "no such socket (is `tidelog agent` running?)"
    elif exc.errno == errno.ECONNREFUSED:
        try:
            is_socket = stat.S_ISSOCK(os.lstat(path).st_mode)
        except OSError:
            is_socket = True
        reason = (
            "no agent serves this socket (left by an agent that stopped)"
            if is_socket
            else "not a socket"
        )
    return AgentClosedError(f"cannot connect to the agent at {path}: {reason}")


def _error(status: int, payload: bytes) -> AgentError:
    """The exception an error status stands for: the one the agent raised in-process."""
    message = payload.decode("utf-8", "replace")
    if status == QUEUE_FULL:
        return QueueFullError(message)
    if status == TOO_LARGE:
        return EventTooLargeError(message)
    if status == CLOSED:
        return AgentClosedError(message)
    if status == BAD_REQUEST:
        return AgentError(f"the agent refused the request: {message}")
    return AgentError(message)


def _decode(kind: int, topic: str, status: int, payload: bytes) -> Any:
    """The answer to a request of ``kind``; raises the AgentError it stands for, or one
    saying it does not parse (the frames around it still do: only this request fails)."""
    if status != OK:
        raise _error(status, payload)
    try:
        if kind == OP_SEND:
            partition, number = SEND_ACK.unpack(payload)
            return EventId(topic, partition, number)
        if kind == OP_QUERY:
            state, offset, partition = QUERY_ANSWER.unpack(payload)
            return Delivery(STATES[state], offset, partition)
        return json.loads(payload)
    except (struct.error, IndexError, ValueError) as exc:
        raise AgentError(f"the agent sent a malformed answer: {exc}") from None


def _fresh(error: AgentError) -> AgentError:
    """A copy of the connection's ``error`` to raise or hand to one caller: raising one
    exception object again and again chains each raise's frames onto its traceback (a
    failed connection's cause, raised to every waiting and later request, would grow
    without bound)."""
    return copy.copy(error)


def _settle(
    future: Future[Any] | asyncio.Future[Any],
    result: Any = None,
    error: BaseException | None = None,
) -> None:
    """Set ``future`` unless it is done already (a reader never dies of a future it cannot
    set; an asyncio one is set on its loop's thread, so done() cannot change meanwhile)."""
    if future.done():
        return
    with contextlib.suppress(InvalidStateError):
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


class _Many:
    """The answers to one :meth:`AgentClient.submit_many` (or ``send_many`` of either
    client): one future for all of them.

    Every event is answered for itself, so the future waits for all the answers: when some
    failed, it fails with the first error, whose ``stored`` lists the id of each event
    stored (None for the others) in the order of the call, as in-process
    :meth:`Agent.send_many <tidelog.agent.Agent.send_many>` says it (None when none was).
    """

    __slots__ = ("error", "future", "remaining", "results", "topic")

    def __init__(self, count: int, topic: str) -> None:
        self.topic = topic
        self.future: Future[list[EventId]] = Future()
        # Written requests cannot be withdrawn: cancel() says so (returns False).
        self.future.set_running_or_notify_cancel()
        self.results: list[Any] = [None] * count
        self.remaining = count
        self.error: AgentError | None = None

    def answer(self, index: int, status: int, payload: bytes) -> None:
        """The agent's answer to the call's event at ``index``."""
        try:
            self.set(index, _decode(OP_SEND, self.topic, status, payload))
        except AgentError as exc:
            self.refused(index, exc)

    def set(self, index: int, value: Any) -> None:
        self.results[index] = value
        self._answered()

    def refused(self, index: int, error: AgentError) -> None:
        if self.error is None:
            self.error = error
        self._answered()

    def _answered(self) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            if self.error is None:
                _settle(self.future, self.results)
            else:
                self._raise(self.error)

    def fail(self, error: AgentError) -> None:
        """The connection failed: the answers still to come never will. The error says
        which events are known stored (the others may or may not be)."""
        if self.future.done():
            return
        if self.error is None:
            # ``error`` fails every request of the connection: this call's gets its own copy.
            self.error = _fresh(error)
        self._raise(self.error)

    def _stored(self) -> bool:
        return any(result is not None for result in self.results)

    def _raise(self, error: AgentError) -> None:
        if self._stored():
            error.stored = list(self.results)
        _settle(self.future, error=error)


class AgentClient:
    """A synchronous, thread-safe connection to the agent daemon at ``path``.

    Answers are read by whichever thread needs one, one thread at a time (the *reader*): a
    thread in :meth:`send`, :meth:`send_many`, :meth:`delivery` or :meth:`status` reads the
    socket itself unless another thread is already reading, so a lone caller's answer comes
    back without a hand-off to a reader thread and back (about 100 µs at the median). A
    background thread reads for futures nobody waits on here (:meth:`submit`,
    :meth:`submit_many`). The reader sets every future its reads answer, so callbacks added
    to a future run on whichever thread that was: a callback may submit (a ``submit_many``
    larger than the socket's buffers stalls: nobody reads the answers while it writes), but
    a call that waits for an answer (``send``, ``send_many``, ``delivery``, ``status``)
    would wait for the very thread it runs on, and ends with ``TimeoutError`` after
    ``timeout``.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float | None = 30.0) -> None:
        self.path = os.fspath(path)
        self.timeout = timeout
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(self.path)
        except OSError as exc:
            self._sock.close()
            raise _connect_error(self.path, exc) from None
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._many: dict[int, _ManyEntry] = {}
        self._write_lock = threading.Lock()
        self._failure: AgentError | None = None
        # Set when the agent stopped taking requests (a write failed: it shut its reading
        # side at a graceful stop, or the connection broke): nothing more is written, but
        # the answers to what it took are still read, up to the end of the stream.
        self._writes_closed: AgentError | None = None
        self._buffer = bytearray()
        self._readable = select.poll()
        self._readable.register(self._sock, select.POLLIN)
        self._writable = select.poll()  # used by the writer only, under _write_lock
        self._writable.register(self._sock, select.POLLOUT)
        # Who reads the socket: at most one thread at a time holds ``_reading``.
        state_lock = threading.Lock()
        self._state = threading.Condition(state_lock)
        self._reading = False
        # Callers blocked in _wait (woken after each read that answered something, and when
        # the reader leaves); the background reader has a condition of its own, so neither
        # is woken for nothing (a wake-up is a thread switch through the GIL).
        self._callers_waiting = 0
        self._background_wake = threading.Condition(state_lock)
        self._closed = False
        self._background = threading.Thread(
            target=self._background_reads, name="agent-client", daemon=True
        )
        self._background.start()

    # ------------------------------------------------------------------ requests

    def _request(
        self, op: int, payload: bytes, topic: str = "", *, waited_for: bool = False
    ) -> Future[Any]:
        future: Future[Any] = Future()
        # Written requests cannot be withdrawn: cancel() says so (returns False).
        future.set_running_or_notify_cancel()
        _check_frame(len(payload))
        with self._writing() as broken:
            request_id = next(self._ids) & 0xFFFFFFFF
            self._pending[request_id] = (future, op, topic)
            try:
                self._write_locked(encode_request(op, request_id, payload), broken)
            except BaseException:
                self._pending.pop(request_id, None)
                raise
        if not waited_for:
            self._wake_background()
        return future

    @contextlib.contextmanager
    def _writing(self) -> Iterator[list[AgentError]]:
        """Hold the write lock for whole frames; the list yields the failure that broke the
        connection, if the write did. The connection is failed after the lock is released:
        failing futures runs their callbacks, which may send again."""
        broken: list[AgentError] = []
        try:
            with self._write_lock:
                if self._failure is not None:
                    raise _fresh(self._failure)
                if self._writes_closed is not None:
                    raise _fresh(self._writes_closed)
                yield broken
        finally:
            if broken:
                self._fail(broken[0])

    def _write_locked(self, data: bytes, broken: list[AgentError]) -> None:
        """Write ``data`` (whole frames) within ``timeout``.

        A request written in part leaves the stream in the middle of a frame, so whatever
        stops the write after it began (the agent not reading for ``timeout`` seconds, a
        ``KeyboardInterrupt``) fails the connection: ``broken`` gets the error, and every
        request on it fails with it. Stopped before any byte went out, only this request
        fails. A write the agent refused (it shut its reading side at a stop, or the
        connection is gone) closes the writing side only: the request being written fails,
        while the agent's answers to the requests it took are read to the end of the stream,
        so that an event it stored is reported stored, not failed with the connection.
        """
        view = memoryview(data)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        sent = 0
        began = False
        try:
            while sent < len(view):
                try:
                    began = True
                    sent += self._sock.send(view[sent:], socket.MSG_DONTWAIT)
                except BlockingIOError:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        if sent:
                            raise TimeoutError from None
                        raise TimeoutError("the agent did not take the request in time") from None
                    self._writable.poll(None if remaining is None else int(remaining * 1000) + 1)
        except TimeoutError:
            if not sent:
                raise
            why = f"the agent took only part of a request in {self.timeout} s"
            self._break_locked(broken, AgentClosedError(why))
            raise broken[0] from None
        except OSError as exc:
            if self._failure is not None:
                # Failed already (closed by the application, broken under a reader): the
                # requests fail with that cause, those answered ok named as stored.
                self._break_locked(broken, self._failure)
                raise broken[0] from None
            raise self._close_writes_locked(
                AgentClosedError(f"the connection to the agent failed: {exc}")
            ) from None
        except BaseException:
            if began:
                self._break_locked(
                    broken, AgentClosedError("a request was interrupted while being written")
                )
            raise

    def _close_writes_locked(self, error: AgentError) -> AgentError:
        """The agent refused a write: write nothing more (later requests raise ``error``),
        and let the reader read what the agent still answers; the end of the stream fails
        the requests it never answered. Returns the error for the request being written."""
        if self._writes_closed is None:
            self._writes_closed = error
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
        # Answers still come for requests nobody waits on here (submit()): read them.
        self._wake_background()
        return _fresh(self._writes_closed)

    def _break_locked(self, broken: list[AgentError], error: AgentError) -> None:
        """Fail the connection from a writer: the failure is set before the socket is shut,
        so a reader woken by the shutdown fails the requests with this cause. A connection
        failed already (closed by the application, broken under a reader) keeps its cause,
        which the writer raises too."""
        if self._failure is None:
            self._failure = error
            broken.append(error)
        else:
            broken.append(_fresh(self._failure))
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def _call(self, op: int, payload: bytes, topic: str = "") -> Any:
        """Send one request and wait for its answer, reading it on this thread if no other
        thread reads. The role is taken before the request goes out, so that the background
        reader cannot take the answer first."""
        reading = self._take_reading()
        try:
            future = self._request(op, payload, topic, waited_for=True)
        except BaseException:
            if reading:
                self._give_up_reading()
            raise
        return self._wait(future, reading)

    def _wait(self, future: Future[Any], reading: bool) -> Any:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            if reading:
                try:
                    self._read_until(future.done, deadline)
                finally:
                    self._give_up_reading()
                if not future.done() and self._failure is not None:
                    # The connection failed and _fail (on another thread) has not reached
                    # this future yet: its cause, not a TimeoutError of result(0).
                    raise _fresh(self._failure)
                return future.result(0)
            with self._state:
                while not future.done() and self._reading:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError("no answer from the agent in time")
                    self._callers_waiting += 1
                    try:
                        self._state.wait(remaining)
                    finally:
                        self._callers_waiting -= 1
                if future.done():
                    return future.result(0)
                self._reading = reading = True

    def _take_reading(self) -> bool:
        with self._state:
            if self._reading:
                return False
            self._reading = True
            return True

    def _give_up_reading(self) -> None:
        with self._state:
            self._reading = False
            if self._pending or self._many:
                # Someone else's answers are still to come: a waiting caller or the
                # background reader takes over. Both are woken: the callers counted as
                # waiting may all find their answers already there and leave, and the
                # answers still to come may be for submit() futures nobody waits on.
                if self._callers_waiting:
                    self._state.notify_all()
                self._background_wake.notify()

    def _wake_background(self) -> None:
        with self._state:
            self._background_wake.notify()

    def _answered(self) -> None:
        """Wake the callers waiting for answers, after a read dispatched some."""
        with self._state:
            if self._callers_waiting:
                self._state.notify_all()

    def _wake_all(self) -> None:
        with self._state:
            self._state.notify_all()
            self._background_wake.notify_all()

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
        result: EventId = self._call(
            OP_SEND, _send_payload(topic, value, key, headers, partition, timestamp), topic
        )
        return result

    def submit_many(
        self,
        topic: str,
        events: list[tuple[bytes | None, bytes | None]],
        *,
        partition: int | None = None,
    ) -> Future[list[EventId]]:
        """Send (key, value) events in one write, without waiting; the future resolves to
        their ids once all are durable (or fails with the first error)."""
        return self._submit_many(topic, events, partition)

    def _submit_many(
        self,
        topic: str,
        events: list[tuple[bytes | None, bytes | None]],
        partition: int | None,
    ) -> Future[list[EventId]]:
        prefix, bodies = _many_frames(topic, events, partition)
        waiter = _Many(len(events), topic)
        if not events:
            waiter.future.set_result([])
            return waiter.future
        refused_part_way = False
        try:
            with self._writing() as broken:
                ids = [next(self._ids) & 0xFFFFFFFF for _ in bodies]
                self._many.update(
                    zip(ids, ((waiter, index) for index in range(len(ids))), strict=True)
                )
                frames = _join_frames(prefix, bodies, ids)
                # The background reader reads the answers while this thread writes: the
                # agent answers as it reads, and with nobody reading, a long write would fill
                # the socket both ways and stop both sides.
                self._wake_background()
                try:
                    self._write_locked(frames, broken)
                except BaseException:
                    if broken:
                        pass  # the connection failed, and this call with it (below)
                    elif self._writes_closed is not None:
                        # The agent stopped taking requests part-way: the future fails at
                        # the end of the stream, once the answers to what the agent took
                        # are in (not waited for here: this may be the reading thread).
                        refused_part_way = True
                    else:  # nothing went out: only this call fails
                        for request_id in ids:
                            self._many.pop(request_id, None)
                    raise
        except AgentError:
            if refused_part_way:
                return waiter.future
            # The connection broke in the middle of the write: failing it failed this call
            # too, with the events answered stored so far in the error's ``stored``.
            if waiter.future.done() and not waiter.future.cancelled():
                error = waiter.future.exception()
                if isinstance(error, AgentError):
                    raise error from None
            raise
        return waiter.future

    def send_many(
        self,
        topic: str,
        events: list[tuple[bytes | None, bytes | None]],
        *,
        partition: int | None = None,
    ) -> list[EventId]:
        """Pipelined (key, value) sends; returns when all are durable."""
        # Not the reader while writing (see _submit_many); the answers are awaited after.
        future = self._submit_many(topic, events, partition)
        result: list[EventId] = self._wait(future, False)
        return result

    def delivery(self, event: EventId | str) -> Delivery:
        """Whether the event reached the cluster, and its offset when known."""
        result: Delivery = self._call(OP_QUERY, _query_payload(event))
        return result

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call(OP_STATUS, b"")
        return result

    # ------------------------------------------------------------------ reading

    def _background_reads(self) -> None:
        """Read while answers are awaited and no caller reads (answers to submit())."""
        while True:
            with self._state:
                while (
                    not self._closed
                    and self._failure is None
                    and (self._reading or not (self._pending or self._many))
                ):
                    self._background_wake.wait()
                if self._closed or self._failure is not None:
                    return
                self._reading = True
            try:
                self._read_until(lambda: not (self._pending or self._many), None)
            finally:
                self._give_up_reading()

    def _read_until(self, done: Callable[[], bool], deadline: float | None) -> None:
        """Read and dispatch answers until ``done()`` (the caller is the reader)."""
        try:
            # Whole frames a reader before this one read but did not dispatch (it was
            # interrupted) are answered first: recv() would wait for answers already here.
            if self._dispatch():
                self._answered()
            while not done() and self._failure is None:
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._readable.poll(int(remaining * 1000) + 1):
                        if time.monotonic() >= deadline:
                            raise TimeoutError("no answer from the agent in time")
                        continue
                chunk = self._sock.recv(1 << 18)
                if not chunk:
                    self._fail(AgentClosedError("the agent closed the connection"))
                    return
                self._buffer += chunk
                self._dispatch()
                self._answered()
        except TimeoutError:
            # Only this caller gives up; the connection and the other requests carry on.
            raise
        except OSError as exc:
            self._fail(AgentClosedError(f"the connection to the agent failed: {exc}"))
        except AgentError as exc:
            self._fail(exc)

    def _dispatch(self) -> int:
        """Set the futures of the whole frames in the buffer; how many frames there were."""
        return _dispatch_answers(self._buffer, self._pending, self._many)

    def _fail(self, error: AgentError) -> None:
        with self._write_lock:
            if self._failure is None:
                self._failure = error
            error = self._failure  # the first cause, e.g. a write that broke the stream
            pending, self._pending = self._pending, {}
            waiting, self._many = self._many, {}
        for future, _, _ in pending.values():
            _settle(future, error=_fresh(error))
        for waiter, _ in waiting.values():
            waiter.fail(error)
        self._wake_all()

    def close(self) -> None:
        with self._state:
            self._closed = True
        if self._failure is None:
            # The cause, set before the shutdown below makes a reader see the end of the
            # stream (it would say the agent closed the connection).
            self._failure = AgentClosedError("the client is closed")
        self._wake_all()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._background.join(timeout=5)
        # Nothing is read any more: what is still awaited fails instead of waiting forever.
        self._fail(AgentClosedError("the client is closed"))
        self._sock.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncAgentClient:
    """The asyncio client: ``client = await AsyncAgentClient.connect(path)``.

    A client serves the event loop it connected on: a request from another loop, or after
    that loop stopped, raises :class:`AgentClosedError`. ``timeout`` (None: none) bounds the
    connect and each request (the write and the wait for its answer) with a
    ``TimeoutError``; as in :class:`AgentClient` only that call gives up, the connection goes
    on (the request may still be stored).

    It works on the socket itself (the loop's ``sock_recv`` and a writer callback), not on
    a stream transport: a transport whose write fails stops reading at once, and the answers
    the agent sent before it stopped taking requests (a graceful stop) would be lost with the
    connection. Here a refused write closes the writing side only, and the answers are read
    to the end of the stream, as :class:`AgentClient` does.
    """

    #: Requests wait in ``_drain`` while more than this is buffered, unwritten (the agent
    #: reads slower than they come), and go on once it is down to ``_LOW_WATER``.
    _HIGH_WATER = 1 << 16
    _LOW_WATER = 1 << 14

    def __init__(self, sock: socket.socket, *, timeout: float | None = None) -> None:
        self._sock = sock
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._many: dict[int, _ManyEntry] = {}  # the events of send_many calls
        self._failure: AgentError | None = None
        # Set when the agent stopped taking requests: nothing more is written, the answers
        # to what it took are still read (see the class's text).
        self._writes_closed: AgentError | None = None
        self._unwritten = bytearray()
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._read_loop())

    @classmethod
    async def connect(
        cls, path: str | os.PathLike[str], *, timeout: float | None = None
    ) -> AsyncAgentClient:
        path = os.fspath(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            async with asyncio.timeout(timeout):
                await asyncio.get_running_loop().sock_connect(sock, path)
        except TimeoutError:
            sock.close()
            raise TimeoutError(f"cannot connect to the agent at {path} in time") from None
        except OSError as exc:
            sock.close()
            raise _connect_error(path, exc) from None
        except BaseException:
            sock.close()
            raise
        return cls(sock, timeout=timeout)

    def _check_loop(self) -> None:
        if asyncio.get_running_loop() is self._loop:
            return
        if self._loop.is_closed():
            raise AgentClosedError(
                "the event loop this client connected on is closed (a client serves the "
                "loop it connected on: connect one per event loop)"
            )
        raise AgentClosedError(
            "the client is used from an event loop other than the one it connected on "
            "(connect one client per event loop)"
        )

    def _check_open(self) -> None:
        self._check_loop()
        if self._failure is not None:
            raise _fresh(self._failure)
        if self._writes_closed is not None:
            raise _fresh(self._writes_closed)

    def _request(self, op: int, payload: bytes, topic: str) -> tuple[int, asyncio.Future[Any]]:
        self._check_open()
        _check_frame(len(payload))
        request_id = next(self._ids) & 0xFFFFFFFF
        future: asyncio.Future[Any] = self._loop.create_future()
        self._pending[request_id] = (future, op, topic)
        if not self._write(encode_request(op, request_id, payload)):
            self._pending.pop(request_id, None)
            future.cancel()
            raise _fresh(self._writes_closed or AgentClosedError("the write was refused"))
        return request_id, future

    def _write(self, data: bytes) -> bool:
        """Write whole frames, or buffer what the socket does not take now (in order).
        False when the agent refused the write and nothing of ``data`` went out: only the
        caller's requests fail now; those before them are answered or fail at the end of
        the stream."""
        if self._unwritten:
            self._unwritten += data
            return True
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._close_writes(exc)
            return False
        if sent < len(data):
            self._unwritten += memoryview(data)[sent:]
            self._loop.add_writer(self._sock.fileno(), self._write_ready)
        return True

    def _write_ready(self) -> None:
        try:
            sent = self._sock.send(self._unwritten)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close_writes(exc)
            return
        del self._unwritten[:sent]
        if not self._unwritten:
            self._loop.remove_writer(self._sock.fileno())
        if len(self._unwritten) <= self._LOW_WATER:
            self._release_drain_waiters()

    def _close_writes(self, exc: OSError) -> None:
        """The agent refused a write (it shut its reading side at a stop, or the connection
        is gone): write nothing more. Frames not written whole are dropped (never taken, so
        never answered: they fail at the end of the stream); the reading goes on."""
        if self._writes_closed is None:
            self._writes_closed = AgentClosedError(f"the connection to the agent failed: {exc}")
        self._stop_writing()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    def _stop_writing(self) -> None:
        if self._unwritten:
            self._unwritten.clear()
            with contextlib.suppress(Exception):  # the loop may be closing
                self._loop.remove_writer(self._sock.fileno())
        # Requests waiting for room go on to wait for their answers (or the end of the
        # stream): one written before the refusal may have been stored.
        self._release_drain_waiters()

    def _release_drain_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _drain(self) -> None:
        """Wait while the agent has not taken what is buffered (above the high water)."""
        if len(self._unwritten) > self._HIGH_WATER:
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    async def _answer(self, answer: Awaitable[Any]) -> Any:
        """Wait for the agent to take what was written, then for ``answer``, within
        ``timeout`` in all."""
        written = False
        try:
            async with asyncio.timeout(self.timeout):
                await self._drain()
                written = True
                return await answer
        except TimeoutError:
            if written:
                raise TimeoutError("no answer from the agent in time") from None
            raise TimeoutError("the agent did not take the request in time") from None

    async def _call(self, op: int, payload: bytes, topic: str = "") -> Any:
        """Send one request and wait for its answer (within ``timeout``)."""
        request_id, future = self._request(op, payload, topic)
        try:
            return await self._answer(future)
        except BaseException:
            # Given up (an error, a timeout, a cancellation): the answer, if one comes, is
            # for nobody, and an error set on the future is never "never retrieved".
            self._pending.pop(request_id, None)
            _discard(future)
            raise

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
        result: EventId = await self._call(
            OP_SEND, _send_payload(topic, value, key, headers, partition, timestamp), topic
        )
        return result

    async def send_many(
        self,
        topic: str,
        events: list[tuple[bytes | None, bytes | None]],
        *,
        partition: int | None = None,
    ) -> list[EventId]:
        """(key, value) events in one write; returns their ids once all are durable. When
        some were refused it raises the first error, whose ``stored`` names the events
        stored, as :meth:`AgentClient.send_many` does."""
        self._check_loop()
        prefix, bodies = _many_frames(topic, events, partition)
        if not events:
            return []
        self._check_open()
        waiter = _Many(len(events), topic)
        ids = [next(self._ids) & 0xFFFFFFFF for _ in bodies]
        self._many.update(zip(ids, ((waiter, index) for index in range(len(ids))), strict=True))
        answered = asyncio.wrap_future(waiter.future)
        try:
            if not self._write(_join_frames(prefix, bodies, ids)):
                raise _fresh(self._writes_closed or AgentClosedError("the write was refused"))
            result: list[EventId] = await self._answer(answered)
            return result
        except BaseException:
            # Given up or failed: answers still to come are for nobody, and an error set on
            # the future is never "never retrieved".
            for request_id in ids:
                self._many.pop(request_id, None)
            _discard(answered)
            raise

    async def delivery(self, event: EventId | str) -> Delivery:
        result: Delivery = await self._call(OP_QUERY, _query_payload(event))
        return result

    async def status(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(OP_STATUS, b"")
        return result

    async def _read_loop(self) -> None:
        error: AgentError = AgentClosedError("the agent closed the connection")
        buffer = bytearray()
        try:
            while True:
                chunk = await self._loop.sock_recv(self._sock, 1 << 18)
                if not chunk:
                    if buffer:
                        error = AgentClosedError(
                            "the connection to the agent ended in the middle of an answer"
                        )
                    return
                buffer += chunk
                _dispatch_answers(buffer, self._pending, self._many)
        except OSError as exc:
            error = AgentClosedError(f"the connection to the agent ended: {exc}")
        except AgentError as exc:
            error = exc
        except asyncio.CancelledError:
            error = AgentClosedError("the client stopped reading (its event loop stopped)")
            # Closed while the loop still runs: a loop closing with the client open would
            # otherwise leave the socket to the garbage collector.
            self._stop_writing()
            self._sock.close()
            raise
        finally:
            # However reading ends, nothing waits for an answer that will never come.
            self._fail(error)

    def _fail(self, error: AgentError) -> None:
        """Fail the connection (the first cause stays) and every request waiting on it."""
        if self._failure is None:
            self._failure = error
        pending, self._pending = self._pending, {}
        for future, _, _ in pending.values():
            if not future.done():
                future.set_exception(_fresh(self._failure))
        waiting, self._many = self._many, {}
        for waiter, _ in waiting.values():
            waiter.fail(self._failure)
        self._stop_writing()

    async def close(self) -> None:
        """Close at once, whether or not the agent reads: requests still waiting fail with
        AgentClosedError("the client is closed") (their events may or may not be stored),
        and bytes not yet written are dropped."""
        if asyncio.get_running_loop() is not self._loop:
            self._close_from_elsewhere()
            return
        self._shut()
        await asyncio.wait([self._task])

    def _shut(self) -> None:
        """Fail what waits, drop what is unwritten and stop reading (on the client's loop);
        the socket is closed once the read is cancelled (it no longer watches the socket)."""
        self._fail(AgentClosedError("the client is closed"))
        self._stop_writing()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._task.cancel()
        self._task.add_done_callback(lambda _: self._sock.close())

    def _close_from_elsewhere(self) -> None:
        if not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._shut)
                return
        # The loop is gone, and its reads with it (they failed what waited and closed the
        # socket); a socket left open by a loop that never ran the read is closed here.
        if self._failure is None:
            self._failure = AgentClosedError("the client is closed")
        self._sock.close()
