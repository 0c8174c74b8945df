"""Group members as real client processes, watched through the events they print.

`Member` runs one member process (group_member.py for the Python clients, the Java harness's
`group-member` command, or kcat in balanced-consumer mode) and collects what it prints from a
reader thread: rebalance callbacks ("assigned", "revoked", "lost" with the partitions owned
afterwards), records, commits. The tests wait on those events (`wait_for`), then stop the
member cleanly ("stop" on stdin, or SIGTERM for kcat) or kill it with SIGKILL.

`GroupBroker` is the interop suite's broker process started with broker config overrides
(`group.initial.rebalance.delay.ms` above all, so that groups form without Kafka's 3 s wait).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from interop_broker import BrokerProcess
from java_harness import JavaClient

HERE = Path(__file__).resolve().parent
MEMBER_SCRIPT = HERE / "group_member.py"
TIMEOUT_S = 30.0
# Kafka's smallest allowed session timeout; it bounds how long a dead member keeps partitions.
SESSION_TIMEOUT_MS = 6000


class GroupBroker(BrokerProcess):
    """A `tidelog serve` process with `--override KEY=VALUE` settings."""

    def __init__(self, workdir: Path, overrides: dict[str, str]) -> None:
        super().__init__(workdir, kind="tidelog")
        self.overrides = dict(overrides)

    def command(self) -> list[str]:
        extra = [arg for k, v in self.overrides.items() for arg in ("--override", f"{k}={v}")]
        return [*super().command(), *extra]


def wait_until(check: Callable[[], bool], what: str, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


# ---- topics and records --------------------------------------------------------------------


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=TIMEOUT_S)
    futures[topic].result(TIMEOUT_S)
    wait_until(
        lambda: len(admin.list_topics(topic, timeout=5).topics[topic].partitions) == partitions,
        f"{topic} to have {partitions} partitions",
    )


def produce(bootstrap: str, topic: str, values: Sequence[str], partitions: int) -> None:
    """Writes value i to partition i % partitions, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    failures: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    for i, value in enumerate(values):
        producer.produce(topic, value.encode(), partition=i % partitions, on_delivery=report)
    assert producer.flush(TIMEOUT_S) == 0, "records left unsent"
    assert not failures, failures


def values(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i:05d}" for i in range(count)]


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = reader.committed([TopicPartition(topic, p) for p in range(partitions)], TIMEOUT_S)
    finally:
        reader.close()
    return {tp.partition: tp.offset for tp in tps}


# ---- members -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    value: str


class Member:
    """One member process and the events it has printed so far."""

    def __init__(self, name: str, argv: list[str], parse: Callable[[str], dict[str, Any] | None]):
        self.name = name
        self.argv = argv
        self._parse = parse
        self._lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self.garbage: list[str] = []
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.started = time.monotonic()
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            event = self._parse(line)
            with self._lock:
                if event is None:
                    self.garbage.append(line.rstrip("\n"))
                else:
                    event["at"] = time.monotonic()
                    self.events.append(event)

    # ---- what it said --------------------------------------------------------------------

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def of(self, *kinds: str) -> list[dict[str, Any]]:
        return [e for e in self.snapshot() if e["event"] in kinds]

    def owned(self) -> set[int] | None:
        """The partitions held after the last rebalance callback (None before the first)."""
        callbacks = self.of("assigned", "revoked", "lost")
        return set(callbacks[-1]["owned"]) if callbacks else None

    def records(self) -> list[Record]:
        return [Record(e["partition"], e["offset"], e["value"]) for e in self.of("record")]

    def committed(self) -> dict[int, int]:
        offsets: dict[int, int] = {}
        for e in self.of("committed"):
            for p, n in e["offsets"].items():
                offsets[int(p)] = max(offsets.get(int(p), 0), int(n))
        return offsets

    def describe(self) -> str:
        tail = self.snapshot()[-15:]
        return (
            f"member {self.name} ({self.proc.poll()=}): events tail {tail!r}; "
            f"other output {self.garbage[-15:]!r}"
        )

    # ---- ending it -----------------------------------------------------------------------

    def stop(self, timeout: float = TIMEOUT_S) -> None:
        """Close cleanly: the consumer commits nothing more, closes, leaves (unless static)."""
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.name} did not stop in {timeout}s: {self.describe()}"
            ) from None
        for t in self._threads:
            t.join(5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def _json_event(line: str) -> dict[str, Any] | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def python_member(
    client: str,
    bootstrap: str,
    topic: str,
    group: str,
    *,
    name: str | None = None,
    assignor: str | None = None,
    instance_id: str | None = None,
    session_timeout_ms: int = SESSION_TIMEOUT_MS,
) -> Member:
    options: dict[str, Any] = {
        "bootstrap": bootstrap,
        "topic": topic,
        "group": group,
        "session_timeout_ms": session_timeout_ms,
    }
    if assignor:
        options["assignor"] = assignor
    if instance_id:
        options["instance_id"] = instance_id
    if name:
        options["client_id"] = name
    argv = [sys.executable, str(MEMBER_SCRIPT), client, json.dumps(options)]
    return Member(name or client, argv, _json_event)


def java_member(
    java: JavaClient,
    topic: str,
    group: str,
    *,
    name: str = "java",
    assignor: str | None = None,
    instance_id: str | None = None,
    session_timeout_ms: int = SESSION_TIMEOUT_MS,
) -> Member:
    configs = {
        "session.timeout.ms": str(session_timeout_ms),
        "heartbeat.interval.ms": "500",
        "metadata.max.age.ms": "2000",
        "client.id": name,
    }
    if assignor:
        configs["partition.assignment.strategy"] = assignor
    if instance_id:
        configs["group.instance.id"] = instance_id
    argv = java.argv("group-member", {"topic": topic, "group": group, "configs": configs})
    return Member(name, argv, _json_event)


# kcat's balanced consumer prints its rebalances on stderr, e.g.
#   % Group g rebalanced (memberid rdkafka-...): assigned: t [0], t [1]
#   % Group g rebalanced (memberid ...): revoked: t [0], t [1]
_KCAT_REBALANCE = re.compile(r"rebalanced \(memberid [^)]*\): (assigned|revoked): ?(.*)$")
_KCAT_PARTITION = re.compile(r"\[(\d+)\]")


class _KcatParser:
    """Turns kcat's output into the events the other members print (eager assignors only)."""

    def __init__(self) -> None:
        self.owned: set[int] = set()

    def __call__(self, line: str) -> dict[str, Any] | None:
        line = line.rstrip("\n")
        found = _KCAT_REBALANCE.search(line)
        if found:
            kind = found.group(1)
            parts = [int(p) for p in _KCAT_PARTITION.findall(found.group(2))]
            if kind == "assigned":
                self.owned |= set(parts)
            else:
                self.owned -= set(parts)
            return {"event": kind, "partitions": parts, "owned": sorted(self.owned)}
        if line.startswith("REC "):
            _, partition, offset, value = line.split(" ", 3)
            return {
                "event": "record",
                "partition": int(partition),
                "offset": int(offset),
                "value": value,
            }
        return None


def kcat_member(bootstrap: str, topic: str, group: str, *, name: str = "kcat") -> Member:
    """kcat -G: librdkafka's balanced consumer with auto-commit of the offsets it printed."""
    argv = [
        "kcat",
        "-b",
        bootstrap,
        "-G",
        group,
        topic,
        "-o",
        "beginning",
        "-u",
        "-f",
        "REC %p %o %s\\n",
        "-X",
        f"session.timeout.ms={SESSION_TIMEOUT_MS}",
        "-X",
        "heartbeat.interval.ms=500",
        "-X",
        "auto.commit.interval.ms=200",
        "-X",
        "partition.assignment.strategy=range",
        "-X",
        f"client.id={name}",
    ]
    return Member(name, argv, _KcatParser())


def stop_kcat(member: Member) -> None:
    """kcat ends on SIGTERM like on Ctrl-C: it closes the consumer, committing its offsets."""
    if member.proc.poll() is None:
        member.proc.send_signal(signal.SIGTERM)
    member.proc.wait(TIMEOUT_S)


# ---- fixtures' helpers ------------------------------------------------------------------


class Names:
    def __init__(self, stem: str) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.topic = f"gt-{stem}-{suffix}"
        self.group = f"gg-{stem}-{suffix}"


class Members:
    """Keeps every member a test started; the ones still running are killed at the end."""

    def __init__(self) -> None:
        self.all: list[Member] = []

    def add(self, member: Member) -> Member:
        self.all.append(member)
        return member


# ---- group-wide checks ---------------------------------------------------------------------


def wait_assigned(
    members: Iterable[Member], partitions: int, what: str = "", timeout: float = TIMEOUT_S
) -> dict[str, set[int]]:
    """Waits until the members' owned partitions are disjoint and cover all partitions,
    each member owning some; returns them by member name."""
    members = list(members)

    def split() -> dict[str, set[int]] | None:
        owned = {m.name: m.owned() for m in members}
        if any(not o for o in owned.values()):
            return None
        held = [p for o in owned.values() for p in o or ()]
        if sorted(held) != list(range(partitions)):
            return None
        return {k: set(v or ()) for k, v in owned.items()}

    try:
        wait_until(lambda: split() is not None, what or "a complete assignment", timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n" + "\n".join(m.describe() for m in members)) from None
    result = split()
    assert result is not None
    return result


def group_committed(members: Iterable[Member]) -> dict[int, int]:
    """The highest offset any of the members reports having committed, per partition."""
    best: dict[int, int] = {}
    for m in members:
        for p, n in m.committed().items():
            best[p] = max(best.get(p, 0), n)
    return best


def wait_consumed(
    members: Iterable[Member], ends: dict[int, int], timeout: float = TIMEOUT_S
) -> None:
    """Waits until the members have committed up to `ends` (partition -> end offset)."""
    members = list(members)
    try:
        wait_until(lambda: group_committed(members) == ends, f"commits up to {ends}", timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n" + "\n".join(m.describe() for m in members)) from None


def ends_of(count: int, partitions: int) -> dict[int, int]:
    """End offsets after `produce` wrote `count` records round-robin to a fresh topic."""
    return {p: len(range(p, count, partitions)) for p in range(partitions)}


def assert_exactly_once(
    members: Iterable[Member], expected: Sequence[str], partitions: int
) -> None:
    """Every produced value was consumed exactly once, by the member owning its partition,
    in offset order per partition."""
    members = list(members)
    seen = [r for m in members for r in m.records()]
    counts: dict[str, int] = {}
    for r in seen:
        counts[r.value] = counts.get(r.value, 0) + 1
    duplicates = {v: n for v, n in counts.items() if n > 1}
    assert not duplicates, f"consumed more than once: {sorted(duplicates)[:10]}"
    assert sorted(counts) == sorted(expected), (
        f"missing {sorted(set(expected) - set(counts))[:10]}, "
        f"unexpected {sorted(set(counts) - set(expected))[:10]}"
    )
    for r in seen:
        assert int(r.value.rsplit("-", 1)[1]) % partitions == r.partition, r
