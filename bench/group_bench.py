"""How long a consumer group takes to become Stable again when one more member joins.

Against a running broker::

    bench/group_bench.py --bootstrap-server 127.0.0.1:9092

or, by default, against a `tidelog serve` this script starts on a free port with a temporary
data directory and ``--override group.initial.rebalance.delay.ms=0``.

One run: ``--members`` (10) confluent-kafka consumers, each polled by its own thread, subscribe
to a topic of ``2 * (members + 1)`` partitions in a fresh group (eager ``range`` assignor) and
are waited for until every one holds its share. Then an extra consumer subscribes; the clock
starts just before its ``subscribe()`` and stops when all ``members + 1`` consumers have had
their ``on_assign`` callback for the new generation (each one's callback after the start,
with the partitions disjoint and covering the topic). That is the whole rebalance as the
clients see it: the existing members learning of it from a heartbeat, revoking, rejoining, the
leader assigning and everyone syncing. The figure is therefore bounded below by the members'
``heartbeat.interval.ms`` (librdkafka's default 3000, ``--heartbeat-ms``): run with a small
value to see the broker's part. Median, min and max of ``--runs`` (10) runs are printed, and
last one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT_S = 60.0


class Member:
    """One consumer and the thread that polls it; records the time of each on_assign."""

    def __init__(self, bootstrap: str, group: str, topic: str, heartbeat_ms: int) -> None:
        self.assigned: list[tuple[float, frozenset[int]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "session.timeout.ms": max(6000, 3 * heartbeat_ms),
                "heartbeat.interval.ms": heartbeat_ms,
                "partition.assignment.strategy": "range",
                "enable.auto.commit": False,
                "log_level": 3,
            }
        )
        self.topic = topic
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _on_assign(self, _consumer: Any, partitions: Any) -> None:
        with self._lock:
            self.assigned.append((time.monotonic(), frozenset(tp.partition for tp in partitions)))

    def _on_revoke(self, _consumer: Any, _partitions: Any) -> None:
        # Eager protocol: a revocation empties the member until its next assignment.
        with self._lock:
            self.assigned.append((time.monotonic(), frozenset()))

    def start(self) -> None:
        self.consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        self.thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.consumer.poll(0.05)

    def latest_since(self, since: float) -> frozenset[int] | None:
        with self._lock:
            after = [parts for at, parts in self.assigned if at >= since]
        return after[-1] if after else None

    def last_assign_at(self) -> float:
        with self._lock:
            return self.assigned[-1][0]

    def close(self) -> None:
        self._stop.set()
        self.thread.join()
        self.consumer.close()


def complete(members: list[Member], since: float, partitions: int) -> bool:
    held = [m.latest_since(since) for m in members]
    if any(not h for h in held):
        return False
    return sorted(p for h in held for p in h or ()) == list(range(partitions))


def wait(check: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.002)


def one_run(bootstrap: str, topic: str, partitions: int, members: int, heartbeat_ms: int) -> float:
    group = f"bench-{uuid.uuid4().hex[:10]}"
    group_members = [Member(bootstrap, group, topic, heartbeat_ms) for _ in range(members)]
    extra = Member(bootstrap, group, topic, heartbeat_ms)
    try:
        formed_from = time.monotonic()
        for m in group_members:
            m.start()
        # The group forms through several rebalances as members trickle in; the clock starts
        # once it is complete and nothing has moved for longer than a heartbeat interval.
        quiet = heartbeat_ms / 1000 + 1.0
        wait(
            lambda: (
                complete(group_members, formed_from, partitions)
                and time.monotonic() - max(m.last_assign_at() for m in group_members) > quiet
            ),
            "the group to form",
        )
        started = time.monotonic()
        extra.start()
        everyone = [*group_members, extra]
        wait(lambda: complete(everyone, started, partitions), "the rebalance to complete")
        return max(m.last_assign_at() for m in everyone) - started
    finally:
        for m in [*group_members, extra]:
            m.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_broker(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    tidelog = Path(sys.executable).parent / "tidelog"
    log = (root / "broker.log").open("wb")
    proc = subprocess.Popen(
        [
            str(tidelog),
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(root / "data"),
            "--override",
            "group.initial.rebalance.delay.ms=0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    bootstrap = f"127.0.0.1:{port}"
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=2)
            return proc, bootstrap
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"broker did not start; see {root / 'broker.log'}") from None
            time.sleep(0.1)


def create_topic(bootstrap: str, partitions: int) -> str:
    topic = f"group-bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(TIMEOUT_S)
    wait(
        lambda: len(admin.list_topics(topic, timeout=5).topics[topic].partitions) == partitions,
        "the topic",
    )
    return topic


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-server", help="a running broker (default: start one)")
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--heartbeat-ms", type=int, default=3000)
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="group-bench-"))
    proc = None
    try:
        if args.bootstrap_server:
            bootstrap = args.bootstrap_server
        else:
            proc, bootstrap = start_broker(root)
        partitions = 2 * (args.members + 1)
        topic = create_topic(bootstrap, partitions)
        times = []
        for i in range(args.runs):
            took = one_run(bootstrap, topic, partitions, args.members, args.heartbeat_ms)
            times.append(took)
            print(f"run {i + 1}: {took * 1000:.0f} ms", file=sys.stderr, flush=True)
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        shutil.rmtree(root, ignore_errors=True)

    figures = {
        "members": args.members,
        "heartbeat_ms": args.heartbeat_ms,
        "runs": args.runs,
        "median_ms": round(statistics.median(times) * 1000, 1),
        "min_ms": round(min(times) * 1000, 1),
        "max_ms": round(max(times) * 1000, 1),
        "all_ms": [round(t * 1000, 1) for t in times],
    }
    print(
        f"{args.members} members + 1 joining, heartbeat.interval.ms={args.heartbeat_ms}: "
        f"stable again after median {figures['median_ms']} ms "
        f"(min {figures['min_ms']}, max {figures['max_ms']}) over {args.runs} runs"
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
