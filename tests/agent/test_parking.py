"""Events for a topic the cluster does not know yet: parked durably, moved exactly once.

The crash test kills a real agent process with SIGKILL at each fsync of the move in turn (and
sometimes also throws away what the killed process had written but not synced), restarts
it, and checks that every parked event ends up in exactly one partition queue, once, in
order, in the partition the client's partitioner gives it. The end-to-end test runs the
`tidelog agent` daemon against a broker that does not auto-create topics: the clients get
their acknowledgements while the topic does not exist, and everything arrives once the topic
is created, across a SIGKILL of the daemon.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import add_partitions, create_topic, read_topic, wait_for
from interop_broker import BrokerProcess
from test_crash import Daemon

from tidelog.agent import Agent, AgentClient, AgentServer, EventId
from tidelog.agent.event import decode_body
from tidelog.agent.parking import MoveJournal
from tidelog.agent.queue import ENTRY, ENTRY_SIZE, DiskQueue
from tidelog.client.partitioner import partition_for_key

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
PARTITIONS = 3


def queue_entries(directory: Path) -> list[tuple[int, bytes]]:
    """Every entry of a partition queue on disk, from its first: (number, body)."""
    queue = DiskQueue.open(directory)
    try:
        pos, n = queue.segments[0].base, queue.segments[0].first_n
        out = []
        while True:
            entries = queue.read(pos, n, 1 << 20)
            if not entries:
                return out
            out.extend((e.number, bytes(e.body)) for e in entries)
            last = entries[-1]
            pos, n = last.position + ENTRY_SIZE + len(last.body), last.number + 1
    finally:
        queue.close()


def lose_unsynced_half(data: Path, topic: str) -> bool:
    """As a machine crash could: drop the second half of the newest group a move placed
    (the agent was killed before that append's fsync). True when something was dropped."""
    parked = data / "parked" / topic
    cursor = DiskQueue.open(parked)
    _, next_n = cursor.start_of_next_read()
    cursor.close()
    journal = MoveJournal(parked, lambda fd: None)
    plan = journal.plans.get(next_n)
    journal.close()
    if plan is None or not plan.placed:
        return False
    partition, records = max(plan.placed.items(), key=lambda kv: kv[1][-1][1])
    _, first, count = records[-1]
    segments = sorted((data / "queues" / f"{topic}-{partition}").glob("*.q"))
    seg = segments[-1]
    raw = seg.read_bytes()
    seg_first = int(seg.stem.split("-")[1])
    keep = first + count // 2
    if keep <= seg_first or count < 2:
        return False
    pos, n = 0, seg_first
    while n < keep and pos + ENTRY_SIZE <= len(raw):
        length, _, _ = ENTRY.unpack_from(raw, pos)
        pos += ENTRY_SIZE + length
        n += 1
    if pos >= len(raw):
        return False
    seg.write_bytes(raw[:pos])
    return True


# Parking with drop-oldest and a small budget: the parked queue drops its oldest segments, so
# the move starts at the skip position, not at the read position.
DROPPING = {
    "queue.full.policy": "drop-oldest",
    "queue.max.bytes": 65536,
    "queue.segment.bytes": 16384,
}


def quick_retries(data: Path) -> dict[str, object]:
    """An agent on ``data`` with no cluster, retrying a failed move within milliseconds."""
    return {
        "bootstrap.servers": "127.0.0.1:1",
        "data.dir": str(data),
        "retry.backoff.ms": 20,
        "retry.backoff.max.ms": 50,
    }


@pytest.mark.parametrize("drops", [False, True], ids=["all-parked", "after-drops"])
def test_sigkill_at_every_step_of_a_move_neither_loses_nor_duplicates(
    tmp_path: Path, drops: bool
) -> None:
    data = tmp_path / "data"
    topic = "parked-topic"
    config = {"bootstrap.servers": "127.0.0.1:1", "data.dir": str(data)}
    sent: list[tuple[EventId, bytes | None, bytes]] = []
    with Agent({**config, **DROPPING} if drops else config) as agent:
        for i in range(2000 if drops else 1500):
            key = None if i % 3 == 0 else b"key-%d" % (i % 17)
            value = b"event-%05d" % i
            event = agent.send(topic, value, key=key)
            assert event.partition == -1 and event.number == i
            sent.append((event, key, value))
        if drops:
            sent = [s for s in sent if agent.delivery(s[0]).state != "dropped"]
            assert 0 < len(sent) < 2000
    # The topic becomes known (as a metadata answer would make it) while the agent is down.
    (data / "topics.json").write_text(json.dumps({topic: PARTITIONS}))
    kill_at, rounds, lost_halves = 1, 0, 0
    while True:
        child = subprocess.run(
            [sys.executable, str(HERE / "park_child.py"), str(data), str(kill_at)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        rounds += 1
        if child.returncode == 0:
            assert child.stdout.strip() == "moved", child.stderr[-2000:]
            break
        assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
        if rounds % 2 == 0 and lose_unsynced_half(data, topic):
            lost_halves += 1
        kill_at += 1 + rounds % 3
        assert rounds < 200
    assert rounds > 10 and lost_halves > 0
    # Every parked event is in exactly one partition queue, once, where its key sends it,
    # and each partition holds them in the order they were sent.
    found: dict[bytes, tuple[int, int]] = {}
    for p in range(PARTITIONS):
        values = []
        for number, body in queue_entries(data / "queues" / f"{topic}-{p}"):
            _, key, value, _ = decode_body(body)
            assert value is not None and value not in found, value
            found[value] = (p, number)
            values.append(value)
            if key is not None:
                assert p == partition_for_key(key, PARTITIONS)
        assert values == sorted(values)
    assert set(found) == {v for _, _, v in sent}
    # The parked ids still answer: pending in their partition queue (no cluster here).
    with Agent(config) as agent:
        for event, _, value in sent[::50]:
            state = agent.delivery(event)
            assert (state.state, state.partition) == ("pending", found[value][0])


def test_an_error_in_the_middle_of_a_move_is_retried_without_duplicates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A move stopped by an error after some of its groups were placed (here the journal
    record of the second group, refused as on a full disk) finishes its own plan when it is
    retried: the groups already placed are not appended again."""
    data = tmp_path / "data"
    topic = "parked-topic"
    config = quick_retries(data)
    values = [b"event-%05d" % i for i in range(300)]
    with Agent(config) as agent:
        for i, value in enumerate(values):
            agent.send(topic, value, key=b"key-%d" % (i % 7))
    (data / "topics.json").write_text(json.dumps({topic: PARTITIONS}))
    calls = [0]
    real_placed = MoveJournal.placed

    def placed(journal: MoveJournal, *args: int) -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_placed(journal, *args)

    monkeypatch.setattr(MoveJournal, "placed", placed)
    with Agent(config) as agent:
        wait_for(lambda: not any(r["depth"] for r in agent.status() if r["partition"] < 0))
    assert calls[0] > PARTITIONS  # the refused record was written again
    moved = []
    for p in range(PARTITIONS):
        in_partition = [
            decode_body(body)[2] for _, body in queue_entries(data / "queues" / f"{topic}-{p}")
        ]
        assert in_partition == sorted(in_partition)
        moved.extend(in_partition)
    assert sorted(moved) == values


def damage_parked_entries(directory: Path, numbers: range, *, lost_page: bool) -> None:
    """Damage the parked entries ``numbers`` on disk: a flipped byte in each one's value, or
    (``lost_page``) all their bytes zeroed, lengths and numbers included."""
    (seg,) = sorted(directory.glob("*.q"))
    raw = bytearray(seg.read_bytes())
    pos, n = 0, int(seg.stem.split("-")[1])
    spans = []
    while n < numbers.stop:
        length, _, number = ENTRY.unpack_from(raw, pos)
        assert number == n and length > 0
        if n in numbers:
            spans.append((pos, pos + ENTRY_SIZE + length))
        pos += ENTRY_SIZE + length
        n += 1
    if lost_page:
        raw[spans[0][0] : spans[-1][1]] = bytes(spans[-1][1] - spans[0][0])
    else:
        for _, end in spans:
            raw[end - 1] ^= 0xFF
    seg.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "where",
    [
        "lost-page-at-start",
        "flipped-bytes-in-middle",
        "flipped-bytes-at-end",
        "flipped-bytes-in-middle-then-crash-before-commit",
    ],
)
def test_damage_in_an_interrupted_move_loses_only_the_damaged_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A move stopped after its first group was placed, then damage in the parked queue
    inside its chunk. The next agent finishes the move instead of stopping there: the
    damaged events not placed yet are dropped (a query says so), every other parked event,
    the damaged ones already placed included, is in its partition queue exactly once, and
    new events of the topic no longer wait behind the parked ones.

    Damage at the end of the queue is cut as a torn tail when it opens: new events must
    still be numbered after the planned ones. A crash after the damaged events were
    recorded as dropped but before the move's commit loses that record (a drop past the
    read position is taken for one that never happened): the next agent records it again.
    """
    data = tmp_path / "data"
    topic = "parked-topic"
    config = quick_retries(data)
    values = [b"event-%05d" % i for i in range(300)]
    with Agent(config) as agent:
        ids = [agent.send(topic, value, key=b"key-%d" % (i % 7)) for i, value in enumerate(values)]
    (data / "topics.json").write_text(json.dumps({topic: PARTITIONS}))
    calls = [0]
    real_placed = MoveJournal.placed

    def placed(journal: MoveJournal, *args: int) -> None:
        calls[0] += 1
        if calls[0] >= 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_placed(journal, *args)

    with monkeypatch.context() as patch:
        patch.setattr(MoveJournal, "placed", placed)
        with Agent(config) as agent:
            wait_for(lambda: calls[0] >= 2)
    parked = data / "parked" / topic
    journal = MoveJournal(parked, lambda fd: None)
    plan = journal.plans[0]
    journal.close()
    assert plan.n1 == len(values) and len(plan.placed) == 1
    damaged = {"start": range(0, 6), "end": range(294, 300)}.get(
        where.split("-")[-1], range(150, 156)
    )
    in_place = [i for i in damaged if plan.assign[i] in plan.placed]
    lost = [i for i in damaged if plan.assign[i] not in plan.placed]
    assert in_place and lost  # both kinds, for the test to mean something
    damage_parked_entries(parked, damaged, lost_page=where.startswith("lost-page"))

    if where.endswith("crash-before-commit"):
        real_commit = DiskQueue.commit

        def commit(queue: DiskQueue, *args: Any, **kwargs: Any) -> None:
            if queue.directory == parked:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            real_commit(queue, *args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(DiskQueue, "commit", commit)
            with Agent(config) as agent:
                # The damaged events are recorded as dropped; the commit never comes.
                wait_for(lambda: agent.delivery(ids[lost[0]]).state == "dropped")

    with Agent(config) as agent:
        # Numbering goes on after the planned entries, whatever recovery cut.
        assert agent._parked[topic].queue.write_n >= plan.n1
        wait_for(lambda: not any(r["depth"] for r in agent.status() if r["partition"] < 0))
        assert agent.send(topic, b"after", key=b"key-1").partition >= 0
        for i in lost:
            assert agent.delivery(ids[i]).state == "dropped"
        for i in in_place:
            assert agent.delivery(ids[i]).partition == plan.assign[i]
    found: list[bytes] = []
    for p in range(PARTITIONS):
        in_partition = [
            decode_body(body)[2] for _, body in queue_entries(data / "queues" / f"{topic}-{p}")
        ]
        if b"after" in in_partition:
            assert in_partition.pop() == b"after"  # behind every moved event
        assert in_partition == sorted(in_partition)
        found.extend(in_partition)
    assert sorted(found) == [v for i, v in enumerate(values) if i not in lost]


class NoAutoCreateBroker(BrokerProcess):
    """`tidelog serve` that, like a production Kafka cluster, creates no topic on request."""

    def command(self) -> list[str]:
        return [*super().command(), "--override", "auto.create.topics.enable=false"]


def test_daemon_parks_events_until_the_topic_exists(
    tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    broker = NoAutoCreateBroker(tmp_path / "broker", kind="tidelog")
    broker.workdir.mkdir()
    broker.start()
    daemon = Daemon(broker.bootstrap, tmp_path)
    topic = topic_name()
    try:
        daemon.start()
        acked: list[list[tuple[EventId, bytes]]] = [[], []]

        def client(index: int) -> None:
            with AgentClient(daemon.socket) as c:
                for chunk in range(10):
                    events = [
                        (b"c%d" % index, b"%d:%04d" % (index, chunk * 200 + j)) for j in range(200)
                    ]
                    ids = c.send_many(topic, events)
                    acked[index].extend(zip(ids, [v for _, v in events], strict=True))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        # All acknowledged while the cluster has no such topic: parked, partition -1.
        assert all(e.partition == -1 for a in acked for e, _ in a)
        assert sum(len(a) for a in acked) == 4000
        with AgentClient(daemon.socket) as c:
            [row] = [q for q in c.status()["queues"] if q["partition"] == -1]
            assert row["depth"] == 4000
            assert c.delivery(acked[0][0][0]).state == "pending"
        create_topic(broker.bootstrap, topic, PARTITIONS)
        # Killed while the mover may be at work; the restarted daemon finishes the move.
        with AgentClient(daemon.socket) as c:
            deadline = time.monotonic() + 30
            while not any(q["partition"] >= 0 for q in c.status()["queues"]):
                assert time.monotonic() < deadline
                time.sleep(0.005)
        daemon.kill()
        daemon.start()
        with AgentClient(daemon.socket) as c:
            deadline = time.monotonic() + 60
            while any(q["depth"] for q in c.status()["queues"]):
                assert time.monotonic() < deadline, c.status()
                time.sleep(0.05)
            answers = {v: c.delivery(e) for a in acked for e, v in a}
    finally:
        daemon.stop()
    records = read_topic(broker.bootstrap, topic, PARTITIONS)
    broker.stop()
    seen: dict[bytes, tuple[int, int]] = {}
    for p, rs in records.items():
        for offset, key, value in rs:
            assert value is not None and value not in seen
            seen[value] = (p, offset)
            assert p == partition_for_key(key or b"", PARTITIONS)
        per_client: dict[bytes, list[bytes]] = {}
        for _, key, value in rs:
            assert key is not None and value is not None
            per_client.setdefault(key, []).append(value)
        assert all(vs == sorted(vs) for vs in per_client.values())
    assert set(seen) == set(answers)
    # Asked by the parked id, after the restart: delivered, at the offset the topic shows.
    for value, answer in answers.items():
        assert (answer.state, answer.partition, answer.offset) == ("delivered", *seen[value])


def test_explicit_partitions_stay_behind_the_parked_events(
    tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    """Once a topic has parked events, events sent to an explicit partition (in-process or
    over the socket) are parked too, pinned to it, so that nobody's events overtake their
    own earlier ones; a pinned partition the topic does not have yet waits for it."""
    broker = NoAutoCreateBroker(tmp_path / "broker", kind="tidelog")
    broker.workdir.mkdir()
    broker.start()
    topic = topic_name()
    config = {
        "bootstrap.servers": broker.bootstrap,
        "data.dir": str(tmp_path / "data"),
        "metadata.max.age.ms": 500,
    }
    expected: dict[bytes, int | None] = {}  # value -> its partition (None: sticky)
    try:
        with Agent(config) as agent:
            server = AgentServer(agent, tmp_path / "agent.sock")
            server.start()
            try:
                with AgentClient(tmp_path / "agent.sock") as client:
                    ids = [agent.send(topic, b"e000")]  # parked: the topic is unknown
                    expected[b"e000"] = None
                    for i in range(1, 300):
                        value = b"e%03d" % i
                        if i % 4 == 0:
                            ids.append(agent.send(topic, value, partition=1))
                            expected[value] = 1
                        elif i % 4 == 1:
                            key = b"k%d" % (i % 5)
                            ids.append(agent.send(topic, value, key=key))
                            expected[value] = partition_for_key(key, PARTITIONS)
                        elif i % 4 == 2:
                            ids.extend(agent.send_many(topic, [(None, value)], partition=2))
                            expected[value] = 2
                        else:
                            ids.append(client.send(topic, value, partition=1))
                            expected[value] = 1
                    late = agent.send(topic, b"late", partition=PARTITIONS + 1)
                    assert {e.partition for e in [*ids, late]} == {-1}
                    create_topic(broker.bootstrap, topic, PARTITIONS)
                    wait_for(lambda: all(agent.delivery(e).state == "delivered" for e in ids))
                    # Pinned to a partition the topic does not have: moved, and waiting.
                    state = agent.delivery(late)
                    assert (state.state, state.partition) == ("pending", PARTITIONS + 1)
                    add_partitions(broker.bootstrap, topic, PARTITIONS + 2)
                    wait_for(lambda: agent.delivery(late).state == "delivered")
            finally:
                server.stop()
        records = read_topic(broker.bootstrap, topic, PARTITIONS + 2)
    finally:
        broker.stop()
    assert [v for _, _, v in records[PARTITIONS + 1]] == [b"late"]
    assert records[PARTITIONS] == []
    found = [(p, v) for p in range(PARTITIONS) for _, _, v in records[p]]
    assert sorted(v for _, v in found if v is not None) == sorted(expected)
    for p in range(PARTITIONS):
        values = [v for _, _, v in records[p] if v is not None]
        # Each partition holds its events in the order they were sent, whichever way.
        assert values == sorted(values)
        assert all(expected[v] in (p, None) for v in values)


def test_one_damaged_journal_record_does_not_take_the_records_after_it(tmp_path: Path) -> None:
    journal = MoveJournal(tmp_path, lambda fd: None)
    journal.plan(0, 3, 100, 2, [0, 1, 0])
    journal.placed(0, 0, 0, 0, 2)
    journal.plan(3, 6, 200, 2, [1, 1, 1])
    journal.placed(3, 1, 0, 0, 3)
    journal.close()
    path = tmp_path / "moves"
    size = path.stat().st_size
    data = bytearray(path.read_bytes())
    data[12] ^= 0x10  # in the first plan's payload
    path.write_bytes(bytes(data))
    journal = MoveJournal(tmp_path, lambda fd: None)
    try:
        # The first plan is lost (and its PLACED record with it); the second is whole.
        assert sorted(journal.plans) == [3]
        assert journal.plans[3].placed == {1: [(0, 0, 3)]}
        assert list(journal.plans[3].assign) == [1, 1, 1]
    finally:
        journal.close()
    assert path.stat().st_size == size  # nothing cut: the damage is not a torn tail
