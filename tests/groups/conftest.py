"""Consumer groups against a real `tidelog serve`, with real clients as member processes.

The broker process helper and the Java client harness are the interoperability suite's
(`tests/interop/interop_broker.py`, `tests/interop/java_harness.py`), imported from there.
Brokers run with `group.initial.rebalance.delay.ms=0` so that a group forms as soon as its
members have joined.

Fixtures: `broker` (one per test module), `own_broker` (a test's own, for restarts), `names`
(a unique topic and group per test), `members` (starts member processes and kills whatever is
left at the end), `java` (the Java harness bound to `broker`). A failing test's report carries
the broker log tail and every member's last events.
"""

from __future__ import annotations

import gc
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_HERE = Path(__file__).parent
for _path in (_HERE, _HERE.parent / "interop"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from group_harness import GroupBroker, Members, Names  # noqa: E402  (needs the path above)
from java_harness import JavaClient  # noqa: E402

OVERRIDES = {"group.initial.rebalance.delay.ms": "0"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GroupBroker]:
    process = GroupBroker(tmp_path_factory.mktemp("broker"), OVERRIDES)
    process.start()
    try:
        yield process
    finally:
        gc.collect()
        process.stop()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Callable[[], GroupBroker]]:
    started: list[GroupBroker] = []

    def start() -> GroupBroker:
        process = GroupBroker(tmp_path / f"broker{len(started)}", OVERRIDES)
        process.workdir.mkdir(parents=True)
        started.append(process)
        process.start()
        return process

    yield start
    gc.collect()
    for process in started:
        process.stop()


@pytest.fixture
def names(request: pytest.FixtureRequest) -> Names:
    return Names(re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")[:80])


@pytest.fixture
def members() -> Iterator[Members]:
    started = Members()
    yield started
    for member in started.all:
        member.kill()


@pytest.fixture(scope="session")
def java_client() -> JavaClient:
    return JavaClient.build()


@pytest.fixture
def java(java_client: JavaClient, broker: GroupBroker) -> JavaClient:
    return java_client.bound(broker.bootstrap)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Iterator[None] | pytest.TestReport:
    report: pytest.TestReport = yield
    if report.failed:
        funcargs = getattr(item, "funcargs", {})
        process = funcargs.get("broker")
        if isinstance(process, GroupBroker):
            report.sections.append((f"broker log tail ({process.log_path})", process.log_tail()))
        tmp_path = funcargs.get("tmp_path")
        if isinstance(tmp_path, Path):
            for log in sorted(tmp_path.glob("broker*/broker.log")):
                lines = log.read_text(errors="replace").splitlines()
                report.sections.append((f"broker log tail ({log})", "\n".join(lines[-60:])))
        started = funcargs.get("members")
        if isinstance(started, Members):
            report.sections.append(("members", "\n".join(m.describe() for m in started.all)))
    return report


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "filterwarnings", "ignore:(read_text|open_text) is deprecated:DeprecationWarning"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Every test here starts real processes: `-m "not slow"` leaves them out.
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.slow)
