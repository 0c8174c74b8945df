"""The daemon's socket against a real agent (its cluster unreachable): what a client sees
when storing fails part-way, when the agent cannot open a queue, when it runs out of file
descriptors, and with large or many pipelined requests."""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import pytest
from agent_helpers import wait_for
from interop_broker import free_port

from tidelog.agent import (
    Agent,
    AgentClient,
    AgentClosedError,
    AgentError,
    AgentServer,
    EventId,
    EventTooLargeError,
    QueueFullError,
)
from tidelog.agent.event import decode_body, encode_body
from tidelog.agent.wire import (
    ERROR,
    MAX_FRAME,
    OK,
    OP_QUERY,
    OP_SEND,
    OP_STATUS,
    QUEUE_FULL,
    RESPONSE_HEAD,
    SEND_ACK,
    encode_number,
    encode_request,
    encode_topic_partition,
)
from tidelog.client.partitioner import partition_for_key


def start(data: Path, **config: object) -> tuple[Agent, AgentServer]:
    agent = Agent(
        {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(data), **config}
    )
    server = AgentServer(agent, data / "agent.sock")
    server.start()
    return agent, server


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Agent, AgentServer]]:
    agent, server = start(tmp_path)
    yield agent, server
    server.stop()
    agent.close()


def send_frame(request_id: int, topic: str, partition: int, key: bytes | None) -> bytes:
    body = encode_body(key, b"value", None, 1)
    return encode_request(OP_SEND, request_id, encode_topic_partition(topic, partition) + body)


def read_answers(sock: socket.socket, count: int) -> list[tuple[int, int, bytes]]:
    sock.settimeout(10)
    data = b""
    out: list[tuple[int, int, bytes]] = []
    while len(out) < count:
        chunk = sock.recv(1 << 16)
        assert chunk, f"the connection closed after {out}"
        data += chunk
        while len(data) >= RESPONSE_HEAD.size:
            size, request_id, status = RESPONSE_HEAD.unpack_from(data)
            if len(data) < 4 + size:
                break
            out.append((request_id, status, data[RESPONSE_HEAD.size : 4 + size]))
            data = data[4 + size :]
    return out


def test_requests_stored_before_another_partition_refused_theirs_are_answered_ok(
    tmp_path: Path,
) -> None:
    """Two independent SENDs in one read, their keys in partitions 0 and 1, partition 1's
    queue full under `reject`: the first is durable and answered OK with its id, only the
    second gets QUEUE_FULL (a client retrying the first would store it twice)."""
    (tmp_path / "topics.json").write_text(json.dumps({"t": 2}))
    keys: dict[int, bytes] = {}
    for k in range(100):
        keys.setdefault(partition_for_key(b"k%d" % k, 2), b"k%d" % k)
    agent, server = start(tmp_path, **{"queue.max.bytes": 4096, "queue.full.policy": "reject"})
    try:
        with AgentClient(server.path) as client, pytest.raises(QueueFullError):
            for _ in range(1000):  # to the last byte an event like the one below needs
                client.send("t", b"value", keys[1], timestamp=1)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(server.path))
            sock.sendall(send_frame(1, "t", -1, keys[0]) + send_frame(2, "t", -1, keys[1]))
            (first, first_status, ack), (second, second_status, _) = read_answers(sock, 2)
        assert (first, first_status, SEND_ACK.unpack(ack)) == (1, OK, (0, 0))
        assert (second, second_status) == (2, QUEUE_FULL)
        assert agent.queue_for("t", 0).depth() == 1
    finally:
        server.stop()
        agent.close()


def test_a_queue_the_agent_cannot_open_is_answered_and_the_connection_kept(
    daemon: tuple[Agent, AgentServer],
) -> None:
    """A queue the file system will not make (a file stands where its directory goes): that
    request gets ERROR with the reason; the answer of the SEND before it (stored) still
    comes, and the connection serves on."""
    agent, server = daemon
    (agent.data_dir / "queues" / "b-5").write_bytes(b"not a queue")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(server.path))
        sock.sendall(send_frame(1, "a", 0, None) + send_frame(2, "b", 5, None))
        (_, first, _), (_, second, reason) = read_answers(sock, 2)
        assert (first, second) == (OK, ERROR)
        assert b"cannot be opened" in reason and b"b-5" in reason
        sock.sendall(send_frame(3, "a", 0, None))
        assert read_answers(sock, 1)[0][:2] == (3, OK)
    assert agent.queue_for("a", 0).depth() == 2


def test_the_daemon_serves_again_after_running_out_of_file_descriptors(
    daemon: tuple[Agent, AgentServer],
) -> None:
    _, server = daemon
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[socket.socket] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        try:
            while True:
                sock = socket.socket(socket.AF_UNIX)
                held.append(sock)
                sock.settimeout(1)  # a full backlog blocks a connect
                sock.connect(str(server.path))
        except OSError:
            pass  # out of descriptors: the daemon's accept fails the same way meanwhile
        threading.Event().wait(0.5)
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    with AgentClient(server.path, timeout=10) as client:
        assert client.send("t", b"after", partition=0).partition == 0


def test_pipelined_sends_larger_than_the_socket_buffers_complete(
    daemon: tuple[Agent, AgentServer],
) -> None:
    """50,000 events in one write: the agent's answers (which it writes as it reads) are
    read while the write goes on, so neither side waits for the other forever."""
    _, server = daemon
    events = [(None, b"e%d" % i) for i in range(50_000)]
    with AgentClient(server.path, timeout=60) as client:
        ids = client.send_many("t", events, partition=0)
        assert [e.number for e in ids] == list(range(50_000))
        later = client.submit_many("t", events, partition=1).result(60)
        assert [e.number for e in later] == list(range(50_000))


def test_submitted_futures_are_answered_while_other_threads_send(
    daemon: tuple[Agent, AgentServer],
) -> None:
    """submit() futures nobody waits on beside send() callers on other threads: each round
    the submitted event's answer comes, whichever thread read it."""
    _, server = daemon
    with AgentClient(server.path, timeout=10) as client:
        start, done = threading.Barrier(3), threading.Barrier(3)
        rounds = 300

        def sender(partition: int) -> None:
            for _ in range(rounds):
                start.wait()
                client.send("t", b"s", partition=partition)
                done.wait()

        senders = [threading.Thread(target=sender, args=(p,), daemon=True) for p in (0, 1)]
        for thread in senders:
            thread.start()
        for i in range(rounds):
            start.wait()
            threading.Event().wait(0.0002 * (i % 5))
            future = client.submit("t", b"sub", partition=2)
            done.wait()
            try:
                assert future.result(5).number == i
            except FutureTimeout:
                pytest.fail(f"round {i}: no answer to the submitted event")
        for thread in senders:
            thread.join(10)


def test_a_request_over_the_frame_limit_is_refused_by_the_client(
    daemon: tuple[Agent, AgentServer],
) -> None:
    """Refused before it is written, with the reason; the connection stays usable (the agent
    would have closed it, failing every request in flight on it)."""
    _, server = daemon
    with AgentClient(server.path) as client:
        with pytest.raises(EventTooLargeError, match="frame limit"):
            client.send("t", b"x" * MAX_FRAME, partition=0)
        with pytest.raises(EventTooLargeError):
            client.submit_many("t", [(None, b"x" * MAX_FRAME)], partition=0)
        assert client.send("t", b"small", partition=0).number == 0


def test_errors_reach_the_client_as_the_agents_own_exceptions(tmp_path: Path) -> None:
    """An event above max.request.size raises EventTooLargeError over the socket as it does
    in-process, and a closed agent AgentClosedError: a client can tell them apart."""
    agent, server = start(tmp_path, **{"max.request.size": 1000})
    try:
        with AgentClient(server.path) as client:
            with pytest.raises(EventTooLargeError, match=r"max\.request\.size"):
                client.send("t", b"x" * 2000, partition=0)
            agent.close()
            with pytest.raises(AgentClosedError, match="closed"):
                client.send("t", b"x", partition=0)
    finally:
        server.stop()
        agent.close()


def test_pipelined_sends_alternating_partitions_share_group_commits(
    daemon: tuple[Agent, AgentServer],
) -> None:
    """300 SENDs in one write, round robin over 3 explicit partitions, then a STATUS: a
    group commit per partition per read of the daemon, not one per event (as when every
    change of partition stored the events before it); each partition's events are stored
    in the order sent; the STATUS, answered last, counts them all."""
    agent, server = daemon
    sends = [send_frame(i, "t", i % 3, b"%d" % i) for i in range(300)]
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(server.path))
        sock.sendall(b"".join(sends) + encode_request(OP_STATUS, 300, b""))
        got = read_answers(sock, 301)
    assert [(r, status) for r, status, _ in got] == [(r, OK) for r in range(301)]
    assert [SEND_ACK.unpack(ack) for _, _, ack in got[:300]] == [
        (i % 3, i // 3) for i in range(300)
    ]
    queues = [q for q in json.loads(got[300][2])["queues"] if q["topic"] == "t"]
    assert [(q["partition"], q["appended"]) for q in queues] == [(0, 100), (1, 100), (2, 100)]
    # 3 per read: the write is taken by a read or a few, never by 100.
    fsyncs = sum(q["fsyncs"] for q in agent.status() if q["topic"] == "t")
    assert 3 <= fsyncs <= 15
    for p in range(3):
        queue = agent.queue_for("t", p)
        entries = queue.read(*queue.start_of_next_read(), 1 << 20)
        keys = [decode_body(e.body)[1] for e in entries]
        assert keys == [b"%d" % i for i in range(p, 300, 3)]


def test_a_query_the_agent_fails_to_answer_is_answered_with_an_error(
    daemon: tuple[Agent, AgentServer],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The agent's delivery lookup raising what it never should (a race elsewhere): that
    QUERY alone is answered ERROR with the reason, and logged; the requests pipelined
    around it on the connection are answered, and the connection serves on."""
    agent, server = daemon

    def broken(event: object) -> object:
        raise RuntimeError("dictionary changed size during iteration")

    monkeypatch.setattr(agent, "delivery", broken)
    query = encode_request(OP_QUERY, 2, encode_topic_partition("t", 0) + encode_number(0))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(server.path))
        sock.sendall(send_frame(1, "t", 0, None) + query + send_frame(3, "t", 0, None))
        got = read_answers(sock, 3)
        assert [(r, status) for r, status, _ in got] == [(1, OK), (2, ERROR), (3, OK)]
        assert b"t/0/0" in got[1][2] and b"dictionary changed size" in got[1][2]
        sock.sendall(encode_request(OP_STATUS, 4, b"") + send_frame(5, "t", 0, None))
        assert [(r, status) for r, status, _ in read_answers(sock, 2)] == [(4, OK), (5, OK)]
    assert any(r.exc_info is not None and "t/0/0" in r.getMessage() for r in caplog.records), (
        caplog.records
    )
    with AgentClient(server.path) as client:
        with pytest.raises(AgentError, match="dictionary changed size"):
            client.delivery(EventId("t", 0, 0))
        assert client.send("t", b"after", partition=0).number == 3


def test_a_stopping_server_answers_the_requests_it_took(tmp_path: Path) -> None:
    """A stop in the middle of a pipeline: every event the daemon stored is answered as
    stored (none fails with the connection, to be sent again by its application), and no
    request the daemon did not take is stored."""
    agent, server = start(tmp_path)
    answered: list[tuple[int, int]] = []
    written = [0]
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(server.path))
            sock.settimeout(10)

            def write() -> None:
                with contextlib.suppress(OSError):
                    while True:
                        first = written[0]
                        frames = [send_frame(first + i, "t", 0, None) for i in range(50)]
                        sock.sendall(b"".join(frames))
                        written[0] += 50

            writer = threading.Thread(target=write)
            writer.start()
            data = b""
            stopped = False
            # Until the end of the stream: the daemon closes once it has answered.
            while chunk := sock.recv(1 << 16):
                data += chunk
                while len(data) >= RESPONSE_HEAD.size:
                    size, request_id, status = RESPONSE_HEAD.unpack_from(data)
                    if len(data) < 4 + size:
                        break
                    answered.append((request_id, status))
                    data = data[4 + size :]
                if len(answered) >= 2000 and not stopped:  # well into the pipeline
                    stopped = True
                    threading.Thread(target=server.stop).start()
            writer.join(10)
            assert not writer.is_alive()  # its writes fail once the daemon stops reading
        assert stopped and data == b""
        assert answered == [(r, OK) for r in range(len(answered))]
        [row] = agent.status()
        assert row["appended"] == len(answered) <= written[0]
    finally:
        server.stop()
        agent.close()


def test_a_client_pipelining_through_a_stop_learns_every_event_stored(tmp_path: Path) -> None:
    """AgentClient.submit() through a graceful stop: the daemon stops reading, so a write
    fails; the answers to what it had taken still come, and the client reports each of those
    events stored. Exactly the events the agent stored are answered ok, and the others fail
    with AgentClosedError (none stored is reported failed, to be sent again)."""
    agent, server = start(tmp_path)
    futures: list[Future[EventId]] = []
    refused: list[BaseException] = []
    try:
        client = AgentClient(server.path, timeout=10)
        stopper: threading.Thread | None = None
        try:
            while True:
                try:
                    futures.append(client.submit("t", b"value", partition=0))
                except AgentClosedError as exc:  # the write the stop refused, and later ones
                    refused.append(exc)
                    break
                if len(futures) == 3000:
                    stopper = threading.Thread(target=server.stop)
                    stopper.start()
            assert stopper is not None
            stopper.join(10)
            stored = [f.result(10) for f in futures if f.exception(10) is None]
            failed = [f.exception() for f in futures if f.exception() is not None]
        finally:
            client.close()
        assert all(isinstance(e, AgentClosedError) for e in failed), failed[:3]
        [row] = agent.status()
        assert len(stored) == row["appended"] >= 3000
        assert [e.number for e in stored] == list(range(len(stored)))
        # The answers are in request order: the stored events are the first ones sent.
        assert all(f.exception() is None for f in futures[: len(stored)])
        with pytest.raises(AgentClosedError):
            client.send("t", b"after")
    finally:
        server.stop()
        agent.close()


def test_send_many_cut_by_a_stop_names_exactly_the_events_stored(tmp_path: Path) -> None:
    """A send_many whose write a graceful stop refuses part-way: the error's ``stored`` lists
    each event the agent stored (its id) and None for the others, once the agent's answers
    to what it took are in."""
    agent, server = start(tmp_path)
    try:
        client = AgentClient(server.path, timeout=10)
        try:
            events: list[tuple[bytes | None, bytes | None]] = [(None, b"v" * 1000)] * 50_000

            def stop_once_some_are_stored() -> None:
                # The stop lands while the 50 MB write is under way, after a first store.
                while not any(row["appended"] for row in agent.status()):
                    time.sleep(0.001)
                server.stop()

            stopper = threading.Thread(target=stop_once_some_are_stored)
            stopper.start()
            with pytest.raises(AgentClosedError) as caught:
                client.send_many("t", events, partition=0)
            stopper.join(10)
        finally:
            client.close()
        stored = caught.value.stored
        assert stored is not None and len(stored) == len(events)
        ids = [e for e in stored if e is not None]
        [row] = agent.status()
        assert 0 < len(ids) == row["appended"] < len(events)
        assert [e.number for e in ids] == list(range(len(ids)))
        assert stored[len(ids) :] == [None] * (len(events) - len(ids))
    finally:
        server.stop()
        agent.close()


def test_submit_many_refused_part_way_returns_without_waiting(tmp_path: Path) -> None:
    """submit_many() from a future's callback (which runs on the thread reading the
    answers) after the daemon began a stop: its write is refused, and it returns its future
    at once rather than wait for the end of the stream on the thread that must read it; the
    answers already sent come in, and the future fails once they are all in."""
    agent, server = start(tmp_path)
    outcome: list[object] = []
    try:
        client = AgentClient(server.path, timeout=10)

        def follow_up(_: object) -> None:
            threading.Thread(target=server.stop).start()
            # The connection's thread ends once the stop has shut its reading side and it
            # has answered what it had read.
            wait_for(lambda: not server._connections, timeout=10)
            try:
                many = client.submit_many("t", [(None, b"follow-up")] * 10, partition=0)
                # Nothing is read while this callback runs on the reading thread: a future
                # already failed here would mean the call waited for the end of the stream.
                outcome.extend((many, many.done()))
            except AgentError as exc:
                outcome.extend((exc, None))

        try:
            # At once: the answer takes a round trip and a group commit.
            client.submit("t", b"v", partition=0).add_done_callback(follow_up)
            for _ in range(19):
                client.submit("t", b"v", partition=0)
            last = client.submit("t", b"last", partition=0)
            assert last.result(10) == EventId("t", 0, 20)
            many, done_at_return = outcome
            assert isinstance(many, Future) and done_at_return is False, outcome
            with pytest.raises(AgentClosedError):
                many.result(10)
        finally:
            client.close()
        [row] = agent.status()
        assert row["appended"] == 21
    finally:
        server.stop()
        agent.close()


def test_send_many_cut_by_close_names_the_events_answered_stored(tmp_path: Path) -> None:
    """close() from another thread while a large send_many is being written: the call fails
    with "the client is closed", and its ``stored`` names the events the agent had answered
    as stored (the agent stored them: an application trusting the error would send them
    again otherwise)."""
    agent, server = start(tmp_path)
    outcome: list[BaseException] = []
    try:
        client = AgentClient(server.path, timeout=30)

        def send() -> None:
            try:
                client.send_many("t", [(None, b"v" * 50)] * 300_000, partition=0)
            except AgentError as exc:
                outcome.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        wait_for(lambda: any(row["appended"] >= 20_000 for row in agent.status()))
        client.close()
        sender.join(30)
        [error] = outcome
        assert isinstance(error, AgentClosedError) and "closed" in str(error)
        stored = error.stored
        assert stored is not None and len(stored) == 300_000
        ids = [e for e in stored if e is not None]
        [row] = agent.status()
        # Answered stored before the close: at least some, and only events the agent has.
        assert 0 < len(ids) <= row["appended"] < 300_000
        assert ids == [EventId("t", 0, n) for n in range(len(ids))]
    finally:
        server.stop()
        agent.close()
