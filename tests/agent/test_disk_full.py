"""A real full disk under the agent: a 2 MiB tmpfs (in a private mount namespace, so no
privileges are needed) holding the data directory, the cluster unreachable until the disk
fills.

* block: senders in several threads fill the disk; once it is full, more threads send, and
  for a second no send is acknowledged (while the disk stays full all the time, as the
  queue's status shows). The agent is then killed with SIGKILL, the disk still full, and a
  new agent opens the same directory, full as it is; a thread sends more, and once the
  broker is up delivery frees room: every event acknowledged before the kill (and after the
  restart) is delivered once, each thread's events in order, as read back by confluent-kafka.
* reject: a send while the disk is full raises QueueFullError saying so; the events
  acknowledged are delivered once, in order.
* drop-oldest: sending never stops; the oldest segments are dropped (counted, and answered
  "dropped"), every other event is delivered once, in order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_helpers import read_topic
from interop_broker import BrokerProcess

HERE = Path(__file__).resolve().parent
EVENTS = 4000
MOUNT = 'mount -t tmpfs -o size=2m tmpfs "$1" && shift && exec "$@"'


def run_child(
    tmp_path: Path, broker: BrokerProcess, policy: str, topic: str
) -> tuple[list[str], dict]:
    data = tmp_path / "tmpfs"
    data.mkdir()
    command = [
        "unshare",
        "--mount",
        "--map-root-user",
        "sh",
        "-c",
        MOUNT,
        "sh",
        str(data),
        sys.executable,
        str(HERE / "disk_full_child.py"),
        str(data),
        broker.bootstrap,
        policy,
        topic,
        str(EVENTS),
    ]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.extend(child.stderr or ()), daemon=True)
    reader.start()
    lines: list[str] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line.strip())
            if line.startswith("full"):
                # Only now can anything be delivered: room comes from delivery from here on.
                broker.start()
        assert child.wait(180) == 0, (lines, "".join(errors)[:3000])
    finally:
        if child.poll() is None:
            child.kill()
    assert lines and lines[-1].startswith("done "), (lines, "".join(errors)[-3000:])
    return lines, json.loads(lines[-1][5:])


@pytest.mark.parametrize("policy", ["reject", "drop-oldest"])
def test_a_full_disk(tmp_path: Path, policy: str, topic_name: Callable[[], str]) -> None:
    broker = BrokerProcess(tmp_path / "broker", kind="tidelog")
    broker.workdir.mkdir()
    topic = topic_name()
    try:
        lines, done = run_child(tmp_path, broker, policy, topic)
        assert done["full_seen"], lines
        status = done["status"]
        # The file system itself said it was full (not the budget), and then had room again.
        assert status["disk_full_waits"] > 0 and not status["disk_full"]
        delivered = [v for _, _, v in read_topic(broker.bootstrap, topic, 1)[0]]
    finally:
        broker.stop()
    sent = [b"A%06d" % i + b"x" * 993 for i in range(EVENTS)]
    if policy == "drop-oldest":
        assert done["acked"] == EVENTS and done["refused"] == 0
        assert status["dropped"] > 0
        kept = [s == "delivered" for s in done["states"]]
        assert done["states"].count("dropped") == status["dropped"]
        assert delivered == [v for v, k in zip(sent, kept, strict=True) if k]
        return
    # reject: every event acknowledged, delivered once, in order; nothing dropped.
    assert done["acked"] == EVENTS and status["dropped"] == 0
    assert done["numbers"] == list(range(EVENTS))
    assert done["states"] == ["delivered"] * EVENTS
    assert delivered == sent
    [rejected] = [line for line in lines if line.startswith("rejected")]
    assert "the disk is full" in rejected and "No space left on device" in rejected


TMPFS_BYTES = 2 * 1024 * 1024
THREADS = 4  # two send from the start, two start once the disk is full
AFTER_RESTART = 20  # events sent by the restarted agent (disk_full_child.AFTER_RESTART)
# The shell stays in the mount namespace, so the tmpfs outlives the first agent: it runs the
# agent that fills the disk (until the test kills it), then one that opens what it left.
CRASH_THEN_RESTART = (
    'mount -t tmpfs -o size=2m tmpfs "$1" || exit 1; '
    '"$2" "$3" crash "$1" "$4" "$5" "$6"; '
    'exec "$2" "$3" restart "$1" "$4" "$5" "$6"'
)


class BlockRun:
    """What the two agents of the block test printed, checked as it arrives."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.acked = [0] * (THREADS + 1)  # per thread: how many sends returned
        self.pid: int | None = None
        self.full: dict | None = None
        self.checked: dict | None = None
        self.acked_at_kill: list[int] | None = None
        self.free: int | None = None
        self.opened: dict | None = None
        self.done: dict | None = None

    def line(self, line: str) -> None:
        word, _, rest = line.partition(" ")
        if word == "ack":
            t, i = map(int, rest.split())
            assert i == self.acked[t], f"thread {t}: ack of event {i} after {self.acked[t]}"
            assert self.checked is None or t == THREADS, f"acknowledged after the check: {line}"
            self.acked[t] += 1
            # The cluster is down until the restart: every event acknowledged before is on
            # the disk, which cannot hold more than this.
            held = sum(self.acked[:THREADS])
            assert held * 1000 <= TMPFS_BYTES, f"{held} KB acknowledged on a 2 MiB disk"
        elif word == "pid":
            self.pid = int(rest)
        elif word == "full":
            self.full = json.loads(rest)
            # Every thread sending so far waits in a send, its earlier acks all printed.
            assert all(self.full["inside"]), self.full
            assert self.full["acks"] == sum(self.acked), (self.full, self.acked)
        elif word == "status" and self.full is not None and self.checked is None:
            status = json.loads(rest)
            if status["t"] - self.full["t"] >= 1.0:
                self.check_and_kill(status)
        elif word == "free":
            self.free = int(rest)
        elif word == "opened":
            self.opened = json.loads(rest)
            # Only now can anything be delivered: room comes from delivery from here on.
            self.broker.start()
        elif word == "done":
            self.done = json.loads(rest)

    def check_and_kill(self, status: dict) -> None:
        """A second after the disk was found full: nothing acknowledged meanwhile."""
        assert self.full is not None and self.pid is not None
        self.checked = status
        # The same count of full disks, full at both ends: no write succeeded in between.
        assert status["disk_full"] and status["waits"] == self.full["waits"], (self.full, status)
        grown = sum(self.acked) - self.full["acks"]
        assert grown == 0, f"{grown} send(s) acknowledged while the disk was full"
        assert status["acks"] == self.full["acks"], (self.full, status)
        # Every thread is in a send: those started while the disk was full wait too.
        assert status["inside"] == [True] * THREADS, status
        os.kill(self.pid, signal.SIGKILL)
        self.acked_at_kill = list(self.acked)


def test_block_on_a_full_disk_survives_a_kill(
    tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    broker = BrokerProcess(tmp_path / "broker", kind="tidelog")
    broker.workdir.mkdir()
    topic = topic_name()
    data = tmp_path / "tmpfs"
    data.mkdir()
    command = ["unshare", "--mount", "--map-root-user", "sh", "-c", CRASH_THEN_RESTART, "sh"]
    command += [str(data), sys.executable, str(HERE / "disk_full_child.py")]
    command += [broker.bootstrap, topic, str(THREADS)]
    # Its own process group: the shell and both agents go together if the test fails.
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.extend(child.stderr or ()), daemon=True)
    reader.start()
    # A run that never gets there (the disk never full, delivery stuck) ends the output.
    timed_out: list[bool] = []

    def time_out() -> None:
        timed_out.append(True)
        os.killpg(child.pid, signal.SIGKILL)

    watchdog = threading.Timer(60, time_out)
    watchdog.start()
    run = BlockRun(broker)
    lines: list[str] = []
    try:
        try:
            assert child.stdout is not None
            for line in child.stdout:
                lines.append(line.strip())
                run.line(line.strip())
            assert not timed_out, ("killed after 60 s", lines[-20:], "".join(errors)[-3000:])
            assert child.wait(60) == 0, (lines[-20:], "".join(errors)[-3000:])
        finally:
            watchdog.cancel()
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        assert run.acked_at_kill is not None, (lines[-20:], "".join(errors)[-3000:])
        assert run.done is not None and run.opened is not None and run.free is not None
        records = read_topic(broker.bootstrap, topic, 1)[0]
    finally:
        broker.stop()
    acked = run.acked_at_kill
    assert sum(acked) > 0 and acked[THREADS] == 0
    # Killed while full: the tmpfs had no room for one more 4 KiB page of events.
    assert run.free < 4096, run.free
    # The restarted agent opened on the full disk, with every acknowledged event queued (and
    # at most one more per thread, durable but not answered yet).
    depth = run.opened["depth"]
    assert sum(acked) <= depth <= sum(acked) + THREADS, (acked, run.opened)
    status = run.done["status"]
    assert run.done["delivered"] and run.done["acks"] == AFTER_RESTART, run.done
    assert status["dropped"] == 0 and not status["disk_full"], status
    # Read back: each thread's events once, in order, from its first: every one acknowledged
    # before the kill, perhaps the one it was waiting for, then the restarted agent's.
    values = [v for _, _, v in records]
    assert len(values) == depth + AFTER_RESTART
    heads = [v.split(b"x", 1)[0].decode() for v in values]
    sent = [(int(t), int(i)) for t, i in (h[1:].split("-") for h in heads)]
    assert values == [disk_full_child_value(t, i) for t, i in sent]
    for t in range(THREADS + 1):
        numbers = [i for u, i in sent if u == t]
        assert numbers == list(range(len(numbers))), (t, numbers[:5])
        if t < THREADS:
            assert acked[t] <= len(numbers) <= acked[t] + 1, (t, acked[t], len(numbers))
    assert run.acked[THREADS] == AFTER_RESTART
    assert [t for t, _ in sent[depth:]] == [THREADS] * AFTER_RESTART


def disk_full_child_value(t: int, i: int) -> bytes:
    head = b"T%d-%06d" % (t, i)
    return head + b"x" * (1000 - len(head))
