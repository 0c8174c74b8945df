"""What a node's state machines take from the world, injected as one :class:`Runtime`.

The controller (and later Raft) never reads the wall clock, draws random numbers or fsyncs
on its own: it is handed a clock, a random source and an fsync, so that a simulation can
give it a fake clock, a seeded ``random.Random`` and a disk that forgets unsynced writes,
and replay a run exactly. :meth:`Runtime.system` is the real one a server uses.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Clock", "Fsync", "Runtime", "random_uuid", "wall_clock_ms"]

#: Milliseconds since the epoch.
Clock = Callable[[], int]
#: Make what was written to a file descriptor durable (``os.fsync`` for real).
Fsync = Callable[[int], None]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def random_uuid(source: random.Random) -> uuid.UUID:
    """A version-4 UUID drawn from ``source`` (deterministic for a seeded source)."""
    return uuid.UUID(int=source.getrandbits(128), version=4)


@dataclass(frozen=True)
class Runtime:
    """Time, randomness and disk durability for one node."""

    clock: Clock
    random: random.Random
    fsync: Fsync

    @classmethod
    def system(cls, clock: Clock = wall_clock_ms) -> Runtime:
        """The real world: ``clock`` (the wall clock unless given), the operating system's
        random source, ``os.fsync``."""
        return cls(clock=clock, random=random.SystemRandom(), fsync=os.fsync)

    @classmethod
    def seeded(cls, seed: int, clock: Clock, fsync: Fsync = os.fsync) -> Runtime:
        """A reproducible runtime: the same seed draws the same ids."""
        return cls(clock=clock, random=random.Random(seed), fsync=fsync)
