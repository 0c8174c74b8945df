"""The cluster kit itself: the checker flags each kind of violation, and a cut link of the
proxy network really stops traffic until it is healed. No tidelog process runs here."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest
from cluster_harness import History, Op, ProxyNet, check_creates


def _history(*ops: tuple[str, str]) -> History:
    history = History()
    for name, outcome in ops:
        history.add(Op(name, 1, outcome))
    return history


def test_a_consistent_history_passes() -> None:
    history = _history(("t-1", "ok"), ("t-2", "fail"), ("t-3", "info"), ("t-4", "info"))
    seen = {n: {"t-1": "a", "t-3": "c"} for n in (1, 2, 3)}
    assert check_creates(history, "t-", seen) == []


@pytest.mark.parametrize(
    ("seen", "flagged"),
    [
        # an acknowledged create missing on one node
        ({1: {"t-1": "a"}, 2: {"t-1": "a"}, 3: {}}, "acknowledged create t-1"),
        # a create that certainly failed, present
        ({n: {"t-1": "a", "t-2": "b"} for n in (1, 2, 3)}, "failed create t-2"),
        # a topic nobody asked for
        ({n: {"t-1": "a", "t-9": "z"} for n in (1, 2, 3)}, "t-9, which nobody created"),
        # the same name with another topic id on one node
        ({1: {"t-1": "a"}, 2: {"t-1": "a"}, 3: {"t-1": "other"}}, "node 3 differs"),
    ],
)
def test_each_violation_is_flagged(seen: dict[int, dict[str, str]], flagged: str) -> None:
    history = _history(("t-1", "ok"), ("t-2", "fail"), ("t-3", "info"))
    problems = check_creates(history, "t-", seen)
    assert any(flagged in p for p in problems), problems


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _round_trip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
        sock.sendall(payload)
        return sock.recv(4096)


def test_a_cut_link_carries_nothing_until_healed(echo_port: int) -> None:
    net = ProxyNet()
    try:
        port = net.link(1, 2, echo_port)
        back = net.link(2, 1, echo_port)
        assert _round_trip(port, b"before") == b"before"
        open_conn = socket.create_connection(("127.0.0.1", port), timeout=1.0)
        net.isolate(2)
        # The connection open at the cut is dropped; a new one is accepted but answered
        # by nobody, in both directions.
        with pytest.raises(OSError):
            open_conn.sendall(b"x")
            if not open_conn.recv(1):
                raise ConnectionResetError("closed")
        open_conn.close()
        for link_port in (port, back):
            with pytest.raises(TimeoutError):
                _round_trip(link_port, b"during")
        net.heal()
        assert _round_trip(port, b"after") == b"after"
        assert _round_trip(back, b"after") == b"after"
    finally:
        net.close()
