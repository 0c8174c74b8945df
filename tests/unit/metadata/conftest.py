"""Fixtures of the metadata tests: a fake clock and controllers on a temporary data dir."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The helpers module sits next to this file; make it importable for the tests.
sys.path.insert(0, str(Path(__file__).parent))

from metadata_helpers import ControllerFactory, FakeClock

from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.controller import Controller
from tidelog.metadata.node import MetadataNode, build_metadata_node
from tidelog.runtime.system import Runtime


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def start_controller(data_dir: Path, clock: FakeClock) -> Iterator[ControllerFactory]:
    """Start a controller on ``data_dir`` with extra config values (built as the server
    builds it); closes them all."""
    started: list[MetadataNode] = []

    def start(**values: str) -> Controller:
        config = {"log.dirs": str(data_dir)}
        config.update({key.replace("_", "."): value for key, value in values.items()})
        node = build_metadata_node(BrokerConfig(config), Runtime.system(clock))
        started.append(node)
        return node.controller

    yield start
    for node in started:
        node.close()


@pytest.fixture
def controller(start_controller: ControllerFactory) -> Controller:
    return start_controller()
