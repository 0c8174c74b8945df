"""Fixtures of the interoperability tests: one real broker per test module, real clients.

`broker` is module-scoped: every test of a file talks to the same broker process, so each test
uses its own topics (`topic_name`). When a test that used the broker fails, the tail of the
broker's log is attached to the failure report. The broker is chosen by TIDELOG_INTEROP_BROKER
(see interop_broker.py); `java` is the compiled Java client harness (see java_harness.py).
"""

from __future__ import annotations

import gc
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# The helper modules sit next to this file; make them importable for the tests.
sys.path.insert(0, str(Path(__file__).parent))

from interop_broker import BrokerProcess
from interop_certs import make_certificates
from java_harness import JavaClient


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("broker"))
    process.start()
    try:
        yield process
    finally:
        # Clients the tests dropped close their connections when collected; a broker that
        # drains open connections on SIGTERM then stops at once.
        gc.collect()
        process.stop()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[[], BrokerProcess]]:
    """Starts brokers of the test's own (for crash tests that kill and restart them)."""
    started: list[BrokerProcess] = []

    def start() -> BrokerProcess:
        process = BrokerProcess(tmp_path / f"broker{len(started)}")
        process.workdir.mkdir(parents=True)
        started.append(process)
        process.start()
        return process

    yield start
    gc.collect()
    for process in started:
        process.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses: the test's name plus a random suffix."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")[:120]
    return f"it-{stem}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A test CA with broker and client certificates (made with `openssl`)."""
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def java_client() -> JavaClient:
    return JavaClient.build()


@pytest.fixture
def java(java_client: JavaClient, broker: BrokerProcess) -> JavaClient:
    return java_client.bound(broker.bootstrap)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Iterator[None] | pytest.TestReport:
    report: pytest.TestReport = yield
    if report.failed:
        funcargs = getattr(item, "funcargs", {})
        process = funcargs.get("broker")
        if isinstance(process, BrokerProcess):
            report.sections.append(
                (f"broker log tail ({process.kind}, {process.log_path})", process.log_tail())
            )
    return report


def pytest_configure(config: pytest.Config) -> None:
    # kafka-python loads its protocol schemas with importlib.resources calls that Python 3.11
    # deprecates; that is the library's business, not the broker's.
    config.addinivalue_line(
        "filterwarnings", "ignore:(read_text|open_text) is deprecated:DeprecationWarning"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Every test here starts real processes: `-m "not slow"` leaves them out.
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.slow)
