"""The writes a coordinator handed to its driver and waits to hear about.

Both coordinators return writes as effects and learn their outcome later, when the driver
calls ``write_completed(write_id, now_ms, error)``. :class:`PendingWrites` numbers them and
keeps each one's callback until then; a write reported twice, or one the coordinator
forgot (its partition was unloaded), is ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from tidelog.protocol.error_codes import ErrorCode

T = TypeVar("T")


class PendingWrites(Generic[T]):
    __slots__ = ("_callbacks", "_next_id")

    def __init__(self) -> None:
        self._callbacks: dict[int, Callable[[ErrorCode, int], T]] = {}
        self._next_id = 1

    def add(self, callback: Callable[[ErrorCode, int], T]) -> int:
        """A new write id; ``callback(error, now_ms)`` runs when it is reported."""
        write_id = self._next_id
        self._next_id += 1
        self._callbacks[write_id] = callback
        return write_id

    def complete(self, write_id: int, error: ErrorCode, now_ms: int) -> T | None:
        """Run the write's callback; None for a write not (or no longer) pending."""
        callback = self._callbacks.pop(write_id, None)
        return None if callback is None else callback(error, now_ms)

    def __len__(self) -> int:
        return len(self._callbacks)
