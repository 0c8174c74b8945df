"""How AgentClient reads answers: the waiting caller reads, others are woken, submit()
futures are answered by the background reader; timeouts and closing fail only what they
should. Against a real AgentServer (nothing delivered: the cluster is unreachable) and a
scripted server that holds chosen answers back."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import traceback
from concurrent.futures import Future
from pathlib import Path

import pytest
from agent_helpers import wait_for
from interop_broker import free_port

from tidelog.agent import Agent, AgentClient, AgentServer, AsyncAgentClient, EventId
from tidelog.agent.errors import AgentClosedError, QueueFullError
from tidelog.agent.event import check_body, decode_body
from tidelog.agent.wire import (
    OK,
    REQUEST_HEAD,
    SEND_ACK,
    encode_response,
    parse_topic_partition,
)


def test_threads_sharing_one_client_with_futures(tmp_path: Path) -> None:
    agent = Agent(
        {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(tmp_path / "a")}
    )
    server = AgentServer(agent, tmp_path / "agent.sock")
    server.start()
    try:
        with AgentClient(tmp_path / "agent.sock") as client:
            ids: dict[str, list[EventId]] = {}

            def sender(name: str) -> None:
                ids[name] = [
                    client.send("t", b"%s-%d" % (name.encode(), i), partition=0) for i in range(150)
                ]

            futures: list[Future[EventId]] = []
            batches: list[Future[list[EventId]]] = []

            def submitter() -> None:
                for i in range(150):
                    futures.append(client.submit("t", b"f-%d" % i, partition=0))
                    if i % 50 == 0:
                        batches.append(
                            client.submit_many("t", [(None, b"m-%d" % i)] * 10, partition=0)
                        )

            threads = [threading.Thread(target=sender, args=(f"s{n}",)) for n in range(6)]
            threads.append(threading.Thread(target=submitter))
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            from_futures = [f.result(30) for f in futures]
            from_batches = [e for b in batches for e in b.result(30)]
            # Each thread's events are queued in the order it sent them.
            for name, got in ids.items():
                assert [e.number for e in got] == sorted(e.number for e in got), name
            assert [e.number for e in from_futures] == sorted(e.number for e in from_futures)
            numbers = [e.number for got in ids.values() for e in got]
            numbers += [e.number for e in from_futures + from_batches]
            assert sorted(numbers) == list(range(6 * 150 + 150 + 30))
            assert client.status()["queues"][0]["depth"] == 6 * 150 + 150 + 30
    finally:
        server.stop()
        agent.close()


class HoldingServer:
    """Accepts one connection; answers every SEND at once except those whose value is
    ``b"hold"``, which get no answer."""

    def __init__(self, path: Path) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.held: list[int] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        buffer = b""
        number = 0
        with conn:
            while chunk := conn.recv(65536):
                buffer += chunk
                while len(buffer) >= 4 and len(buffer) >= 4 + int.from_bytes(buffer[:4], "big"):
                    size = int.from_bytes(buffer[:4], "big")
                    frame, buffer = memoryview(buffer[: 4 + size]), buffer[4 + size :]
                    _, _, request_id = REQUEST_HEAD.unpack_from(frame, 0)
                    payload = frame[REQUEST_HEAD.size :]
                    _, partition, used = parse_topic_partition(payload)
                    check_body(payload[used:])
                    if decode_body(payload[used:])[2] == b"hold":
                        self.held.append(request_id)
                        continue
                    conn.sendall(encode_response(request_id, OK, SEND_ACK.pack(partition, number)))
                    number += 1

    def close(self) -> None:
        self.listener.close()


def test_a_timeout_fails_one_call_and_closing_fails_what_is_left(tmp_path: Path) -> None:
    server = HoldingServer(tmp_path / "s.sock")
    client = AgentClient(tmp_path / "s.sock", timeout=0.3)
    try:
        assert client.send("t", b"a", partition=0) == EventId("t", 0, 0)
        held = client.submit("t", b"hold", partition=0)
        with pytest.raises(TimeoutError):
            client.send("t", b"hold", partition=0)
        # The connection carries on: later calls are answered, the held ones still wait.
        assert client.send("t", b"b", partition=0) == EventId("t", 0, 1)
        assert not held.done()
        assert len(server.held) == 2
    finally:
        client.close()
        server.close()
    with pytest.raises(AgentClosedError):
        held.result(5)
    with pytest.raises(AgentClosedError):
        client.send("t", b"c", partition=0)


class GatedServer:
    """Accepts one connection and answers every SEND (partition 0, number = request id), but
    only once :meth:`open` was called: the requests received before in one write, the later
    ones as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.received: list[int] = []
        self._lock = threading.Lock()
        self._conn: socket.socket | None = None
        self._open = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        self._conn = conn
        buffer = b""
        with conn:
            while chunk := conn.recv(65536):
                buffer += chunk
                while len(buffer) >= 4 and len(buffer) >= 4 + int.from_bytes(buffer[:4], "big"):
                    _, _, request_id = REQUEST_HEAD.unpack_from(buffer, 0)
                    buffer = buffer[4 + int.from_bytes(buffer[:4], "big") :]
                    with self._lock:
                        self.received.append(request_id)
                        if self._open:
                            conn.sendall(
                                encode_response(request_id, OK, SEND_ACK.pack(0, request_id))
                            )

    def open(self) -> None:
        with self._lock:
            self._open = True
            assert self._conn is not None
            self._conn.sendall(
                b"".join(encode_response(i, OK, SEND_ACK.pack(0, i)) for i in self.received)
            )

    def close(self) -> None:
        self.listener.close()


def test_a_written_request_cannot_be_cancelled_and_reading_goes_on(tmp_path: Path) -> None:
    """cancel() of a submit()/submit_many() future refuses (the request is written: it will
    be stored whatever the caller does), so the reader setting its answer does not die of it,
    and the answers read with it (in the same chunk) reach their futures."""
    server = GatedServer(tmp_path / "s.sock")
    client = AgentClient(server.path, timeout=5)
    try:
        one = client.submit("t", b"a", partition=0)  # request 1
        many = client.submit_many("t", [(None, b"b"), (None, b"c")], partition=0)  # 2, 3
        wait_for(lambda: len(server.received) == 3, 10)
        cancelled = [one.cancel(), many.cancel()]
        later = client.submit("t", b"d", partition=0)  # 4
        wait_for(lambda: len(server.received) == 4, 10)
        server.open()  # the four answers in one write
        assert later.result(5) == EventId("t", 0, 4)
        assert one.result(5) == EventId("t", 0, 1)
        assert many.result(5) == [EventId("t", 0, 2), EventId("t", 0, 3)]
        assert cancelled == [False, False]
        assert client.send("t", b"e", partition=0) == EventId("t", 0, 5)
    finally:
        client.close()
        server.close()


def test_send_many_refused_in_part_says_which_events_were_stored(tmp_path: Path) -> None:
    """Under `reject` the daemon stores the events of a send_many up to the queue's budget
    and refuses the rest, answering each: the error says which were stored, as in-process,
    from the sync client and the asyncio one (on a topic of its own)."""
    agent = Agent(
        {
            "bootstrap.servers": f"127.0.0.1:{free_port()}",
            "data.dir": str(tmp_path / "a"),
            "queue.full.policy": "reject",
            "queue.max.bytes": 307200,
            "queue.segment.bytes": 65536,
        }
    )
    server = AgentServer(agent, tmp_path / "agent.sock")
    server.start()
    try:
        with AgentClient(tmp_path / "agent.sock") as client:
            client.send("t", b"first", partition=0)  # a queue not empty: the budget applies
            events: list[tuple[bytes | None, bytes | None]] = [
                (None, b"%03d" % i + b"v" * 2000) for i in range(200)
            ]

            async def asyncio_send_many() -> QueueFullError:
                aclient = await AsyncAgentClient.connect(tmp_path / "agent.sock", timeout=30)
                try:
                    await aclient.send("u", b"first", partition=0)
                    with pytest.raises(QueueFullError) as caught:
                        await aclient.send_many("u", events, partition=0)
                    return caught.value
                finally:
                    await aclient.close()

            with pytest.raises(QueueFullError) as caught:
                client.send_many("t", events, partition=0)
            for topic, error in (("t", caught.value), ("u", asyncio.run(asyncio_send_many()))):
                stored = error.stored
                assert stored is not None and len(stored) == 200
                kept = [event for event in stored if isinstance(event, EventId)]
                assert 0 < len(kept) < 200 and len(kept) + stored.count(None) == 200
                assert kept == [EventId(topic, 0, n) for n in range(1, len(kept) + 1)]
                [row] = [q for q in client.status()["queues"] if q["topic"] == topic]
                assert row["appended"] == 1 + len(kept)
                assert all(client.delivery(event).state == "pending" for event in kept)
    finally:
        server.stop()
        agent.close()


def test_send_many_cut_off_by_a_lost_connection_says_which_events_were_stored(
    tmp_path: Path,
) -> None:
    server = HoldingServer(tmp_path / "s.sock")
    client = AgentClient(tmp_path / "s.sock", timeout=5)
    try:
        held = client.submit("t", b"hold", partition=0)
        many = client.submit_many("t", [(None, b"a"), (None, b"hold"), (None, b"b")], partition=0)
        # Answered in order: once "c" is, "a" and "b" are too.
        assert client.send("t", b"c", partition=0) == EventId("t", 0, 2)
    finally:
        client.close()
        server.close()
    error = many.exception(5)
    assert isinstance(error, AgentClosedError)
    assert "the client is closed" in str(error)
    assert error.stored == [EventId("t", 0, 0), None, EventId("t", 0, 1)]
    # The cause every request of the connection shares is not changed by it.
    held_error = held.exception(5)
    assert isinstance(held_error, AgentClosedError)
    assert held_error.stored is None


def test_a_failed_connection_raises_a_short_error_to_every_caller(tmp_path: Path) -> None:
    """Every request waiting on a connection that failed, and every later one, raises the
    connection's cause; each raise its own exception object, so that raising the cause
    to thousands of callers does not chain thousands of frames onto one traceback."""
    server = HoldingServer(tmp_path / "s.sock")
    client = AgentClient(tmp_path / "s.sock", timeout=5)
    try:
        held = [client.submit("t", b"hold", partition=0) for _ in range(300)]
        wait_for(lambda: len(server.held) == 300)
    finally:
        client.close()
        server.close()
    raised = []
    for future in held:
        with pytest.raises(AgentClosedError, match="the client is closed") as caught:
            future.result(5)
        raised.append(caught.value)
    for _ in range(300):
        with pytest.raises(AgentClosedError, match="the client is closed") as caught:
            client.send("t", b"later", partition=0)
        raised.append(caught.value)
    assert len({id(error) for error in raised}) == len(raised)
    assert max(len(traceback.extract_tb(error.__traceback__)) for error in raised) < 20


def test_send_many_cut_off_while_still_written_says_which_events_were_stored(
    tmp_path: Path,
) -> None:
    """A daemon that answers the first 1000 events of a long pipelined write, stops reading
    and then drops the connection while the client is still writing: the call's error
    lists those 1000 as stored (the others never reached a queue, or may have)."""
    path = tmp_path / "s.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    answered = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            buffer, number = b"", 0
            while number < 1000 and (chunk := conn.recv(65536)):
                buffer += chunk
                while number < 1000 and len(buffer) >= 4 + int.from_bytes(buffer[:4], "big"):
                    size = int.from_bytes(buffer[:4], "big")
                    _, _, request_id = REQUEST_HEAD.unpack_from(buffer, 0)
                    buffer = buffer[4 + size :]
                    conn.sendall(encode_response(request_id, OK, SEND_ACK.pack(0, number)))
                    number += 1
            answered.set()
            # The client's reader takes the answers while its writer waits for room.
            time.sleep(1)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    client = AgentClient(path, timeout=None)
    events: list[tuple[bytes | None, bytes | None]] = [(None, b"v" * 100)] * 100_000
    try:
        with pytest.raises(AgentClosedError) as caught:
            client.send_many("t", events, partition=0)
    finally:
        client.close()
        listener.close()
    assert answered.is_set()
    stored = caught.value.stored
    assert stored is not None and len(stored) == len(events)
    assert stored[:1000] == [EventId("t", 0, n) for n in range(1000)]
    assert stored[1000:] == [None] * (len(events) - 1000)
