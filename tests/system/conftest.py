"""System tests: real `tidelog serve` processes, killed, restarted and fed bad bytes.

The broker process helper is the interoperability suite's (`tests/interop/interop_broker.py`,
`BrokerProcess`); it is imported from there, not copied. `system_wire.py` next to this file
is a small blocking client over the project's own protocol and records code.

`brokers` starts brokers of the test's own in its temporary directory and stops them at the
end; when a test fails, the tail of each one's log is attached to the report. With
``ready=False`` it only makes the process object (``data_dir``, ``prefix``, ``extra_args`` go to
`BrokerProcess`), for a start that must fail (`BrokerProcess.run_to_exit`).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__).parent
# The helpers next to this file, and the interop suite's broker process helper.
for _path in (_HERE, _HERE.parent / "interop"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from interop_broker import BrokerProcess  # noqa: E402  (needs the path above)


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Call it to start a broker (fresh data dir, free port); all are stopped afterwards."""
    started: list[BrokerProcess] = []

    def start(*, ready: bool = True, **options: Any) -> BrokerProcess:
        process = BrokerProcess(tmp_path / f"broker{len(started)}", kind="tidelog", **options)
        process.workdir.mkdir(parents=True)
        started.append(process)
        if ready:
            process.start()
        return process

    yield start
    # Clients the test dropped close their connections when collected.
    gc.collect()
    for process in started:
        process.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Iterator[None] | pytest.TestReport:
    report: pytest.TestReport = yield
    if report.failed:
        tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
        if isinstance(tmp_path, Path):
            for log in sorted(tmp_path.glob("broker*/broker.log")):
                lines = log.read_text(errors="replace").splitlines()
                report.sections.append((f"broker log tail ({log})", "\n".join(lines[-60:])))
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Every test here starts real processes: `-m "not slow"` leaves them out.
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.slow)
