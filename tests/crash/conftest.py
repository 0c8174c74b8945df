"""Crash tests: the helpers module and the writer script sit next to this file."""

from __future__ import annotations

import sys
from pathlib import Path

# Makes crash_helpers importable for the tests (the writer script finds it by itself).
sys.path.insert(0, str(Path(__file__).parent))
