"""Crash proofs with real processes: SIGKILL of a writer mid-append (with the torn tails a
machine crash could leave made in copies of its queue), and of the daemon while clients send
and the broker goes away."""

from __future__ import annotations

import logging
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_helpers import create_topic, read_topic
from crc32c import crc32c
from interop_broker import BrokerProcess
from queue_writer import body

from tidelog.agent import AgentClient, AgentError
from tidelog.agent.queue import ENTRY_SIZE, DiskQueue

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def read_all(queue: DiskQueue) -> int:
    """Check that ``queue`` holds queue_writer.py's entries from 0, in order and byte for byte;
    their count."""
    pos, n = queue.start_of_next_read()
    recovered = 0
    while entries := queue.read(pos, n, 1 << 20):
        for e in entries:
            assert e.number == recovered
            assert bytes(e.body) == body(e.number)
            recovered += 1
        last = entries[-1]
        pos, n = last.position + ENTRY_SIZE + len(last.body), last.number + 1
    return recovered


def entry(number: int) -> bytes:
    """Entry ``number`` of queue_writer.py as docs/agent.md lays it out on disk (encoded here,
    not by the queue, so that recovery is checked against the format)."""
    data = body(number)
    crc = crc32c(struct.pack(">IQ", len(data), number) + data)
    return struct.pack(">IIQ", len(data), crc, number) + data


def whole_entries(data: bytes, first: int) -> tuple[int, int]:
    """(number after the last entry, offset where it ends) of the entries that ``data``, a
    segment starting at entry ``first``, holds whole and byte for byte from its start: what
    recovery must keep of it when it is the newest. The non-zero bytes after them are the
    torn tail."""
    at, number = 0, first
    while data[at : at + len(whole := entry(number))] == whole:
        at += len(whole)
        number += 1
    return number, at


def machine_crash_tails(
    real: bytes, acked_end: int, first_unacked: int, rng: random.Random
) -> list[tuple[str, bytes]]:
    """Contents the newest segment (``real`` as the killed writer left it, its acknowledged
    entries ending at offset ``acked_end``) could have after a crash of the machine, which
    can lose or half-write any block never synced: the acknowledged bytes, then part of the
    unacknowledged entries that followed, garbage, or a partial entry over zeros."""
    past = real[acked_end:]
    if not past.startswith(entry(first_unacked)):
        # Killed before it wrote the next entry in this segment: what it would have written.
        past = b"".join(entry(n) for n in range(first_unacked, first_unacked + 3))
    first = len(entry(first_unacked))
    second = first + len(entry(first_unacked + 1))
    written = len(past.rstrip(b"\0"))
    # Cuts from 4 bytes in: the first bytes of a length are zeros, which recovery rightly
    # takes for zeros written ahead.
    cuts = [
        ("in the header of the first unacknowledged entry", rng.randint(4, ENTRY_SIZE - 1)),
        ("in the body of the first unacknowledged entry", rng.randint(ENTRY_SIZE, first - 1)),
        ("in the second unacknowledged entry", rng.randint(first + 4, second - 1)),
        *(("at random past the acknowledged end", rng.randint(1, written)) for _ in range(3)),
    ]
    acked = real[:acked_end]
    tails = [(f"cut {where}: +{cut}", acked + past[:cut]) for where, cut in cuts]
    cut = rng.randint(acked_end, len(real))
    tails.append((f"the killed file cut at {cut} of {len(real)}", real[:cut]))
    garbage = rng.randbytes(rng.randint(0, 399)) + bytes([rng.randint(1, 255)])
    tails.append(("garbage past the acknowledged end", acked + garbage))
    tails.append(("garbage, then zeros written ahead", acked + garbage + bytes(4096)))
    cut = rng.randint(4, first - 1)
    tails.append((f"a partial entry (+{cut}) over zeros", acked + past[:cut] + bytes(8192)))
    return tails


def check_machine_crashes(
    snapshot: Path, acked: int, rng: random.Random, work: Path, caplog: pytest.LogCaptureFixture
) -> tuple[int, int]:
    """Tear copies of ``snapshot`` (a queue directory as a SIGKILL left it, entries 0 to
    ``acked`` acknowledged) as a machine crash could, and check what recovery keeps of each:
    every acknowledged entry, byte for byte and in order, then the unacknowledged entries
    that are there whole, never a partial one. Returns (copies whose torn tail was cut,
    copies that kept an unacknowledged entry)."""
    segments = []
    for path in sorted(snapshot.glob("*.q")):
        base, first = (int(part) for part in path.stem.split("-"))
        segments.append((base, first, path))
    # Where the acknowledged entries end; the newest segment of a crashed copy is the one
    # that position falls in (a later one holds only unacknowledged entries, and goes).
    base, first, path = max(s for s in segments if s[1] <= acked)
    acked_end = base + sum(len(entry(n)) for n in range(first, acked + 1))
    base, first, path = max(s for s in segments if s[0] <= acked_end)
    real = path.read_bytes()
    assert whole_entries(real, first)[0] > acked  # what was acknowledged is all there
    torn_copies = kept_unacked = 0
    tails = machine_crash_tails(real, acked_end - base, acked + 1, rng)
    for index, (what, data) in enumerate(tails):
        copy = work / f"crash-{index}"
        shutil.copytree(snapshot, copy)
        for _, _, later in (s for s in segments if s[0] > base):
            (copy / later.name).unlink()
        (copy / path.name).write_bytes(data)
        end_n, end = whole_entries(data, first)
        torn = len(data[end:].rstrip(b"\0"))
        assert end_n > acked, what
        caplog.clear()
        queue = DiskQueue.open(copy, segment_bytes=64 * 1024)
        try:
            assert (queue.write_n, queue.truncated_bytes) == (end_n, torn), what
            cuts = [r for r in caplog.records if "bytes of torn tail" in r.getMessage()]
            assert len(cuts) == (1 if torn else 0), what
            assert read_all(queue) == end_n, what
        finally:
            queue.close()
        assert (copy / path.name).stat().st_size == end, what
        shutil.rmtree(copy)
        torn_copies += bool(torn)
        kept_unacked += end_n > acked + 1
    return torn_copies, kept_unacked


def test_kill_mid_append_loses_only_unacknowledged_events(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGKILL a writer mid-stream: recovery keeps every acknowledged event. A killed process
    cannot tear a write (what it wrote is in the page cache), so each killed queue is also
    copied and its newest segment torn past the acknowledged entries as a crash of the
    machine could: recovery must cut exactly the torn bytes."""
    caplog.set_level(logging.WARNING, logger="tidelog.agent.queue")
    directory = tmp_path / "q"
    rng = random.Random(11)
    acked = -1
    torn_copies = kept_unacked = 0
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
        # The files as the kill left them, before recovery touches them.
        snapshot = tmp_path / f"killed-{round_}"
        shutil.copytree(directory, snapshot)
        torn, kept = check_machine_crashes(snapshot, acked, rng, tmp_path, caplog)
        torn_copies += torn
        kept_unacked += kept
        queue = DiskQueue.open(directory, segment_bytes=64 * 1024)
        try:
            recovered = read_all(queue)
            assert recovered == queue.write_n
            # Every acknowledged event survived; anything beyond was in flight at the kill.
            assert recovered >= acked + 1
            acked = recovered - 1
        finally:
            queue.close()
    # Each kill: at least the three cuts inside the first two unacknowledged entries, the two
    # garbage tails and the partial entry were torn tails, and recovery cut them.
    assert torn_copies >= 3 * 6
    assert kept_unacked >= 3  # the cut inside the second unacknowledged entry keeps the first


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
