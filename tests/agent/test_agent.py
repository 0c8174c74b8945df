"""The agent in-process and as a socket server, against a real `tidelog serve`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_helpers import add_partitions, create_topic, delete_topic, read_topic, wait_for
from interop_broker import BrokerProcess, free_port

from tidelog.agent import (
    Agent,
    AgentClient,
    AgentError,
    AgentServer,
    AsyncAgentClient,
    EventId,
    EventTooLargeError,
    QueueFullError,
)
from tidelog.agent.event import encode_body
from tidelog.agent.queue import CURSOR_SLOT, Cursor
from tidelog.client.partitioner import partition_for_key
from tidelog.protocol import ErrorCode

pytestmark = pytest.mark.slow


def test_in_process_delivery_offsets_and_key_partitioning(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    create_topic(broker.bootstrap, topic, 3)
    delivered: dict[EventId, int] = {}
    with Agent({"bootstrap.servers": broker.bootstrap, "data.dir": str(tmp_path / "a")}) as agent:
        ids = [
            agent.send(
                topic,
                b"value-%d" % i,
                key=b"key-%d" % (i % 11),
                headers=[("n", b"%d" % i)],
                on_delivery=lambda e, o: delivered.__setitem__(e, o),
            )
            for i in range(300)
        ]
        assert agent.flush(30)
        wait_for(lambda: len(delivered) == 300)
        records = read_topic(broker.bootstrap, topic, 3)
        by_value = {v: (p, off, k) for p, rs in records.items() for off, k, v in rs}
        assert sum(len(rs) for rs in records.values()) == 300
        # The first events arrive before the agent has the topic's metadata: they are parked
        # (partition -1) and moved; the rest go to their partition queue directly.
        assert ids[0].partition == -1
        for i, event in enumerate(ids):
            p, offset, key = by_value[b"value-%d" % i]
            assert key == b"key-%d" % (i % 11)
            assert p == partition_for_key(key, 3)
            assert event.partition in (-1, p)
            assert delivered[event] == offset
            assert agent.delivery(event) == ("delivered", offset, p)
        status = {(s["topic"], s["partition"]): s for s in agent.status()}
        assert sum(s["delivered"] for s in status.values()) == 300
        assert all(s["depth"] == 0 for s in status.values())


def test_the_agent_wide_callback_sees_every_event_and_no_callback_stops_delivery(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    """``Agent(on_delivery=...)`` runs for every delivered event, sent with a callback of
    its own or not, with the offset a consumer reads; a callback that raises, even
    SystemExit, is logged and delivery goes on."""
    topic = topic_name()
    create_topic(broker.bootstrap, topic, 1)
    seen: dict[EventId, int] = {}

    def hook(event: EventId, offset: int) -> None:
        seen[event] = offset
        if len(seen) == 1:
            raise SystemExit("the application's callback exits")

    def own(event: EventId, offset: int) -> None:
        raise SystemExit("so does this one")

    config = {"bootstrap.servers": broker.bootstrap, "data.dir": str(tmp_path / "a")}
    with Agent(config, on_delivery=hook) as agent:
        ids = [agent.send(topic, b"plain-%d" % i, partition=0) for i in range(20)]
        assert agent.flush(30)
        ids.append(agent.send(topic, b"own", partition=0, on_delivery=own))
        ids += agent.send_many(topic, [(None, b"many-%d" % i) for i in range(20)], partition=0)
        assert agent.flush(30)
        wait_for(lambda: len(seen) == len(ids))
    offsets = {v: off for off, _, v in read_topic(broker.bootstrap, topic, 1)[0]}
    values = [b"plain-%d" % i for i in range(20)] + [b"own"] + [b"many-%d" % i for i in range(20)]
    assert [seen[event] for event in ids] == [offsets[v] for v in values]


def test_keys_of_any_bytes_type_go_to_the_same_partition(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    create_topic(broker.bootstrap, topic, 3)
    with Agent({"bootstrap.servers": broker.bootstrap, "data.dir": str(tmp_path / "a")}) as agent:
        agent.refresh_topic_sync(topic)  # known: send_many hashes the keys itself
        keys = [b"key-%d" % i for i in range(12)]
        forms: list[bytes | bytearray | memoryview] = []
        for i, key in enumerate(keys):
            forms.append((bytes, bytearray, memoryview)[i % 3](key))
        many = agent.send_many(topic, [(key, b"v") for key in forms])  # type: ignore[misc]
        one = [agent.send(topic, b"v", key=key) for key in forms]  # type: ignore[arg-type]
        expected = [partition_for_key(key, 3) for key in keys]
        assert [e.partition for e in many] == [e.partition for e in one] == expected
        assert agent.flush(30)
    records = read_topic(broker.bootstrap, topic, 3)
    assert sorted(k for rs in records.values() for _, k, _ in rs) == sorted(keys * 2)


def test_null_keys_stick_to_one_partition_and_topics_are_auto_created(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()  # not created: the broker creates it on the agent's request
    with Agent({"bootstrap.servers": broker.bootstrap, "data.dir": str(tmp_path / "a")}) as agent:
        ids = [agent.send(topic, b"x%d" % i) for i in range(50)]
        assert agent.flush(30)
        count = agent.partition_count(topic)
        assert count is not None
        answers = [agent.delivery(e) for e in ids]
    assert {a.state for a in answers} == {"delivered"}
    [partition] = {a.partition for a in answers}
    records = read_topic(broker.bootstrap, topic, count)
    assert [v for _, _, v in records[partition]] == [b"x%d" % i for i in range(50)]
    assert [off for off, _, _ in records[partition]] == [a.offset for a in answers]


def test_partition_growth_is_picked_up(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    create_topic(broker.bootstrap, topic, 2)
    config = {
        "bootstrap.servers": broker.bootstrap,
        "data.dir": str(tmp_path / "a"),
        "metadata.max.age.ms": 200,
    }
    with Agent(config) as agent:
        agent.send(topic, b"first", key=b"k")
        wait_for(lambda: agent.partition_count(topic) == 2)
        add_partitions(broker.bootstrap, topic, 4)
        wait_for(lambda: agent.partition_count(topic) == 4)
        ids = [agent.send(topic, b"v%d" % i, key=b"key%d" % (i % 10)) for i in range(40)]
        assert {e.partition for e in ids} >= {2, 3}
        assert agent.flush(30)
    records = read_topic(broker.bootstrap, topic, 4)
    # Every event once, in the partition its key gives with 4 partitions (the new ones
    # included), each key's events in the order sent.
    assert sorted(v for rs in records.values() for _, _, v in rs) == sorted(
        [b"first"] + [b"v%d" % i for i in range(40)]
    )
    assert records[2] and records[3]
    by_key: dict[bytes, list[tuple[int, bytes]]] = {}
    for partition, got in records.items():
        for _, key, value in got:
            by_key.setdefault(key, []).append((partition, value))
    for k in range(10):
        key = b"key%d" % k
        expected = partition_for_key(key, 4)
        assert by_key[key] == [(expected, b"v%d" % i) for i in range(k, 40, 10)]


def test_a_topic_created_again_with_fewer_partitions_is_followed(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    """Kafka never shrinks a topic, but one deleted and created again (a new topic id) may
    have fewer partitions: keyed events hash over the new count instead of waiting forever
    for partitions that are gone. Here the agent's own metadata request re-creates it."""
    topic = topic_name()
    create_topic(broker.bootstrap, topic, 3)
    config = {"bootstrap.servers": broker.bootstrap, "data.dir": str(tmp_path / "a")}
    keys = [b"key-%d" % i for i in range(20)]
    with Agent(config) as agent:
        agent.refresh_topic_sync(topic)
        assert agent.partition_count(topic) == 3
        first = agent.send_many(topic, [(k, b"first") for k in keys])
        assert {e.partition for e in first} == {0, 1, 2}
        assert agent.flush(30)
        delete_topic(broker.bootstrap, topic)
        # The agent's own metadata request creates it again, with the broker's default
        # number of partitions (num.partitions=1).
        wait_for(lambda: agent.refresh_topic_sync(topic) is ErrorCode.NONE)
        wait_for(lambda: agent.partition_count(topic) == 1)
        again = agent.send_many(topic, [(k, b"again") for k in keys])
        assert {e.partition for e in again} == {0}
        assert agent.flush(30)
    records = read_topic(broker.bootstrap, topic, 1)
    assert [(k, v) for _, k, v in records[0]] == [(k, b"again") for k in keys]
    # A restart keeps the new count (and id): no stale broker can raise it back.
    saved = json.loads((tmp_path / "a" / "topics.json").read_text())[topic]
    assert saved["count"] == 1 and saved["id"]
    with Agent(config) as agent:
        assert agent.partition_count(topic) == 1


def test_a_topic_name_the_cluster_refuses_is_shown_in_the_status(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    """A legal name the cluster still refuses (it collides with an existing topic's name
    once '.' and '_' are swapped): its events stay parked, and the status says why."""
    taken = topic_name().replace("-", "_") + "_x"
    create_topic(broker.bootstrap, taken, 1)
    refused = taken.replace("_", ".")
    config = {"bootstrap.servers": broker.bootstrap, "data.dir": str(tmp_path / "a")}
    with Agent(config) as agent:
        event = agent.send(refused, b"v")
        assert event.partition == -1

        def parked_error() -> str:
            (row,) = [s for s in agent.status() if s["topic"] == refused]
            return str(row["last_error"])

        wait_for(lambda: parked_error() == "the cluster refuses the topic: INVALID_TOPIC_EXCEPTION")
        assert agent.delivery(event).state == "pending"


def test_a_cluster_out_of_reach_is_shown_in_the_status_of_parked_events(tmp_path: Path) -> None:
    """Not "the cluster does not know the topic yet": nobody could be asked."""
    dead = f"127.0.0.1:{free_port()}"
    config = {"bootstrap.servers": dead, "data.dir": str(tmp_path / "a"), "retry.backoff.ms": 20}
    with Agent(config) as agent:
        assert agent.send("unseen", b"v").partition == -1

        def parked_error() -> str:
            (row,) = agent.status()
            return str(row["last_error"])

        wait_for(lambda: parked_error().startswith("cannot reach the cluster: "))
        assert dead in parked_error()


def test_resend_after_a_lost_cursor_is_recognised(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    """A crash after the broker's ack but before the read position was persisted: the
    restarted sender must find, through DescribeProducers, that the broker has the events."""
    topic = topic_name()
    create_topic(broker.bootstrap, topic, 1)
    config = {"bootstrap.servers": broker.bootstrap, "data.dir": str(tmp_path / "a")}
    with Agent(config) as agent:
        for chunk in range(10):
            agent.send_many(topic, [(None, b"e%d" % (chunk * 20 + i)) for i in range(20)])
        assert agent.flush(30)
        [row] = [s for s in agent.status() if s["partition"] == 0]
        producer_id = row["producer_id"]
    cursor_path = tmp_path / "a" / "queues" / f"{topic}-0" / "cursor"
    raw = cursor_path.read_bytes()
    slots = [Cursor.unpack(raw[i * CURSOR_SLOT : (i + 1) * CURSOR_SLOT]) for i in range(2)]
    newest = max((c for c in slots if c is not None), key=lambda c: c.generation)
    # Back to "nothing acknowledged", same producer: as if no cursor write had reached disk.
    stale = Cursor(newest.generation + 1, 0, 0, 0, 0, 0, producer_id, 0)
    data = bytearray(raw)
    slot = (stale.generation % 2) * CURSOR_SLOT
    data[slot : slot + CURSOR_SLOT] = stale.pack()
    cursor_path.write_bytes(bytes(data))
    with Agent(config) as agent:
        assert agent.flush(30)
        [status] = [s for s in agent.status() if s["partition"] == 0]
        assert status["duplicates_avoided"] == 200
        assert status["producer_id"] == producer_id
        agent.send(topic, b"after")
        assert agent.flush(30)
    records = read_topic(broker.bootstrap, topic, 1)
    assert [v for _, _, v in records[0]] == [b"e%d" % i for i in range(200)] + [b"after"]


def test_full_queue_policies_without_a_cluster(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    base = {"bootstrap.servers": dead, "queue.max.bytes": 4096, "retry.backoff.ms": 50}
    with Agent({**base, "data.dir": str(tmp_path / "r"), "queue.full.policy": "reject"}) as agent:
        with pytest.raises(QueueFullError):
            for _ in range(1000):
                agent.send("t", b"x" * 100, partition=0)
        assert agent.status()[0]["depth"] > 0
        with pytest.raises(EventTooLargeError, match=r"max\.request\.size"):
            agent.send("t", b"x" * 2_000_000, partition=0)
    config = {**base, "data.dir": str(tmp_path / "d"), "queue.full.policy": "drop-oldest"}
    with Agent(config) as agent:
        ids = [agent.send("t", b"%05d" % i + b"x" * 95, partition=0) for i in range(1000)]
        assert [e.number for e in ids] == list(range(1000))
        [status] = agent.status()
        assert status["dropped"] > 0
        assert status["depth"] + status["dropped"] == 1000
        assert agent.delivery(ids[0]).state == "dropped"
        assert agent.delivery(ids[-1]).state == "pending"


def test_drops_forget_callbacks_and_never_trouble_a_query(tmp_path: Path) -> None:
    """With the cluster down, drop-oldest drops on the sending threads: the callbacks of
    the dropped events (never to run) are let go, of a partition queue's and of a parked
    queue's events alike, and queries running meanwhile always answer."""
    config = {
        "bootstrap.servers": f"127.0.0.1:{free_port()}",
        "data.dir": str(tmp_path / "a"),
        "queue.full.policy": "drop-oldest",
        "queue.max.bytes": 16384,
        "queue.segment.bytes": 4096,
    }
    with Agent(config) as agent:
        stop = threading.Event()
        errors: list[BaseException] = []

        def send(topic: str, partition: int | None) -> None:
            try:
                while not stop.is_set():
                    agent.send(topic, b"x" * 500, partition=partition, on_delivery=print)
            except BaseException as exc:
                errors.append(exc)

        senders = [
            threading.Thread(target=send, args=("direct", 0)),
            threading.Thread(target=send, args=("parked", None)),
        ]
        for thread in senders:
            thread.start()
        answers = 0
        deadline = time.monotonic() + 3
        try:
            while time.monotonic() < deadline:
                for event in (("direct", 0, 10**9), ("parked", -1, 10**9), ("direct", 0, 0)):
                    agent.delivery(event)
                    answers += 1
        finally:
            stop.set()
            for thread in senders:
                thread.join()
        assert not errors and answers > 100
        rows = {row["topic"]: row for row in agent.status()}
        assert rows["direct"]["dropped"] > 100 and rows["parked"]["dropped"] > 100
        direct = agent.sender_callbacks("direct", 0)
        parked = agent._parked["parked"].callbacks
        assert direct is not None
        for held, row in ((direct, rows["direct"]), (parked, rows["parked"])):
            # Only the undelivered events' callbacks are held.
            assert len(held) == row["depth"] > 0


def test_socket_round_trip_sync_async_and_status(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    create_topic(broker.bootstrap, topic, 2)
    sock = tmp_path / "agent.sock"
    agent = Agent({"bootstrap.servers": broker.bootstrap, "data.dir": str(tmp_path / "a")})
    # Metadata first, so that no event is parked: the ids below are partition queue ids.
    agent.refresh_topic_sync(topic)
    assert agent.partition_count(topic) == 2
    server = AgentServer(agent, sock)
    server.start()
    try:
        with AgentClient(sock) as client:
            first = client.send(topic, b"one", key=b"a", headers=[("h", None)])
            assert first.partition == partition_for_key(b"a", 2)
            many = client.send_many(topic, [(b"a", b"v%d" % i) for i in range(500)])
            assert [e.number for e in many] == list(range(first.number + 1, first.number + 501))

            async def async_sends() -> tuple[list[EventId], list[EventId]]:
                aclient = await AsyncAgentClient.connect(sock)
                try:
                    sent = await asyncio.gather(
                        *(aclient.send(topic, b"async%d" % i, key=b"b") for i in range(100))
                    )
                    sent_many = await aclient.send_many(
                        topic, [(b"c", b"amany%d" % i) for i in range(300)]
                    )
                    return list(sent), sent_many
                finally:
                    await aclient.close()

            async_ids, async_many = asyncio.run(async_sends())
            assert len({e.number for e in async_ids}) == 100
            # One call's events: the key's partition, numbered one after the other.
            assert {e.partition for e in async_many} == {partition_for_key(b"c", 2)}
            numbers = [e.number for e in async_many]
            assert numbers == list(range(numbers[0], numbers[0] + 300))
            wait_for(lambda: client.delivery(many[-1]).state == "delivered")
            wait_for(lambda: client.delivery(async_ids[-1]).state == "delivered")
            wait_for(lambda: client.delivery(async_many[-1]).state == "delivered")
            assert client.delivery(first).offset == 0
            with pytest.raises(Exception, match="refused"):
                client._request(1, b"\x00\x01t\x00\x00\x00\x00garbage").result(10)
            # The counters follow the persisted read position (which the queries read)
            # once the sender's loop resumes after the commit: an instant later.
            wait_for(lambda: sum(q["delivered"] for q in client.status()["queues"]) == 901)
        out = subprocess.run(
            [sys.executable, "-m", "tidelog", "agent", "status", "--socket", str(sock)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        header, *rows = out.splitlines()
        assert header.split()[:3] == ["TOPIC", "PARTITION", "DEPTH"]
        disk = header.index("DISK")  # columns are aligned; empty cells are blank
        mine = [row[disk:].split()[0] for row in rows if row.startswith(topic)]
        assert mine and set(mine) == {"ok"}
    finally:
        server.stop()
        agent.close()
    records = read_topic(broker.bootstrap, topic, 2)
    values = [v for rs in records.values() for _, _, v in rs]
    assert len(values) == len(set(values)) == 901
    # The asyncio send_many's events in the order of the call, at their partition.
    [async_partition] = {e.partition for e in async_many}
    assert [v for _, _, v in records[async_partition] if v.startswith(b"amany")] == [
        b"amany%d" % i for i in range(300)
    ]


def test_offsets_and_ages_survive_a_restart(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    create_topic(broker.bootstrap, topic, 2)
    config = {"bootstrap.servers": broker.bootstrap, "data.dir": str(tmp_path / "a")}
    offsets: dict[EventId, int] = {}
    with Agent(config) as agent:
        agent.refresh_topic_sync(topic)
        ids = agent.send_many(topic, [(b"k%d" % (i % 5), b"v%d" % i) for i in range(400)])
        assert agent.flush(30)
        for event in ids:
            state, offset, partition = agent.delivery(event)
            assert state == "delivered" and offset >= 0 and partition == event.partition
            offsets[event] = offset
    records = read_topic(broker.bootstrap, topic, 2)
    by_value = {v: (p, off) for p, rs in records.items() for off, _, v in rs}
    sock = tmp_path / "agent.sock"
    agent = Agent(config)
    server = AgentServer(agent, sock)
    server.start()
    try:
        with AgentClient(sock) as client:
            for i, event in enumerate(ids):
                expected = ("delivered", offsets[event], event.partition)
                assert agent.delivery(event) == expected
                assert client.delivery(event) == expected
                assert by_value[b"v%d" % i] == (event.partition, offsets[event])
    finally:
        server.stop()
        agent.close()


def test_age_of_the_oldest_event_survives_a_restart(tmp_path: Path) -> None:
    config = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(tmp_path / "a")}
    hour_ago = int(time.time() * 1000) - 3_600_000
    with Agent(config) as agent:
        agent.send("t", b"old", partition=0, timestamp=hour_ago)
        agent.send("t", b"new", partition=1)
        time.sleep(1.1)
        [row0, row1] = agent.status()
        assert row0["oldest_age_s"] >= 1.0 and row1["oldest_age_s"] >= 1.0
    with Agent(config) as agent:
        [row0, row1] = agent.status()
        # From the entries: their timestamp (capped by when the segment was last written),
        # so an event with a timestamp set an hour back counts as an hour old.
        assert row0["depth"] == row1["depth"] == 1
        assert row0["oldest_age_s"] >= 3600
        assert 1.0 <= row1["oldest_age_s"] < 3600


def test_a_waiting_sender_is_woken_and_a_busy_one_left_alone(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    """Bursts from 4 threads with pauses between them, so that the sender goes idle again
    and again: every burst is delivered (no wake-up is lost), and the event loop was woken
    fewer times than the queue synced (syncs while the sender was busy woke nobody)."""
    import threading

    topic = topic_name()
    create_topic(broker.bootstrap, topic, 1)
    with Agent({"bootstrap.servers": broker.bootstrap, "data.dir": str(tmp_path / "a")}) as agent:
        agent.send(topic, b"first", partition=0)
        assert agent.flush(30)
        (sender,) = agent._senders.values()
        wakes = 0
        real_wake = sender.wake

        def counted_wake() -> None:
            nonlocal wakes
            wakes += 1
            real_wake()

        sender.wake = counted_wake  # type: ignore[method-assign]
        queue = sender.queue
        syncs_before = queue.fsyncs
        for burst in range(20):

            def send_some(thread: int, burst: int = burst) -> None:
                for i in range(10):
                    agent.send(topic, b"%d-%d-%d" % (burst, thread, i), partition=0)

            threads = [threading.Thread(target=send_some, args=(t,)) for t in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            deadline = time.monotonic() + 30
            while queue.depth() > 0:
                assert time.monotonic() < deadline, f"burst {burst} was not delivered"
                time.sleep(0.005)
            time.sleep(0.02)  # the sender waits for entries again
        syncs = queue.fsyncs - syncs_before
        assert 0 < wakes < syncs
        records = read_topic(broker.bootstrap, topic, 1)
        assert len(records[0]) == 1 + 20 * 4 * 10


def test_explicit_partitions_are_checked_and_never_set_the_partition_count(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    config = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(data)}
    with Agent(config) as agent:
        for bad in (-1, -7, True, 2**31, "0", 1.0):
            with pytest.raises(AgentError, match="partition must be an integer"):
                agent.send("t", b"x", partition=bad)  # type: ignore[arg-type]
            with pytest.raises(AgentError, match="partition must be an integer"):
                agent.send_many("t", [(None, b"x")], partition=bad)  # type: ignore[arg-type]
        # Queue directories are named after topics: no other name reaches the file system.
        for topic in ("../../outside", "a/b", "", "..", "x" * 250, "caf\u00e9"):
            for partition in (0, None):
                with pytest.raises(AgentError, match="not a valid topic name"):
                    agent.send(topic, b"x", partition=partition)
        assert not list((data / "queues").iterdir())
        assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
        # An explicit partition of a topic the cluster has not described yet is queued...
        assert agent.send("fresh", b"p", partition=5) == EventId("fresh", 5, 0)
        # ...without making up a partition count: keyed events wait, parked, for the real
        # one instead of being hashed over six partitions the topic may not have.
        assert agent.partition_count("fresh") is None
        assert agent.send("fresh", b"k", key=b"key").partition == -1
        # From now on the explicit partition is parked too (pinned), behind that event.
        assert agent.send("fresh", b"q", partition=5).partition == -1
        assert agent.partition_count("fresh") is None
        # Parked or not, pinned or not, an event must fit max.request.size (the record body:
        # it has to fit in the partition queue it moves to).
        limit = 1_048_576  # max.request.size's default
        fits = b"v" * (limit - len(encode_body(None, b"", None, 0)))
        for partition in (None, 5):
            assert agent.send("fresh", fits, partition=partition).partition == -1
            with pytest.raises(EventTooLargeError, match=f"larger than {limit} bytes"):
                agent.send("fresh", fits + b"12345", partition=partition)
            with pytest.raises(EventTooLargeError):
                agent.send_many("fresh", [(None, fits + b"1")], partition=partition)
    # A known count (as metadata left it in topics.json) is not raised by a partition past it;
    # what metadata could not have written there is ignored.
    (data / "topics.json").write_text('{"known": 3, "../up": 2, "neg": -1, "bool": true}')
    with Agent(config) as agent:
        assert agent.send("known", b"p", partition=7).partition == 7
        assert agent.partition_count("known") == 3
        assert [agent.partition_count(t) for t in ("../up", "neg", "bool")] == [None] * 3
        for key in (b"a", b"b", b"c", b"d", b"e"):
            event = agent.send("known", b"v", key=key)
            assert event.partition == partition_for_key(key, 3)


def test_the_socket_client_checks_partitions_and_the_server_refuses_bad_ones(
    tmp_path: Path,
) -> None:
    config = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(tmp_path / "d")}
    with Agent(config) as agent:
        server = AgentServer(agent, tmp_path / "agent.sock")
        server.start()
        try:
            with AgentClient(tmp_path / "agent.sock") as client:
                for bad in (-1, 2**31, False):
                    with pytest.raises(AgentError, match="partition must be an integer"):
                        client.send("t", b"x", partition=bad)
                    with pytest.raises(AgentError, match="partition must be an integer"):
                        client.send_many("t", [(None, b"x")], partition=bad)
                ids = client.send_many("t", [(None, b"a"), (b"k", b"b")], partition=2)
                assert ids == [EventId("t", 2, 0), EventId("t", 2, 1)]
        finally:
            server.stop()


def test_events_the_topic_refuses_are_skipped_and_the_rest_delivered(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    """A topic that takes CreateTimes within an hour of now (Kafka's
    message.timestamp.before/after.max.ms): events outside can never be delivered as they are.
    They are skipped (rejected, answering "dropped"); the others arrive once, in order."""
    topic = topic_name()
    hour = 3_600_000
    create_topic(
        broker.bootstrap,
        topic,
        1,
        {"message.timestamp.before.max.ms": str(hour), "message.timestamp.after.max.ms": str(hour)},
    )
    now = int(time.time() * 1000)
    # Too new anywhere in a batch, and too old at its start (where the broker looks first).
    shifts = [-2 * hour, 0, 0, 2 * hour, 2 * hour, 0, 0, 2 * hour] + [0] * 20
    delivered: dict[EventId, int] = {}
    config = {"bootstrap.servers": broker.bootstrap, "data.dir": str(tmp_path / "a")}
    with Agent(config) as agent:
        agent.send(topic, b"first", partition=0)
        assert agent.flush(30)
        ids = []
        for i, shift in enumerate(shifts):
            ids.append(
                agent.send(
                    topic,
                    b"e%d" % i,
                    partition=0,
                    timestamp=now + shift,
                    on_delivery=lambda e, o: delivered.__setitem__(e, o),
                )
            )
            if i == 0:
                assert agent.flush(30)
        assert agent.flush(30)
        [status] = agent.status()
        assert status["rejected"] == 4 and status["depth"] == 0
        good = [i for i, shift in enumerate(shifts) if shift == 0]
        wait_for(lambda: len(delivered) == len(good))
        for i, event in enumerate(ids):
            state = agent.delivery(event)
            assert state.state == ("delivered" if i in good else "dropped"), i
            assert (event in delivered) == (i in good)
    records = read_topic(broker.bootstrap, topic, 1)
    assert [v for _, _, v in records[0]] == [b"first"] + [b"e%d" % i for i in good]


def test_send_many_stores_nothing_when_a_queue_cannot_be_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call whose events go to two partitions, one of whose queues the full disk does not
    let the agent create: the call fails with QueueFullError and stores nothing, so that a
    caller who retries stores nothing twice."""
    import errno
    import json

    from tidelog.agent import agent as agent_module

    (tmp_path / "topics.json").write_text(json.dumps({"t": 2}))
    keys: dict[int, bytes] = {}
    for k in range(100):
        keys.setdefault(partition_for_key(b"k%d" % k, 2), b"k%d" % k)
    real_open = agent_module.DiskQueue.open

    def open_(directory: Path, **options: object) -> object:
        if directory.name == "t-1":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(directory, **options)

    monkeypatch.setattr(agent_module.DiskQueue, "open", open_)
    config = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(tmp_path)}
    with Agent(config) as agent:
        with pytest.raises(QueueFullError, match="t-1 cannot be created: the disk is full"):
            agent.send_many("t", [(keys[0], b"to-0"), (keys[1], b"to-1")])
        assert agent.queue_for("t", 0).depth() == 0
