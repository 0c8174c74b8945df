"""The messages of the metadata quorum, named and shaped after Kafka's KRaft APIs.

Each class holds the fields of one partition entry of the Kafka request or response (the
quorum replicates a single partition, ``__cluster_metadata-0``), so that the wire codec can map
them one to one onto kio's ``vote``, ``begin_quorum_epoch``, ``end_quorum_epoch`` and ``fetch``
schemas. Error fields use the project's one error table. An :class:`Envelope` carries a message
between two nodes with the correlation id that the Kafka request header would carry.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidelog.protocol.error_codes import ErrorCode


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of the replicated log: the records of one controller operation, or a control
    record, stored as one record batch (Kafka's ``__cluster_metadata-0`` holds one batch per
    operation, applied whole or not at all).

    The entry spans offsets ``[offset, offset + len(records))``: every record has its own
    offset. Raft itself reasons only about entry boundaries: the high watermark, fetch
    offsets, truncation points, snapshot ids and epoch start offsets never fall inside an
    entry. ``control`` entries (KRaft's LeaderChange record, written by every new leader at
    the start of its epoch) are replicated and committed like any other, and skipped by the
    loader.
    """

    offset: int
    epoch: int
    records: tuple[bytes, ...]
    control: bool = False

    def __post_init__(self) -> None:
        if not self.records:
            raise ValueError(f"an entry holds at least one record (offset {self.offset})")

    @property
    def end_offset(self) -> int:
        """The offset after the entry's last record: where the next entry starts."""
        return self.offset + len(self.records)

    @property
    def size(self) -> int:
        """The bytes of its records (what fetch byte limits count)."""
        return sum(len(record) for record in self.records)


@dataclass(frozen=True, slots=True)
class OffsetAndEpoch:
    """An end offset and the epoch of the entry before it: a log position, or a snapshot id."""

    offset: int
    epoch: int


@dataclass(frozen=True, slots=True)
class VoteRequest:
    """Vote (API 52). ``pre_vote`` (KIP-996) asks whether the voter *would* vote: it bumps
    no epoch and persists nothing. ``candidate_epoch`` is the epoch the candidate runs in (for
    a pre-vote, the one it would run in: its current epoch + 1)."""

    candidate_epoch: int
    candidate_id: int
    voter_id: int
    last_offset_epoch: int
    last_offset: int
    pre_vote: bool


@dataclass(frozen=True, slots=True)
class VoteResponse:
    error: ErrorCode
    leader_id: int | None
    leader_epoch: int
    vote_granted: bool
    pre_vote: bool


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochRequest:
    """BeginQuorumEpoch (API 53): a new leader tells the voters it leads ``leader_epoch``."""

    leader_epoch: int
    leader_id: int
    voter_id: int


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochResponse:
    error: ErrorCode
    leader_id: int | None
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class EndQuorumEpochRequest:
    """EndQuorumEpoch (API 54): the leader resigns; ``preferred_successors`` lists the voters
    most caught up first, and the first of them starts its election at once."""

    leader_epoch: int
    leader_id: int
    preferred_successors: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EndQuorumEpochResponse:
    error: ErrorCode
    leader_id: int | None
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """Fetch (API 1) of the metadata partition by a voter or an observer.

    ``fetch_offset`` counts only entries the replica has flushed: the leader treats it as the
    replica's durable end. ``last_fetched_epoch`` is the epoch of the entry before it (0 for an
    empty log); the leader checks the pair against its own log. ``max_wait_ms`` lets the leader
    hold the request until it has something new (a long poll, as Kafka does).
    """

    replica_id: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    max_bytes: int
    max_wait_ms: int


@dataclass(frozen=True, slots=True)
class FetchResponse:
    """The answer to a Fetch: ``records`` starting at the fetch offset, or ``diverging_epoch``
    (the end offset of the largest epoch the leader has at or below the one the replica sent)
    telling the replica where to truncate before it fetches again, or ``snapshot_id`` when
    what the replica needs is no longer in the leader's log: it fetches that snapshot first
    (FetchSnapshot) and then fetches from its end."""

    error: ErrorCode
    leader_id: int | None
    leader_epoch: int
    high_watermark: int
    log_start_offset: int
    records: tuple[Entry, ...] = ()
    diverging_epoch: OffsetAndEpoch | None = None
    snapshot_id: OffsetAndEpoch | None = None


@dataclass(frozen=True, slots=True)
class FetchSnapshotRequest:
    """FetchSnapshot (API 59, KIP-630): ``max_bytes`` of snapshot ``snapshot_id`` from
    ``position``."""

    replica_id: int
    current_leader_epoch: int
    snapshot_id: OffsetAndEpoch
    position: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchSnapshotResponse:
    """A chunk of a snapshot: ``unaligned_records`` are its bytes from ``position``; ``size``
    is the whole snapshot's."""

    error: ErrorCode
    leader_id: int | None
    leader_epoch: int
    snapshot_id: OffsetAndEpoch
    size: int = 0
    position: int = 0
    unaligned_records: bytes = b""


Message = (
    VoteRequest
    | VoteResponse
    | BeginQuorumEpochRequest
    | BeginQuorumEpochResponse
    | EndQuorumEpochRequest
    | EndQuorumEpochResponse
    | FetchRequest
    | FetchResponse
    | FetchSnapshotRequest
    | FetchSnapshotResponse
)


@dataclass(frozen=True, slots=True)
class Envelope:
    """A message from ``source`` to ``destination``. A response carries the correlation id of
    its request; a node accepts a response only for the request it is waiting on, so duplicated
    or late responses are ignored."""

    source: int
    destination: int
    correlation_id: int
    message: Message
