"""Fixtures of the console tests: one real `tidelog serve` per test module (the interop kit's
BrokerProcess), an admin client and the console application on it."""

from __future__ import annotations

import gc
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# The page readers sit next to this file; the broker kit and the waiting helper live with the
# interoperability tests.
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "interop"))

from interop_broker import BrokerProcess
from starlette.testclient import TestClient

from tidelog.client import Admin
from tidelog.console.app import ConsoleConfig, create_app


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("broker"), kind="tidelog")
    process.start()
    try:
        yield process
    finally:
        gc.collect()
        process.stop()


@pytest.fixture(scope="module")
def admin(broker: BrokerProcess) -> Iterator[Admin]:
    with Admin({"bootstrap.servers": broker.bootstrap}) as client:
        yield client


@pytest.fixture(scope="module")
def console(broker: BrokerProcess) -> Iterator[TestClient]:
    """The console application on the module's broker, with its clients started."""
    with TestClient(create_app(ConsoleConfig(broker.bootstrap))) as client:
        yield client


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")[:80]
    return f"c-{stem}-{uuid.uuid4().hex[:8]}"
