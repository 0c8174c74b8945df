"""Group consumers against a real broker: partitions split between members, handed over when a
member leaves or dies, committed offsets resumed, a mixed group with confluent-kafka, new
partitions and topics picked up, cooperative rebalances moving only what moves.

Each test runs against both broker kinds of conftest.py; for tidelog the module starts its own
``tidelog serve`` with ``group.initial.rebalance.delay.ms=0`` so that groups form without the
3 s initial delay.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from client_broker import Broker, broker_kinds

from tidelog.client import (
    Admin,
    ClientError,
    Consumer,
    NewTopic,
    OffsetAndMetadata,
    Producer,
    TopicPartition,
)
from tidelog.client.membership import RebalanceListener, WakeupError

pytestmark = pytest.mark.slow

# Session timeouts below the broker's group.min.session.timeout.ms (6000) are refused.
SESSION_MS = 6000
WAIT_S = 30.0


# Groups form at once instead of after the 3 s initial rebalance delay.
NO_DELAY = ("group.initial.rebalance.delay.ms=0",)


@pytest.fixture(scope="module", params=broker_kinds())
def group_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir = tmp_path_factory.mktemp(f"group-broker-{request.param}")
    serve = Broker(workdir, request.param, NO_DELAY)
    try:
        yield serve
    finally:
        serve.stop()


@pytest.fixture
def bootstrap(group_broker: Any) -> str:
    return str(group_broker.bootstrap)


def make_topic(bootstrap: str, name: str, partitions: int) -> None:
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])


def produce(bootstrap: str, topic: str, count: int, partitions: int, start: int = 0) -> None:
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as producer:
        futures = [
            producer.send(topic, f"v{i}".encode(), partition=i % partitions)
            for i in range(start, start + count)
        ]
        for f in futures:
            f.result(WAIT_S)


def group_config(bootstrap: str, group: str, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": SESSION_MS,
        "heartbeat.interval.ms": 300,
        "partition.assignment.strategy": "range",
    }
    config.update(extra)
    return config


def poll_until(
    consumers: list[Consumer],
    condition: Callable[[], bool],
    *,
    sink: list[Any] | None = None,
    commit: bool = False,
    other: Callable[[], None] | None = None,
) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        for consumer in consumers:
            records = consumer.poll(0.1)
            if sink is not None:
                sink.extend((id(consumer), r) for r in records)
            if commit and records:
                consumer.commit()
        if other is not None:
            other()


def stored(broker: Any, committed: OffsetAndMetadata | None) -> tuple[int, str | None] | None:
    """A committed offset as (offset, metadata); Tansu keeps no commit metadata, so for it
    only the offset is compared."""
    if committed is None:
        return None
    return committed.offset, committed.metadata if broker.kind == "tidelog" else None


def partitions_of(consumer: Consumer) -> list[int]:
    return sorted(tp.partition for tp in consumer.assignment())


def test_three_members_split_six_partitions_and_read_each_record_once(bootstrap: str) -> None:
    topic, group = f"cg3-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(bootstrap, topic, 6)
    consumers = [Consumer(group_config(bootstrap, group)) for _ in range(3)]
    try:
        for c in consumers:
            c.subscribe([topic])
        poll_until(consumers, lambda: all(len(c.assignment()) == 2 for c in consumers))
        layouts = sorted(partitions_of(c) for c in consumers)
        assert layouts == [[0, 1], [2, 3], [4, 5]]
        produce(bootstrap, topic, 600, 6)
        got: list[Any] = []
        poll_until(consumers, lambda: len(got) >= 600, sink=got, commit=True)
        places = Counter((r.partition, r.offset) for _, r in got)
        assert len(got) == 600 and all(n == 1 for n in places.values())
        for c in consumers:
            mine = {r.partition for owner, r in got if owner == id(c)}
            assert mine == set(partitions_of(c))
        committed = consumers[0].committed([TopicPartition(topic, p) for p in range(6)])
        assert {tp.partition: o.offset for tp, o in committed.items() if o} == dict.fromkeys(
            range(6), 100
        )
    finally:
        for c in consumers:
            c.close()


def test_close_hands_partitions_over_without_waiting_for_the_session(group_broker: Any) -> None:
    bootstrap = group_broker.bootstrap
    topic, group = f"cgl-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(bootstrap, topic, 6)
    # A session far longer than the wait: only LeaveGroup can move the partitions in time.
    # (Tansu holds a join phase for about the session timeout, so it gets the short one.)
    session_ms = 120_000 if group_broker.kind == "tidelog" else SESSION_MS
    config = group_config(bootstrap, group, **{"session.timeout.ms": session_ms})
    consumers = [Consumer(config) for _ in range(3)]
    try:
        for c in consumers:
            c.subscribe([topic])
        poll_until(consumers, lambda: all(len(c.assignment()) == 2 for c in consumers))
        consumers[0].close()
        rest = consumers[1:]
        poll_until(rest, lambda: sorted(len(c.assignment()) for c in rest) == [3, 3])
        assert sorted(p for c in rest for p in partitions_of(c)) == list(range(6))
    finally:
        for c in consumers:
            c.close()


CHILD = """
import sys, time
from tidelog.client import Consumer
bootstrap, group, topic = sys.argv[1:4]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 6000,
              "heartbeat.interval.ms": 300, "partition.assignment.strategy": "range",
              "auto.offset.reset": "earliest"})
c.subscribe([topic])
while True:
    c.poll(0.2)
    print(len(c.assignment()), flush=True)
"""


def test_a_killed_member_loses_its_partitions_after_the_session_timeout(bootstrap: str) -> None:
    topic, group = f"cgk-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(bootstrap, topic, 6)
    survivor = Consumer(group_config(bootstrap, group))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, bootstrap, group, topic],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        survivor.subscribe([topic])
        assert child.stdout is not None
        os.set_blocking(child.stdout.fileno(), False)
        child_holds: list[int] = []

        def read_child() -> None:
            for line in child.stdout.readlines():  # type: ignore[union-attr]
                child_holds.append(int(line))

        poll_until(
            [survivor],
            lambda: len(survivor.assignment()) == 3 and bool(child_holds) and child_holds[-1] == 3,
            other=read_child,
        )
        child.send_signal(signal.SIGKILL)
        child.wait()
        poll_until([survivor], lambda: len(survivor.assignment()) == 6)
        assert partitions_of(survivor) == list(range(6))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        survivor.close()


def test_committed_offsets_resume_after_a_restart(group_broker: Any) -> None:
    bootstrap = group_broker.bootstrap
    topic, group = f"cgr-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, 100, 2)
    first: list[Any] = []
    with Consumer(group_config(bootstrap, group)) as c:
        c.subscribe([topic])
        while len(first) < 40:
            first.extend(c.poll(0.2, max_records=10))
        c.commit()
        tp0 = TopicPartition(topic, 0)
        first_position = c.position(tp0)
        c.commit(offsets={tp0: OffsetAndMetadata(first_position, "resume-here")})
    second: list[Any] = []
    with Consumer(group_config(bootstrap, group)) as c:
        c.subscribe([topic])
        expected = stored(group_broker, OffsetAndMetadata(first_position, "resume-here"))
        assert stored(group_broker, c.committed([tp0])[tp0]) == expected
        poll_until([c], lambda: len(first) + len(second) >= 100, sink=second)
    again = first + [r for _, r in second]
    assert sorted((r.partition, r.offset) for r in again) == sorted(
        (p, o) for p in range(2) for o in range(50)
    )


def test_a_mixed_group_with_confluent_kafka_splits_partitions_by_range(bootstrap: str) -> None:
    topic, group = f"cgm-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(bootstrap, topic, 6)
    ours = Consumer(group_config(bootstrap, group))
    theirs = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": 300,
            "partition.assignment.strategy": "range",
        }
    )
    their_records: list[tuple[int, int]] = []

    def poll_theirs() -> None:
        message = theirs.poll(0.1)
        if message is not None and message.error() is None:
            their_records.append((message.partition(), message.offset()))

    def their_partitions() -> list[int]:
        return sorted(tp.partition for tp in theirs.assignment())

    try:
        ours.subscribe([topic])
        theirs.subscribe([topic])
        poll_until(
            [ours],
            lambda: len(ours.assignment()) == 3 and len(their_partitions()) == 3,
            other=poll_theirs,
        )
        assert sorted(partitions_of(ours) + their_partitions()) == list(range(6))
        produce(bootstrap, topic, 120, 6)
        our_records: list[Any] = []
        poll_until(
            [ours],
            lambda: len(our_records) + len(their_records) >= 120,
            sink=our_records,
            other=poll_theirs,
        )
        assert {r.partition for _, r in our_records} == set(partitions_of(ours))
        assert {p for p, _ in their_records} == set(their_partitions())
    finally:
        ours.close()
        theirs.close()


def test_new_partitions_and_matching_topics_are_picked_up(group_broker: Any) -> None:
    bootstrap = group_broker.bootstrap
    stem, group = f"cgp-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(bootstrap, f"{stem}-a", 2)
    config = group_config(bootstrap, group, **{"metadata.max.age.ms": 300})
    with Consumer(config) as c:
        c.subscribe(pattern=f"{stem}-.*")
        poll_until([c], lambda: len(c.assignment()) == 2)
        total = 2
        if group_broker.kind == "tidelog":  # Tansu does not serve CreatePartitions
            with Admin({"bootstrap.servers": bootstrap}) as admin:
                admin.create_partitions({f"{stem}-a": 4})
            total = 4
            poll_until([c], lambda: len(c.assignment()) == total)
        make_topic(bootstrap, f"{stem}-b", 1)
        poll_until([c], lambda: len(c.assignment()) == total + 1)
        assert c.subscription() == {f"{stem}-a", f"{stem}-b"}


class Recorder(RebalanceListener):
    def __init__(self, consumer: list[Consumer]) -> None:
        self.events: list[tuple[str, list[int]]] = []
        self.consumer = consumer

    def on_assigned(self, partitions: list[TopicPartition]) -> None:
        self.events.append(("assigned", [tp.partition for tp in partitions]))

    def on_revoked(self, partitions: list[TopicPartition]) -> None:
        # A callback may use the consumer: commit what is being handed back.
        self.consumer[0].commit()
        self.events.append(("revoked", [tp.partition for tp in partitions]))

    def on_lost(self, partitions: list[TopicPartition]) -> None:
        # No commit: the partitions may belong to another member already.
        self.events.append(("lost", [tp.partition for tp in partitions]))


def test_cooperative_sticky_revokes_only_the_partitions_that_move(bootstrap: str) -> None:
    topic, group = f"cgc-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(bootstrap, topic, 6)
    config = group_config(
        bootstrap, group, **{"partition.assignment.strategy": "cooperative-sticky"}
    )
    first, second = Consumer(config), Consumer(config)
    one, two = Recorder([first]), Recorder([second])
    try:
        first.subscribe([topic], listener=one)
        poll_until([first], lambda: len(first.assignment()) == 6)
        second.subscribe([topic], listener=two)
        poll_until(
            [first, second], lambda: [len(first.assignment()), len(second.assignment())] == [3, 3]
        )
        assert [kind for kind, _ in one.events] == ["assigned", "revoked"]
        assert sorted(one.events[1][1]) == partitions_of(second)
        assert two.events == [("assigned", partitions_of(second))]
    finally:
        first.close()
        second.close()


def test_standalone_commits_auto_commit_pause_and_wakeup(group_broker: Any) -> None:
    bootstrap = group_broker.bootstrap
    topic, group = f"cgs-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, 20, 2)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    config = group_config(bootstrap, group, **{"auto.commit.interval.ms": 0})
    config["enable.auto.commit"] = True
    with Consumer(config) as c:
        c.assign([tp0, tp1])
        c.pause(tp1)
        got: list[Any] = []
        poll_until([c], lambda: len(got) >= 10, sink=got)
        assert {r.partition for _, r in got} == {0}
        # Auto commit (every poll here) of what the polls returned.
        want = stored(group_broker, OffsetAndMetadata(10, ""))
        poll_until([c], lambda: stored(group_broker, c.committed([tp0])[tp0]) == want)
        future = c.commit({tp1: OffsetAndMetadata(3, "async")}, asynchronous=True)
        assert not isinstance(future, dict)
        assert future.result(WAIT_S) == {tp1: OffsetAndMetadata(3, "async")}
        assert stored(group_broker, c.committed([tp1])[tp1]) == stored(
            group_broker, OffsetAndMetadata(3, "async")
        )
        c.resume(tp1)
        c.seek(tp1, 3)
        more: list[Any] = []
        poll_until([c], lambda: len(more) >= 7, sink=more)
        assert sorted(r.offset for _, r in more) == list(range(3, 10))

        import threading

        threading.Timer(0.2, c.wakeup).start()
        with pytest.raises(WakeupError):
            c.poll(10.0)
    # The group's committed offsets are where assigned partitions start.
    with Consumer(group_config(bootstrap, group, **{"auto.offset.reset": "none"})) as c:
        c.assign([tp0])
        assert c.position(tp0) == 10
    fresh = group_config(bootstrap, f"g-{uuid.uuid4().hex[:8]}", **{"auto.offset.reset": "none"})
    with Consumer(fresh) as c:
        c.assign([tp0])
        with pytest.raises(ClientError, match=r"auto\.offset\.reset=none"):
            c.poll(1.0)


def test_a_static_member_comes_back_to_its_partitions_without_a_rebalance(
    tmp_path: Path,
) -> None:
    # Against tidelog only: Tansu does not hand a static member's place to its successor and
    # its rebalance can then cycle for good (docs/compatibility.md).
    serve = Broker(tmp_path, "tidelog", NO_DELAY)
    bootstrap = serve.bootstrap
    topic, group = f"cgi-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(bootstrap, topic, 6)

    def static(instance: str) -> Consumer:
        return Consumer(group_config(bootstrap, group, **{"group.instance.id": instance}))

    first, other = static("instance-a"), static("instance-b")
    watcher = Recorder([other])
    restarted = None
    try:
        first.subscribe([topic])
        other.subscribe([topic], listener=watcher)
        poll_until(
            [first, other], lambda: [len(first.assignment()), len(other.assignment())] == [3, 3]
        )
        held = partitions_of(first)
        assert held == [0, 1, 2]  # static members are ordered by instance id

        def stable() -> bool:
            with Admin({"bootstrap.servers": bootstrap}) as admin:
                return admin.describe_groups([group])[group].state == "Stable"

        # The claim is about a Stable group: no rebalance may still be under way.
        poll_until([first, other], stable)
        seen_before = len(watcher.events)
        first.close()  # a static member does not leave: its place is kept for the session
        restarted = static("instance-a")
        restarted.subscribe([topic])
        poll_until([restarted, other], lambda: len(restarted.assignment()) == 3)
        assert partitions_of(restarted) == held
        for _ in range(5):
            other.poll(0.1)
        assert watcher.events[seen_before:] == []  # the other member saw no rebalance
        assert stable()
    finally:
        first.close()
        other.close()
        if restarted is not None:
            restarted.close()
        serve.stop()


def test_a_member_cut_off_from_its_coordinator_declares_its_partitions_lost(
    tmp_path: Path,
) -> None:
    # A broker of its own: this test freezes it (SIGSTOP), as a hung or partitioned
    # coordinator would look to the member: connections stay open, nothing is answered.
    serve = Broker(tmp_path, "tidelog", NO_DELAY)
    bootstrap = serve.bootstrap
    topic, group = f"cgd-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    consumer: Consumer | None = None
    try:
        make_topic(bootstrap, topic, 2)
        produce(bootstrap, topic, 10, 2)
        consumer = Consumer(group_config(bootstrap, group, **{"request.timeout.ms": 2000}))
        recorder = Recorder([consumer])
        consumer.subscribe([topic], listener=recorder)
        seen: list[Any] = []
        poll_until([consumer], lambda: len(seen) == 10, sink=seen)
        assert [kind for kind, _ in recorder.events] == ["assigned"]

        serve.proc.send_signal(signal.SIGSTOP)
        try:
            frozen_at = time.monotonic()
            poll_until([consumer], lambda: any(kind == "lost" for kind, _ in recorder.events))
            # Not before the session could have expired at the coordinator.
            assert time.monotonic() - frozen_at >= SESSION_MS / 1000 * 0.9
        finally:
            serve.proc.send_signal(signal.SIGCONT)
        assert recorder.events[-1] == ("lost", [0, 1])

        # Back in the group once the coordinator answers again; nothing was committed, so
        # the member reads from the beginning and then the records written since.
        produce(bootstrap, topic, 10, 2, start=10)
        again: list[Any] = []
        poll_until([consumer], lambda: len({r.value for _, r in again}) == 20, sink=again)
        assert {r.value for _, r in again} == {f"v{i}".encode() for i in range(20)}
        assert recorder.events[-1] == ("assigned", [0, 1])
    finally:
        if consumer is not None:
            consumer.close()
        serve.stop()
