"""Helpers of the metadata tests: a fake clock and an fsync counter."""

from __future__ import annotations

import os
from collections.abc import Callable

from tidelog.metadata.controller import Controller

#: start_controller(**config) -> a started controller (see conftest).
ControllerFactory = Callable[..., Controller]


class FakeClock:
    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class FsyncCounter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        os.fsync(fd)
