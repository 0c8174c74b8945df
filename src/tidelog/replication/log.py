"""What the replica state machine needs from a partition's log.

:class:`tidelog.storage.log.Log` satisfies :class:`ReplicaLog` structurally (a typed test
checks it), and so does the simulation's in-memory model; this package imports neither.
"""

from __future__ import annotations

from typing import Protocol


class EpochAssigner(Protocol):
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; False when nothing changed."""
        ...


class ReplicaLog(Protocol):
    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def recovery_point(self) -> int:
        """Everything below it is fsynced: what survives a crash."""
        ...

    @property
    def high_watermark(self) -> int: ...

    def update_high_watermark(self, offset: int) -> int: ...

    @property
    def latest_epoch(self) -> int: ...

    @property
    def epoch_cache(self) -> EpochAssigner: ...

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: ``(largest epoch <= epoch, its end offset)``."""
        ...

    def append(
        self,
        batches: bytes | bytearray | memoryview,
        *,
        leader_epoch: int = -1,
        durable: bool = False,
    ) -> object: ...

    def append_as_follower(
        self, batches: bytes | bytearray | memoryview, *, durable: bool = False
    ) -> object: ...

    def truncate_to(self, offset: int) -> bool: ...

    def sync(self) -> bool:
        """fsync everything up to the log end offset; False when it already was."""
        ...

    def read_bytes(self, offset: int, max_bytes: int) -> bytes: ...
