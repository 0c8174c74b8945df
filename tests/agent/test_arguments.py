"""What a wrong argument to a send, or a data directory that cannot be one, gets: one clear
error, and nothing stored."""

from __future__ import annotations

import fcntl
import os
import re
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from interop_broker import free_port

from tidelog.agent import Agent, AgentClient, AgentServer, EventId
from tidelog.agent.errors import AgentClosedError, AgentError, EventFormatError
from tidelog.agent.event import decode_body, encode_bodies, encode_body
from tidelog.client.errors import ConfigError

WRONG: list[tuple[dict[str, Any], str]] = [
    ({"value": "text"}, "value must be bytes or None, not str"),
    ({"value": b"v", "key": "k"}, "key must be bytes or None, not str"),
    ({"value": b"v", "key": 7}, "key must be bytes or None, not int"),
    ({"value": b"v", "headers": [("h", "text")]}, "header 'h' must have a bytes value"),
    ({"value": b"v", "headers": [(b"h", b"x")]}, "header name must be a str, not bytes"),
    ({"value": b"v", "headers": [("h",)]}, r"header must be a \(name, value\) pair"),
    ({"value": b"v", "headers": {"h": b"x"}}, "headers must be a list"),
    ({"value": b"v", "headers": [("h" * 65536, b"x")]}, "longer than 65535 bytes"),
    ({"value": b"v", "timestamp": -1}, "timestamp must be epoch milliseconds from 0"),
    ({"value": b"v", "timestamp": 1 << 63}, "timestamp must be epoch milliseconds from 0"),
    ({"value": b"v", "timestamp": 1.5}, "timestamp must be epoch milliseconds from 0"),
]


def test_wrong_arguments_are_refused_with_a_clear_error(tmp_path: Path) -> None:
    config = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(tmp_path)}
    with Agent(config) as agent:
        for arguments, message in WRONG:
            with pytest.raises(EventFormatError, match=message):
                agent.send("t", partition=0, **arguments)
        with pytest.raises(EventFormatError, match="event 1: key must be bytes"):
            agent.send_many("t", [(None, b"ok"), ("k", b"v")], partition=0)
        with pytest.raises(EventFormatError, match=r"event 0: expected a \(key, value\) pair"):
            agent.send_many("t", [(b"k",)], partition=0)  # type: ignore[list-item]
        # Nothing of the refused calls was stored; what is right still goes.
        assert agent.send("t", bytearray(b"v"), partition=0).number == 0
        assert agent.send("t", None, key=memoryview(b"k"), partition=0).number == 1
        assert agent.status()[0]["depth"] == 2


def test_right_arguments_encode_as_before() -> None:
    body = encode_body(b"k", bytearray(b"v"), [("h", None), ("\u00e9", b"x")], 0)
    assert decode_body(body) == (0, b"k", b"v", [("h", None), ("\u00e9", b"x")])
    assert encode_bodies([(None, b"v"), (b"k", None)], 5) == [
        encode_body(None, b"v", None, 5),
        encode_body(b"k", None, None, 5),
    ]


def test_a_partition_whose_queue_name_is_too_long_is_refused_even_when_parked(
    tmp_path: Path,
) -> None:
    topic = "t" * 249  # the longest legal name: "<topic>-<partition>" may pass 255 bytes
    config = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(tmp_path)}
    with Agent(config) as agent:
        parked = agent.send(topic, b"v")  # unknown topic: parked
        assert parked.partition == -1
        for send in (
            lambda: agent.send(topic, b"v", partition=123456),
            lambda: agent.send_many(topic, [(None, b"v")], partition=123456),
        ):
            with pytest.raises(AgentError, match="directory name would be longer than 255"):
                send()
        assert agent.send(topic, b"v", partition=12).partition == -1  # fits: parked, pinned
        (row,) = agent.status()
        assert row["depth"] == 2


def test_a_data_dir_that_cannot_be_one_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    for data_dir in (tmp_path / "file", tmp_path / "file" / "below"):
        config = {"bootstrap.servers": "127.0.0.1:1", "data.dir": str(data_dir)}
        with pytest.raises(ConfigError, match=r"data\.dir: cannot use .*Not a directory"):
            Agent(config)
    assert (tmp_path / "file").read_bytes() == b"x"


BAD_CONFIG: list[tuple[dict[str, Any], str]] = [
    ({"data.dir": None}, "data.dir: expected a directory path, got None"),
    ({"data.dir": False}, "data.dir: expected a directory path, got False"),
    ({"data.dir": 0}, "data.dir: expected a directory path, got 0"),
    ({"queue.max.bytes": True}, "queue.max.bytes: expected an integer, got True"),
    ({"queue.max.bytes": 1.9}, "queue.max.bytes: expected an integer, got 1.9"),
    ({"queue.segment.bytes": 2.5}, "queue.segment.bytes: expected an integer, got 2.5"),
    ({"acks": 1}, "acks: the agent delivers with acks=all only, got 1"),
    ({"acks": "0"}, "acks: the agent delivers with acks=all only, got '0'"),
    ({"enable.idempotence": "false"}, "enable.idempotence: the agent's producer is always"),
    ({"partitioner.class": lambda *_: 3}, "partitioner.class: not supported by the agent"),
    ({"key.serializer": str.encode}, "key.serializer: not supported by the agent"),
]


@pytest.mark.parametrize(
    ("wrong", "message"),
    BAD_CONFIG,
    ids=[f"{i}-{next(iter(w))}" for i, (w, _) in enumerate(BAD_CONFIG)],
)
def test_config_the_agent_cannot_honour_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wrong: dict[str, Any], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    config = {"bootstrap.servers": "127.0.0.1:1", "data.dir": str(tmp_path / "d"), **wrong}
    with pytest.raises(ConfigError, match=re.escape(message)):
        Agent(config)
    assert list(tmp_path.iterdir()) == []  # no directory made, not even one named "None"


def test_producer_config_the_agent_does_not_use_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = {
        "bootstrap.servers": "127.0.0.1:1",
        "data.dir": str(tmp_path),
        "acks": "all",
        "delivery.timeout.ms": 5000,
        "max.block.ms": "0",
    }
    with caplog.at_level("WARNING", logger="tidelog.agent"), Agent(config) as agent:
        assert agent.send("t", b"v", partition=0).number == 0
    warned = [
        r.getMessage() for r in caplog.records if "is not used by the agent" in r.getMessage()
    ]
    assert warned == [
        "delivery.timeout.ms is not used by the agent: events are retried until delivered",
        "max.block.ms is not used by the agent: queue.full.policy decides what a send does when "
        "the queue is full",
    ]


def test_the_socket_path_replaces_only_a_stale_socket(tmp_path: Path) -> None:
    config = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(tmp_path / "d")}
    with Agent(config) as agent:
        # A file given as the socket path by mistake is refused and kept.
        mistaken = tmp_path / "orders.log"
        mistaken.write_bytes(b"precious")
        server = AgentServer(agent, mistaken)
        with pytest.raises(AgentError, match="exists and is not a socket"):
            server.start()
        server.stop()
        assert mistaken.read_bytes() == b"precious"
        # A socket left by a daemon that is gone is replaced.
        path = tmp_path / "agent.sock"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as left:
            left.bind(str(path))
        first = AgentServer(agent, path)
        first.start()
        try:
            # The socket of a daemon still serving is not taken over.
            second = AgentServer(agent, path)
            with pytest.raises(AgentError, match="another agent serves"):
                second.start()
            second.stop()
            with AgentClient(path) as client:
                assert client.send("t", b"v", partition=0).number == 0
        finally:
            first.stop()
        assert not path.exists()
        with pytest.raises(AgentError, match=r"cannot listen on .*: No such file"):
            AgentServer(agent, tmp_path / "missing" / "agent.sock").start()


def test_a_socket_path_is_owned_by_one_server_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as left:
        left.bind(str(path))  # stale: nobody listens
    agents = [
        Agent({"bootstrap.servers": "127.0.0.1:1", "data.dir": str(tmp_path / f"d{i}")})
        for i in range(6)
    ]
    try:
        # A daemon that owns the path but has not bound its socket yet (the moment two
        # daemons started together both used to find the socket stale): the path is not
        # taken from it, and the socket it is about to replace is left alone.
        owner = AgentServer(agents[0], path)
        with owner.lock_path.open("a") as held:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with pytest.raises(AgentError, match="another agent serves"):
                owner.start()
        assert stat.S_ISSOCK(os.lstat(path).st_mode)

        # Servers of different agents started at the same moment: exactly one serves.
        servers = [AgentServer(agent, path) for agent in agents]
        gate = threading.Barrier(len(servers))
        outcomes: list[str] = [""] * len(servers)

        def start(index: int) -> None:
            gate.wait()
            try:
                servers[index].start()
                outcomes[index] = "serving"
            except AgentError as exc:
                outcomes[index] = str(exc)

        threads = [threading.Thread(target=start, args=(i,)) for i in range(len(servers))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        winners = [i for i, outcome in enumerate(outcomes) if outcome == "serving"]
        assert len(winners) == 1, outcomes
        assert all("another agent serves" in o for o in outcomes if o != "serving")
        with AgentClient(path) as client:
            assert client.send("t", b"v", partition=0).number == 0
        assert agents[winners[0]].status()[0]["depth"] == 1
        for server in servers:
            server.stop()
        assert not path.exists() and not servers[0].lock_path.exists()
        # Once it stopped, the path is free for the next one.
        again = AgentServer(agents[1], path)
        again.start()
        again.stop()
    finally:
        for agent in agents:
            agent.close()


def test_status_says_why_no_agent_answers(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as left:
        left.bind(str(stale))
    (tmp_path / "file").write_bytes(b"x")
    cases = {
        stale: "no agent serves this socket (left by an agent that stopped)",
        tmp_path / "file": "not a socket",
        tmp_path / "missing.sock": "no such socket (is `tidelog agent` running?)",
    }
    for path, why in cases.items():
        done = subprocess.run(
            [sys.executable, "-m", "tidelog", "agent", "status", "--socket", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr == f"tidelog agent: cannot connect to the agent at {path}: {why}\n"
        with pytest.raises(AgentClosedError, match=re.escape(why)):
            AgentClient(path)


def test_delivery_queries_take_ids_in_any_form_and_refuse_impossible_ones(tmp_path: Path) -> None:
    config = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(tmp_path / "d")}
    with Agent(config) as agent:
        event = agent.send("t", b"v", partition=0)
        server = AgentServer(agent, tmp_path / "agent.sock")
        server.start()
        try:
            with AgentClient(tmp_path / "agent.sock") as client:
                for delivery in (agent.delivery, client.delivery):
                    for form in (event, ("t", 0, 0), "t/0/0"):
                        assert delivery(form) == ("pending", -1, 0)  # type: ignore[arg-type]
                    assert delivery("t/0/1").state == "unknown"
                    assert delivery(EventId("t", -1, 0)).state == "unknown"  # nothing parked
                    for wrong in (
                        EventId("t", 0, -1),
                        EventId("t", -2, 0),
                        EventId("t", 2**31, 0),
                        EventId("t", 0, 2**64),
                        "t/0/-1",
                        "t/0",
                        # int() takes these; they are not the text of any id.
                        "t/0/1_0",
                        "t/+0/0",
                        "t/-0/0",
                        "t/00/0",
                        "t/0/00",
                        "t/0/\u0660",
                        "t/0/0\n",
                        "a/t/0/0",
                        ("t", 0),
                        42,
                    ):
                        with pytest.raises(AgentError, match="is not an event id"):
                            delivery(wrong)  # type: ignore[arg-type]
        finally:
            server.stop()


def test_a_config_file_that_is_not_text_is_named_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "agent.properties"
    config.write_bytes(b"batch.size=1000\nlinger.ms=\xff\n")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "tidelog", "agent", "--config", str(config)),
            *("--socket", str(tmp_path / "agent.sock")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"tidelog agent: {config}: not UTF-8 text (byte 26)\n"
