"""Fixtures of the client tests: a broker process per module and kind (client_broker.py)."""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from client_broker import Broker, broker_kinds


@pytest.fixture(scope="module", params=broker_kinds())
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Broker]:
    process = Broker(tmp_path_factory.mktemp(f"broker-{request.param}"), request.param)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")[:80]
    return f"ct-{stem}-{uuid.uuid4().hex[:8]}"
