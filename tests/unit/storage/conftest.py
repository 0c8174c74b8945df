"""Fixtures of the storage tests (helpers live in storage_helpers)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The helpers module sits next to this file; make it importable for the tests.
sys.path.insert(0, str(Path(__file__).parent))

from storage_helpers import FakeClock, LogFactory

from tidelog.storage import Log, LogConfig


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "topic-0"


@pytest.fixture
def open_log(log_dir: Path, clock: FakeClock) -> Iterator[LogFactory]:
    opened: list[Log] = []

    def factory(config: dict[str, str | int] | None = None, **kwargs: object) -> Log:
        log = Log.open(
            log_dir,
            LogConfig.from_mapping(config or {}),
            topic="topic",
            partition=0,
            clock=clock,
            **kwargs,  # type: ignore[arg-type]
        )
        opened.append(log)
        return log

    yield factory
    for log in opened:
        if not log.closed:
            log.close()
