"""`tidelog cluster up` for real: three nodes started, described by `cluster describe` and
`metadata-quorum`, stopped by Ctrl-C; and a node that cannot start stopping the others."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TIDELOG = [sys.executable, "-m", "tidelog"]
READY_TIMEOUT_S = 90.0


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port() -> int:
    """A base port whose three client and three controller ports are free, below the
    ephemeral range (where a node's own outbound connections could take them)."""
    for _ in range(200):
        base = random.randrange(20000, 29000)
        if all(_bindable(base + offset) for offset in (0, 1, 2, 100, 101, 102)):
            return base
    raise RuntimeError("no free port range")


class Up:
    """A running `tidelog cluster up`, its output collected line by line."""

    def __init__(self, base_dir: Path, base_port: int) -> None:
        self.base_port = base_port
        self.process = subprocess.Popen(
            [*TIDELOG, "cluster", "up", "--base-dir", str(base_dir), "--base-port", str(base_port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.errors: list[str] = []
        assert self.process.stdout is not None and self.process.stderr is not None
        self.readers = [
            threading.Thread(target=self._collect, args=(stream, into), daemon=True)
            for stream, into in (
                (self.process.stdout, self.lines),
                (self.process.stderr, self.errors),
            )
        ]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _collect(stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if self.process.poll() is not None:
                self.drain()
                if any(text in line for line in self.lines):
                    return
                raise AssertionError(f"cluster up exited: {self.lines} {self.errors}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} after {timeout}s: {self.lines} {self.errors}")
            time.sleep(0.1)

    def drain(self) -> None:
        """After the exit: everything it printed has been read."""
        for reader in self.readers:
            reader.join(10)

    def controllers(self) -> str:
        return ",".join(f"127.0.0.1:{self.base_port + 100 + n}" for n in range(3))

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(60)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    cluster = Up(tmp_path / "cluster", free_base_port())
    try:
        yield cluster
    finally:
        cluster.kill()


def tidelog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TIDELOG, *args], capture_output=True, text=True, timeout=60)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_up_describe_and_ctrl_c(up: Up) -> None:
    up.wait_for("is ready.")
    table = [line.split() for line in up.lines if line[:1].isdigit()]
    assert [row[0] for row in table] == ["1", "2", "3"]
    assert sorted(row[4] for row in table) == ["follower", "follower", "leader"]
    pids = [int(row[3]) for row in table]
    bootstrap = f"127.0.0.1:{up.base_port}"

    status = tidelog(
        "metadata-quorum", "--bootstrap-controller", up.controllers(), "describe", "--status"
    )
    assert status.returncode == 0, status.stderr
    fields = dict(line.split(":", 1) for line in status.stdout.splitlines())
    assert fields["CurrentVoters"].strip() == "[1,2,3]"
    assert int(fields["LeaderId"]) in (1, 2, 3)

    replication = tidelog(
        "metadata-quorum", "--bootstrap-controller", up.controllers(), "describe", "--replication"
    )
    assert replication.returncode == 0, replication.stderr
    statuses = sorted(line.split()[-1] for line in replication.stdout.splitlines()[1:])
    assert statuses == ["Follower", "Follower", "Leader"]

    described = tidelog(
        "cluster", "describe", "--bootstrap-server", bootstrap, "--controllers", up.controllers()
    )
    assert described.returncode == 0, described.stderr
    brokers = [line.split() for line in described.stdout.splitlines() if line[:1].isdigit()]
    assert [(b[0], b[1], b[3]) for b in brokers[:3]] == [
        (str(n + 1), f"127.0.0.1:{up.base_port + n}", "active") for n in range(3)
    ]

    # A follower's controller alone cannot describe the quorum: one line that says why.
    follower = next(n for n in (1, 2, 3) if n != int(fields["LeaderId"]))
    alone = tidelog(
        "metadata-quorum",
        "--bootstrap-controller",
        f"127.0.0.1:{up.base_port + 99 + follower}",
        "describe",
        "--status",
    )
    assert alone.returncode == 1
    assert alone.stderr.count("\n") == 1 and "NOT_LEADER_OR_FOLLOWER" in alone.stderr

    up.process.send_signal(signal.SIGINT)
    assert up.process.wait(60) == 0
    up.drain()
    for n in (1, 2, 3):
        assert f"Stopped node {n} (exit status 0)." in up.lines
    assert not any(_pid_alive(pid) for pid in pids)


def test_a_node_that_cannot_start_stops_the_others(tmp_path: Path) -> None:
    base = free_base_port()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", base + 1))  # node 2's client port
        squatter.listen()
        result = subprocess.run(
            [*TIDELOG, "cluster", "up", "--base-dir", str(tmp_path), "--base-port", str(base)],
            capture_output=True,
            text=True,
            timeout=READY_TIMEOUT_S,
        )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("tidelog cluster up: node 2 exited with status 1")
    # The tail of node 2's log: what `tidelog serve` said about its port.
    assert result.stderr.rstrip().endswith("choose another port in listeners")
    assert "Stopped node 1 (exit status 0)." in result.stdout
    assert "Stopped node 3 (exit status 0)." in result.stdout
