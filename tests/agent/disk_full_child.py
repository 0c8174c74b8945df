"""An agent on a small tmpfs that sends until the disk is full, for test_disk_full.

    disk_full_child.py DATA_DIR BOOTSTRAP POLICY TOPIC EVENTS
    disk_full_child.py crash DATA_DIR BOOTSTRAP TOPIC THREADS
    disk_full_child.py restart DATA_DIR BOOTSTRAP TOPIC THREADS

Meant to run in a private mount namespace with a tmpfs of a few MiB on DATA_DIR (see the
test). Lines are flushed as they are written.

The first form (policies reject and drop-oldest): a thread sends EVENTS events of 1 KB
(``A000000...``) to partition 0, sending an event again when it is refused (policy reject),
so that every event is acknowledged once, in order. The main thread watches the queue: once
the disk is full it prints ``full``, and with policy reject also ``rejected <message>`` for a
send tried meanwhile. At the end, after every queue is delivered, it prints ``done <json>``:
the status row and the state of every event. The test starts the broker when it reads
``full``.

``crash`` (policy block, the cluster down) never ends by itself: the test kills it with
SIGKILL. It prints ``pid <pid>``; THREADS sender threads send events of 1 KB to partition 0,
thread t its events ``T<t>-000000``, ``T<t>-000001``, ... in order, each printing
``ack <t> <i>`` once its send of event i returned. Half of them (at least one) start at
once; once the disk has been full for half a second (``disk_full`` with the same
``disk_full_waits``) while each of those waits in a send, the main thread prints
``full <json>`` and starts the others, which so arrive while the disk is full. From then on
it prints ``status <json>`` every 0.1 s. ``full`` and ``status`` are printed under the lock
of the ``ack`` lines, together with which threads are in a send (``inside``): a thread in a
send has printed the ``ack`` of each send that returned before it.

``restart`` opens an agent on the same directory (the disk still full): it prints
``free <bytes>`` (what the file system had before the agent opened) and ``opened <json>``
(the queue's status row), then thread THREADS sends 20 events ``T<THREADS>-...`` the same
way, and once they are acknowledged and every queue is delivered it prints ``done <json>``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from tidelog.agent import Agent, EventId
from tidelog.agent.errors import QueueFullError

CONFIG = {"queue.segment.bytes": 262144, "retry.backoff.max.ms": 200}
PER_THREAD = 10000  # far more than the disk holds: the senders of `crash` never finish
AFTER_RESTART = 20


def emit(line: str) -> None:
    print(line, flush=True)


def main() -> None:
    if sys.argv[1] in ("crash", "restart"):
        mode, data_dir, bootstrap, topic, threads = sys.argv[1:6]
        if mode == "restart":
            # Before the agent opens the directory: how full the crash left it.
            stat = os.statvfs(data_dir)
            emit(f"free {stat.f_bavail * stat.f_frsize}")
        config = {"bootstrap.servers": bootstrap, "data.dir": data_dir}
        agent = Agent(config | {"queue.full.policy": "block"} | CONFIG)
        if mode == "crash":
            fill_and_wait(agent, topic, int(threads))
        else:
            restart(agent, topic, int(threads))
        return
    data_dir, bootstrap, policy, topic, count = sys.argv[1:6]
    events = int(count)
    config = {
        "bootstrap.servers": bootstrap,
        "data.dir": data_dir,
        "queue.full.policy": policy,
    } | CONFIG
    agent = Agent(config)
    acked: list[EventId] = []
    refused = 0

    def send_all() -> None:
        nonlocal refused
        for i in range(events):
            value = b"A%06d" % i + b"x" * 993
            while True:
                try:
                    acked.append(agent.send(topic, value, partition=0))
                    break
                except QueueFullError:
                    refused += 1
                    time.sleep(0.05)

    sender = threading.Thread(target=send_all)
    sender.start()
    full_seen = False
    while sender.is_alive():
        rows = agent.status()
        if not rows:  # the queue is made by the first send
            time.sleep(0.01)
            continue
        [row] = rows
        # drop-oldest makes room at once: the disk may be full only for an instant.
        if (row["disk_full"] or row["disk_full_waits"]) and not full_seen:
            full_seen = True
            if policy == "reject":
                try:
                    agent.send(topic, b"B", partition=0)
                    print("accepted while full", flush=True)
                except QueueFullError as exc:
                    print(f"rejected {exc}", flush=True)
            print(f"full {len(acked)}", flush=True)
        time.sleep(0.01)
    sender.join()
    if not agent.flush(120):
        print("not delivered in time", flush=True)
        sys.exit(1)
    [row] = agent.status()
    states = [agent.delivery(e).state for e in acked]
    print(
        "done "
        + json.dumps(
            {"acked": len(acked), "numbers": [e.number for e in acked], "status": row}
            | {"states": states, "refused": refused, "full_seen": full_seen}
        ),
        flush=True,
    )
    agent.close()


def tagged(t: int, i: int) -> bytes:
    """Event i of thread t: 1,000 bytes."""
    head = b"T%d-%06d" % (t, i)
    return head + b"x" * (1000 - len(head))


class Senders:
    """Sender threads that print ``ack <t> <i>`` under one lock as each send returns."""

    def __init__(self, agent: Agent, topic: str) -> None:
        self.agent = agent
        self.topic = topic
        self.lock = threading.Lock()
        self.acks = 0
        self.inside: dict[int, bool] = {}
        self.threads: list[threading.Thread] = []

    def start(self, t: int, count: int) -> None:
        self.inside[t] = False
        thread = threading.Thread(target=self._send, args=(t, count), daemon=True)
        self.threads.append(thread)
        thread.start()

    def _send(self, t: int, count: int) -> None:
        for i in range(count):
            self.inside[t] = True
            self.agent.send(self.topic, tagged(t, i), partition=0)
            with self.lock:
                self.acks += 1
                emit(f"ack {t} {i}")
                self.inside[t] = False

    def report(self, word: str, row: dict) -> None:
        """Print ``word <json>``; the caller holds the lock."""
        inside = [self.inside[t] for t in sorted(self.inside)]
        emit(
            f"{word} "
            + json.dumps(
                {"t": time.monotonic(), "disk_full": row["disk_full"]}
                | {"waits": row["disk_full_waits"], "acks": self.acks, "inside": inside}
            )
        )


def fill_and_wait(agent: Agent, topic: str, threads: int) -> None:
    emit(f"pid {os.getpid()}")
    senders = Senders(agent, topic)
    early = max(1, threads // 2)
    for t in range(early):
        senders.start(t, PER_THREAD)
    full_since: tuple[int, float] | None = None  # (disk_full_waits, since when)
    while True:
        rows = agent.status()
        if rows:
            [row] = rows
            if not row["disk_full"]:
                full_since = None
            elif full_since is None or full_since[0] != row["disk_full_waits"]:
                full_since = (row["disk_full_waits"], time.monotonic())
            elif time.monotonic() - full_since[1] >= 0.5:
                with senders.lock:
                    [row] = agent.status()
                    if row["disk_full"] and all(senders.inside.values()):
                        senders.report("full", row)
                        break
        time.sleep(0.01)
    for t in range(early, threads):
        senders.start(t, PER_THREAD)
    while True:  # until killed
        time.sleep(0.1)
        with senders.lock:
            [row] = agent.status()
            senders.report("status", row)


def restart(agent: Agent, topic: str, threads: int) -> None:
    [row] = agent.status()
    emit("opened " + json.dumps(row))
    senders = Senders(agent, topic)
    senders.start(threads, AFTER_RESTART)
    senders.threads[0].join(120)
    delivered = agent.flush(120)
    [row] = agent.status()
    emit("done " + json.dumps({"delivered": delivered, "status": row, "acks": senders.acks}))
    agent.close()


if __name__ == "__main__":
    main()
