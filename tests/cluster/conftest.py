"""Fixtures of the cluster fault tests: a fresh three-node quorum per test (`cluster`), whose
nodes' log tails are attached to a failing test's report."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_HERE = Path(__file__).parent
for _path in (_HERE, _HERE.parent / "interop"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from cluster_harness import Cluster  # noqa: E402  (needs the path above)


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path)
    try:
        nodes.start()
        yield nodes
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(nodes.log_tails(40))
        nodes.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
