"""The socket clients facing answers that do not parse (a daemon of another version, a
bug): the request they answer fails with an AgentError saying so, and the connection goes
on serving the requests after it, instead of leaving futures waiting forever."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.agent import AgentClient, AgentError, AsyncAgentClient
from tidelog.agent.wire import OK, REQUEST_HEAD, SEND_ACK, encode_response


@pytest.fixture
def garbling_daemon(tmp_path: Path) -> Iterator[Path]:
    """Answers every odd request OK with a 3-byte payload (no SEND answer, no status JSON),
    every even one as a SEND stored at partition 0, number = request id."""
    path = tmp_path / "fake.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()

    def serve(conn: socket.socket) -> None:
        data = b""
        with conn:
            while chunk := conn.recv(1 << 16):
                data += chunk
                while len(data) >= 4 and len(data) >= 4 + struct.unpack_from(">I", data)[0]:
                    size, _, request_id = REQUEST_HEAD.unpack_from(data)
                    data = data[4 + size :]
                    if request_id % 2:
                        conn.sendall(encode_response(request_id, OK, b"\x00\x01\x02"))
                    else:
                        conn.sendall(encode_response(request_id, OK, SEND_ACK.pack(0, request_id)))

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield path
    listener.close()


def test_the_sync_client_fails_only_the_request_answered_badly(garbling_daemon: Path) -> None:
    with AgentClient(garbling_daemon, timeout=5) as client:
        with pytest.raises(AgentError, match="malformed answer"):
            client.send("t", b"v", partition=0)  # request 1
        assert client.send("t", b"v", partition=0).number == 2
        with pytest.raises(AgentError, match="malformed answer"):
            client.status()  # request 3
        many = client.submit_many("t", [(None, b"a"), (None, b"b")], partition=0)  # 4, 5
        with pytest.raises(AgentError, match="malformed answer"):
            many.result(5)
        assert client.send("t", b"v", partition=0).number == 6


def test_the_async_client_fails_only_the_request_answered_badly(garbling_daemon: Path) -> None:
    async def run() -> None:
        client = await AsyncAgentClient.connect(garbling_daemon)
        try:
            with pytest.raises(AgentError, match="malformed answer"):
                await asyncio.wait_for(client.send("t", b"v", partition=0), 5)
            sent = await asyncio.wait_for(client.send("t", b"v", partition=0), 5)
            assert sent.number == 2
        finally:
            await client.close()

    asyncio.run(run())
