"""How AgentClient reads answers: the waiting caller reads, others are woken, submit()
futures are answered by the background reader; timeouts and closing fail only what they
should. Against a real AgentServer (nothing delivered: the cluster is unreachable) and a
scripted server that holds chosen answers back."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest
from interop_broker import free_port

from tidelog.agent import Agent, AgentClient, AgentServer, EventId
from tidelog.agent.errors import AgentClosedError
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
