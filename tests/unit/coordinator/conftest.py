"""Fixtures of the coordinator tests (helpers live in coordinator_helpers)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The helpers module sits next to this file; make it importable for the tests.
sys.path.insert(0, str(Path(__file__).parent))

from coordinator_helpers import Harness


@pytest.fixture
def h() -> Harness:
    return Harness()
