"""A request the socket client stops writing half-way (the agent not reading in time, a
KeyboardInterrupt) leaves the stream in the middle of a frame: the connection must be failed
as a whole, never carry another request behind half a frame."""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import wait_for

from tidelog.agent import AgentClient, AgentClosedError
from tidelog.agent.wire import OP_SEND, REQUEST_HEAD

BIG = [(None, b"x" * 1000)] * 20_000  # 20 MB: far more than a socket buffer holds


@dataclass
class StalledDaemon:
    """Accepts one connection and reads nothing until released; then reads to the end."""

    path: Path
    release: threading.Event = field(default_factory=threading.Event)
    received: bytearray = field(default_factory=bytearray)
    finished: threading.Event = field(default_factory=threading.Event)

    def frames(self) -> tuple[list[tuple[int, int]], int]:
        """(op, request id) of every whole frame received, and the bytes left after them."""
        data, pos, frames = self.received, 0, []
        while len(data) - pos >= REQUEST_HEAD.size:
            size, op, request_id = REQUEST_HEAD.unpack_from(data, pos)
            if len(data) - pos - 4 < size:
                break
            frames.append((op, request_id))
            pos += 4 + size
        return frames, len(data) - pos


@pytest.fixture
def stalled(tmp_path: Path) -> Iterator[StalledDaemon]:
    daemon = StalledDaemon(tmp_path / "stalled.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(daemon.path))
    listener.listen()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            daemon.release.wait()
            while chunk := conn.recv(1 << 20):
                daemon.received += chunk
        daemon.finished.set()

    threading.Thread(target=serve, daemon=True).start()
    yield daemon
    daemon.release.set()
    listener.close()


def in_thread(call: Any, seconds: float) -> BaseException | None:
    """Run ``call`` on a thread; what it raised (it must finish within ``seconds``)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still writing after {seconds} s"
    return outcome[0]


def check_stream(daemon: StalledDaemon) -> None:
    """The daemon got whole SEND frames numbered from 1 ("before", then the first ones of
    the big write), then the start of one more, then the end of the connection: no byte of
    any later request."""
    daemon.release.set()
    assert daemon.finished.wait(10)
    frames, left = daemon.frames()
    assert len(frames) >= 1
    assert frames == [(OP_SEND, number) for number in range(1, len(frames) + 1)]
    assert left, "the big write went out whole"
    (size,) = struct.unpack_from(">I", daemon.received, len(daemon.received) - left)
    assert size > 1000 and left < 4 + size  # one of the big write's frames, cut


def test_a_request_the_agent_takes_only_in_part_fails_the_connection(
    stalled: StalledDaemon,
) -> None:
    client = AgentClient(stalled.path, timeout=0.5)
    try:
        before = client.submit("t", b"before", partition=0)  # request 1, written whole
        error = in_thread(lambda: client.send_many("t", BIG, partition=0), 10)
        assert isinstance(error, AgentClosedError)
        assert "took only part of a request in 0.5 s" in str(error)
        # Every request on the connection fails with it, and nothing more is written.
        with pytest.raises(AgentClosedError, match="took only part"):
            before.result(5)
        with pytest.raises(AgentClosedError, match="took only part"):
            client.send("t", b"after", partition=0)
    finally:
        client.close()
    check_stream(stalled)


def interrupt_when_stuck_writing(client: AgentClient, thread: int) -> None:
    """SIGINT to ``thread`` once it is stuck in the middle of a write: it holds the write
    lock and the socket takes no more (not after a fixed delay: building the frames of a
    big write takes a loaded machine long enough that the signal would come first)."""
    deadline = time.monotonic() + 30
    while not client._write_lock.locked() or select.select([], [client._sock], [], 0)[1]:
        assert time.monotonic() < deadline, "the write never got stuck"
        time.sleep(0.005)
    signal.pthread_kill(thread, signal.SIGINT)


def test_a_request_interrupted_while_written_fails_the_connection(
    stalled: StalledDaemon,
) -> None:
    main = threading.get_ident()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    client = AgentClient(stalled.path, timeout=None)
    try:
        before = client.submit("t", b"before", partition=0)
        interrupter = threading.Thread(target=interrupt_when_stuck_writing, args=(client, main))
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            client.send_many("t", BIG, partition=0)
        interrupter.join()
        with pytest.raises(AgentClosedError, match="interrupted while being written"):
            before.result(5)
        stalled.release.set()  # the agent reads again: still nothing more goes out
        error = in_thread(lambda: client.send("t", b"after", partition=0), 10)
        assert isinstance(error, AgentClosedError)
        assert "interrupted while being written" in str(error)
    finally:
        signal.signal(signal.SIGINT, previous)
        client.close()
    check_stream(stalled)


def test_a_timeout_before_any_byte_went_out_fails_only_that_request(tmp_path: Path) -> None:
    """The agent not reading while the socket buffer is full: a request that could not start
    fails alone, and the connection is whole for the next one once the agent reads."""
    daemon = StalledDaemon(tmp_path / "stalled.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(daemon.path))
    listener.listen()
    client = AgentClient(daemon.path, timeout=0.3)
    conn, _ = listener.accept()
    try:
        # Fill the socket both ways' worth with whole frames, one small request at a time,
        # until one cannot start.
        submitted: list[int] = []

        def fill() -> None:
            while True:
                client.submit("t", b"x" * 100, partition=0)
                submitted.append(1)

        error = in_thread(fill, 10)
        assert isinstance(error, TimeoutError)
        assert "did not take the request in time" in str(error)
        sent = len(submitted)
        assert sent > 10
        # A small frame goes into a Unix stream socket whole or not at all: the stream is
        # whole, and the next request, once the agent reads, goes out after it (the id of the
        # one that timed out is not reused).
        conn.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while chunk := conn.recv(1 << 20):
                daemon.received += chunk
        after = client.submit("t", b"after", partition=0)
        conn.settimeout(5)
        while True:
            daemon.received += conn.recv(1 << 20)
            frames, left = daemon.frames()
            if len(frames) == sent + 1 and left == 0:
                break
        assert frames == [(OP_SEND, n) for n in range(1, sent + 1)] + [(OP_SEND, sent + 2)]
        assert not after.done()
    finally:
        client.close()
        conn.close()
        listener.close()


def test_a_caller_waiting_when_another_breaks_the_connection_gets_the_cause(
    stalled: StalledDaemon,
) -> None:
    """The connection fails while a caller whose request went out whole waits for its
    answer, and _fail is still failing futures one by one (a slow callback on one of them):
    that caller gets the cause, not a TimeoutError long before its own timeout."""
    client = AgentClient(stalled.path, timeout=10.0)
    try:
        first = client.submit("t", b"first", partition=0)
        first.add_done_callback(lambda _: time.sleep(1.5))
        outcome: list[BaseException] = []

        def caller() -> None:
            try:
                client.send("t", b"mine", partition=0)
            except BaseException as exc:
                outcome.append(exc)

        # The background thread reads (for `first`), so the caller below waits for it.
        wait_for(lambda: client._reading, timeout=10)
        waiting = threading.Thread(target=caller)
        waiting.start()
        # The caller has written its request and waits, its deadline taken from the
        # timeout of 10 s, before the timeout is lowered for the big write below.
        wait_for(lambda: client._callers_waiting == 1, timeout=10)
        client.timeout = 0.5  # the big write below gives up after 0.5 s
        with pytest.raises(AgentClosedError, match="took only part"):
            client.send_many("t", BIG, partition=0)
        waiting.join(15)
        assert len(outcome) == 1
        assert isinstance(outcome[0], AgentClosedError), repr(outcome[0])
        assert "took only part" in str(outcome[0])
    finally:
        client.close()


def test_closing_the_client_under_a_writer_tells_the_writer_so(
    stalled: StalledDaemon,
) -> None:
    """A thread blocked writing to a daemon that does not read, and the application closes
    the client: the writer is told the client is closed, not of a broken pipe."""
    client = AgentClient(stalled.path, timeout=None)
    big: list[tuple[bytes | None, bytes | None]] = [(None, b"x" * 1000)] * 2000
    outcome: list[BaseException] = []

    def write() -> None:
        try:
            client.send_many("t", big, partition=0)
        except BaseException as exc:
            outcome.append(exc)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    # It blocks once the socket's buffers are full (about 200 KB of the 2 MB write).
    deadline = time.monotonic() + 10
    while not client._write_lock.locked() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    client.close()
    writer.join(30)
    assert not writer.is_alive()
    assert [(type(e), str(e)) for e in outcome] == [(AgentClosedError, "the client is closed")]
    stalled.release.set()
    assert stalled.finished.wait(10)
