"""What a Raft node needs from its disk: the replicated log and the quorum-state file.

Both are injected, so that the node never touches a file itself: production wraps the
partition log of ``__cluster_metadata-0`` and a ``quorum-state`` file; the simulation in
``tidelog.testing`` keeps them in memory and loses what was not flushed when a node crashes.

Entries are batches: an entry spans ``[entry.offset, entry.end_offset)``, one offset per
record, and every offset this interface takes (``read``'s start, ``truncate_to``, snapshot
ids) is an entry boundary: the log start, the log end, or the first offset of an entry.

Snapshots (KIP-630): the log starts at ``start_offset``, and the entries before it are
summarised by the latest snapshot, whose id is ``OffsetAndEpoch(start_offset, epoch of the
entry before it)``. A snapshot's bytes are record batches
(:func:`~tidelog.metadata.raft.batches.encode_snapshot`: header, the state's records,
footer), built by the node; the log stores them, serves them in chunks (FetchSnapshot) and
installs them as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tidelog.metadata.raft.messages import Entry, OffsetAndEpoch


class RaftLog(Protocol):
    """The replicated log of one node.

    ``append`` and ``truncate_to`` change what the log holds at once; appended entries are
    durable only after ``flush``. ``truncate_to`` is durable when it returns (truncating a
    segment file is). A crash keeps exactly the entries below ``flushed_end_offset``.
    """

    def start_offset(self) -> int: ...

    def end_offset(self) -> int: ...

    def flushed_end_offset(self) -> int: ...

    def last_epoch(self) -> int:
        """The epoch of the last entry, or of the snapshot when the log is empty past it;
        0 when there is neither."""
        ...

    def entry_epoch(self, offset: int) -> int:
        """The epoch of the entry holding ``offset`` (``start_offset <= offset < end_offset``)."""
        ...

    def entry_start(self, offset: int) -> int:
        """The first offset of the entry holding ``offset`` (``start_offset <= offset <
        end_offset``): ``offset`` itself when it is an entry boundary."""
        ...

    def read(self, start: int, max_bytes: int) -> Sequence[Entry]:
        """Whole entries from the boundary ``start``: at least one if there is one, then
        while within ``max_bytes`` of records."""
        ...

    def append(self, entries: Sequence[Entry]) -> None:
        """Append entries each starting where the one before ends (the first at the log end)
        and whose epochs never go down."""
        ...

    def truncate_to(self, end_offset: int) -> None:
        """Drop every entry at or after the boundary ``end_offset``."""
        ...

    def flush(self) -> None: ...

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        """The leader-epoch cache: the largest epoch at or below ``epoch`` that the log holds
        and the offset where it ends (the start of the next epoch, or the log end).
        ``OffsetAndEpoch(start_offset, snapshot epoch or 0)`` when no entry is that old."""
        ...

    def latest_snapshot_id(self) -> OffsetAndEpoch | None: ...

    def read_snapshot(self) -> tuple[OffsetAndEpoch, bytes] | None:
        """The latest snapshot and its bytes (record batches)."""
        ...

    def write_snapshot(self, snapshot_id: OffsetAndEpoch, payload: bytes) -> None:
        """Store a snapshot of the entries below the boundary ``snapshot_id.offset``
        (durable on return, as a file written, fsynced and renamed is) and delete the log
        before it: the log then starts at ``snapshot_id.offset``."""
        ...

    def install_snapshot(self, snapshot_id: OffsetAndEpoch, payload: bytes) -> None:
        """Replace the whole log by a snapshot fetched from the leader: every entry is
        dropped and the log starts, empty, at ``snapshot_id.offset`` (durable on return)."""
        ...


@dataclass(frozen=True, slots=True)
class QuorumState:
    """The contents of the quorum-state file: the epoch this node is in, whom it voted for in
    that epoch, and the leader of that epoch if it knows one."""

    epoch: int
    voted_for: int | None
    leader_id: int | None


class QuorumStateStore(Protocol):
    """The quorum-state file. ``write`` replaces the contents; they are durable after
    ``flush`` only. ``read`` gives the durable contents after a restart (``None``: never
    written)."""

    def read(self) -> QuorumState | None: ...

    def write(self, state: QuorumState) -> None: ...

    def flush(self) -> None: ...
