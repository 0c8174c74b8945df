"""Deadlines keyed by name, for a state machine that is told the time.

A key has at most one deadline; scheduling it again replaces the old one. Entries live in a heap
and stale ones (replaced or cancelled) are skipped when popped, so scheduling is O(log n) and no
scan over all groups is needed to find what is due.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable


class Timers:
    __slots__ = ("_deadlines", "_heap", "_seq")

    def __init__(self) -> None:
        self._deadlines: dict[Hashable, tuple[int, int]] = {}
        self._heap: list[tuple[int, int, Hashable]] = []
        self._seq = 0

    def schedule(self, key: Hashable, deadline_ms: int) -> None:
        self._seq += 1
        self._deadlines[key] = (deadline_ms, self._seq)
        heapq.heappush(self._heap, (deadline_ms, self._seq, key))

    def cancel(self, key: Hashable) -> None:
        self._deadlines.pop(key, None)

    def deadline(self, key: Hashable) -> int | None:
        entry = self._deadlines.get(key)
        return None if entry is None else entry[0]

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap:
            deadline, seq, key = heap[0]
            if self._deadlines.get(key) == (deadline, seq):
                return
            heapq.heappop(heap)

    def next_deadline(self) -> int | None:
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int) -> tuple[Hashable, int] | None:
        """The earliest key whose deadline is at or before ``now_ms``, removed; else ``None``."""
        self._drop_stale()
        if not self._heap or self._heap[0][0] > now_ms:
            return None
        deadline, _, key = heapq.heappop(self._heap)
        del self._deadlines[key]
        return key, deadline

    def __len__(self) -> int:
        return len(self._deadlines)
