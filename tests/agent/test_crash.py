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


# The figures: 4 socket clients, 100,000 events, 5 SIGKILLs of the agent, the broker
# down twice for 30 s. Both outages and three of the kills happen while the clients send.
CLIENTS = 4
EVENTS_PER_CLIENT = 25_000
WINDOW = 200
OUTAGE_S = 30.0


class Progress:
    """What the clients have had acknowledged, and how far the conductor lets them go."""

    def __init__(self) -> None:
        self.acked: list[list[int]] = [[] for _ in range(CLIENTS)]
        self.cap = CLIENTS * EVENTS_PER_CLIENT
        self.changed = threading.Condition()
        self.stop = False

    def total(self) -> int:
        return sum(len(a) for a in self.acked)

    def wait_below_cap(self) -> None:
        with self.changed:
            while self.total() >= self.cap and not self.stop:
                self.changed.wait(0.1)

    def set_cap(self, cap: int) -> None:
        with self.changed:
            self.cap = cap
            self.changed.notify_all()


def run_client(index: int, daemon: Daemon, topic: str, progress: Progress) -> None:
    """Send this client's events in order, `WINDOW` in flight, each acknowledged on its own;
    an event whose answer was lost with a killed agent is in doubt and never sent again (so it
    may be missing, never twice)."""
    acked = progress.acked[index]
    client: AgentClient | None = None
    i = 0
    while i < EVENTS_PER_CLIENT and not progress.stop:
        progress.wait_below_cap()
        try:
            if client is None:
                client = AgentClient(daemon.socket, timeout=60)
            window = list(range(i, min(i + WINDOW, EVENTS_PER_CLIENT)))
            # Before submitting: a submit that fails half-way leaves the window in doubt.
            i = window[-1] + 1
            futures = [
                client.submit(topic, b"%d:%06d" % (index, j), key=b"client-%d" % index)
                for j in window
            ]
            for j, future in zip(window, futures, strict=True):
                future.result(60)
                acked.append(j)
        except AgentError:
            if client is not None:
                client.close()
            client = None
            time.sleep(0.05)
    if client is not None:
        client.close()


def test_four_clients_100k_events_five_agent_kills_two_broker_outages(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    partitions = 4
    create_topic(broker.bootstrap, topic, partitions)
    daemon = Daemon(broker.bootstrap, tmp_path)
    daemon.start()
    total = CLIENTS * EVENTS_PER_CLIENT
    progress = Progress()
    threads = [
        threading.Thread(target=run_client, args=(c, daemon, topic, progress), daemon=True)
        for c in range(CLIENTS)
    ]
    kills = 0
    outages: list[float] = []
    broker_down_since = 0.0

    def reach(fraction: float) -> None:
        deadline = time.monotonic() + 120
        while progress.total() < total * fraction:
            assert time.monotonic() < deadline, "clients made no progress"
            # One client may finish before the others (it got more CPU); only when all
            # have finished can the fraction no longer be reached.
            assert any(t.is_alive() for t in threads), (
                f"every client finished with {progress.total()} of {total} events acknowledged"
            )
            time.sleep(0.005)

    def kill_agent() -> None:
        nonlocal kills
        daemon.kill()
        daemon.start()
        kills += 1

    def broker_down(hard: bool) -> None:
        nonlocal broker_down_since
        if hard:
            broker.kill()
        else:
            broker.stop()
        broker_down_since = time.monotonic()

    def broker_up() -> None:
        time.sleep(max(0.0, broker_down_since + OUTAGE_S - time.monotonic()))
        outages.append(time.monotonic() - broker_down_since)
        broker.start()

    try:
        for t in threads:
            t.start()
        reach(0.05)
        kill_agent()  # 1: broker up, batches in flight
        reach(0.10)
        broker_down(hard=False)  # outage 1: SIGTERM
        reach(0.20)
        kill_agent()  # 2: broker down
        progress.set_cap(int(total * 0.40))  # the clients keep sending during the outage
        broker_up()
        progress.set_cap(total)
        reach(0.50)
        kill_agent()  # 3: broker back, the backlog being delivered
        reach(0.60)
        broker_down(hard=True)  # outage 2: SIGKILL
        reach(0.70)
        kill_agent()  # 4: broker down
        progress.set_cap(int(total * 0.85))
        broker_up()
        progress.set_cap(total)
        reach(0.92)
        kill_agent()  # 5: broker back, backlog and new events
        for t in threads:
            t.join(180)
            assert not t.is_alive()
        # Everything queued reaches the broker.
        deadline = time.monotonic() + 120
        with AgentClient(daemon.socket) as client:
            while any(q["depth"] for q in client.status()["queues"]):
                assert time.monotonic() < deadline, client.status()
                time.sleep(0.1)
    finally:
        progress.stop = True
        progress.set_cap(total)
        daemon.stop()
    assert kills == 5 and len(outages) == 2 and all(o >= OUTAGE_S for o in outages)
    records = read_topic(broker.bootstrap, topic, partitions)
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
        missing = [j for j in progress.acked[c] if b"%d:%06d" % (c, j) not in seen]
        assert not missing, (c, missing[:10])
    # Only the events in flight at a kill may be missing: at most a window per client each time.
    assert progress.total() >= total - kills * CLIENTS * WINDOW
