"""Fixtures of the agent tests: a real `tidelog serve` per module, topic helpers, a reader.

The broker is the BrokerProcess of the interoperability tests, always `tidelog serve`. Topics
are created and read back with confluent-kafka, so that what the agent delivered is checked by
a client that shares no code with it.
"""

from __future__ import annotations

import gc
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "interop"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

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
def topic_name() -> Callable[[], str]:
    return lambda: f"agent-{uuid.uuid4().hex[:10]}"
