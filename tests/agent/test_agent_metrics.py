"""The agent's ``metrics.listener``: its figures against what really happened, and its
``/health`` and ``/ready``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import create_topic, read_topic, wait_for
from interop_broker import BrokerProcess, free_port
from interop_metrics import http_get, scrape, value

from tidelog.agent import Agent, AgentClient
from tidelog.agent.metrics import AgentMetricsServer
from tidelog.client.errors import ConfigError

_LISTEN_ANYWHERE = "http://127.0.0.1:0"


def _figure(port: int, name: str, topic: str, partition: int) -> float | None:
    return value(scrape(port), name, topic=topic, partition=str(partition))


def test_delivered_events_are_counted_per_partition(
    broker: BrokerProcess, tmp_path: Path, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    create_topic(broker.bootstrap, topic, 2)
    config = {
        "bootstrap.servers": broker.bootstrap,
        "data.dir": str(tmp_path / "a"),
        "metrics.listener": _LISTEN_ANYWHERE,
    }
    with Agent(config) as agent:
        assert agent.metrics_server is not None
        port = agent.metrics_server.port
        for i in range(150):
            agent.send(topic, b"event-%d" % i, partition=i % 2)
        assert agent.flush(30)
        records = read_topic(broker.bootstrap, topic, 2)
        assert [len(records[p]) for p in (0, 1)] == [75, 75]
        sample = scrape(port)
        for partition in (0, 1):
            labels = {"topic": topic, "partition": str(partition)}
            assert value(sample, "tidelog_agent_events_appended_total", **labels) == 75
            assert value(sample, "tidelog_agent_events_delivered_total", **labels) == 75
            assert value(sample, "tidelog_agent_queue_depth_events", **labels) == 0
            assert value(sample, "tidelog_agent_events_in_flight", **labels) == 0
            assert value(sample, "tidelog_agent_events_in_doubt", **labels) == 0
            assert value(sample, "tidelog_agent_events_dropped_total", **labels) == 0
            assert value(sample, "tidelog_agent_oldest_event_age_seconds", **labels) == 0
        assert http_get(port, "/health") == (200, "up\n")
        assert http_get(port, "/ready") == (200, "ready\n")
        assert http_get(port, "/nope")[0] == 404
        assert http_get(port, "/metrics", method="POST")[0] == 405
    # Closed with the agent: nothing listens any more.
    with pytest.raises(OSError):
        http_get(port, "/health")


def test_events_held_for_an_unreachable_cluster_show_as_depth_and_age(tmp_path: Path) -> None:
    config = {
        "bootstrap.servers": f"127.0.0.1:{free_port()}",
        "data.dir": str(tmp_path / "a"),
        "retry.backoff.ms": 50,
        "metrics.listener": _LISTEN_ANYWHERE,
    }
    with Agent(config) as agent:
        assert agent.metrics_server is not None
        port = agent.metrics_server.port
        for i in range(40):
            agent.send("held", b"event-%d" % i, partition=3)
        assert _figure(port, "tidelog_agent_queue_depth_events", "held", 3) == 40
        assert _figure(port, "tidelog_agent_events_delivered_total", "held", 3) == 0
        # The age grows while nothing is delivered: the figure an alert on a stuck agent uses.
        wait_for(
            lambda: (_figure(port, "tidelog_agent_oldest_event_age_seconds", "held", 3) or 0) > 0.2
        )
        # Waiting for a cluster is the agent's job, not a failure: it stays ready.
        assert http_get(port, "/ready") == (200, "ready\n")


def test_a_bad_or_busy_metrics_listener_is_refused_and_frees_the_directory(
    tmp_path: Path,
) -> None:
    base = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(tmp_path / "a")}
    with pytest.raises(ConfigError, match=r"metrics\.listener: expected http://host:port"):
        Agent({**base, "metrics.listener": "127.0.0.1:9000"})
    with Agent({**base, "metrics.listener": _LISTEN_ANYWHERE}) as first:
        assert first.metrics_server is not None
        busy = first.metrics_server.port
        other = {
            **base,
            "data.dir": str(tmp_path / "b"),
            "metrics.listener": f"http://127.0.0.1:{busy}",
        }
        with pytest.raises(ConfigError, match=r"metrics\.listener: cannot listen on 127\.0\.0\.1"):
            Agent(other)
    # The refused agent released its directory lock: the same directory opens at once.
    with Agent({**other, "metrics.listener": ""}) as again:
        assert again.metrics_server is None


def test_ready_names_the_queues_whose_disk_is_full() -> None:
    queues: list[dict[str, Any]] = [
        {"topic": "a", "partition": 0, "disk_full": False},
        {"topic": "b", "partition": 2, "disk_full": True},
    ]

    async def main() -> tuple[tuple[int, str], tuple[int, str]]:
        server = AgentMetricsServer(lambda: queues, "127.0.0.1", 0)
        await server.start()
        try:
            full = await asyncio.to_thread(http_get, server.port, "/ready")
            queues[1]["disk_full"] = False
            freed = await asyncio.to_thread(http_get, server.port, "/ready")
        finally:
            await server.stop()
        return full, freed

    full, freed = asyncio.run(main())
    assert full == (503, "not ready: queue disk full: b-2\n")
    assert freed == (200, "ready\n")


def test_the_daemon_serves_metrics_and_logs_json_lines(tmp_path: Path) -> None:
    port = free_port()
    sock = tmp_path / "agent.sock"
    daemon = subprocess.Popen(
        [
            *(sys.executable, "-m", "tidelog", "agent", "--socket", str(sock)),
            *("--bootstrap-server", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "d")),
            *("--log-format", "json", "--property", f"metrics.listener=http://127.0.0.1:{port}"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def serving() -> bool:
            try:
                return http_get(port, "/health")[0] == 200 and sock.exists()
            except OSError:
                return False

        wait_for(serving)
        with AgentClient(str(sock), timeout=10) as client:
            for i in range(5):
                client.send("held", b"e%d" % i, partition=0)
        assert _figure(port, "tidelog_agent_queue_depth_events", "held", 0) == 5
        assert _figure(port, "tidelog_agent_events_appended_total", "held", 0) == 5
    finally:
        daemon.terminate()
        _, stderr = daemon.communicate(timeout=30)
    assert daemon.returncode == 0, stderr
    lines = [json.loads(line) for line in stderr.splitlines()]
    messages = [line["message"] for line in lines]
    assert f"agent metrics on http://127.0.0.1:{port}/metrics" in messages
    assert f"agent serving on {sock}" in messages
