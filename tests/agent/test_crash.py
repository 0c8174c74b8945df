"""Crash proofs with real processes: SIGKILL of a writer mid-append, and of the daemon while
clients send and the broker goes away."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_helpers import create_topic, read_topic
from interop_broker import BrokerProcess
from queue_writer import body

from tidelog.agent import AgentClient, AgentError
from tidelog.agent.queue import ENTRY_SIZE, DiskQueue

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def test_kill_mid_append_loses_only_unacknowledged_events(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    acked = -1
    for round_ in range(3):
        child = subprocess.Popen(
            [sys.executable, str(HERE / "queue_writer.py"), str(directory)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        target = acked + 1500 + 700 * round_
        for line in child.stdout:
            acked = int(line)
            if acked >= target:
                break
        child.send_signal(signal.SIGKILL)
        child.wait()
        queue = DiskQueue.open(directory, segment_bytes=64 * 1024)
        try:
            pos, n = queue.start_of_next_read()
            recovered = 0
            while True:
                entries = queue.read(pos, n, 1 << 20)
                if not entries:
                    break
                for e in entries:
                    assert e.number == recovered
                    assert bytes(e.body) == body(e.number)
                    recovered += 1
                last = entries[-1]
                pos, n = last.position + ENTRY_SIZE + len(last.body), last.number + 1
            assert recovered == queue.write_n
            # Every acknowledged event survived; anything beyond was in flight at the kill.
            assert recovered >= acked + 1
            acked = recovered - 1
        finally:
            queue.close()


class Daemon:
    """`tidelog agent` as a child process."""

    def __init__(self, bootstrap: str, workdir: Path) -> None:
        self.socket = workdir / "agent.sock"
        self.command = [
            str(Path(sys.executable).parent / "tidelog"),
            "agent",
            "--bootstrap-server",
            bootstrap,
            "--data-dir",
            str(workdir / "data"),
            "--socket",
            str(self.socket),
            "--property",
            "retry.backoff.max.ms=200,request.timeout.ms=5000",
            "--log-level",
            "INFO",
        ]
        self.log = workdir / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                AgentClient(self.socket, timeout=5).close()
                return
            except AgentError:
                assert self.proc.poll() is None, self.log.read_text()[-2000:]
                assert time.monotonic() < deadline, "the agent did not start"
                time.sleep(0.05)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


CLIENTS = 4
EVENTS_PER_CLIENT = 5000
WINDOW = 20


def run_client(
    index: int, daemon: Daemon, topic: str, acked: list[int], stop: Callable[[], bool]
) -> None:
    """Send this client's events in order, `WINDOW` in flight; an event whose answer was lost
    with a killed agent is in doubt and never sent again (so it may be missing, never twice)."""
    client: AgentClient | None = None
    i = 0
    while i < EVENTS_PER_CLIENT and not stop():
        try:
            if client is None:
                client = AgentClient(daemon.socket, timeout=30)
            window = list(range(i, min(i + WINDOW, EVENTS_PER_CLIENT)))
            futures = [
                client.submit(topic, b"%d:%06d" % (index, j), key=b"client-%d" % index)
                for j in window
            ]
            i = window[-1] + 1
            for j, future in zip(window, futures, strict=True):
                future.result(30)
                acked.append(j)
        except AgentError:
            if client is not None:
                client.close()
            client = None
            time.sleep(0.05)
    if client is not None:
        client.close()


def test_daemon_killed_and_broker_stopped_every_acked_event_exactly_once(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    create_topic(broker.bootstrap, topic, 4)
    daemon = Daemon(broker.bootstrap, tmp_path)
    daemon.start()
    acked: list[list[int]] = [[] for _ in range(CLIENTS)]
    failed = threading.Event()
    threads = [
        threading.Thread(
            target=run_client, args=(c, daemon, topic, acked[c], failed.is_set), daemon=True
        )
        for c in range(CLIENTS)
    ]
    try:
        for t in threads:
            t.start()

        def progress() -> int:
            return sum(len(a) for a in acked)

        total = CLIENTS * EVENTS_PER_CLIENT
        for kill, broker_down in ((1, False), (2, True), (3, False)):
            threshold = total * kill // 4
            deadline = time.monotonic() + 60
            while progress() < threshold:
                assert time.monotonic() < deadline, "clients made no progress"
                time.sleep(0.01)
            if broker_down:
                broker.stop()
            daemon.kill()
            daemon.start()
            if broker_down:
                time.sleep(3)
                broker.start()
        for t in threads:
            t.join(120)
            assert not t.is_alive()
        # Everything queued reaches the broker.
        deadline = time.monotonic() + 60
        with AgentClient(daemon.socket) as client:
            while any(q["depth"] for q in client.status()["queues"]):
                assert time.monotonic() < deadline, client.status()
                time.sleep(0.1)
    finally:
        failed.set()
        daemon.stop()
    records = read_topic(broker.bootstrap, topic, 4)
    seen: dict[bytes, int] = {}
    for p, rs in records.items():
        last_by_client: dict[int, int] = {}
        for _, key, value in rs:
            assert value is not None and key is not None
            seen[value] = seen.get(value, 0) + 1
            client_index, number = (int(x) for x in value.split(b":"))
            assert key == b"client-%d" % client_index
            # Each client's events, in the order it sent them.
            assert number > last_by_client.get(client_index, -1), (p, value)
            last_by_client[client_index] = number
    duplicates = [v for v, c in seen.items() if c > 1]
    assert not duplicates, duplicates[:10]
    for c in range(CLIENTS):
        missing = [j for j in acked[c] if b"%d:%06d" % (c, j) not in seen]
        assert not missing, (c, missing[:10])
    assert sum(len(a) for a in acked) >= total - CLIENTS * WINDOW * 3
