"""Fixtures of the console tests: one real `tidelog serve` per test module (the interop kit's
BrokerProcess), the console application on it, and helpers that read the rendered pages."""

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


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("broker"), kind="tidelog")
    process.start()
    try:
        yield process
    finally:
        gc.collect()
        process.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")[:80]
    return f"c-{stem}-{uuid.uuid4().hex[:8]}"
