"""tidelog.metadata.raft: the metadata quorum (KRaft's protocol) as a sans-io state machine.

Modules: ``node`` (:class:`RaftNode`, its roles and :class:`Effects`), ``messages`` (Vote,
BeginQuorumEpoch, EndQuorumEpoch, Fetch and FetchSnapshot, shaped after Kafka's schemas), ``store`` (the log
and quorum-state interfaces a node is given), ``batches`` (entries and snapshots as Kafka
record batches) and ``config``. See "The quorum (Raft)" in
``docs/metadata.md``.
"""

from tidelog.metadata.raft.batches import decode_entries, encode_entries
from tidelog.metadata.raft.config import RaftConfig
from tidelog.metadata.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    Entry,
    Envelope,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    OffsetAndEpoch,
    VoteRequest,
    VoteResponse,
)
from tidelog.metadata.raft.node import (
    Effects,
    ProposeResult,
    RaftNode,
    RandomSource,
    Role,
)
from tidelog.metadata.raft.store import QuorumState, QuorumStateStore, RaftLog

__all__ = [
    "BeginQuorumEpochRequest",
    "BeginQuorumEpochResponse",
    "Effects",
    "EndQuorumEpochRequest",
    "EndQuorumEpochResponse",
    "Entry",
    "Envelope",
    "FetchRequest",
    "FetchResponse",
    "FetchSnapshotRequest",
    "FetchSnapshotResponse",
    "Message",
    "OffsetAndEpoch",
    "ProposeResult",
    "QuorumState",
    "QuorumStateStore",
    "RaftConfig",
    "RaftLog",
    "RaftNode",
    "RandomSource",
    "Role",
    "VoteRequest",
    "VoteResponse",
    "decode_entries",
    "encode_entries",
]
